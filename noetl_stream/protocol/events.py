"""Canonical event names (001 §15, 003 §8), defined once.

Event names are dotted lower-case strings. On the wire each dot becomes a
subject token: ``noetl.events.<execution_id>.step.done``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from noetl_stream.protocol.wire import Event

# --- server (control plane) -------------------------------------------------
EXECUTION_REQUESTED: Final = "playbook.execution.requested"
REQUEST_EVALUATED: Final = "playbook.request.evaluated"
REQUEST_REJECTED: Final = "playbook.request.rejected"
WORKFLOW_STARTED: Final = "workflow.started"
STEP_SCHEDULED: Final = "step.scheduled"
STEP_SKIPPED: Final = "step.skipped"
NEXT_EVALUATED: Final = "next.evaluated"
CTX_PATCHED: Final = "ctx.patched"
LOOP_STARTED: Final = "loop.started"
WORKFLOW_FINISHED: Final = "workflow.finished"
PLAYBOOK_PROCESSED: Final = "playbook.processed"

# --- worker (data plane) ----------------------------------------------------
# (`loop.started` is written by both: the controller for a distributed loop, the worker for a local one.)
STEP_STARTED: Final = "step.started"
TASK_STARTED: Final = "task.started"
TASK_DONE: Final = "task.done"
STEP_DONE: Final = "step.done"
STEP_FAILED: Final = "step.failed"
LOOP_ITERATION_STARTED: Final = "loop.iteration.started"
LOOP_ITERATION_DONE: Final = "loop.iteration.done"
LOOP_ITERATION_FAILED: Final = "loop.iteration.failed"
LOOP_DONE: Final = "loop.done"
# The answer to a keychain check (`Command.keychain_check`): the playbook's declared keychain entries
# resolved on a worker before the workflow starts (payload ``entries``: their names), or one of them
# could not be (payload ``error``, naming the entry; never a value).
KEYCHAIN_RESOLVED: Final = "keychain.resolved"
KEYCHAIN_FAILED: Final = "keychain.failed"
KEYCHAIN_EVENTS: Final = frozenset({KEYCHAIN_RESOLVED, KEYCHAIN_FAILED})

SERVER_EVENTS: Final = frozenset(
    {
        EXECUTION_REQUESTED,
        REQUEST_EVALUATED,
        REQUEST_REJECTED,
        WORKFLOW_STARTED,
        STEP_SCHEDULED,
        STEP_SKIPPED,
        NEXT_EVALUATED,
        CTX_PATCHED,
        LOOP_STARTED,
        WORKFLOW_FINISHED,
        PLAYBOOK_PROCESSED,
    }
)
WORKER_EVENTS: Final = frozenset(
    {
        STEP_STARTED,
        TASK_STARTED,
        TASK_DONE,
        STEP_DONE,
        STEP_FAILED,
        LOOP_STARTED,
        LOOP_ITERATION_STARTED,
        LOOP_ITERATION_DONE,
        LOOP_ITERATION_FAILED,
        LOOP_DONE,
        KEYCHAIN_RESOLVED,
        KEYCHAIN_FAILED,
    }
)

# Worker events that may travel inside the message of the worker boundary written right after them
# (`carried.py`), by that boundary's name: a step run (or a loop iteration) that ends before its events
# are published sends them in its boundary's message. (The controller's own events are not carried: a
# controller of an older release resuming an execution would not see a carried effect as stored, and
# would write it again; and carrying `next.evaluated` in `step.scheduled` measured no faster.)
CARRIED_EVENTS: Final = frozenset({STEP_STARTED, TASK_STARTED, TASK_DONE})
# A local loop's iteration records, written by batches (one message per few milliseconds of iterations):
# the last iteration boundary of a batch carries the batch's earlier records, its iterations' starts and
# boundaries too. Only a local loop's: the controller folds a distributed loop's iteration boundaries, so
# those are never carried (`history.scan` reads them as stored messages).
ITERATION_EVENTS: Final = frozenset({LOOP_ITERATION_STARTED, LOOP_ITERATION_DONE, LOOP_ITERATION_FAILED})
CARRIED_BY: Final = {
    **dict.fromkeys((STEP_DONE, STEP_FAILED, LOOP_DONE), CARRIED_EVENTS),
    **dict.fromkeys((LOOP_ITERATION_DONE, LOOP_ITERATION_FAILED), CARRIED_EVENTS | ITERATION_EVENTS),
}
CARRIERS: Final = frozenset(CARRIED_BY)
MAY_BE_CARRIED: Final = frozenset().union(*CARRIED_BY.values())
"""Every name that may be stored inside another event's message (readers by name read the carriers too)."""

# Terminal boundary events of a step run: the controller evaluates `next` arcs on these.
BOUNDARY_EVENTS: Final = frozenset({STEP_DONE, STEP_FAILED, LOOP_DONE})
# How a step run ends: its boundary, or the controller skipping it.
RUN_ENDS: Final = BOUNDARY_EVENTS | {STEP_SKIPPED}

# Operator actions and timers, recorded as events and consumed by the controller.
EXECUTION_CANCEL_REQUESTED: Final = "execution.cancel.requested"
EXECUTION_PAUSE_REQUESTED: Final = "execution.pause.requested"
EXECUTION_RESUME_REQUESTED: Final = "execution.resume.requested"
EXECUTION_DEADLINE_EXCEEDED: Final = "execution.deadline.exceeded"
CONTROL_EVENTS: Final = frozenset(
    {
        EXECUTION_CANCEL_REQUESTED,
        EXECUTION_PAUSE_REQUESTED,
        EXECUTION_RESUME_REQUESTED,
        EXECUTION_DEADLINE_EXCEEDED,
    }
)
# What the controller records when it pauses or resumes an execution (informative, not inputs).
WORKFLOW_PAUSED: Final = "workflow.paused"
WORKFLOW_RESUMED: Final = "workflow.resumed"

# The events the controller's reducer folds, in stream order: the request, the answer to its keychain
# check, step boundaries (including those the controller writes itself for router steps and distributed
# loops), distributed-iteration results and operator actions. Replay folds exactly these.
CONTROLLER_INPUT_EVENTS: Final = (
    BOUNDARY_EVENTS
    | KEYCHAIN_EVENTS
    | {EXECUTION_REQUESTED, LOOP_ITERATION_DONE, LOOP_ITERATION_FAILED}
    | CONTROL_EVENTS
)

# Legacy (000) aliases of boundary names, and the canonical boundaries each stands for. They exist only
# inside legacy translation: it rewrites `event.name == 'call.done'` to a test of these names.
LEGACY_ALIASES: Final = {
    "call.done": (STEP_DONE, LOOP_DONE),
    "call.error": (STEP_FAILED,),
    "step.exit": (STEP_DONE, STEP_FAILED, LOOP_DONE),
}

ALL_EVENTS: Final = SERVER_EVENTS | WORKER_EVENTS | CONTROL_EVENTS | {WORKFLOW_PAUSED, WORKFLOW_RESUMED}


class EndedRuns:
    """The step runs of one history whose end was read. A redelivered command's second run writes events
    with ids of their own after the first run's boundary; the controller ignores them, and so must
    anything else that folds a history (`client.Tracker`, the execution graph)."""

    __slots__ = ("_ended",)

    def __init__(self) -> None:
        self._ended: set[str] = set()

    def stale(self, event: Event) -> bool:
        """Whether ``event`` comes after its step run's end (``next.evaluated``, the routing of that end,
        does not); an end is recorded as it is read."""
        run = event.step_run_id
        if not run:
            return False
        if run in self._ended:
            return event.name != NEXT_EVALUATED
        if event.name in RUN_ENDS:
            self._ended.add(run)
        return False
