"""``noetl_executions_running`` and ``noetl_executions_finished_total`` follow the folds of the controller
that holds an execution's partition, wherever the execution started: an execution handed over (a lost
lease, a restart) is counted by its new owner and forgotten by the old one, and a completion published
by a resume (not by a fold) is counted. Pure: the real `Metrics`, events fed directly."""

from __future__ import annotations

from helpers import event
from prometheus_client import generate_latest

from noetl_stream.control.core.state import ExecutionState
from noetl_stream.control.metrics import Metrics
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology


def sample(m: Metrics, name: str, **labels: str) -> float:
    value = m.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_running_counts_only_the_executions_whose_partition_is_held_here() -> None:
    held = {"e"}
    m = Metrics(Topology())
    m.holds = lambda eid: eid in held
    running = ExecutionState(execution_id="e", file="f.yaml", path="p/a")
    m.observe(event(E.EXECUTION_REQUESTED), [event(E.REQUEST_EVALUATED, path="p/a")], running)
    assert sample(m, "noetl_executions_running") == 1

    held.clear()  # handed over: its new owner counts it from its own folds
    assert sample(m, "noetl_executions_running") == 0
    held.add("e")
    assert sample(m, "noetl_executions_running") == 0  # forgotten here until a fold here says so


def test_an_execution_taken_over_is_counted_by_its_new_owner_until_a_resume_finishes_it() -> None:
    m = Metrics(Topology())  # the new owner: it never saw the request
    state = ExecutionState(execution_id="e", file="f.yaml", path="p/a")
    m.observe(event(E.STEP_DONE, "s"), [event(E.NEXT_EVALUATED, "s")], state)
    assert sample(m, "noetl_executions_running") == 1

    state.status = "success"
    m.observe(None, [event(E.WORKFLOW_FINISHED), event(E.PLAYBOOK_PROCESSED, status="success")], state)

    assert sample(m, "noetl_executions_running") == 0
    assert sample(m, "noetl_executions_finished_total", playbook="p/a", status="success") == 1
    assert b"noetl_executions_running 0.0" in generate_latest(m.registry)
