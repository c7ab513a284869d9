"""structlog configuration, done once at the edge: JSON when not a TTY, console on a TTY.

Components bind what a log line is about with `bound` (contextvars, so it follows the asyncio task):
the worker binds ``execution_id``, ``step``, ``step_run_id`` and ``worker`` while it handles a command,
the controller ``execution_id`` while it folds an execution's events.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

import structlog

__all__ = ["bound", "configure"]


def configure(level: str = "info", *, json: bool | None = None, stream: object = None) -> None:
    out = stream if stream is not None else sys.stderr
    if json is None:
        json = not getattr(out, "isatty", lambda: False)()
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=out),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )


@contextlib.contextmanager
def bound(**values: object) -> Iterator[None]:
    """Add ``values`` (``None`` ones skipped) to every log line of the current task inside the block;
    restores what was bound before on the way out."""
    with structlog.contextvars.bound_contextvars(**{k: v for k, v in values.items() if v is not None}):
        yield
