"""structlog configuration, done once at the edge: JSON when not a TTY, console on a TTY.

Components bind what a log line is about with `bound` (contextvars, so it follows the asyncio task):
the worker binds ``execution_id``, ``step``, ``step_run_id`` and ``worker`` while it handles a command,
the controller ``execution_id`` while it folds an execution's events.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import types
from collections.abc import Mapping, MutableMapping
from typing import Any

import structlog

__all__ = ["Hush", "bound", "configure", "configure_unless_configured"]


class _Stderr:
    """Whatever ``sys.stderr`` is when a line is written (a test runner, a daemon may swap it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


class Hush:
    """A log processor that drops the lines named in `names` (what a command shows its user another way:
    ``run``'s progress names a failed step), and every line below ``error`` once `quiet` was called
    (``run`` interrupted, or past its ``--timeout``: what its shutdown says about the work it abandons
    is no news to whoever stopped it)."""

    _BELOW_ERROR = frozenset({"debug", "info", "warning", "warn", "msg"})

    def __init__(self, names: frozenset[str] = frozenset()) -> None:
        self.names = names
        self.quieted = False

    def quiet(self) -> None:
        """From now on, errors alone (the standard library's loggers, asyncio's and the NATS client's:
        nothing below critical)."""
        self.quieted = True
        logging.disable(logging.ERROR)

    def __call__(self, _: Any, method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        if event_dict.get("event") in self.names or (self.quieted and method in self._BELOW_ERROR):
            raise structlog.DropEvent
        return event_dict


def configure(
    level: str = "info", *, json: bool | None = None, stream: object = None, hush: Hush | None = None
) -> None:
    out = stream if stream is not None else _Stderr()
    if json is None:
        json = not getattr(out, "isatty", lambda: False)()
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            *([hush] if hush is not None else []),
            structlog.contextvars.merge_contextvars,
            _merge_bound,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=out),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )


def configure_unless_configured(level: str = "warning") -> None:
    """`configure` unless the application has configured structlog itself. structlog's own default
    writes to stdout and, with ``rich`` installed, prints each frame's local variables with a traceback:
    a credential in a local would be logged."""
    if not structlog.is_configured():
        configure(level)


_BOUND: contextvars.ContextVar[Mapping[str, object]] = contextvars.ContextVar(
    "noetl_bound", default=types.MappingProxyType({})
)


def _merge_bound(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Add what `bound` holds to a log line (only when a line is actually logged)."""
    for key, value in _BOUND.get().items():
        event_dict.setdefault(key, value)
    return event_dict


class bound:  # used like a function: ``with bound(execution_id=...):``
    """Add ``values`` (``None`` ones skipped) to every log line of the current task inside the block;
    restores what was bound before on the way out. One context variable set per block (the hot paths
    enter one per message), not one per key as ``structlog.contextvars.bound_contextvars``."""

    __slots__ = ("_token", "_values")

    def __init__(self, **values: object) -> None:
        self._values = (
            values if None not in values.values() else {k: v for k, v in values.items() if v is not None}
        )

    def __enter__(self) -> None:
        outer = _BOUND.get()
        self._token = _BOUND.set({**outer, **self._values} if outer else self._values)

    def __exit__(self, *exc: object) -> None:
        _BOUND.reset(self._token)
