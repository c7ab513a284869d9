"""Distributed loops on the controller: a loop step whose iterations run as commands of their own, on any
worker of its pool. Its start (``in`` rendered, the items packed and stored once), the dispatch of up to
``max_in_flight`` iterations, each iteration's answer, its deadline, and its end (``loop.done``, or
``step.failed``). Local loops run on one worker (``dataplane/loops.py``)."""

from __future__ import annotations

from typing import Any

from noetl_stream.control.core.effects import Blob, LoopResults
from noetl_stream.control.core.items import INLINE_ITEMS_BYTES, ItemsMissingError, Packed, checksum, pack
from noetl_stream.control.core.runcontext import RunContext
from noetl_stream.control.core.state import LoopRun, StepRun
from noetl_stream.dsl.inflight import MaxInFlightError, loop_max_in_flight
from noetl_stream.dsl.model import Step
from noetl_stream.dsl.templates import RenderError, render_value
from noetl_stream.protocol import events as E
from noetl_stream.protocol.errorinfo import ErrorInfo
from noetl_stream.protocol.wire import Event, Iteration


def _loop_limit(step: Step) -> float | None:
    """What bounds a distributed loop from its start: the shorter of ``lifecycle.timeout_s`` and
    ``lifecycle.deadline_s`` (one step run, one loop: both bound it as a whole)."""
    limits = [t for t in (step.timeout_s, step.deadline_s) if t]
    return min(limits) if limits else None


_STOPPED = ErrorInfo(kind="loop_error", message="the loop stopped before all its iterations ran").to_dict()


def _no_error(index: int) -> dict[str, Any]:
    """What an iteration's failure recorded without its error is said to be (a malformed event)."""
    return ErrorInfo(kind="error", message=f"iteration {index} failed; its event says no more").to_dict()


class Loops(RunContext):
    """The run's distributed loops (`RunContext` and what they add)."""

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
                lr.first_error = ErrorInfo(
                    kind="timeout",
                    retryable=False,
                    message=f"step '{step.name}' ran longer than its lifecycle.timeout_s ({step.timeout_s} s)",
                ).to_dict()
            else:
                lr.first_error = ErrorInfo(
                    kind="deadline",
                    retryable=False,
                    message=f"step '{step.name}' did not finish within its lifecycle.deadline_s "
                    f"({step.deadline_s} s)",
                ).to_dict()

    def fail_run(self, run: StepRun, error: dict[str, Any]) -> None:
        """The controller itself failed a run (e.g. a loop that cannot start): a step.failed boundary."""
        self.emit(
            E.STEP_FAILED, "step", run.run_id, "error", run.run_id, {"error": error}, run.step, run.run_id
        )

    def start_distributed_loop(self, step: Step, run: StepRun, scope: dict[str, Any]) -> None:
        assert step.loop is not None
        where = f"step '{step.name}' loop"
        try:
            items = render_value(step.loop.in_, scope, f"{where}.in", as_input=True)
            mif_raw = render_value(step.loop.spec.max_in_flight, scope, f"{where}.spec.max_in_flight")
        except RenderError as exc:
            self.fail_run(run, ErrorInfo(kind="template_error", message=str(exc)).to_dict())
            return
        if items is None:  # as NoETL: nothing to iterate over
            items = []
        if not isinstance(items, list):
            self.fail_run(
                run,
                ErrorInfo(
                    kind="loop_error",
                    message=f"{where}: 'in' must render to a list, got {type(items).__name__}",
                ).to_dict(),
            )
            return
        try:
            mif = loop_max_in_flight(step.loop.spec, mif_raw, len(items), f"{where}.spec.max_in_flight")
        except MaxInFlightError as exc:
            self.fail_run(run, ErrorInfo(kind="loop_error", message=str(exc)).to_dict())
            return
        try:
            packed = pack(items)
        except TypeError as exc:
            message = f"{where}: 'in' holds a value that cannot be sent to a worker as JSON: {exc}"
            self.fail_run(run, ErrorInfo(kind="loop_error", message=message).to_dict())
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
                error = lr.first_error if lr.first_error is not None else _STOPPED
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
                lr.first_error = conflict or event.payload.get("error") or _no_error(index)
            if step.failure_mode == "fail_fast":
                lr.stopping = True
        self.pump_loop(step, run)
