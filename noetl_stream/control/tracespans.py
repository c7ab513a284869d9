"""The controller's spans of an execution's trace (OpenTelemetry, when tracing is on: `tracing.active`).

Made from what a fold read and wrote, once its effects are stored (`GroupCommit`, the ``spans`` of
`CommitParts`): no I/O of their own, and with tracing off one global read per commit. Their times are
the events' (``timestamp``, milliseconds) and the commit's, so a controller that folds late (a restart,
a takeover) still places them right. Children of the execution's root (`tracing.root_context`):

* ``intake``: the request recorded (``playbook.execution.requested``) → the fold that evaluated it
  stored its effects (``playbook.request.evaluated``, ``workflow.started``, the first commands).
* ``route <step>``: the step's boundary (``step.done``, ``step.failed``, ``loop.done``;
  ``keychain.resolved``/``failed`` for ``route keychain-check``), written by its worker (by the
  controller for a step without a tool) → the fold that routed it stored its effects; ``noetl.next``
  names the steps it scheduled.
* ``schedule <step>`` (``schedule <step> [<index>]`` for a distributed loop's iteration): one per
  command, from its ``issued_at`` to the commit that published it; a child of the ``intake`` or
  ``route`` span of the fold that issued it, else of the root. The wait until a worker takes it is the
  worker's ``queued <step>`` span (`tracing.StepTrace`).
* ``execution <playbook>``, the root itself, when the fold ends the execution (`tracing.export_execution`):
  from the request's time to the commit that stored its end.

Not traced: the folds of other inputs (a distributed loop's iteration events, cancel, pause, deadlines),
apart from the commands they issue; and the end of an execution that a resume (`ExecutionCache`) or a
takeover finishes without a fold of this controller's (its root is not exported).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import structlog

from noetl_stream import tracing
from noetl_stream.protocol import events as E

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

    from noetl_stream.control.core.effects import Effects
    from noetl_stream.control.core.state import ExecutionState
    from noetl_stream.protocol.wire import Command, Event

log = structlog.get_logger(__name__)

__all__ = ["CommitSpans"]

_ROUTED = frozenset({E.STEP_DONE, E.STEP_FAILED, E.LOOP_DONE, E.KEYCHAIN_RESOLVED, E.KEYCHAIN_FAILED})
_KEYCHAIN = frozenset({E.KEYCHAIN_RESOLVED, E.KEYCHAIN_FAILED})


class CommitSpans:
    """Called by the commit path with one execution's fold once its effects are stored."""

    def __init__(self, controller_id: str) -> None:
        self.controller_id = controller_id

    def __call__(
        self,
        inputs: list[Event],
        effects: list[Effects],
        state: ExecutionState | None,
        ended_before: bool,
        committed_ns: int | None = None,
    ) -> None:
        """`inputs`: the events folded, each with its `effects`; `state`: the execution after them;
        `ended_before`: it had ended before this fold; `committed_ns`: when the effects were stored."""
        tracer = tracing.active()
        if tracer is None or state is None:
            return
        try:
            self._spans(tracer, inputs, effects, state, ended_before, committed_ns or time.time_ns())
        except Exception as exc:  # a span is never worth a fold
            log.warning("tracing.controller_spans_failed", error=str(exc) or type(exc).__name__)

    def _spans(
        self,
        tracer: Tracer,
        inputs: list[Event],
        effects: list[Effects],
        state: ExecutionState,
        ended_before: bool,
        at: int,
    ) -> None:
        eid, carried = state.execution_id, state.trace_id
        root = tracing.root_context(eid, carried)
        for event, fx in zip(inputs, effects, strict=True):
            start = min(tracing.ns_of(event.timestamp) or at, at)
            fold: Span | None = None
            if event.name == E.EXECUTION_REQUESTED:
                fold = tracer.start_span("intake", context=root, attributes=self._base(eid), start_time=start)
                fold.set_attribute("noetl.playbook", event.entity_id)
                rejected = next((ev for ev in fx.events if ev.name == E.REQUEST_REJECTED), None)
                if rejected is not None:
                    tracing.set_error(fold, rejected.payload.get("error"))
            elif event.name in _ROUTED:
                step = "keychain-check" if event.name in _KEYCHAIN else event.step or event.entity_id
                fold = tracer.start_span(
                    f"route {step}", context=root, attributes=self._base(eid), start_time=start
                )
                fold.set_attributes(
                    {
                        "noetl.step": step,
                        "noetl.step_run_id": event.step_run_id or "",
                        "noetl.event": event.name,
                        "noetl.status": event.status,
                        "noetl.next": sorted({cmd.step for cmd in fx.commands if not cmd.keychain_check}),
                    }
                )
            if fx.commands:
                parent = root if fold is None else _context_of(fold)
                for cmd in fx.commands:
                    self._schedule(tracer, cmd, parent, at)
            if fold is not None:
                fold.end(end_time=at)
        if state.terminal and not ended_before:
            self._root(tracer, state, inputs, at)

    def _base(self, eid: str) -> dict[str, Any]:
        return {"noetl.execution_id": eid, "noetl.controller": self.controller_id}

    def _schedule(self, tracer: Tracer, cmd: Command, parent: Context, at: int) -> None:
        attributes = self._base(cmd.execution_id)
        name = "keychain-check" if cmd.keychain_check else cmd.step
        if cmd.iteration is not None:
            attributes["noetl.iteration"] = cmd.iteration.index
            name += f" [{cmd.iteration.index}]"
        attributes.update(
            {
                "noetl.step": cmd.step,
                "noetl.step_run_id": cmd.step_run_id,
                "noetl.pool": cmd.pool,
                "noetl.command_id": cmd.command_id,
            }
        )
        start = min(tracing.ns_of(cmd.issued_at) or at, at)
        tracer.start_span(f"schedule {name}", context=parent, attributes=attributes, start_time=start).end(
            end_time=at
        )

    def _root(self, tracer: Tracer, state: ExecutionState, inputs: list[Event], at: int) -> None:
        start = tracing.ns_of(state.started_at) or tracing.ns_of(inputs[0].timestamp) or at
        attributes = self._base(state.execution_id)
        attributes["noetl.status"] = state.status
        attributes["noetl.playbook"] = state.path or state.file or state.name
        if state.parent_execution_id:
            attributes["noetl.parent_execution_id"] = state.parent_execution_id
        error: Any = None
        if state.status in ("failed", "cancelled", "rejected"):
            error = state.error or state.status
        tracing.export_execution(
            tracer,
            state.execution_id,
            state.trace_id,
            f"execution {state.name or state.path or state.file or state.execution_id}",
            min(start, at),
            at,
            attributes,
            error,
        )


def _context_of(span: Span) -> Context:
    from opentelemetry import trace

    return trace.set_span_in_context(span)
