"""Local loops: every iteration of a loop step runs in this worker.

``sequential`` runs items in order; ``parallel`` runs up to ``max_in_flight`` at a
time (stable iteration ids = the item's index). ``fail_fast`` stops starting new
iterations after the first failure (in-flight ones finish); ``best_effort`` runs
them all and reports ``{total, done, failed}``.

Each iteration's ``iter`` is ``{<iterator>: item, index}``, plus ``parent`` (the outer iteration) when the
execution is a child started from a loop iteration (003 §6.4, `children.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from noetl_stream.dataplane.children import in_iteration
from noetl_stream.dataplane.pipeline import PipelineInput, PipelineResult, TaskEvent, run_pipeline
from noetl_stream.errors import NoetlError
from noetl_stream.protocol.errorinfo import ErrorInfo

IterationEvent = Callable[[str, int, dict[str, Any]], Awaitable[None]]


@dataclass
class Completed:
    """An iteration finished by an earlier delivery of the same command (read back from its events)."""

    result: Any = None
    ctx_patches: list[dict[str, Any]] = field(default_factory=list)


class HandedBackError(NoetlError):
    """A local loop stopped starting iterations because its worker is shutting down: the command goes
    back to the pool unsettled, and its next delivery skips the iterations recorded as done."""


@dataclass
class LoopResult:
    total: int
    done: int = 0
    failed: int = 0
    results: list[Any] = field(default_factory=list)
    errors: dict[int, dict[str, Any]] = field(default_factory=dict)
    ctx_patches: list[dict[str, Any]] = field(default_factory=list)
    stopped: bool = False
    handed_back: bool = False
    """The worker is shutting down: no iteration was started after it began (the rest are another's)."""

    @property
    def first_error(self) -> dict[str, Any] | None:
        return self.errors[min(self.errors)] if self.errors else None


def iteration_scope(
    iterator: str, item: Any, index: int, parent: dict[str, Any] | None = None
) -> dict[str, Any]:
    """An iteration's ``iter``; `parent`: the outer iteration's (``iter.parent``), if nested."""
    scope: dict[str, Any] = {iterator: item, "index": index}
    if parent is not None:
        scope["parent"] = parent
    return scope


async def run_local_loop(
    base: PipelineInput,
    items: list[Any],
    *,
    parallel: bool,
    max_in_flight: int,
    fail_fast: bool,
    on_iteration: IterationEvent | None = None,
    on_task: Callable[[int], TaskEvent | None] | None = None,
    completed: dict[int, Completed] | None = None,
    parent_iter: dict[str, Any] | None = None,
    hand_back: Callable[[], bool] | None = None,
    indices: Sequence[int] | None = None,
) -> LoopResult:
    """Run the iterations; those in ``completed`` (a resumed command) are not run again. `parent_iter`:
    the outer iteration (``iter.parent``) when the execution is a child started from one. `indices`: the
    iteration index of each item (a cursor loop's frame, `cursor.py`), else its position; ``results``
    are by position."""
    loop = base.step.loop
    assert loop is not None
    total = len(items)
    out = LoopResult(total=total, results=[None] * total)
    limit = max(1, max_in_flight) if parallel else 1
    sem = asyncio.Semaphore(limit)
    ctx = dict(base.scope.get("ctx") or {})

    async def one(k: int) -> None:
        index = indices[k] if indices is not None else k
        try:
            if fail_fast and out.errors:
                out.stopped = True
                return
            if on_iteration is not None:
                await on_iteration("loop.iteration.started", index, {})
            # (a parallel iteration reads the base scope's ctx: the pipeline copies the scope it writes)
            scope = base.scope if parallel else {**base.scope, "ctx": ctx}
            it = iteration_scope(loop.iterator, items[k], index, parent_iter)
            inp = base.for_iteration(scope, f"{base.scope_id}.{index}", it)
            with in_iteration(it):
                res: PipelineResult = await run_pipeline(inp, on_task(index) if on_task else None)
            if res.ctx_patches:
                for patch in res.ctx_patches:
                    ctx.update(patch)
                out.ctx_patches.extend(res.ctx_patches)
            if res.status == "ok":
                out.done += 1
                out.results[k] = res.result
                if on_iteration is not None:
                    payload: dict[str, Any] = {"result": res.result}
                    if res.ctx_patches:
                        payload["ctx_patches"] = res.ctx_patches
                    await on_iteration("loop.iteration.done", index, payload)
            else:
                out.failed += 1
                out.errors[index] = (
                    res.error
                    or ErrorInfo(
                        kind="error", message=f"iteration {index} failed; its outcome says no more"
                    ).to_dict()
                )
                if on_iteration is not None:
                    await on_iteration("loop.iteration.failed", index, {"error": res.error})
        finally:
            sem.release()

    tasks: set[asyncio.Task[None]] = set()
    try:
        for k in range(total):
            index = indices[k] if indices is not None else k
            done_before = completed.get(index) if completed else None
            if done_before is not None:
                out.done += 1
                out.results[k] = done_before.result
                for patch in done_before.ctx_patches:
                    ctx.update(patch)
                out.ctx_patches.extend(done_before.ctx_patches)
                continue
            await sem.acquire()
            if hand_back is not None and hand_back():  # shutting down: what is left goes to another worker
                sem.release()
                out.handed_back = True
                break
            if (fail_fast and out.errors) or (base.stop_check is not None and base.stop_check() is not None):
                sem.release()
                out.stopped = True
                break
            if limit == 1:
                await one(k)
            else:
                task = asyncio.ensure_future(one(k))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*list(tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        raise
    return out
