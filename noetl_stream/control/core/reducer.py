"""The controller's pure reducer: ``(state, event) -> effects``.

The reducer folds the controller's input events (``events.CONTROLLER_INPUT_EVENTS``)
in stream order. It never performs I/O: it returns the events and commands to
publish. Every id it mints is deterministic, so publishing the same effects twice
(after a crash) is deduplicated by JetStream, and replay rebuilds the same state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from noetl_stream.control.core.effects import (
    Effects,
    _epoch,
    invalid_playbook_error,
    rejection_events,
    server_event,
)
from noetl_stream.control.core.items import ItemsMissingError, LoopItems
from noetl_stream.control.core.keychaincheck import CHECK_FLAG, check_command
from noetl_stream.control.core.plan import Plan
from noetl_stream.control.core.plans import PlanCache
from noetl_stream.control.core.state import ExecutionState
from noetl_stream.control.core.transitions import Run as _Run
from noetl_stream.dsl.diagnostics import Diagnostic
from noetl_stream.dsl.scope import render_workload
from noetl_stream.dsl.templates import RenderError
from noetl_stream.errors import NoetlError
from noetl_stream.protocol import events as E
from noetl_stream.protocol.decoding import shape_error
from noetl_stream.protocol.errorinfo import ErrorInfo
from noetl_stream.protocol.wire import (
    Event,
    ExecutionRequest,
)

Clock = Callable[[], str]
"""What the reducer stamps the events and commands it mints with (ISO-8601 UTC): the controller passes the
wall clock (`protocol.wire.now_iso`); none stamps them with the timestamp of the event being folded."""

__all__ = [
    "Clock",
    "Effects",
    "NotLoadedError",
    "Reducer",
    "invalid_playbook_error",
    "rejection_events",
]


class NotLoadedError(NoetlError, LookupError):
    """The execution's compiled playbook is not in the plan cache (the controller loads it first)."""


class Reducer:
    """Folds input events into ``ExecutionState`` and says what to publish.

    It reads no clock of its own: every time in the state is the timestamp of an event it folded (so a
    replay folds to the same state), and what it mints is stamped by `clock` (the controller's wall
    clock) or, without one, with the folded event's timestamp."""

    def __init__(self, plans: PlanCache, clock: Clock | None = None) -> None:
        self.plans = plans
        self.clock = clock
        self.items = LoopItems()
        """The packed items of running distributed loops (not in the state: see `control/core/items.py`)."""

    def now(self, event: Event) -> str:
        """The time of what folding `event` mints: the clock's, else the event's own."""
        return self.clock() if self.clock is not None else event.timestamp

    # -- entry point ------------------------------------------------------------------------------
    def apply(
        self, state: ExecutionState | None, event: Event, seq: int = 0
    ) -> tuple[ExecutionState | None, Effects]:
        """Fold `event` into `state`. Raises `NotLoadedError` or `ItemsMissingError` when the caller must
        load something first (nothing is applied). Any other failure of the reducer itself (a bug) fails
        the execution with ``internal_error`` (rejects it, for its request): the same live, on resume and
        in replay, so that every execution still reaches a terminal event; ``Effects.error`` holds it."""
        try:
            return self._apply(state, event, seq)
        except (NotLoadedError, ItemsMissingError):
            raise
        except Exception as exc:
            return self._internal_failure(state, event, seq, exc)

    def _internal_failure(
        self, state: ExecutionState | None, event: Event, seq: int, exc: Exception
    ) -> tuple[ExecutionState | None, Effects]:
        fx = Effects(error=exc)
        error = ErrorInfo(kind="internal_error", message=f"{type(exc).__name__}: {exc}").to_dict()
        if state is None or event.name == E.EXECUTION_REQUESTED:  # its request: never started
            if state is None:
                state = ExecutionState(
                    execution_id=event.execution_id,
                    file=event.entity_id or "<playbook>",
                    started_at=event.timestamp or None,
                )
            self._reject(state, fx, error, self.now(event))
        else:
            state.status = "failed"
            state.error = error
            state.finished_at = event.timestamp or None
            summary = {"status": "failed", "error": error, "steps": dict(state.step_status)}
            for name, etype in ((E.WORKFLOW_FINISHED, "workflow"), (E.PLAYBOOK_PROCESSED, "playbook")):
                fx.events.append(
                    server_event(
                        state.execution_id,
                        name,
                        etype,
                        state.path or state.file,
                        "error",
                        "execution",
                        summary,
                        trace_id=state.trace_id,
                        timestamp=self.now(event),
                    )
                )
        self.items.forget(state.execution_id)
        state.events_applied += 1
        state.last_seq = max(state.last_seq, seq)
        return state, fx

    def _apply(
        self, state: ExecutionState | None, event: Event, seq: int
    ) -> tuple[ExecutionState | None, Effects]:
        fx = Effects()
        if event.name in ITERATION_RESULTS and state is not None and not folds(state, event):
            return state, fx  # not counted, not the new last_seq: as if it had not been delivered
        if event.name == E.EXECUTION_REQUESTED:
            if state is not None:
                return state, fx  # duplicate request for a known execution
            state = self._start(event, fx)
        elif state is None or state.terminal:
            return state, fx
        else:
            plan = self.plans.get(state.content_hash)
            if plan is None:  # the controller loads it before folding; never ack an event we could not apply
                raise NotLoadedError(
                    f"execution {state.execution_id}: playbook {state.content_hash[:12]} not loaded"
                )
            _Run(self, state, plan, fx).on_event(event)
        if state is not None and state.parent_iter is not None and fx.commands:
            for cmd in fx.commands:  # a child started from a loop iteration: its iter.parent
                cmd.parent_iter = state.parent_iter
        if state is not None and state.terminal:
            self.items.forget(state.execution_id)  # e.g. cancelled mid-loop: its items are not needed
        if state is not None:
            state.events_applied += 1
            if seq:
                state.last_seq = seq
        return state, fx

    # -- request ----------------------------------------------------------------------------------
    def _start(self, event: Event, fx: Effects) -> ExecutionState:
        """A recorded request (``playbook.execution.requested``): the execution's state and what starts
        it, ``playbook.request.evaluated`` and then the workflow; a keychain check first when the request
        asks for one; only the given steps for a retry. Its rejection instead, when it cannot run."""
        eid = event.execution_id
        raw = event.payload.get("request") or {}
        request, problem = _recorded_request(raw, eid)
        if problem is not None:  # not written by an intake (which checked it): a forged or corrupt record
            state = ExecutionState(
                execution_id=eid,
                file="<playbook>",
                trace_id=event.trace_id,
                started_at=event.timestamp or None,
            )
            self._reject(state, fx, ErrorInfo(kind="bad_request", message=problem).to_dict(), self.now(event))
            return state
        state = _requested_state(event, request)
        plan = self._evaluate(state, event, request, fx)
        if plan is None:
            return state
        run = _Run(self, state, plan, fx)
        run.timestamp = event.timestamp
        resume = raw.get("resume")
        if isinstance(resume, dict) and resume.get("tokens"):
            _start_retry(run, state, plan, resume)
            return state
        check = check_command(plan, state, self.now(event)) if event.payload.get(CHECK_FLAG) is True else None
        if check is not None:  # the workflow starts when a worker has resolved the keychain
            state.keychain_check = True
            fx.commands.append(check)
            return state
        run.start_workflow()
        return state

    def _evaluate(
        self, state: ExecutionState, event: Event, request: ExecutionRequest, fx: Effects
    ) -> Plan | None:
        """The request's playbook compiled (from the plan cache) and its workload rendered into the state,
        with its deadline, and ``playbook.request.evaluated`` written; None when the request is rejected
        (by intake already, or here: no text, an invalid playbook, a workload template that fails)."""
        rejected = event.payload.get("rejected")
        if isinstance(rejected, dict):  # intake compiled it already: the rejection is written from here
            self._reject(state, fx, rejected, self.now(event))
            return None
        text = request.playbook
        if text is None:
            message = "no playbook text in the request (catalog lookup by path happens at intake)"
            self._reject(state, fx, ErrorInfo(kind="bad_request", message=message).to_dict(), self.now(event))
            return None
        plan, diags = self.plans.load(text, state.file, request.extensions)
        if plan is None:
            self._reject(state, fx, invalid_playbook_error(diags), self.now(event))
            return None
        payload = request.payload if isinstance(request.payload, dict) else {}
        state.content_hash = plan.content_hash
        state.name = plan.playbook.metadata.name
        state.path = plan.playbook.metadata.path
        try:  # the workload's own templates render once, here: every step, and a replay, sees the values
            state.workload = render_workload(plan.playbook.workload, payload, state.execution_id)
        except RenderError as exc:
            self._reject(
                state, fx, ErrorInfo(kind="template_error", message=str(exc)).to_dict(), self.now(event)
            )
            return None
        deadline = request.deadline_s or plan.playbook.executor.spec.get("deadline_s")
        if isinstance(deadline, (int, float)) and not isinstance(deadline, bool) and deadline > 0:
            state.deadline_s = float(deadline)
            state.deadline_at = _epoch(event.timestamp) + float(deadline)
        fx.events.append(self._evaluated(state, plan, diags, request, self.now(event)))
        return plan

    @staticmethod
    def _evaluated(
        state: ExecutionState, plan: Plan, diags: tuple[Diagnostic, ...], request: ExecutionRequest, at: str
    ) -> Event:
        """``playbook.request.evaluated``: the playbook that runs (content hash, name, path, version), its
        compiler's warnings and the DSL extensions it was compiled with."""
        return server_event(
            state.execution_id,
            E.REQUEST_EVALUATED,
            "playbook",
            state.path,
            "success",
            "execution",
            {
                "content_hash": plan.content_hash,
                "name": state.name,
                "path": state.path,
                "version": plan.playbook.metadata.version,
                "warnings": [d.format() for d in diags if d.severity == "warning"],
                **({"extensions": sorted(set(request.extensions))} if request.extensions else {}),
            },
            trace_id=state.trace_id,
            timestamp=at,
        )

    def _reject(self, state: ExecutionState, fx: Effects, error: dict[str, Any], at: str) -> None:
        state.status = "rejected"
        state.error = error
        state.finished_at = state.started_at
        fx.events.extend(rejection_events(state.execution_id, state.file, error, state.trace_id, at))


ITERATION_RESULTS = frozenset({E.LOOP_ITERATION_DONE, E.LOOP_ITERATION_FAILED})


def _requested_state(event: Event, request: ExecutionRequest) -> ExecutionState:
    """A new execution's state from its recorded request: its file, parent, trace, return step,
    attachments, outer iteration, pool (the one intake recorded), start time and what it retries."""
    return ExecutionState(
        execution_id=event.execution_id,
        file=request.file or request.path or "<playbook>",
        parent_execution_id=request.parent_execution_id,
        parent_step_run_id=request.parent_step_run_id,
        trace_id=request.trace_id or event.trace_id,
        return_step=request.return_step,
        attachments=dict(request.attachments) if isinstance(request.attachments, dict) else {},
        parent_iter=request.parent_iter if isinstance(request.parent_iter, dict) else None,
        pool=pool if isinstance(pool := event.payload.get("pool"), str) else None,
        started_at=event.timestamp or None,
        retry_of=request.resume.execution_id if request.resume is not None else None,
    )


def _start_retry(run: _Run, state: ExecutionState, plan: Plan, resume: dict[str, Any]) -> None:
    """A retry: the recorded results and ctx stand; only the given steps run again (a token naming no
    step of the playbook fails the execution)."""
    run.workflow_started()
    state.results = dict(resume.get("results") or {})
    state.result_meta = {k: v for k, v in (resume.get("result_meta") or {}).items() if k in state.results}
    state.ctx = dict(resume.get("ctx") or {})
    state.step_status = {k: str(v) for k, v in (resume.get("step_status") or {}).items()}
    for token in resume["tokens"]:
        if token.get("step") not in plan.steps:
            run.fail_execution(
                ErrorInfo(kind="bad_request", message=f"retry: no step '{token.get('step')}'").to_dict()
            )
            continue
        run.schedule(token["step"], dict(token.get("args") or {}), None)
    run.check_complete()


def _recorded_request(raw: Any, execution_id: str) -> tuple[ExecutionRequest, str | None]:
    """The request recorded with ``playbook.execution.requested``, type-checked, or why it is unusable."""
    empty = ExecutionRequest()
    if not isinstance(raw, dict):
        return empty, f"the recorded request is a {type(raw).__name__}, not a mapping"
    fields = {k: v for k, v in raw.items() if k in ExecutionRequest.__struct_fields__}
    try:
        request = msgspec.convert(fields, ExecutionRequest)
    except msgspec.ValidationError as exc:
        return empty, f"bad request: {shape_error(fields, ExecutionRequest, exc)}"
    if request.execution_id is not None and request.execution_id != execution_id:
        return empty, f"the recorded request is for execution {request.execution_id!r}, not {execution_id!r}"
    return request, None


def folds(state: ExecutionState, event: Event) -> bool:
    """Whether ``event`` changes ``state`` at all. A loop iteration's result changes it only while its
    step run is a distributed loop the controller drives; a local loop's iterations (its worker reports
    them as they finish, so a redelivered command skips them) are progress the controller does not fold,
    nor do late duplicates of a finished loop. The controller acks those without a fold (`Folding.file`),
    and replay skips them the same way, so both count the same events."""
    if event.name not in ITERATION_RESULTS or state.terminal:
        return True
    run = state.runs.get(event.step_run_id or "")
    return run is not None and run.loop is not None and not run.loop.finished
