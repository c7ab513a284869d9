"""One step of an execution in detail, for the viewer's step panel: each run of it with the args it was
scheduled with, the worker, timings, its result (inline, or the reference of a stored one) and error, its
task runs (attempts, the args each ran with, result, error with a python traceback, output) and, for a
loop, its iterations (paged), each with its task runs.

``fold_step`` is pure (events in, ``StepDetail`` out); ``step_detail`` is the route. Everything comes
from the execution's events as the runtime wrote them, redacted as they were written: nothing is
rendered again here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import msgspec
from aiohttp import web

from noetl_stream.api.graph import execution_events, request_playbook
from noetl_stream.api.http import ApiError, query_int, reply
from noetl_stream.protocol import events as E
from noetl_stream.protocol.wire import Event, seconds_between

__all__ = [
    "DeclaredTask",
    "IterationDetail",
    "StepDetail",
    "StepRunDetail",
    "TaskRun",
    "fold_step",
    "step_detail",
]

MAX_ITERATIONS_PAGE = 1000


class TaskRun(msgspec.Struct):
    """One run (attempt) of a task, from its ``task.started`` and ``task.done`` (a worker run with
    ``--task-events informative`` writes neither for a plain first run that succeeded)."""

    task: str
    task_run_id: str
    kind: str = ""
    attempt: int = 1
    status: Literal["running", "ok", "error"] = "running"
    started_at: str | None = None
    finished_at: str | None = None
    duration_s: float | None = None
    worker: str | None = None
    args: Any = None
    """The args it ran with, rendered (keychain values masked), as ``task.done`` recorded them."""
    args_bytes: int | None = None
    """Set instead of ``args`` when they were too large to record (-1: not JSON)."""
    result: Any = None
    error: dict[str, Any] | None = None
    do: str | None = None
    """What its policy decided: continue, retry, fail, jump, break."""
    output: dict[str, Any] | None = None
    """A python task's captured stdout and stderr."""


class IterationDetail(msgspec.Struct):
    index: int
    status: Literal["running", "ok", "failed"] = "running"
    started_at: str | None = None
    finished_at: str | None = None
    duration_s: float | None = None
    worker: str | None = None
    result: Any = None
    error: dict[str, Any] | None = None
    tasks: list[TaskRun] = []


class StepRunDetail(msgspec.Struct):
    step_run_id: str
    status: Literal["scheduled", "running", "ok", "failed", "skipped"] = "scheduled"
    worker: str | None = None
    pool: str | None = None
    scheduled_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    duration_s: float | None = None
    args: dict[str, Any] = {}
    """The args it was scheduled with (the arcs' ``args``, rendered by the controller)."""
    result: Any = None
    """Its result: a value, or ``{"$ref": {...}}`` for one stored in the object store
    (``GET /api/executions/{id}/result?key=...`` reads it)."""
    error: dict[str, Any] | None = None
    reason: str | None = None
    """Why it was skipped."""
    tasks: list[TaskRun] = []
    loop: dict[str, Any] | None = None
    """A loop's ``total``, ``done``, ``failed`` (its ``loop.started`` and ``loop.done``)."""
    iterations: list[IterationDetail] = []
    """A page of its iterations, by index (``offset``, ``limit``)."""
    iterations_total: int = 0
    """How many iterations have an event."""


class DeclaredTask(msgspec.Struct):
    """A task as the playbook declares it (its args as templates, before rendering)."""

    name: str
    kind: str
    args: Any = None


class StepDetail(msgspec.Struct):
    execution_id: str
    step: str
    kind: Literal["router", "tasks", "loop"] = "tasks"
    desc: str | None = None
    declared: list[DeclaredTask] = []
    runs: list[StepRunDetail] = []
    """Every run of the step, oldest first (a step runs more than once in a cycle or a retry loop)."""


_RUN_STATUS: dict[str, Literal["ok", "failed", "skipped"]] = {
    E.STEP_DONE: "ok",
    E.LOOP_DONE: "ok",
    E.STEP_FAILED: "failed",
    E.STEP_SKIPPED: "skipped",
}


class _Fold:
    def __init__(self, execution_id: str, step: str) -> None:
        self.detail = StepDetail(execution_id=execution_id, step=step)
        self.runs: dict[str, StepRunDetail] = {}
        self.tasks: dict[str, TaskRun] = {}
        self.iterations: dict[str, dict[int, IterationDetail]] = {}
        self.ended = E.EndedRuns()
        self.known = False

    def plan(self, request: Any) -> None:
        playbook = request_playbook(request)
        step = playbook.steps.get(self.detail.step) if playbook is not None else None
        if step is None:
            return
        self.known = True
        d = self.detail
        d.kind = "loop" if step.loop is not None else "router" if step.is_router else "tasks"
        d.desc = step.desc
        d.declared = [DeclaredTask(name=t.name, kind=t.kind, args=t.config.get("args")) for t in step.tasks]

    def run(self, ev: Event) -> StepRunDetail | None:
        run_id = ev.step_run_id
        if not run_id:
            return None
        run = self.runs.get(run_id)
        if run is None:
            run = self.runs[run_id] = StepRunDetail(step_run_id=run_id)
            self.iterations[run_id] = {}
        return run

    def iteration(self, run: StepRunDetail, index: int) -> IterationDetail:
        its = self.iterations[run.step_run_id]
        it = its.get(index)
        if it is None:
            it = its[index] = IterationDetail(index=index)
        return it

    def fold(self, ev: Event) -> None:
        if self.ended.stale(ev):
            return
        run = self.run(ev)
        if run is None:
            return
        name, p = ev.name, ev.payload
        if name == E.STEP_SCHEDULED:
            run.scheduled_at = ev.timestamp
            run.pool = p.get("pool") if isinstance(p.get("pool"), str) else None
            run.args = p["args"] if isinstance(p.get("args"), dict) else {}
        elif name in (E.STEP_STARTED, E.LOOP_STARTED):
            run.status = "running"
            run.started_at = run.started_at or ev.timestamp
            run.worker = run.worker or ev.worker
            if name == E.LOOP_STARTED:
                run.loop = {"total": p.get("total"), "done": 0, "failed": 0}
        elif name in (E.LOOP_ITERATION_STARTED, E.LOOP_ITERATION_DONE, E.LOOP_ITERATION_FAILED):
            index = p.get("index")
            if not isinstance(index, int):
                return
            it = self.iteration(run, index)
            it.worker = it.worker or ev.worker
            if name == E.LOOP_ITERATION_STARTED:
                it.started_at = it.started_at or ev.timestamp
                return
            it.status = "ok" if name == E.LOOP_ITERATION_DONE else "failed"
            it.finished_at = ev.timestamp
            it.duration_s = seconds_between(it.started_at or ev.timestamp, ev.timestamp)
            it.result = p.get("result")
            it.error = p.get("error") if isinstance(p.get("error"), dict) else None
            if run.loop is not None:
                key = "done" if it.status == "ok" else "failed"
                run.loop[key] = int(run.loop.get(key) or 0) + 1
        elif name in (E.TASK_STARTED, E.TASK_DONE):
            self.task(run, ev)
        elif name in _RUN_STATUS:
            run.status = _RUN_STATUS[name]
            run.finished_at = ev.timestamp
            run.duration_s = seconds_between(run.started_at or run.scheduled_at or ev.timestamp, ev.timestamp)
            run.worker = run.worker or ev.worker
            run.result = p.get("result")
            run.error = p.get("error") if isinstance(p.get("error"), dict) else None
            if name == E.STEP_SKIPPED:
                run.reason = str(p.get("reason") or "") or None
            if isinstance(p.get("total"), int):
                run.loop = {"total": p["total"], "done": p.get("done"), "failed": p.get("failed")}

    def task(self, run: StepRunDetail, ev: Event) -> None:
        run_id = ev.task_run_id
        if not run_id:
            return
        p = ev.payload
        tr = self.tasks.get(run_id)
        if tr is None:
            tr = self.tasks[run_id] = TaskRun(task=str(p.get("task") or ""), task_run_id=run_id)
            index = _iteration_of(run.step_run_id, run_id)
            if index is not None and self.detail.kind == "loop":
                it = self.iteration(run, index)
                it.tasks.append(tr)
            else:
                run.tasks.append(tr)
        tr.kind = str(p.get("kind") or tr.kind)
        tr.attempt = int(p.get("attempt") or tr.attempt)
        tr.worker = tr.worker or ev.worker
        if ev.name == E.TASK_STARTED:
            tr.started_at = ev.timestamp
            return
        tr.status = "ok" if p.get("status") == "ok" else "error"
        tr.finished_at = ev.timestamp
        tr.duration_s = seconds_between(tr.started_at or ev.timestamp, ev.timestamp)
        tr.result = p.get("result")
        tr.error = p.get("error") if isinstance(p.get("error"), dict) else None
        tr.do = p.get("do") if isinstance(p.get("do"), str) else None
        tr.output = p.get("output") if isinstance(p.get("output"), dict) else None
        if "args" in p:
            tr.args = p["args"]
        if isinstance(p.get("args_bytes"), int):
            tr.args_bytes = p["args_bytes"]

    def finish(self, offset: int, limit: int) -> StepDetail:
        d = self.detail
        for run_id, run in self.runs.items():
            its = self.iterations.get(run_id) or {}
            run.iterations_total = len(its)
            run.iterations = [its[i] for i in sorted(its)][offset : offset + limit]
        d.runs = list(self.runs.values())
        return d


def _iteration_of(step_run_id: str, task_run_id: str) -> int | None:
    """The loop iteration of a task run (``<step_run_id>.<index>.<task>.<run>``), None outside one."""
    rest = task_run_id.removeprefix(step_run_id + ".")
    if rest == task_run_id:
        return None
    head = rest.split(".", 1)[0]
    return int(head) if head.isdigit() and rest.count(".") >= 2 else None


def fold_step(
    execution_id: str, step: str, events: Iterable[tuple[int, Event]], offset: int = 0, limit: int = 100
) -> StepDetail | None:
    """The step's detail from the execution's events in stream order; None when its playbook has no
    such step."""
    fold = _Fold(execution_id, step)
    for _, ev in events:
        if ev.name == E.EXECUTION_REQUESTED and not fold.known:
            fold.plan(ev.payload.get("request"))
        elif ev.step == step:
            fold.fold(ev)
    if not fold.known and not fold.runs:
        return None
    return fold.finish(offset, limit)


async def step_detail(request: web.Request) -> web.StreamResponse:
    step = request.match_info["step"]
    offset = query_int(request, "offset", 0, 0)
    limit = query_int(request, "limit", 100, 1, MAX_ITERATIONS_PAGE)
    execution_id, events = await execution_events(request)
    detail = fold_step(execution_id, step, events, offset, limit)
    if detail is None:
        raise ApiError(404, "not_found", f"execution {execution_id} has no step {step!r}")
    return reply(detail)
