"""A human timeline of one execution's events (``noetl-stream events ID [--follow]``).

One line per event, in stream order, columns fixed so that a followed execution lines up (under
`Timeline.HEADER`'s column names)::

    +0.000s  playbook.execution.requested
    +0.004s  step.scheduled                boom    boom-1
    +0.006s  task.done                     boom    boom-1.divide.1  error      2ms  ZeroDivisionError: ...
    +0.007s  playbook.processed                                     failed     7ms

The offset is from the first event; a duration is given where the event ends something that started
earlier (a task, a loop iteration, a step run, the execution).
"""

from __future__ import annotations

from typing import Any

from noetl_stream.protocol import events as E
from noetl_stream.protocol.errorinfo import error_text
from noetl_stream.protocol.wire import Event, epoch_of

__all__ = ["Timeline", "duration_text", "error_text"]

_STATUS = {"success": "ok", "error": "error", "skipped": "skipped", "in_progress": ""}
_STEP_END = frozenset({E.STEP_DONE, E.STEP_FAILED, E.LOOP_DONE, E.STEP_SKIPPED})
_ITERATION_END = frozenset({E.LOOP_ITERATION_DONE, E.LOOP_ITERATION_FAILED})
_EXECUTION_END = frozenset({E.PLAYBOOK_PROCESSED, E.WORKFLOW_FINISHED})
_MAX_ERROR = 160


def duration_text(seconds: float) -> str:
    """A duration as a person reads it: ``7ms``, ``1.23s``, ``2m03s``, ``1h02m``."""
    seconds = max(seconds, 0.0)
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"  # event timestamps have millisecond resolution
    if seconds < 60:
        return f"{seconds:.2f}s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def _compact(text: str, limit: int | None = _MAX_ERROR) -> str:
    text = " ".join(str(text).split())
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


class Timeline:
    """Formats events one at a time; remembers start times to give durations."""

    HEADER = "  ".join(
        [
            f"{'TIME':>9}",
            f"{'EVENT':<28}",
            f"{'STEP':<14}",
            f"{'RUN':<22}",
            f"{'STATUS':<9}",
            f"{'DURATION':>8}",
            "DETAIL",
        ]
    )
    """The column names of `line` (``events`` prints them first)."""

    def __init__(self) -> None:
        self._t0: float | None = None
        self._started: dict[str, float] = {}

    def line(self, ev: Event) -> str:
        t = epoch_of(ev.timestamp)
        if self._t0 is None and t is not None:
            self._t0 = t
        offset = f"+{t - self._t0:.3f}s" if t is not None and self._t0 is not None else "?"
        duration = self._duration(ev, t)
        status = _STATUS.get(ev.status, ev.status)
        payload: dict[str, Any] = ev.payload if isinstance(ev.payload, dict) else {}
        if ev.name in _EXECUTION_END and payload.get("status"):
            status = str(payload["status"])
        cols = [
            f"{offset:>9}",
            f"{ev.name:<28}",
            f"{ev.step or '':<14}",
            f"{self._run(ev, payload):<22}",
            f"{status:<9}",
            f"{duration:>8}",
        ]
        text = "  ".join(cols)
        extra = self._detail(ev, payload)
        return (text + "  " + extra if extra else text).rstrip()

    @staticmethod
    def _run(ev: Event, payload: dict[str, Any]) -> str:
        """Step run, task run (``<run>.<task>.<n>``, ``#attempt`` after a retry) or iteration."""
        if ev.name in (E.TASK_STARTED, E.TASK_DONE):
            run = ev.task_run_id or ev.entity_id
            attempt = payload.get("attempt")
            return f"{run}#{attempt}" if isinstance(attempt, int) and attempt > 1 else run
        if ev.entity_type == "loop" and ev.name != E.LOOP_DONE:
            return ev.entity_id
        return ev.step_run_id or ""

    def _duration(self, ev: Event, t: float | None) -> str:
        if t is None:
            return ""
        name = ev.name
        if name == E.TASK_STARTED:
            self._started[f"task:{ev.entity_id}"] = t
        elif name == E.LOOP_ITERATION_STARTED:
            self._started[f"iter:{ev.entity_id}"] = t
        elif name == E.STEP_SCHEDULED and ev.step_run_id:
            self._started.setdefault(f"step:{ev.step_run_id}", t)
        elif name == E.STEP_STARTED and ev.step_run_id:
            self._started[f"step:{ev.step_run_id}"] = t  # time on the worker, not in the queue
        key = None
        if name == E.TASK_DONE:
            key = f"task:{ev.entity_id}"
        elif name in _ITERATION_END:
            key = f"iter:{ev.entity_id}"
        elif name in _STEP_END and ev.step_run_id:
            key = f"step:{ev.step_run_id}"
        elif name in _EXECUTION_END and self._t0 is not None:
            return duration_text(t - self._t0)
        start = self._started.pop(key, None) if key else None
        return duration_text(t - start) if start is not None else ""

    @staticmethod
    def _detail(ev: Event, payload: dict[str, Any]) -> str:
        error = payload.get("error")
        if error:
            return error_text(error, _MAX_ERROR)
        name = ev.name
        if name == E.LOOP_DONE or (name == E.STEP_FAILED and "total" in payload):
            return (
                f"{payload.get('done', 0)}/{payload.get('total', 0)} done, {payload.get('failed', 0)} failed"
            )
        if name == E.LOOP_STARTED:
            return f"{payload.get('total', '?')} items"
        if name == E.NEXT_EVALUATED:
            matched = payload.get("matched")
            return "→ " + ", ".join(map(str, matched)) if matched else "→ (no arc)"
        if name == E.STEP_SKIPPED and payload.get("reason"):
            return _compact(str(payload["reason"]))
        if name in (E.TASK_STARTED, E.TASK_DONE) and payload.get("task"):
            do = payload.get("do")
            return f"{payload.get('kind')}" + (f" → {do}" if do and do != "continue" else "")
        if name == E.REQUEST_REJECTED:
            return _compact(str(payload))
        if name == E.KEYCHAIN_RESOLVED and isinstance(payload.get("entries"), list):
            return _compact(", ".join(map(str, payload["entries"])))
        return ""
