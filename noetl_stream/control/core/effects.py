"""What the reducer asks the controller to publish, and the server events it mints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from noetl_stream.dsl.diagnostics import Diagnostic
from noetl_stream.dsl.vocabulary import LEGACY_HINT
from noetl_stream.protocol import events as E
from noetl_stream.protocol.errorinfo import ErrorInfo
from noetl_stream.protocol.wire import (
    Command,
    Event,
    epoch_of,
    make_event,
)


@dataclass(frozen=True)
class Blob:
    """An immutable object the controller stores (results object store) before it publishes the effects
    (the packed items of a distributed loop; the state refers to it by key and checksum)."""

    key: str
    data: bytes | bytearray


@dataclass(frozen=True)
class LoopResults:
    """The ``loop.done`` event ``event_id`` is published with ``result``: the results of the iterations of
    ``step_run_id`` in item order, assembled by the controller from their stored events."""

    event_id: str
    step_run_id: str
    total: int
    after_seq: int


@dataclass
class Effects:
    events: list[Event] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    blobs: list[Blob] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    """Object-store keys of blobs no longer needed (a finished loop's packed items): the controller
    deletes them once this fold's events are stored."""
    loop_results: dict[str, LoopResults] = field(default_factory=dict)
    """By event id: the events of ``events`` whose result the controller fills in before publishing."""
    error: Exception | None = None
    """The reducer's own failure (a bug) that failed the execution with ``internal_error``: for the log."""
    ignored: str | None = None
    """Why the event changed nothing when that is worth a log line (a boundary of no running step run,
    a malformed part of one): for the log (`GroupCommit._fold`)."""


LEGACY_ADVICE = (
    "; it is written in legacy DSL forms: run it with the legacy extension (submit/run --legacy, a "
    "controller with --legacy, or executor.spec.extensions: [legacy]) or rewrite it with "
    "`noetl-stream migrate`"
)


def invalid_playbook_error(diagnostics: tuple[Diagnostic, ...] | list[Diagnostic]) -> dict[str, Any]:
    """The error of a request whose playbook does not compile (the same from intake and reducer)."""
    errors = [d for d in diagnostics if d.severity == "error"]
    first = errors[0].format() if errors else "invalid playbook"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    legacy = LEGACY_ADVICE if any(LEGACY_HINT in d.message for d in errors) else ""
    return ErrorInfo(
        kind="invalid_playbook",
        message=f"invalid playbook: {first}{more}{legacy}",
        diagnostics=[d.format() for d in diagnostics],
    ).to_dict()


def rejection_events(
    execution_id: str,
    entity_id: str,
    error: dict[str, Any],
    trace_id: str | None,
    timestamp: str | None = None,
) -> list[Event]:
    """``playbook.request.rejected`` then ``playbook.processed`` (status ``rejected``), at `timestamp`
    (the reducer's clock; now when None: the intake's)."""
    out = []
    for name, payload in (
        (E.REQUEST_REJECTED, {"error": error}),
        (E.PLAYBOOK_PROCESSED, {"status": "rejected", "error": error}),
    ):
        out.append(
            server_event(
                execution_id,
                name,
                "playbook",
                entity_id,
                "error",
                "execution",
                payload,
                trace_id=trace_id,
                timestamp=timestamp,
            )
        )
    return out


def _plain(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """A routing event dict as plain data (``event.name`` is a str subclass while routing)."""
    if value is None:
        return None
    return {k: (str(v) if k == "name" else v) for k, v in value.items()}


def _epoch(timestamp: str) -> float:
    return epoch_of(timestamp) or 0.0


def server_event(
    execution_id: str,
    name: str,
    entity_type: str,
    entity_id: str,
    status: str,
    scope: str,
    payload: dict[str, Any],
    step: str | None = None,
    step_run_id: str | None = None,
    trace_id: str | None = None,
    timestamp: str | None = None,
) -> Event:
    """An event the controller writes (source ``server``), its id deterministic from its scope. The reducer
    passes its clock's `timestamp`; when None it is now (the controller's own timers and intake)."""
    return make_event(
        execution_id,
        name,
        source="server",
        entity_type=entity_type,
        entity_id=entity_id,
        status=status,
        scope=scope,
        payload=payload,
        step=step,
        step_run_id=step_run_id,
        trace_id=trace_id,
        timestamp=timestamp,
    )
