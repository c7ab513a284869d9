"""The reducer's work on one event of one execution: tokens, joins, loops, routing, completion."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from noetl_stream.control.byref import guard
from noetl_stream.control.effects import Blob, Effects, LoopResults, _epoch, _plain, server_event
from noetl_stream.control.items import INLINE_ITEMS_BYTES, ItemsMissingError, Packed, checksum, pack
from noetl_stream.control.keychaincheck import CHECK_RUN, check_error
from noetl_stream.control.plan import Plan
from noetl_stream.control.state import ExecutionState, JoinState, LoopRun, StepRun
from noetl_stream.dsl.inflight import MaxInFlightError, loop_max_in_flight
from noetl_stream.dsl.model import Step
from noetl_stream.dsl.policy import MAX_FAILED_REENTRIES, admit, route
from noetl_stream.dsl.scope import build_scope
from noetl_stream.dsl.templates import RenderError, render_value
from noetl_stream.dsl.views import result_meta
from noetl_stream.protocol import events as E
from noetl_stream.protocol.wire import (
    Command,
    Event,
    Iteration,
    KeychainDecl,
)

if TYPE_CHECKING:
    from noetl_stream.control.reducer import Reducer


_NO_SCOPE: Mapping[str, Any] = MappingProxyType({})
"""What routing without conditions or args renders with: nothing (`Plan.scoped_routes`)."""


def _loop_limit(step: Step) -> float | None:
    """What bounds a distributed loop from its start: the shorter of ``lifecycle.timeout_s`` and
    ``lifecycle.deadline_s`` (one step run, one loop: both bound it as a whole)."""
    limits = [t for t in (step.timeout_s, step.deadline_s) if t]
    return min(limits) if limits else None


def failing_cycle(step: str, times: int, error: Any) -> dict[str, Any]:
    """The error that ends an execution whose cycle keeps re-entering a step that fails."""
    last = error.get("message") if isinstance(error, dict) else None
    return {
        "kind": "failing_cycle",
        "retryable": False,
        "message": f"step '{step}' failed {times} times in a row, routed back into its cycle each time (an "
        "arc whose 'when' does not test event.name is taken on step.failed too): the execution ends "
        "here rather than run it again; loop on success only (\"... and event.name != 'step.failed'\"), "
        "retry the failing task with its policy" + (f"; its last error: {last}" if last else ""),
        "cause": error,
    }


class _Unroutable(Exception):
    """A boundary the controller cannot route (its error is the execution's, unhandled)."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message"))
        self.error = error


class Run:
    """The reducer's work on one event of one execution (keeps signatures short)."""

    def __init__(self, reducer: Reducer, state: ExecutionState, plan: Plan, fx: Effects) -> None:
        self.reducer = reducer
        self.state = state
        self.plan = plan
        self.fx = fx
        self.timestamp = ""
        """The timestamp of the event being folded: the reducer's clock, the same in replay (`at`)."""

    def now(self) -> str:
        """The time of what this fold mints: the reducer's clock, else the folded event's `timestamp`."""
        clock = self.reducer.clock
        return clock() if clock is not None else self.timestamp

    @property
    def at(self) -> float:
        """`timestamp` in epoch seconds (0.0 when there is none). Parsed only where a deadline needs it:
        not on every event of the fold."""
        return _epoch(self.timestamp) if self.timestamp else 0.0

    # -- dispatch ---------------------------------------------------------------------------------
    def on_event(self, event: Event) -> None:
        self.timestamp = event.timestamp
        if event.name in E.BOUNDARY_EVENTS:
            self.on_boundary(event)
        elif event.name in (E.LOOP_ITERATION_DONE, E.LOOP_ITERATION_FAILED):
            self.on_iteration(event)
        elif event.name in E.KEYCHAIN_EVENTS:
            self.on_keychain(event)
        elif event.name == E.EXECUTION_CANCEL_REQUESTED:
            self.stop(
                "cancelled", {"kind": "cancelled", "message": str(event.payload.get("reason") or "cancelled")}
            )
        elif event.name == E.EXECUTION_DEADLINE_EXCEEDED:
            self.stop(
                "failed",
                {
                    "kind": "deadline_exceeded",
                    "message": "the execution did not finish before its "
                    f"deadline ({self.state.deadline_s} s)",
                },
            )
        elif event.name == E.EXECUTION_PAUSE_REQUESTED:
            self.pause(event)
        elif event.name == E.EXECUTION_RESUME_REQUESTED:
            self.resume(event)
        self.check_complete()

    def emit(
        self,
        name: str,
        entity_type: str,
        entity_id: str,
        status: str,
        scope: str,
        payload: dict[str, Any],
        step: str | None = None,
        run_id: str | None = None,
    ) -> None:
        self.fx.events.append(
            server_event(
                self.state.execution_id,
                name,
                entity_type,
                entity_id,
                status,
                scope,
                payload,
                step,
                run_id,
                self.state.trace_id,
                self.now(),
            )
        )

    def scope(
        self,
        args: dict[str, Any] | None = None,
        event: dict[str, Any] | None = None,
        output: str | None = None,
        failed: bool = False,
    ) -> dict[str, Any]:
        """The scope of admission rules and arcs (with the boundary `event`), and of a distributed loop's
        ``in``. `output`: the step whose boundary is routed, whose result arcs also read as ``output``
        and ``result`` (NoETL's names; the same value as ``{{ <step> }}``)."""
        s = self.state
        # A result stored by reference: reading into it is a clear error (byref.py).
        extra = {"event": guard(event, "event.%s")} if event is not None else None
        scope = build_scope(
            workload=s.workload,
            ctx=s.ctx,
            execution_id=s.execution_id,
            args=guard(args, "args.%s"),
            results=guard(s.results, "the result of step '%s'"),
            result_meta=_guard_tasks(s.result_meta),
            extra=extra,
        )
        if output is not None:
            scope["output"] = scope["result"] = (
                scope.get(output) if output in s.results and not failed else None
            )
        return scope

    def new_run_id(self, step: str) -> str:
        n = self.state.step_runs.get(step, 0) + 1
        self.state.step_runs[step] = n
        return f"{step}-{n}"

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
            error = {"kind": "template_error", "message": str(exc)}
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

    def pool(self, step: Step) -> str:
        """The step's own ``spec.pool``, else the request's, else the playbook's (``executor.spec.pool``,
        else the controller's default)."""
        return self.plan.pool_of(step, self.state.pool)

    def command(self, step: Step, run: StepRun, iteration: Iteration | None) -> Command:
        s = self.state
        run.ctx_base = s.ctx_revision
        reads = self.plan.reads.get(step.name, frozenset())
        suffix = f".{iteration.index}" if iteration is not None else ""
        return Command(
            command_id=f"{s.execution_id}:{run.run_id}{suffix}",
            execution_id=s.execution_id,
            step=step.name,
            step_run_id=run.run_id,
            pool=self.pool(step),
            step_def=step,
            workload=s.workload,
            ctx=s.ctx,
            args=run.args,
            results={k: s.results[k] for k in reads if k in s.results},
            result_meta={k: s.result_meta[k] for k in reads if k in s.result_meta},
            executor_spec=self.plan.playbook.executor.spec,
            iteration=iteration,
            trace_id=s.trace_id,
            issued_at=self.now(),
            workbook={n: self.plan.playbook.workbook[n] for n in self.plan.workbook_refs.get(step.name, ())},
            timeout_s=self.iteration_timeout(step, run) if iteration is not None else step.timeout_s,
            keychain=[
                KeychainDecl(name=k.name, kind=k.kind, config=k.config) for k in self.plan.playbook.keychain
            ]
            if step.name in self.plan.keychain_readers
            else [],
            attachments=s.attachments if self.plan.playbook_refs.get(step.name) else {},
        )

    # -- distributed loops ------------------------------------------------------------------------
    def iteration_timeout(self, step: Step, run: StepRun) -> float | None:
        """An iteration's command may run for what is left of its loop's time (`LoopRun.deadline_at`)."""
        deadline = run.loop.deadline_at if run.loop is not None else None
        if deadline is None:
            return step.timeout_s
        left = max(deadline - self.at, 0.001)
        return left if step.timeout_s is None else min(step.timeout_s, left)

    def past_deadline(self, step: Step, lr: LoopRun) -> None:
        """Past its ``lifecycle.timeout_s`` (or ``deadline_s``, the shorter), a distributed loop starts no
        more iterations and fails with ``timeout`` (``deadline``) once those in flight settle (each was
        given only the time left)."""
        if lr.deadline_at is None or lr.finished or self.at < lr.deadline_at:
            return
        if lr.first_error_index != -2:
            lr.stopping = True
            lr.first_error_index = -2  # (below every index: no iteration's error replaces it)
            if _loop_limit(step) == step.timeout_s:
                lr.first_error = {
                    "kind": "timeout",
                    "retryable": False,
                    "message": f"step '{step.name}' ran longer than its lifecycle.timeout_s ({step.timeout_s} s)",
                }
            else:
                lr.first_error = {
                    "kind": "deadline",
                    "retryable": False,
                    "message": f"step '{step.name}' did not finish within its lifecycle.deadline_s "
                    f"({step.deadline_s} s)",
                }

    def start_distributed_loop(self, step: Step, run: StepRun, scope: dict[str, Any]) -> None:
        assert step.loop is not None
        where = f"step '{step.name}' loop"
        try:
            items = render_value(step.loop.in_, scope, f"{where}.in", as_input=True)
            mif_raw = render_value(step.loop.spec.max_in_flight, scope, f"{where}.spec.max_in_flight")
        except RenderError as exc:
            self.fail_run(run, {"kind": "template_error", "message": str(exc)})
            return
        if items is None:  # as NoETL: nothing to iterate over
            items = []
        if not isinstance(items, list):
            self.fail_run(
                run,
                {
                    "kind": "loop_error",
                    "message": f"{where}: 'in' must render to a list, got {type(items).__name__}",
                },
            )
            return
        try:
            mif = loop_max_in_flight(step.loop.spec, mif_raw, len(items), f"{where}.spec.max_in_flight")
        except MaxInFlightError as exc:
            self.fail_run(run, {"kind": "loop_error", "message": str(exc)})
            return
        try:
            packed = pack(items)
        except TypeError as exc:
            message = f"{where}: 'in' holds a value that cannot be sent to a worker as JSON: {exc}"
            self.fail_run(run, {"kind": "loop_error", "message": message})
            return
        run.status = "looping"
        eid, total = self.state.execution_id, len(items)
        lr = LoopRun(
            total=total,
            max_in_flight=mif,
            settled=bytearray((total + 7) >> 3),
            after_seq=self.state.last_seq,
            deadline_at=self.at + limit if (limit := _loop_limit(step)) and self.at > 0 else None,
        )
        if len(packed) <= INLINE_ITEMS_BYTES:
            lr.packed_items = packed.decode()
        else:  # stored once; the controller writes it before it publishes anything of this fold
            lr.items_key = f"{eid}/{run.run_id}/items"
            lr.items_checksum = checksum(packed)
            self.fx.blobs.append(Blob(lr.items_key, packed))
        self.reducer.items.put(eid, run.run_id, packed)
        run.loop = lr
        # No worker runs the step as a whole: the controller records its start (spec 002: the server may
        # record step.started), then the loop's.
        self.emit(
            E.STEP_STARTED,
            "step",
            run.run_id,
            "in_progress",
            run.run_id,
            {"pool": self.pool(step), "exec": "distributed"},
            step.name,
            run.run_id,
        )
        self.emit(
            E.LOOP_STARTED,
            "loop",
            run.run_id,
            "in_progress",
            run.run_id,
            {
                "total": total,
                "max_in_flight": mif,
                "exec": "distributed",
                "mode": step.loop.spec.mode,
                "pool": self.pool(step),
            },
            step.name,
            run.run_id,
        )
        self.pump_loop(step, run)

    def loop_items(self, run: StepRun) -> Packed:
        """The packed items of a running distributed loop (inline in the state, or loaded by the
        controller from the object store before the fold)."""
        assert run.loop is not None
        eid = self.state.execution_id
        packed = self.reducer.items.get(eid, run.run_id)
        if packed is None and run.loop.packed_items is not None:
            self.reducer.items.put(eid, run.run_id, run.loop.packed_items.encode())
            packed = self.reducer.items.get(eid, run.run_id)
        if packed is None:
            raise ItemsMissingError(f"execution {eid}: the items of loop {run.run_id} are not loaded")
        return packed

    def pump_loop(self, step: Step, run: StepRun) -> None:
        lr = run.loop
        assert lr is not None
        self.past_deadline(step, lr)
        if not lr.stopping and lr.in_flight < lr.max_in_flight and lr.next_index < lr.total:
            items = self.loop_items(run)
            while not lr.stopping and lr.in_flight < lr.max_in_flight and lr.next_index < lr.total:
                i = lr.next_index
                lr.next_index += 1
                lr.in_flight += 1
                self.fx.commands.append(
                    self.command(step, run, Iteration(index=i, item=items[i], total=lr.total))
                )
        if lr.in_flight == 0 and not lr.finished and (lr.stopping or lr.next_index >= lr.total):
            lr.finished = True
            self.reducer.items.drop(self.state.execution_id, run.run_id)
            if lr.items_key is not None:
                # Every item is dispatched: a state from before this point that still needs them is
                # rebuilt from the events if they are gone (the controller deletes them after this fold).
                self.fx.dropped.append(lr.items_key)
            counts = {"total": lr.total, "done": lr.done, "failed": lr.failed}
            if lr.stopping:
                error = lr.first_error if lr.first_error is not None else {"kind": "loop_error"}
                self.emit(
                    E.STEP_FAILED,
                    "step",
                    run.run_id,
                    "error",
                    run.run_id,
                    {"error": error, **counts},
                    step.name,
                    run.run_id,
                )
            else:
                # The result (every iteration's, in item order) is not in the state: the controller
                # assembles it from the stored iteration events when it publishes this event.
                self.emit(
                    E.LOOP_DONE,
                    "loop",
                    run.run_id,
                    "success" if lr.failed == 0 else "error",
                    run.run_id,
                    counts,
                    step.name,
                    run.run_id,
                )
                done = self.fx.events[-1]
                self.fx.loop_results[done.event_id] = LoopResults(
                    done.event_id, run.run_id, lr.total, lr.after_seq
                )

    def on_iteration(self, event: Event) -> None:
        run = self.state.runs.get(event.step_run_id or "")
        if run is None or run.loop is None or run.loop.finished:
            return  # a finished loop has settled every iteration it started: a late duplicate
        lr = run.loop
        index = event.payload.get("index")
        if not isinstance(index, int) or not 0 <= index < lr.total or lr.is_settled(index):
            return
        lr.settle(index)
        lr.in_flight = max(0, lr.in_flight - 1)
        conflict = self.apply_ctx_patches(event, run)
        step = self.plan.steps[run.step]
        if event.name == E.LOOP_ITERATION_DONE and conflict is None:
            lr.done += 1
        else:
            lr.failed += 1
            if lr.first_error is None or index < lr.first_error_index:
                lr.first_error_index = index
                lr.first_error = conflict or event.payload.get("error") or {"kind": "error"}
            if step.failure_mode == "fail_fast":
                lr.stopping = True
        self.pump_loop(step, run)

    # -- boundaries -------------------------------------------------------------------------------
    def fail_run(self, run: StepRun, error: dict[str, Any]) -> None:
        """The controller itself failed a run (e.g. a loop that cannot start): a step.failed boundary."""
        self.emit(
            E.STEP_FAILED, "step", run.run_id, "error", run.run_id, {"error": error}, run.step, run.run_id
        )

    def on_boundary(self, event: Event) -> None:
        run = self.state.runs.get(event.step_run_id or "")
        if run is None and event.step_run_id == CHECK_RUN and event.name != E.LOOP_DONE:
            self.on_keychain(event)  # the check, answered by a worker of an earlier release
            return
        if run is None:
            self.fx.ignored = self.no_run(event)
            return
        if run.loop is not None and not run.loop.finished:
            return  # a late duplicate: a distributed loop ends only through its own boundary
        name = run.step
        step = self.plan.steps[name]
        if event.step is not None and event.step != name:
            self.fx.ignored = f"it names step '{event.step}', but step run '{run.run_id}' is of step '{name}'"
            return
        if event.name == E.LOOP_DONE and step.loop is None:
            self.fx.ignored = f"loop.done for step '{name}', which has no loop"
            return
        del self.state.runs[run.run_id]
        failed = event.name == E.STEP_FAILED
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
        ev = dict(payload)
        ev.update(name=event.name, status=event.status, step=name, step_run_id=run.run_id)
        # (a failed step has no result: its arcs read output as null)
        scope = (
            self.scope(run.args, ev, output=name, failed=failed)
            if name in self.plan.scoped_routes
            else _NO_SCOPE
        )
        try:
            if conflict is not None:  # not routed, like a routing error: the playbook must change
                raise _Unroutable(conflict)
            fired = route(step.next, scope, f"step '{name}'", failed=failed)
            if failed and fired and self.state.failed_in_row[name] >= MAX_FAILED_REENTRIES:
                raise _Unroutable(failing_cycle(name, self.state.failed_in_row[name], payload.get("error")))
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
        except (RenderError, _Unroutable) as exc:
            error = (
                exc.error if isinstance(exc, _Unroutable) else {"kind": "template_error", "message": str(exc)}
            )
            self.emit(
                E.NEXT_EVALUATED, "next", run.run_id, "error", run.run_id, {"error": error}, name, run.run_id
            )
            self.state.unhandled.append({"step": name, "step_run_id": run.run_id, "error": error})
            self.dead(name)
            return
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
                {"step": name, "step_run_id": run.run_id, "error": payload.get("error") or {"kind": "error"}}
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

    def apply_ctx_patches(self, event: Event, run: StepRun) -> dict[str, Any] | None:
        """Apply the ``set_ctx`` patches a run's boundary or iteration carries, in order, and record
        ``ctx.patched``; or refuse them all, returning the ``ctx_conflict`` error, when one sets a key
        that another step run wrote after this run's command was issued, to a different value. The run
        read the older value, so its write would silently undo the other's (two parallel branches
        appending to one list: one append lost). 003 §6.2: conflicting parallel writes are rejected."""
        patches = event.payload.get("ctx_patches")
        if not patches:
            return None
        if not isinstance(patches, list) or not all(isinstance(p, dict) for p in patches):
            self.fx.ignored = (
                f"its ctx_patches are not a list of mappings ({type(patches).__name__}): not applied"
            )
            return None
        s = self.state
        final: dict[str, Any] = {}
        for patch in patches:
            final.update(patch)
        for key, value in final.items():
            written = s.ctx_written.get(key)
            if written is None or written[0] <= run.ctx_base or written[1] == run.run_id:
                continue
            if key in s.ctx and s.ctx[key] == value:
                continue  # the same value: nothing is lost
            return {
                "kind": "ctx_conflict",
                "message": (
                    f"step '{run.step}' (run '{run.run_id}') sets ctx.{key}, which step run '{written[1]}' "
                    "changed after this run started from the older value: applying it would lose that "
                    "change, so none of this run's ctx patches is applied. Steps that run in parallel "
                    "must set different ctx keys (each branch its own key; combine them in a step after "
                    "the join)"
                ),
                "key": key,
                "step_run_id": run.run_id,
                "other_step_run_id": written[1],
            }
        for patch in patches:
            s.ctx.update(patch)
            s.ctx_revision += 1
            for key in patch:
                s.ctx_written[key] = (s.ctx_revision, run.run_id)
        suffix = f".{event.payload['index']}" if "index" in event.payload else ""
        self.emit(
            E.CTX_PATCHED,
            "workflow",  # ctx is the workflow run's (001 §15.1's entity types)
            s.execution_id,
            "success",
            f"{run.run_id}{suffix}",
            {"patches": patches, "revision": s.ctx_revision},
            event.step,
            event.step_run_id,
        )
        return None

    def write_ctx(self, run: StepRun, patches: list[dict[str, Any]]) -> None:
        """The controller's own ctx writes for `run` (the ``set:`` of the arcs its boundary took),
        recorded like a run's patches (``ctx.patched``). They render against the ctx as it is now, so
        they cannot lose another run's write; a run that read an older value and writes the key later
        conflicts with them as with any write (`apply_ctx_patches`). A replay renders them again from
        the same state: the same values."""
        s = self.state
        for patch in patches:
            s.ctx.update(patch)
            s.ctx_revision += 1
            for key in patch:
                s.ctx_written[key] = (s.ctx_revision, run.run_id)
        self.emit(
            E.CTX_PATCHED,
            "workflow",
            s.execution_id,
            "success",
            f"{run.run_id}.next",
            {"patches": patches, "revision": s.ctx_revision},
            run.step,
            run.run_id,
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
            self.fail_execution({"kind": "invalid_playbook", "message": "no 'start' step"})
        else:
            self.deliver("start", pred=None, taken=True, args={}, cause=None)
            self.check_complete()

    def on_keychain(self, event: Event) -> None:
        """A worker's answer to the keychain check (`control/keychaincheck.py`): the workflow starts, or
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


def _guard_tasks(meta: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`meta` with a pipeline's task results stored by reference wrapped (`guard`): reading a label's
    fields in an arc is then the clear error, not an undefined value."""
    if not any("tasks" in m for m in meta.values()):
        return meta
    return {
        step: {**m, "tasks": guard(tasks, f"the result of task '%s' of step '{step}'")}
        if isinstance(tasks := m.get("tasks"), dict)
        else m
        for step, m in meta.items()
    }
