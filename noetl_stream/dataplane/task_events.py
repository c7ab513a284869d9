"""Which task events a worker writes for a scope (a step run or a loop iteration), and when.

``--task-events`` (`TASK_EVENTS`) chooses; with ``informative`` a scope's first task run's events are held
back (`TaskEvents`) until it is known whether they add anything to the scope's own events: written if
they do, dropped when the scope settles if they do not (docs/architecture.md, "Task events").
`CommandRun` (command.py) makes one `TaskEvents` per scope (`task_hook`) and settles it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from noetl_stream.dataplane.pipeline import task_run_id
from noetl_stream.dsl.model import Task
from noetl_stream.protocol import events as E
from noetl_stream.protocol.wire import now_iso

if TYPE_CHECKING:
    from noetl_stream.dataplane.command import CommandRun

TASK_EVENTS_ALL = "all"
TASK_EVENTS_SEPARATE = "separate"
TASK_EVENTS_INFORMATIVE = "informative"
TASK_EVENTS = (TASK_EVENTS_ALL, TASK_EVENTS_SEPARATE, TASK_EVENTS_INFORMATIVE)
"""Which ``task.started``/``task.done`` a worker writes, and how. ``all`` (the default): every task run's,
the spec's recommended event set; a step run that ends before its events are published sends its
``step.started`` and task events inside its boundary's message (`carried.py`). ``separate``: the same
events, each a message of its own (for consumers of ``task.*`` subjects). ``informative``: a step (or loop
iteration) whose pipeline ran one task once, which succeeded with no policy rule fired and no captured
output, writes only its step events — its task events would repeat them (docs/architecture.md, "Task
events"); carried as with ``all``."""


class TaskEvents:
    """One scope's task-event callback (a step run or a loop iteration: `CommandRun.task_hook`).

    With ``--task-events informative`` (`held` is a list) the first task run's ``task.started`` and, if
    it is plain (`_plain`), its ``task.done`` are held back with the time they happened. A second task
    run, or a first ``task.done`` that is not plain, writes them (in order) and everything after; when
    the scope ends (`settle`), they are dropped if it succeeded with that one plain run, and written
    otherwise. With ``all`` (`held` is None) every event is written as it happens."""

    __slots__ = ("held", "run", "scope_id", "started")

    def __init__(self, run: CommandRun, scope_id: str, hold: bool) -> None:
        self.run = run
        self.scope_id = scope_id
        self.held: list[tuple[str, Task, int, int, dict[str, Any], tuple[str, int]]] | None = (
            [] if hold else None
        )
        self.started = 0.0
        """When the scope's task run now running started (its tasks run one after another)."""

    def __call__(self, name: str, task: Task, run_no: int, attempt: int, payload: dict[str, Any]) -> None:
        metrics = self.run.parts.metrics
        if metrics is not None:  # every task run, whatever the events written for it
            if name == E.TASK_STARTED:
                self.started = time.monotonic()
            elif name == E.TASK_DONE:
                status = "ok" if payload.get("status") == "ok" else "error"
                metrics.task_done(task.kind, status, time.monotonic() - self.started)
        held = self.held
        if held is not None:
            first_start = name == E.TASK_STARTED and not held
            plain_done = name == E.TASK_DONE and len(held) == 1 and _plain(payload)
            if first_start or plain_done:
                held.append((name, task, run_no, attempt, payload, (now_iso(), time.time_ns())))
                return
            self.release()
        self._emit(name, task, run_no, attempt, payload, None)

    def settle(self, ok: bool) -> None:
        """The scope's pipeline ended; `ok`: it succeeded."""
        if self.held is not None and ok and len(self.held) == 2:
            self.held = None  # one task, run once, plain: step.done says it all
        self.release()

    def release(self) -> None:
        """Write what is held, in order, with the times it happened; from now on write as it happens."""
        held, self.held = self.held, None
        for name, task, run_no, attempt, payload, at in held or ():
            self._emit(name, task, run_no, attempt, payload, at)

    def _emit(
        self,
        name: str,
        task: Task,
        run_no: int,
        attempt: int,
        payload: dict[str, Any],
        at: tuple[str, int] | None,
    ) -> None:
        run_id = task_run_id(self.scope_id, task.name, run_no)
        status = (
            "in_progress"
            if name == E.TASK_STARTED
            else ("success" if payload.get("status") == "ok" else "error")
        )
        self.run.event(
            name,
            "task",
            run_id,
            status,
            run_id,
            {"task": task.name, "kind": task.kind, "attempt": attempt, **payload},
            run_id,
            at,
        )


def _plain(done: dict[str, Any]) -> bool:
    """A ``task.done`` payload that adds nothing to its step's ``step.done``: success, the default
    decision, no rule fired, no captured stdout/stderr."""
    return (
        done.get("status") == "ok"
        and done.get("do") == "continue"
        and done.get("rule") is None
        and ("output" not in done)
    )
