"""The reducer's work on one event of one execution (`Run`): which handler the event goes to, and the
execution's own transitions: its start (after the keychain check), pause and resume, stop (cancel,
deadline) and completion. What the handlers do is in the layers `Run` builds on: `runcontext.py` (what
a run mints, ctx writes), `loops.py` (distributed loops), `routing.py` (tokens, joins, boundaries)."""

from __future__ import annotations

from typing import Any

from noetl_stream.control.core.keychaincheck import CHECK_RUN, check_error
from noetl_stream.control.core.routing import Routing
from noetl_stream.protocol import events as E
from noetl_stream.protocol.errorinfo import ErrorInfo
from noetl_stream.protocol.wire import Event


class Run(Routing):
    """The reducer's work on one event of one execution: `RunContext`, `Loops`, `Routing`, and the
    execution's start, pause, resume, stop and completion."""

    # -- dispatch ---------------------------------------------------------------------------------
    def on_event(self, event: Event) -> None:
        self.timestamp = event.timestamp
        if event.name in E.BOUNDARY_EVENTS and self.keychain_answer(event):
            self.on_keychain(event)  # the check, answered by a worker of an earlier release
        elif event.name in E.BOUNDARY_EVENTS:
            self.on_boundary(event)
        elif event.name in (E.LOOP_ITERATION_DONE, E.LOOP_ITERATION_FAILED):
            self.on_iteration(event)
        elif event.name in E.KEYCHAIN_EVENTS:
            self.on_keychain(event)
        elif event.name == E.EXECUTION_CANCEL_REQUESTED:
            self.stop(
                "cancelled",
                ErrorInfo(
                    kind="cancelled", message=str(event.payload.get("reason") or "cancelled")
                ).to_dict(),
            )
        elif event.name == E.EXECUTION_DEADLINE_EXCEEDED:
            self.stop(
                "failed",
                ErrorInfo(
                    kind="deadline_exceeded",
                    message=f"the execution did not finish before its deadline ({self.state.deadline_s} s)",
                ).to_dict(),
            )
        elif event.name == E.EXECUTION_PAUSE_REQUESTED:
            self.pause(event)
        elif event.name == E.EXECUTION_RESUME_REQUESTED:
            self.resume(event)
        self.check_complete()

    def keychain_answer(self, event: Event) -> bool:
        """Whether a boundary event is the keychain check's answer from a worker of an earlier release
        (``step.done`` or ``step.failed`` of the check's run, which no step run is)."""
        return (
            event.step_run_id == CHECK_RUN
            and event.name != E.LOOP_DONE
            and self.state.runs.get(event.step_run_id) is None
        )

    # -- start ------------------------------------------------------------------------------------
    def workflow_started(self) -> None:
        s = self.state
        self.emit(
            E.WORKFLOW_STARTED, "workflow", s.path, "in_progress", "execution", {"workload": s.workload}
        )

    def start_workflow(self) -> None:
        """``workflow.started`` and a token for ``start``."""
        self.workflow_started()
        if "start" not in self.plan.steps:
            self.fail_execution(ErrorInfo(kind="invalid_playbook", message="no 'start' step").to_dict())
        else:
            self.deliver("start", pred=None, taken=True, args={}, cause=None)
            self.check_complete()

    def on_keychain(self, event: Event) -> None:
        """A worker's answer to the keychain check (`control/core/keychaincheck.py`): the workflow starts, or
        the execution fails with the entry that could not be resolved, before any step runs. A worker of
        an earlier release answers with ``step.done`` or ``step.failed``."""
        s = self.state
        if not s.keychain_check:
            self.fx.ignored = (
                "no keychain check is pending in this execution (a duplicate answer, or a forged one)"
            )
            return
        if event.step_run_id != CHECK_RUN:
            self.fx.ignored = f"it names run {event.step_run_id!r}, not the keychain check's '{CHECK_RUN}'"
            return
        s.keychain_check = False
        if event.name in (E.KEYCHAIN_RESOLVED, E.STEP_DONE):
            self.start_workflow()
            return
        s.status = "failed"
        s.error = {**check_error(event.payload), "step": None}
        self.finish()

    # -- completion -------------------------------------------------------------------------------
    def pause(self, event: Event) -> None:
        """Schedule nothing new: tokens wait in ``deferred``; running steps finish and are routed."""
        if not self.state.paused:
            self.state.paused = True
            self.emit(E.WORKFLOW_PAUSED, "workflow", self.state.path, "in_progress", event.event_id, {})

    def resume(self, event: Event) -> None:
        if not self.state.paused:
            return
        self.state.paused = False
        self.emit(E.WORKFLOW_RESUMED, "workflow", self.state.path, "in_progress", event.event_id, {})
        deferred, self.state.deferred = self.state.deferred, []
        for token in deferred:
            self.schedule(token["step"], token.get("args") or {}, token.get("cause"))

    def stop(self, status: str, error: dict[str, Any]) -> None:
        """End the execution now (cancel, deadline). Workers stop what still runs for it when they see
        ``workflow.finished``; boundaries that arrive later are ignored."""
        if self.state.terminal:
            return
        self.state.status = status  # type: ignore[assignment]
        self.state.error = error
        self.state.deferred = []
        self.state.keychain_check = False
        self.finish()

    def fail_execution(self, error: dict[str, Any]) -> None:
        self.state.unhandled.append({"step": None, "error": error})

    def check_complete(self) -> None:
        s = self.state
        if s.terminal or s.runs or s.deferred or s.keychain_check:
            return
        # Nothing runs, so predecessors a join still waits for can no longer arrive (a path the
        # graph analysis could not rule out): a join holding a token runs now, the others are dead.
        while s.joins and not s.runs:
            name, join = next(iter(s.joins.items()))
            del s.joins[name]
            if any(join.resolved.values()):
                self.schedule(name, join.args, None)
            else:
                self.dead(name)
        if s.runs or s.terminal:
            return
        if s.unhandled:
            s.status = "failed"
            first = s.unhandled[0]
            s.error = {**(first.get("error") or {}), "step": first.get("step")}
        else:
            s.status = "success"
        self.finish()

    def finish(self) -> None:
        s = self.state
        s.finished_at = self.timestamp or None
        status = "success" if s.status == "success" else "error"
        last = s.return_step if s.return_step is not None else s.last_step
        result = s.results.get(last) if last else None
        summary = {"status": s.status, "result": result, "error": s.error, "steps": dict(s.step_status)}
        self.emit(E.WORKFLOW_FINISHED, "workflow", s.path or s.file, status, "execution", summary)
        self.emit(E.PLAYBOOK_PROCESSED, "playbook", s.path or s.file, status, "execution", summary)
