"""Where tokens go: a step's boundary routed along its ``next`` arcs (their ``args`` and ``set:``
rendered), a token delivered to each arc's target or "not coming" to the successors it did not take,
joins waiting for their predecessors, a step admitted and scheduled (its command, or its distributed
loop); and the failing cycle, which ends an execution rather than run a failing step again."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from noetl_stream.control.core.effects import _plain
from noetl_stream.control.core.loops import Loops
from noetl_stream.control.core.state import JoinState, StepRun
from noetl_stream.dsl.model import Arc
from noetl_stream.dsl.policy import MAX_FAILED_REENTRIES, admit, route
from noetl_stream.dsl.templates import RenderError, render_value
from noetl_stream.dsl.views import result_meta
from noetl_stream.errors import NoetlError
from noetl_stream.protocol import events as E
from noetl_stream.protocol.errorinfo import ErrorInfo
from noetl_stream.protocol.wire import Event

_NO_SCOPE: Mapping[str, Any] = MappingProxyType({})
"""What routing without conditions or args renders with: nothing (`Plan.scoped_routes`)."""


def _no_error(step: str) -> dict[str, Any]:
    """What a failure recorded without its error is said to be (a malformed or foreign event)."""
    return ErrorInfo(kind="error", message=f"step '{step}' failed; its event says no more").to_dict()


def failing_cycle(step: str, times: int, error: Any) -> dict[str, Any]:
    """The error that ends an execution whose cycle keeps re-entering a step that fails."""
    last = error.get("message") if isinstance(error, dict) else None
    return ErrorInfo(
        kind="failing_cycle",
        retryable=False,
        message=f"step '{step}' failed {times} times in a row, routed back into its cycle each time (an "
        "arc whose 'when' does not test event.name is taken on step.failed too): the execution ends "
        "here rather than run it again; loop on success only (\"... and event.name != 'step.failed'\"), "
        "retry the failing task with its policy" + (f"; its last error: {last}" if last else ""),
        cause=error,
    ).to_dict()


class _UnroutableError(NoetlError):
    """A boundary the controller cannot route (its error is the execution's, unhandled)."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message"))
        self.error = error


class Routing(Loops):
    """The run's tokens, joins and boundaries (`Loops` and what they add)."""

    # -- tokens -----------------------------------------------------------------------------------
    def deliver(
        self,
        target: str,
        *,
        pred: str | None,
        taken: bool,
        args: dict[str, Any],
        cause: dict[str, Any] | None,
    ) -> None:
        """A predecessor resolved: ``taken`` carries a token to ``target``; otherwise it says "not coming"."""
        if self._arrive(target, pred, taken, args, cause):
            self.dead(target)

    def _arrive(
        self, target: str, pred: str | None, taken: bool, args: dict[str, Any], cause: dict[str, Any] | None
    ) -> bool:
        """`deliver` for one step: schedule it, or record what its join waits for. True when no token
        will reach ``target`` now: the caller tells its successors."""
        graph = self.plan.graph
        if pred is not None and graph.is_join(target) and graph.is_forward(pred, target):
            join = self.state.joins.setdefault(target, JoinState())
            join.resolved[pred] = join.resolved.get(pred, False) or taken
            if taken:
                join.args.update(args)
            if all(p in join.resolved for p in graph.predecessors[target]):
                del self.state.joins[target]
                if any(join.resolved.values()):
                    self.schedule(target, join.args, cause)
                else:
                    return True
            return False
        if taken:
            self.schedule(target, args, cause)
            return False
        return pred is None or graph.is_forward(pred, target)

    def dead(self, step: str) -> None:
        """No token will reach ``step`` on this path: tell its successors, so joins never wait forever.

        Depth first, in the successors' order, with a stack of our own: a path of thousands of steps
        that will not run goes as deep as it is long (Python's recursion stops at about a thousand)."""
        successors = self.plan.graph.successors
        stack = [(step, iter(successors.get(step, ())))]
        while stack:
            pred, rest = stack[-1]
            succ = next(rest, None)
            if succ is None:
                stack.pop()
            elif self._arrive(succ, pred, False, {}, None):
                stack.append((succ, iter(successors.get(succ, ()))))

    def schedule(self, name: str, args: dict[str, Any], cause: dict[str, Any] | None) -> None:
        if self.state.paused:
            self.state.deferred.append({"step": name, "args": args, "cause": _plain(cause)})
            return
        step = self.plan.steps[name]
        run_id = self.new_run_id(name)
        scope = self.scope(args, cause) if step.admit is not None else {}
        try:
            allowed = admit(step.admit, scope, f"step '{name}' spec.policy")
        except RenderError as exc:
            error = ErrorInfo(kind="template_error", message=str(exc)).to_dict()
            self.emit(
                E.STEP_SKIPPED,
                "step",
                run_id,
                "error",
                run_id,
                {"reason": "admission_error", "error": error},
                name,
                run_id,
            )
            self.state.step_status[name] = "failed"
            self.state.unhandled.append({"step": name, "step_run_id": run_id, "error": error})
            self.dead(name)
            return
        if not allowed:
            self.emit(
                E.STEP_SKIPPED,
                "step",
                run_id,
                "skipped",
                run_id,
                {"reason": "admission_denied"},
                name,
                run_id,
            )
            self.state.step_status[name] = "skipped"
            self.dead(name)
            return
        run = StepRun(step=name, run_id=run_id, status="scheduled", args=args)
        self.state.runs[run_id] = run
        if step.is_router:
            run.status = "routing"
            self.emit(
                E.STEP_DONE, "step", run_id, "success", run_id, {"result": None, "router": True}, name, run_id
            )
            return
        self.emit(
            E.STEP_SCHEDULED,
            "step",
            run_id,
            "in_progress",
            run_id,
            {"pool": self.pool(step), "args": args},
            name,
            run_id,
        )
        if step.loop is not None and step.loop.spec.exec == "distributed":
            # `in` sees what a local loop's sees on the worker: not the event that scheduled the step
            # (only admission and routing do).
            self.start_distributed_loop(step, run, self.scope(args))
            return
        self.fx.commands.append(self.command(step, run, None))

    # -- boundaries -------------------------------------------------------------------------------
    def on_boundary(self, event: Event) -> None:
        """A step run's boundary (``step.done``, ``step.failed``, ``loop.done``): its result and ctx patches
        recorded, its ``next`` arcs evaluated (``next.evaluated``) and a token delivered along each arc
        taken, "not coming" to the successors not taken. A boundary that names no running step run, or
        does not fit the one it names, is ignored (`Effects.ignored` says why)."""
        run = self._boundary_run(event)
        if run is None:
            return
        name = run.step
        failed = event.name == E.STEP_FAILED
        conflict = self._record_boundary(event, run, failed)
        ev = dict(event.payload)
        ev.update(name=event.name, status=event.status, step=name, step_run_id=run.run_id)
        # (a failed step has no result: its arcs read output as null)
        scope = (
            self.scope(run.args, ev, output=name, failed=failed)
            if name in self.plan.scoped_routes
            else _NO_SCOPE
        )
        routed = self._route(event, run, scope, conflict, failed)
        if routed is not None:
            arcs, writes = routed
            self._take_arcs(event, run, arcs, writes, ev, failed)

    def _boundary_run(self, event: Event) -> StepRun | None:
        """The running step run a boundary ends, or None when it is to be ignored: no such run, a late
        duplicate of a distributed loop's iterations, another step's name, a ``loop.done`` of no loop."""
        run = self.state.runs.get(event.step_run_id or "")
        if run is None:
            self.fx.ignored = self.no_run(event)
            return None
        if run.loop is not None and not run.loop.finished:
            return None  # a late duplicate: a distributed loop ends only through its own boundary
        name = run.step
        if event.step is not None and event.step != name:
            self.fx.ignored = f"it names step '{event.step}', but step run '{run.run_id}' is of step '{name}'"
            return None
        if event.name == E.LOOP_DONE and self.plan.steps[name].loop is None:
            self.fx.ignored = f"loop.done for step '{name}', which has no loop"
            return None
        return run

    def _record_boundary(self, event: Event, run: StepRun, failed: bool) -> dict[str, Any] | None:
        """The run ends: its ctx patches applied, its result (and what its view reads of it) recorded, or
        its failure counted toward a failing cycle, and its status. Returns the ``ctx_conflict`` error
        when its patches were refused (`apply_ctx_patches`)."""
        name = run.step
        del self.state.runs[run.run_id]
        payload = event.payload
        conflict = self.apply_ctx_patches(event, run)
        if not failed:
            self.state.results[name] = payload.get("result")
            meta = result_meta(event.name, payload)
            if meta is None:
                self.state.result_meta.pop(name, None)
            else:
                self.state.result_meta[name] = meta
            self.state.last_step = name
            self.state.failed_in_row.pop(name, None)
        else:
            self.state.failed_in_row[name] = self.state.failed_in_row.get(name, 0) + 1
        run.status = "failed" if failed else "done"
        self.state.step_status[name] = run.status
        return conflict

    def _route(
        self,
        event: Event,
        run: StepRun,
        scope: Mapping[str, Any],
        conflict: dict[str, Any] | None,
        failed: bool,
    ) -> tuple[list[tuple[Arc, Any]], list[Any]] | None:
        """The arcs the boundary takes, each with its rendered ``args``, and their rendered ``set:`` values.
        None when it cannot be routed (a ctx conflict, a failing cycle, a template error): the error is
        recorded (``next.evaluated``) as unhandled, and no token goes on from the step."""
        name = run.step
        step = self.plan.steps[name]
        try:
            if conflict is not None:  # not routed, like a routing error: the playbook must change
                raise _UnroutableError(conflict)
            fired = route(step.next, scope, f"step '{name}'", failed=failed)
            if failed and fired and self.state.failed_in_row[name] >= MAX_FAILED_REENTRIES:
                raise _UnroutableError(
                    failing_cycle(name, self.state.failed_in_row[name], event.payload.get("error"))
                )
            arcs = [
                (
                    a,
                    render_value(a.args, scope, f"step '{name}' arc '{a.step}' args", as_input=True)
                    if a.args
                    else {},
                )
                for a in fired
            ]
            writes = [  # an arc's `set:` (NoETL's): every value renders before any is written
                render_value(a.set_ctx, scope, f"step '{name}' arc '{a.step}' set")
                for a in fired
                if a.set_ctx
            ]
        except (RenderError, _UnroutableError) as exc:
            error = (
                exc.error
                if isinstance(exc, _UnroutableError)
                else ErrorInfo(kind="template_error", message=str(exc)).to_dict()
            )
            self.emit(
                E.NEXT_EVALUATED, "next", run.run_id, "error", run.run_id, {"error": error}, name, run.run_id
            )
            self.state.unhandled.append({"step": name, "step_run_id": run.run_id, "error": error})
            self.dead(name)
            return None
        return arcs, writes

    def _take_arcs(
        self,
        event: Event,
        run: StepRun,
        arcs: list[tuple[Arc, Any]],
        writes: list[Any],
        ev: dict[str, Any],
        failed: bool,
    ) -> None:
        """``next.evaluated`` with the arcs taken, a failure no arc handles recorded as unhandled, the arcs'
        ``set:`` written, then a token along each arc and "not coming" to the successors not taken."""
        name = run.step
        step = self.plan.steps[name]
        self.emit(
            E.NEXT_EVALUATED,
            "next",
            run.run_id,
            "success",
            run.run_id,
            {
                "on": event.name,
                "mode": step.next.mode if step.next else "exclusive",
                "matched": [a.step for a, _ in arcs],
            },
            name,
            run.run_id,
        )
        if failed and not arcs:
            self.state.unhandled.append(
                {
                    "step": name,
                    "step_run_id": run.run_id,
                    "error": event.payload.get("error") or _no_error(name),
                }
            )
        if writes:
            self.write_ctx(run, writes)
        taken = {a.step for a, _ in arcs}
        # A step that routed back into a cycle (a back edge or a self-loop) has not finished with its
        # forward successors: its later run decides for them. Only a run that leaves the cycle does.
        looping = any(not self.plan.graph.is_forward(name, a.step) for a, _ in arcs)
        for arc, args in arcs:
            self.deliver(
                arc.step,
                pred=name,
                taken=True,
                args=args if isinstance(args, dict) else {"value": args},
                cause=ev,
            )
        if not looping:
            for succ in self.plan.graph.successors.get(name, ()):
                if succ not in taken:
                    self.deliver(succ, pred=name, taken=False, args={}, cause=None)

    def no_run(self, event: Event) -> str:
        """Why a boundary or iteration names no running step run (for the log)."""
        run_id = event.step_run_id or ""
        step, _, n = run_id.rpartition("-")
        if n.isdigit() and 0 < int(n) <= self.state.step_runs.get(step, 0):
            return (
                f"step run '{run_id}' has ended already (a redelivered command's second run, or a duplicate)"
            )
        return f"no step run '{run_id}' was ever scheduled in this execution"
