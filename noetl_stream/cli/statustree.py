"""What ``noetl-stream status ID`` prints on a terminal: the execution, then its steps as a tree with
their status, duration, attempts and errors (folded from the events by `fold_graph`, as the viewer's
graph is)::

    execution 638d83ff4ca24fc99b59165b4e995b96  failed
      playbook  tests/failing (failing)
      started   2026-12-07T21:59:13.670Z
      finished  2026-12-07T21:59:13.694Z
      duration  24ms
      error     explode: python_error: LookupError: nothing here (line 1)

      STEP           STATUS    DURATION  ATTEMPTS
      ├─ ✔ start     ok             3ms         1
      └─ ✘ explode   failed        12ms         1
         └─ error: python_error: LookupError: nothing here (line 1)

A step's attempts are its runs plus the task runs a policy retried in them (`step_attempts`). Steps come in the order
of the graph's layers (a step after the steps it follows), each layer in its rows' order.
"""

from __future__ import annotations

from collections.abc import Iterable

from noetl_stream.api.graph import ExecutionGraph, GraphStep
from noetl_stream.client.timeline import duration_text, error_text
from noetl_stream.protocol import events as E
from noetl_stream.protocol.wire import Event

MAX_ERROR = 200
"""An error is shown on one line, cut after this many characters (``events`` shows it whole in JSON)."""

__all__ = ["render_status", "step_attempts"]

_RUN_STARTS = frozenset({E.STEP_SCHEDULED, E.STEP_STARTED, E.LOOP_STARTED})

MARKS = {
    "ok": "✔",
    "failed": "✘",
    "running": "▸",
    "scheduled": "…",
    "skipped": "⤼",
    "cancelled": "⊘",
    "pending": "·",
    "unreached": "·",
}


def step_attempts(events: Iterable[tuple[int, Event]]) -> dict[str, int]:
    """Each step's tries, from its events: its runs, plus the task runs a policy retried in them (a
    ``task.started`` of an attempt after the first). Events a run wrote after its end are not counted."""
    ended = E.EndedRuns()
    runs: dict[str, set[str]] = {}
    retried: dict[str, int] = {}
    for _, ev in events:
        if not ev.step or ended.stale(ev):
            continue
        if ev.name in _RUN_STARTS and ev.step_run_id:
            runs.setdefault(ev.step, set()).add(ev.step_run_id)
        elif ev.name == E.TASK_STARTED:
            attempt = ev.payload.get("attempt")
            if isinstance(attempt, int) and attempt > 1:
                retried[ev.step] = retried.get(ev.step, 0) + 1
    return {step: len(runs.get(step, ())) + retried.get(step, 0) for step in runs.keys() | retried.keys()}


def _children(step: GraphStep) -> list[str]:
    out = []
    loop = step.loop
    if loop is not None and (loop.started or loop.done or loop.failed or loop.total is not None):
        total = "?" if loop.total is None else str(loop.total)
        out.append(f"loop: {loop.done}/{total} done, {loop.failed} failed ({loop.mode}, {loop.exec})")
    if step.error is not None:
        out.append(f"error: {error_text(step.error, MAX_ERROR)}")
    return out


def render_status(graph: ExecutionGraph, attempts: dict[str, int] | None = None) -> list[str]:
    """The lines `status` prints for `graph`; `attempts` by step (`step_attempts`), else its runs."""
    g = graph
    tries = attempts if attempts is not None else {s.name: s.runs for s in g.steps}
    head = f"execution {g.execution_id}  {g.status}" + ("  (paused)" if g.paused else "")
    lines = [head]
    fields: list[tuple[str, str]] = []
    if g.path or g.name:
        fields.append(("playbook", f"{g.path} ({g.name})" if g.path and g.name else g.path or g.name))
    if g.started_at:
        fields.append(("started", g.started_at))
    if g.finished_at:
        fields.append(("finished", g.finished_at))
    if g.duration_s is not None:
        fields.append(("duration", duration_text(g.duration_s)))
    if g.error:
        step = g.error.get("step") if isinstance(g.error, dict) else None
        fields.append(("error", (f"{step}: " if step else "") + error_text(g.error, MAX_ERROR)))
    lines += [f"  {name:<9} {value}" for name, value in fields]
    steps = sorted(g.steps, key=lambda s: (s.layer, s.order))
    if not steps:
        return lines
    firsts = []
    for i, step in enumerate(steps):
        connector = "└─" if i == len(steps) - 1 else "├─"
        firsts.append(f"{connector} {MARKS.get(step.status, '?')} {step.name}")
    width = max(len("STEP"), *(len(f) for f in firsts))
    status_width = max(len("STATUS"), *(len(s.status) for s in steps))
    lines += ["", f"  {'STEP':<{width}}  {'STATUS':<{status_width}}  {'DURATION':>8}  {'ATTEMPTS':>8}"]
    for i, (step, first) in enumerate(zip(steps, firsts, strict=True)):
        duration = duration_text(step.duration_s) if step.duration_s is not None else "-"
        lines.append(
            f"  {first:<{width}}  {step.status:<{status_width}}  {duration:>8}  {tries.get(step.name, 0):>8}".rstrip()
        )
        below = "   " if i == len(steps) - 1 else "│  "
        children = _children(step)
        for k, child in enumerate(children):
            lines.append(f"  {below}{'└─' if k == len(children) - 1 else '├─'} {child}")
    return lines
