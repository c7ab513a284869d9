"""Cursor loops (NoETL's ``spec.mode: cursor``): the iterations come from a claim query, a frame at a time.

The worker that runs the loop step (a cursor loop is always local: the controller runs no query) renders
``loop.cursor.claim`` with ``{{ __frame_max_rows }}`` (``loop.spec.frame.max_rows``, default 100) and runs
it with the postgres tool under the cursor's ``auth``. Each row it returns is one iteration (``iter.<it>`` is
the row); a claim that returns no row ends the loop. Iterations are numbered across frames (0, 1, ...).

Records, so that a redelivered command resumes: each claimed row is written as its iteration's
``loop.iteration.started`` (with the row as ``item``) and published before any of them runs; each finished
one as ``loop.iteration.done``. The next delivery runs the claimed rows that have no ``done`` (they are
claimed already: no claim returns them again) and then claims on. Delivery is at least once: a row whose
iteration ran but whose ``done`` was not recorded runs again. Rows a worker claimed and never recorded (it
died between the claim's commit and the publish) stay claimed: releasing them is the claim query's own
concern, e.g. a lease column it also reclaims when old (docs/semantics.md, Loops).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from noetl_stream.dataplane.loops import Completed, HandedBackError, LoopResult, run_local_loop
from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.dataplane.pipeline import PipelineInput
from noetl_stream.dataplane.tools import TOOLS, ToolContext
from noetl_stream.dataplane.tools.base import WorkerServices
from noetl_stream.dsl import vocabulary as V
from noetl_stream.dsl.inflight import MaxInFlightError, loop_max_in_flight
from noetl_stream.dsl.kinds import kind_info
from noetl_stream.dsl.layering import merge_layers
from noetl_stream.dsl.model import Loop, Step
from noetl_stream.dsl.templates import RenderError, render_value
from noetl_stream.errors import NoetlError
from noetl_stream.kv.history import read_events
from noetl_stream.protocol import events as E
from noetl_stream.protocol.errorinfo import ErrorInfo
from noetl_stream.protocol.wire import Command

if TYPE_CHECKING:
    from noetl_stream.dataplane.command import CommandRun

FRAME_ROWS = V.FRAME_ROWS


class CursorError(NoetlError):
    """A claim that failed (to render, to run, or to return rows): the loop step fails with `error`."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message"))
        self.error = error


def frame_rows(loop: Loop) -> int:
    return loop.spec.frame_max_rows or V.DEFAULT_FRAME_MAX_ROWS


async def claim_frame(
    step: Step,
    scope: dict[str, Any],
    executor_spec: dict[str, Any],
    services: WorkerServices | None,
    execution_id: str,
    scope_id: str,
    frame: int,
) -> list[Any]:
    """Run the cursor's claim once; the rows it returned (none: the loop is over)."""
    loop = step.loop
    assert loop is not None and loop.cursor is not None
    where = f"step '{step.name}' loop.cursor"
    try:
        config = render_value(
            {k: v for k, v in loop.cursor.items() if k in ("auth", "dsn", "claim")},
            {**scope, FRAME_ROWS: frame_rows(loop)},
            where,
        )
    except RenderError as exc:
        raise CursorError(
            ErrorInfo(kind="template_error", retryable=False, message=str(exc)).to_dict()
        ) from None
    info = kind_info("postgres")
    spec = merge_layers(info.defaults if info else None, executor_spec, step.spec, loop.raw_spec)
    ctx = ToolContext(
        execution_id=execution_id,
        step=step.name,
        task="cursor",
        spec=spec,
        services=services,
        scope_id=f"{scope_id}.claim.{frame}",
    )
    claim = {k: v for k, v in config.items() if k != "claim" and v is not None}
    outcome: Outcome = await TOOLS["postgres"]({**claim, "command": config["claim"]}, ctx)
    if outcome.status != "ok":
        error = dict(outcome.error or ErrorInfo(kind="pg_error", message="the claim failed").to_dict())
        error["message"] = f"{where}.claim: {error.get('message', 'the claim failed')}"
        raise CursorError(error)
    result = outcome.result
    rows = result.get("rows") if isinstance(result, dict) else None
    if not isinstance(rows, list):
        message = (
            f"{where}.claim: the claim returned no rows to iterate over ({result.get('message') if isinstance(result, dict) else result!r}): "
            "it must end in a statement that returns them (UPDATE ... RETURNING ...)"
        )
        raise CursorError(ErrorInfo(kind="loop_error", retryable=False, message=message).to_dict())
    return rows


def with_ref(cmd: Command, result: Any) -> Any:
    """A step with NoETL's ``output: {store}``: its result (a mapping) gets ``_ref``, naming where it is
    kept: ``{kind: step_result, store, execution_id, step, step_run_id}``. The result stays inline whole;
    a result that is not a mapping has no key to carry it and is left as it is."""
    store = cmd.step_def.result_store
    if store is None or not isinstance(result, dict):
        return result
    ref = {
        "kind": "step_result",
        "store": store,
        "execution_id": cmd.execution_id,
        "step": cmd.step,
        "step_run_id": cmd.step_run_id,
    }
    return {**result, "_ref": ref}


async def _records(run: CommandRun) -> tuple[dict[int, Completed], dict[int, Any]]:
    """The iterations an earlier delivery of this loop run finished, and the rows it claimed, by index."""
    cmd = run.cmd
    done: dict[int, Completed] = {}
    claimed: dict[int, Any] = {}
    names = (E.LOOP_ITERATION_STARTED, E.LOOP_ITERATION_DONE)
    async for _, ev in read_events(run.parts.js, run.parts.topology, cmd.execution_id, names=names):
        index = ev.payload.get("index")
        if ev.step_run_id != cmd.step_run_id or not isinstance(index, int):
            continue
        if ev.name == E.LOOP_ITERATION_DONE:
            done[index] = Completed(ev.payload.get("result"), list(ev.payload.get("ctx_patches") or []))
        elif "item" in ev.payload:
            claimed[index] = ev.payload["item"]
    if claimed:
        run.parts.log.info(
            "worker.loop_resumed", step_run_id=cmd.step_run_id, completed=len(done), claimed=len(claimed)
        )
    return done, claimed


def _max_in_flight(loop: Loop, scope: dict[str, Any], where: str) -> int:
    """Iterations of a frame run at once: 1 (in order) unless ``max_in_flight`` says more."""
    if loop.spec.max_in_flight is None:
        return 1
    rendered = render_value(loop.spec.max_in_flight, scope, where)
    spec = msgspec.structs.replace(loop.spec, mode="parallel")
    return loop_max_in_flight(spec, rendered, frame_rows(loop), where)


async def run_cursor_loop(run: CommandRun, base: PipelineInput) -> None:
    """Claim a frame, run its rows as iterations, until a claim returns none (a redelivery first runs what
    an earlier delivery claimed and did not finish); then ``loop.done`` (or ``step.failed``) as a local
    loop ends."""
    cmd = run.cmd
    step = cmd.step_def
    loop = step.loop
    assert loop is not None
    run_id = cmd.step_run_id
    try:
        max_in_flight = _max_in_flight(loop, base.scope, f"step '{step.name}' loop.spec.max_in_flight")
    except MaxInFlightError as exc:
        run.fail(ErrorInfo(kind="loop_error", message=str(exc)).to_dict())
        return
    except RenderError as exc:
        run.fail(ErrorInfo(kind="template_error", message=str(exc)).to_dict())
        return
    started = {"max_in_flight": max_in_flight, "exec": "local", "mode": "cursor", "pool": cmd.pool}
    run.event(
        E.LOOP_STARTED, "loop", run_id, "in_progress", run_id, {**started, "frame_max_rows": frame_rows(loop)}
    )
    done, claimed = await _records(run) if run.redelivered else ({}, {})
    results: dict[int, Any] = {i: c.result for i, c in done.items()}
    patches = [p for i in sorted(done) for p in done[i].ctx_patches]
    failed: dict[int, dict[str, Any]] = {}
    next_index = max(claimed, default=-1) + 1
    frame = [(i, claimed[i]) for i in sorted(claimed) if i not in done]
    frame_no = 0

    async def on_iteration(name: str, index: int, payload: dict[str, Any]) -> None:
        if name == E.LOOP_ITERATION_STARTED:
            return  # written when its row was claimed
        sid = f"{run_id}.{index}"
        run.settle(sid, name == E.LOOP_ITERATION_DONE)
        status = "success" if name == E.LOOP_ITERATION_DONE else "error"
        run.event(name, "loop", sid, status, sid, {"index": index, **payload})
        await run.events.record()  # recorded before its slot takes the next row: a redelivery skips it

    while True:
        if not frame:
            if run.parts.stopping():
                raise HandedBackError(f"{len(results)} of {next_index} claimed iterations settled")
            reason = base.stop_check() if base.stop_check is not None else None
            if reason is not None:
                run.fail(ErrorInfo(kind="cancelled", retryable=False, message=reason).to_dict())
                return
            try:
                rows = await claim_frame(
                    step, base.scope, cmd.executor_spec, base.services, cmd.execution_id, run_id, frame_no
                )
            except CursorError as exc:
                run.fail(exc.error)
                return
            frame_no += 1
            if not rows:
                break
            frame = [(next_index + k, row) for k, row in enumerate(rows)]
            next_index += len(rows)
            for index, row in frame:  # the claim's record: a redelivery runs these rows, not a new claim
                sid = f"{run_id}.{index}"
                payload = {"index": index, "item": row}
                run.event(E.LOOP_ITERATION_STARTED, "loop", sid, "in_progress", sid, payload)
            await run.events.send_pending_now()
        res: LoopResult = await run_local_loop(
            base,
            [row for _, row in frame],
            parallel=max_in_flight > 1,
            max_in_flight=max_in_flight,
            fail_fast=step.failure_mode == "fail_fast",
            on_iteration=on_iteration,
            on_task=lambda i: run.task_hook(f"{run_id}.{i}"),
            parent_iter=cmd.parent_iter,
            hand_back=run.parts.stopping,
            indices=[i for i, _ in frame],
        )
        run.release_held()
        if res.handed_back:
            raise HandedBackError(f"{len(results) + res.done} of {next_index} claimed iterations settled")
        for (index, _), value in zip(frame, res.results, strict=True):
            if index not in res.errors:
                results[index] = value
        failed.update(res.errors)
        patches.extend(res.ctx_patches)
        frame = []
        if res.errors and step.failure_mode == "fail_fast":
            break
    summary = {"total": next_index, "done": len(results), "failed": len(failed), "ctx_patches": patches}
    if failed and step.failure_mode == "fail_fast":
        run.event(E.STEP_FAILED, "step", run_id, "error", run_id, {"error": failed[min(failed)], **summary})
        return
    result = [results.get(i) for i in range(next_index)]
    status = "success" if not failed else "error"
    run.event(E.LOOP_DONE, "loop", run_id, status, run_id, {"result": result, **summary})
