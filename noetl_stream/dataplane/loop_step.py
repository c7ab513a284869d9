"""A loop step's command on a worker: one iteration of a distributed loop, or a whole local loop.

`run_distributed_iteration` runs the pipeline of the one item the controller dispatched
(`Command.iteration`); `run_list_loop` renders ``loop.in`` and runs every item here (`run_local_loop`,
loops.py), recording each finished iteration at once so that a redelivered command skips it
(`completed_iterations`). A cursor loop's iterations come from a claim query instead (cursor.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from noetl_stream.dataplane.children import in_iteration
from noetl_stream.dataplane.loops import (
    Completed,
    HandedBackError,
    LoopResult,
    iteration_scope,
    run_local_loop,
)
from noetl_stream.dataplane.pipeline import PipelineInput, run_pipeline
from noetl_stream.dsl.inflight import MaxInFlightError, loop_max_in_flight
from noetl_stream.dsl.templates import RenderError, render_value
from noetl_stream.kv.history import read_events
from noetl_stream.protocol import events as E
from noetl_stream.protocol.errorinfo import ErrorInfo

if TYPE_CHECKING:
    from noetl_stream.dataplane.command import CommandRun


async def completed_iterations(run: CommandRun) -> dict[int, Completed]:
    """Iterations of this loop run that an earlier delivery finished (from the events stream)."""
    cmd = run.cmd
    done: dict[int, Completed] = {}
    async for _, ev in read_events(
        run.parts.js, run.parts.topology, cmd.execution_id, names=(E.LOOP_ITERATION_DONE,)
    ):
        index = ev.payload.get("index")
        if ev.step_run_id == cmd.step_run_id and isinstance(index, int):
            done[index] = Completed(ev.payload.get("result"), list(ev.payload.get("ctx_patches") or []))
    if done:
        run.parts.log.info("worker.loop_resumed", step_run_id=cmd.step_run_id, completed=len(done))
    return done


async def run_distributed_iteration(run: CommandRun, base: PipelineInput) -> None:
    """One iteration of a distributed loop (`Command.iteration`): its pipeline, between its
    ``loop.iteration.started`` and its ``loop.iteration.done`` (or ``failed``)."""
    cmd = run.cmd
    it = cmd.iteration
    assert it is not None and cmd.step_def.loop is not None
    loop = cmd.step_def.loop
    scope_id = f"{cmd.step_run_id}.{it.index}"
    run.event(E.LOOP_ITERATION_STARTED, "loop", scope_id, "in_progress", scope_id, {"index": it.index})
    scope = iteration_scope(loop.iterator, it.item, it.index, cmd.parent_iter)
    inp = replace(base, scope_id=scope_id, iter=scope)
    with in_iteration(scope):
        res = await run_pipeline(inp, run.task_hook(scope_id))
    run.settle(scope_id, res.status == "ok")
    if res.status == "ok":
        run.event(
            E.LOOP_ITERATION_DONE,
            "loop",
            scope_id,
            "success",
            scope_id,
            {"index": it.index, "result": res.result, "ctx_patches": res.ctx_patches},
        )
    else:
        run.event(
            E.LOOP_ITERATION_FAILED,
            "loop",
            scope_id,
            "error",
            scope_id,
            {"index": it.index, "error": res.error, "ctx_patches": res.ctx_patches},
        )


async def run_list_loop(run: CommandRun, base: PipelineInput) -> None:
    """A local loop over ``loop.in`` rendered to a list, every iteration on this worker (loops.py), between
    its ``loop.started`` and its ``loop.done`` (or ``step.failed``); a redelivery skips the iterations an
    earlier delivery recorded as done."""
    cmd = run.cmd
    step = cmd.step_def
    loop = step.loop
    assert loop is not None
    run_id = cmd.step_run_id
    where = f"step '{step.name}' loop"
    try:
        items = render_value(loop.in_, base.scope, f"{where}.in", as_input=True)
        mif = render_value(loop.spec.max_in_flight, base.scope, f"{where}.spec.max_in_flight")
    except RenderError as exc:
        run.fail(ErrorInfo(kind="template_error", message=str(exc)).to_dict())
        return
    if items is None:  # as NoETL: nothing to iterate over (an empty list, a query without rows)
        items = []
    if not isinstance(items, list):
        message = f"{where}.in: 'in' must render to a list, got {type(items).__name__}"
        run.fail(ErrorInfo(kind="loop_error", message=message).to_dict())
        return
    try:
        max_in_flight = loop_max_in_flight(loop.spec, mif, len(items), f"{where}.spec.max_in_flight")
    except MaxInFlightError as exc:
        run.fail(ErrorInfo(kind="loop_error", message=str(exc)).to_dict())
        return
    parallel = loop.spec.mode == "parallel"
    # 003 §8: the loop's start, as the controller writes it for a distributed loop (one per loop run).
    run.event(
        E.LOOP_STARTED,
        "loop",
        run_id,
        "in_progress",
        run_id,
        {
            "total": len(items),
            "max_in_flight": max_in_flight if parallel else 1,
            "exec": "local",
            "mode": loop.spec.mode,
            "pool": cmd.pool,
        },
    )

    async def on_iteration(name: str, index: int, payload: dict[str, Any]) -> None:
        sid = f"{run_id}.{index}"
        if name != E.LOOP_ITERATION_STARTED:
            run.settle(sid, name == E.LOOP_ITERATION_DONE)
        status = {"loop.iteration.started": "in_progress", "loop.iteration.done": "success"}.get(
            name, "error"
        )
        run.event(name, "loop", sid, status, sid, {"index": index, **payload})
        if name != E.LOOP_ITERATION_STARTED:
            # Recorded before its slot takes the next item (with the others finishing in this turn): a
            # redelivered command skips the iterations its events show as done.
            await run.events.record()

    completed = await completed_iterations(run) if run.redelivered else None

    res: LoopResult = await run_local_loop(
        replace(base, iteration_total=len(items)),
        items,
        parallel=parallel,
        max_in_flight=max_in_flight,
        fail_fast=step.failure_mode == "fail_fast",
        on_iteration=on_iteration,
        on_task=lambda i: run.task_hook(f"{run_id}.{i}"),
        completed=completed,
        parent_iter=cmd.parent_iter,
        hand_back=run.parts.stopping,
    )
    run.release_held()  # iterations a fail-fast stopped never settled: their tasks ran, write them
    if res.handed_back:
        raise HandedBackError(f"{res.done + res.failed} of {res.total} iterations settled")
    summary = {"total": res.total, "done": res.done, "failed": res.failed, "ctx_patches": res.ctx_patches}
    if res.failed and step.failure_mode == "fail_fast":
        run.event(E.STEP_FAILED, "step", run_id, "error", run_id, {"error": res.first_error, **summary})
    else:
        run.event(
            E.LOOP_DONE,
            "loop",
            run_id,
            "success" if not res.failed else "error",
            run_id,
            {"result": res.results, **summary},
        )
