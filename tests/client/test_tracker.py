"""What `status`, `run` and `submit --wait` show of an execution, folded from its events (no server)."""

from __future__ import annotations

from helpers import event

from noetl_stream.client.tracking import Tracker
from noetl_stream.protocol import events as E


def test_a_step_whose_command_waits_shows_as_scheduled_then_running() -> None:
    t = Tracker("e")
    t.apply(event(E.STEP_SCHEDULED, "g", "in_progress"))
    assert t.summary.steps["g"].status == "scheduled"
    t.apply(event(E.STEP_STARTED, "g", "in_progress"))
    assert t.summary.steps["g"].status == "running"


def test_events_a_task_wrote_after_the_end_do_not_change_the_outcome() -> None:
    t = Tracker("e")
    t.apply(event(E.STEP_SCHEDULED, "charge", "in_progress"))
    t.apply(event(E.PLAYBOOK_PROCESSED, None, "error", **{"status": "cancelled"}))
    t.apply(event(E.STEP_STARTED, "charge", "in_progress"))
    t.apply(event(E.STEP_DONE, "charge"))
    t.apply(event(E.CTX_PATCHED, patches=[{"late": 1}]))
    assert t.summary.status == "cancelled"
    assert t.summary.steps["charge"].status == "cancelled" and t.summary.ctx == {}


def test_a_step_still_running_when_the_execution_ends_shows_as_cancelled() -> None:
    """As the execution graph says (status showed the interrupted step as running for ever)."""
    t = Tracker("e")
    t.apply(event(E.STEP_DONE, "start"))
    t.apply(event(E.STEP_STARTED, "slow", "in_progress"))
    t.apply(event(E.PLAYBOOK_PROCESSED, None, "error", **{"status": "failed"}))
    assert {name: step.status for name, step in t.summary.steps.items()} == {
        "start": "done",
        "slow": "cancelled",
    }


def test_a_retry_shows_the_ctx_it_resumed_with_and_what_it_added() -> None:
    t = Tracker("e")
    t.apply(event(E.EXECUTION_REQUESTED, request={"resume": {"execution_id": "old", "ctx": {"sq": 81}}}))
    t.apply(event(E.CTX_PATCHED, patches=[{"more": 1}]))
    assert t.summary.ctx == {"sq": 81, "more": 1}


def test_a_paused_execution_shows_as_paused_until_it_is_resumed() -> None:
    t = Tracker("e")
    t.apply(event(E.WORKFLOW_PAUSED, None, "in_progress"))
    assert t.summary.status == "paused"
    t.apply(event(E.WORKFLOW_RESUMED, None, "in_progress"))
    assert t.summary.status == "running"


def test_a_redelivered_run_after_the_boundary_does_not_change_the_step() -> None:
    """A worker wrote step.done and died before acking: the command is redelivered and its second run's
    events (ids of their own) come after the boundary the controller already routed on."""
    t = Tracker("e")
    t.apply(event(E.STEP_STARTED, "g", "in_progress"))
    t.apply(event(E.STEP_DONE, "g"))
    t.apply(event(E.STEP_STARTED, "g", "in_progress", delivery=2))
    t.apply(event(E.STEP_FAILED, "g", "error", error={"kind": "boom"}))
    assert t.summary.steps["g"].status == "done" and t.summary.steps["g"].runs == 1
