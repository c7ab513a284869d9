"""An execution's step graph for the viewer: the plan's steps and arcs, laid out in layers, with each
step's status, timings, loop progress and retries folded from the execution's events.

``fold_graph`` is pure (events in, ``ExecutionGraph`` out); ``execution_graph`` is the route.
The plan comes from the playbook text of the ``playbook.execution.requested`` event, so the graph
is the one the execution ran, whatever happened to the catalog since.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import AsyncGenerator, Iterable
from typing import Any, Literal, cast

import msgspec
from aiohttp import web

from noetl_stream.api.http import ApiError, context, path_execution_id, reply
from noetl_stream.dsl.compiler import compile_playbook
from noetl_stream.dsl.graph import build_graph
from noetl_stream.dsl.model import Playbook, Step
from noetl_stream.kv.history import read_events
from noetl_stream.protocol import events as E
from noetl_stream.protocol.wire import Event, seconds_between

__all__ = ["ExecutionGraph", "GraphArc", "GraphStep", "LoopProgress", "execution_graph", "fold_graph"]

StepStatus = Literal["pending", "scheduled", "running", "ok", "failed", "skipped", "cancelled", "unreached"]
_RUN_EVENTS = frozenset(
    {
        E.STEP_SCHEDULED,
        E.STEP_STARTED,
        E.LOOP_STARTED,
        E.STEP_DONE,
        E.STEP_FAILED,
        E.LOOP_DONE,
        E.STEP_SKIPPED,
    }
)
_ACTIVE = ("scheduled", "running")
_REUSED: dict[str, StepStatus] = {"done": "ok", "failed": "failed", "skipped": "skipped"}
_ENDS: dict[str, StepStatus] = {
    E.STEP_DONE: "ok",
    E.LOOP_DONE: "ok",
    E.STEP_FAILED: "failed",
    E.STEP_SKIPPED: "skipped",
}


class LoopProgress(msgspec.Struct):
    """Iterations of the step's latest run (``total`` is unknown until a local loop ends)."""

    mode: str
    exec: str
    total: int | None = None
    started: int = 0
    done: int = 0
    failed: int = 0


class GraphStep(msgspec.Struct):
    name: str
    kind: Literal["router", "tasks", "loop"]
    layer: int
    """Column of the layered layout (longest forward path from a root)."""
    order: int
    """Row within the layer."""
    tasks: list[str]
    desc: str | None = None
    line: int = 0
    status: StepStatus = "pending"
    runs: int = 0
    scheduled_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    duration_s: float | None = None
    """The latest run, from its start (or scheduling) to its boundary event."""
    task_runs: int = 0
    retries: int = 0
    """Task runs a policy retried, over every run of the step."""
    loop: LoopProgress | None = None
    error: dict[str, Any] | None = None


class GraphArc(msgspec.Struct):
    source: str
    target: str
    when: str | None = None
    back: bool = False
    """A back edge (the target is an ancestor): drawn apart, not used for layering."""
    taken: int = 0
    """How many times ``next.evaluated`` fired this arc."""


class ExecutionGraph(msgspec.Struct):
    execution_id: str
    status: str
    steps: list[GraphStep]
    arcs: list[GraphArc]
    name: str = ""
    path: str = ""
    paused: bool = False
    started_at: str | None = None
    finished_at: str | None = None
    duration_s: float | None = None
    error: dict[str, Any] | None = None
    events: int = 0
    last_seq: int = 0
    retry_of: str | None = None
    """The execution this one retries (its request's ``resume``)."""


@functools.lru_cache(maxsize=32)
def _compile(text: str, file: str) -> Playbook | None:
    return compile_playbook(text, file).playbook


def request_playbook(request: Any) -> Playbook | None:
    """The playbook of an execution request (its ``playbook.execution.requested`` payload), compiled
    once for the graph and the step details of the same execution (None if it does not compile)."""
    if not isinstance(request, dict) or not isinstance(request.get("playbook"), str):
        return None
    return _compile(request["playbook"], str(request.get("file") or request.get("path") or "<playbook>"))


async def execution_events(request: web.Request) -> tuple[str, list[tuple[int, Event]]]:
    """The execution the route names and its events in order; 404 when it has none."""
    ctx = context(request)
    execution_id = path_execution_id(request)
    reader = cast(
        AsyncGenerator[tuple[int, Event], None],
        read_events(ctx.inspector.js, ctx.topology, execution_id),
    )
    async with contextlib.aclosing(reader) as stream:
        events = [item async for item in stream]
    if not events:
        raise ApiError(404, "not_found", f"no execution {execution_id}")
    return execution_id, events


def _when(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def _layout(playbook: Playbook) -> tuple[dict[str, tuple[int, int]], list[GraphArc]]:
    """Layers by longest forward path, rows ordered by the mean row of the predecessors (then YAML)."""
    graph = build_graph(playbook)
    names = [s.name for s in playbook.workflow]
    index = {n: i for i, n in enumerate(names)}
    preds = {n: [p for p in names if n in graph.successors.get(p, ())] for n in names}
    layer: dict[str, int] = {}
    pending = {n: len(preds[n]) for n in names}
    ready = [n for n in names if pending[n] == 0]
    while ready:
        node = ready.pop(0)
        layer[node] = max((layer[p] + 1 for p in preds[node]), default=0)
        for succ in graph.successors.get(node, ()):
            pending[succ] -= 1
            if pending[succ] == 0:
                ready.append(succ)
    for n in names:  # unreachable by forward arcs alone (cannot happen after back-edge removal)
        layer.setdefault(n, 0)
    rows: dict[str, int] = {}
    for col in range(max(layer.values(), default=-1) + 1):
        members = [n for n in names if layer[n] == col]

        def weight(n: str) -> tuple[float, int]:
            placed = [rows[p] for p in preds[n] if p in rows]
            return (sum(placed) / len(placed) if placed else -1.0, index[n])

        for row, n in enumerate(sorted(members, key=weight)):
            rows[n] = row
    arcs = [
        GraphArc(source=s.name, target=a.step, when=_when(a.when), back=(s.name, a.step) in graph.back_edges)
        for s in playbook.workflow
        for a in (s.next.arcs if s.next else ())
    ]
    return {n: (layer[n], rows[n]) for n in names}, arcs


def _node(step: Step, where: tuple[int, int]) -> GraphStep:
    loop = None
    if step.loop is not None:
        loop = LoopProgress(mode=step.loop.spec.mode, exec=step.loop.spec.exec)
    kind: Literal["router", "tasks", "loop"] = (
        "loop" if step.loop is not None else "router" if step.is_router else "tasks"
    )
    return GraphStep(
        name=step.name,
        kind=kind,
        layer=where[0],
        order=where[1],
        tasks=[t.name for t in step.tasks],
        desc=step.desc,
        line=step.line,
        loop=loop,
    )


class _Fold:
    def __init__(self, execution_id: str) -> None:
        self.graph = ExecutionGraph(execution_id=execution_id, status="pending", steps=[], arcs=[])
        self.steps: dict[str, GraphStep] = {}
        self.arcs: dict[tuple[str, str], list[GraphArc]] = {}
        self.run_ids: dict[str, str] = {}
        self.ended = E.EndedRuns()
        self.request: dict[str, Any] | None = None

    def plan(self, request: dict[str, Any]) -> None:
        playbook = request_playbook(request)
        if playbook is None:
            return
        places, arcs = _layout(playbook)
        self.graph.name, self.graph.path = playbook.metadata.name, playbook.metadata.path
        self.graph.steps = [_node(s, places[s.name]) for s in playbook.workflow]
        self.graph.arcs = arcs
        self.steps = {s.name: s for s in self.graph.steps}
        resume = request.get("resume")
        if isinstance(resume, dict):  # a retry: the steps the earlier execution finished are reused
            retried = resume.get("execution_id")
            self.graph.retry_of = retried if isinstance(retried, str) else None
            for name, status in (resume.get("step_status") or {}).items():
                reused = _REUSED.get(str(status))
                if name in self.steps and reused is not None:
                    self.steps[name].status = reused
        for arc in arcs:
            self.arcs.setdefault((arc.source, arc.target), []).append(arc)

    def execution(self, ev: Event) -> None:
        g = self.graph
        if ev.name == E.EXECUTION_REQUESTED and self.request is None:
            request = ev.payload.get("request")
            self.request = request if isinstance(request, dict) else {}  # the controller rejects the rest
            g.started_at = ev.timestamp
            self.plan(self.request)
        elif ev.name in (E.REQUEST_EVALUATED, E.WORKFLOW_STARTED) and g.status == "pending":
            g.status = "running"
        elif ev.name == E.WORKFLOW_PAUSED:
            g.paused = True
        elif ev.name == E.WORKFLOW_RESUMED:
            g.paused = False
        elif ev.name in (E.WORKFLOW_FINISHED, E.PLAYBOOK_PROCESSED):
            g.status = str(ev.payload.get("status") or "failed")
            g.error = ev.payload.get("error") or g.error
            g.finished_at = ev.timestamp
            g.paused = False

    def step(self, ev: Event, node: GraphStep) -> None:
        name, p = ev.name, ev.payload
        if self.ended.stale(ev):
            return
        if name in _RUN_EVENTS and ev.step_run_id and self.run_ids.get(node.name) != ev.step_run_id:
            self.run_ids[node.name] = ev.step_run_id  # a new run: its own timings and iterations
            node.runs += 1
            node.scheduled_at = node.started_at = node.finished_at = None
            node.duration_s, node.error = None, None
            if node.loop is not None:
                node.loop = LoopProgress(mode=node.loop.mode, exec=node.loop.exec)
        if name == E.STEP_SCHEDULED:
            node.status, node.scheduled_at = "scheduled", ev.timestamp
        elif name in (E.STEP_STARTED, E.LOOP_STARTED):
            if (
                name == E.LOOP_STARTED
            ):  # a distributed loop recorded before the controller wrote its step.started
                node.scheduled_at = node.scheduled_at or ev.timestamp
            node.status = "running"
            node.started_at = node.started_at or ev.timestamp
            if node.loop is not None and isinstance(p.get("total"), int):
                node.loop.total = p["total"]
        elif name in (E.LOOP_ITERATION_STARTED, E.LOOP_ITERATION_DONE, E.LOOP_ITERATION_FAILED):
            if node.status in ("pending", "scheduled"):
                node.status = "running"
            if node.loop is not None:
                field = {
                    E.LOOP_ITERATION_STARTED: "started",
                    E.LOOP_ITERATION_DONE: "done",
                    E.LOOP_ITERATION_FAILED: "failed",
                }[name]
                setattr(node.loop, field, getattr(node.loop, field) + 1)
        elif name == E.TASK_STARTED:
            node.task_runs += 1
        elif name == E.TASK_DONE:
            if p.get("do") == "retry":
                node.retries += 1
        elif name in _ENDS:
            node.status = _ENDS[name]
            node.finished_at = ev.timestamp
            node.duration_s = seconds_between(
                node.started_at or node.scheduled_at or ev.timestamp, ev.timestamp
            )
            if isinstance(p.get("error"), dict):
                node.error = p["error"]
            if node.loop is not None and isinstance(p.get("total"), int):
                node.loop.total = p["total"]
                node.loop.done = int(p.get("done") or 0)
                node.loop.failed = int(p.get("failed") or 0)
        elif name == E.NEXT_EVALUATED:
            for target in p.get("matched") or []:
                for arc in self.arcs.get((node.name, str(target)), [])[:1]:
                    arc.taken += 1

    def finish(self) -> ExecutionGraph:
        g = self.graph
        g.duration_s = seconds_between(g.started_at, g.finished_at)
        if g.finished_at is not None:
            for node in g.steps:
                if node.status in _ACTIVE:
                    node.status = "cancelled"
                elif node.status == "pending":
                    node.status = "unreached"
        return g


def fold_graph(execution_id: str, events: Iterable[tuple[int, Event]]) -> ExecutionGraph:
    """The graph of an execution from its events in stream order (``(stream sequence, event)``)."""
    fold = _Fold(execution_id)
    for seq, ev in events:
        fold.graph.events += 1
        fold.graph.last_seq = seq
        fold.execution(ev)
        node = fold.steps.get(ev.step) if ev.step else None
        if node is not None:
            fold.step(ev, node)
    return fold.finish()


async def execution_graph(request: web.Request) -> web.StreamResponse:
    execution_id, events = await execution_events(request)
    return reply(fold_graph(execution_id, events))
