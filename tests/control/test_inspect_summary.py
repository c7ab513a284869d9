"""What `status` says of the steps of an execution read from its snapshot: a run still in progress
when the execution ended (cancelled, failed, past its deadline) was stopped, and says so, as the
execution graph does (it read ``scheduled`` for ever)."""

from __future__ import annotations

import pytest

from noetl_stream.control.core.state import ExecutionState, StepRun
from noetl_stream.control.inspect import summarize


@pytest.mark.parametrize("status", ["cancelled", "failed"])
def test_a_run_in_progress_when_the_execution_ended_reads_cancelled(status: str) -> None:
    state = ExecutionState(
        execution_id="e1",
        status=status,  # type: ignore[arg-type]
        step_status={"start": "done"},
        runs={"fetch-1": StepRun(step="fetch", run_id="fetch-1", status="scheduled")},
    )
    assert summarize(state).steps == {"start": "done", "fetch": "cancelled"}


def test_a_run_in_progress_of_a_running_execution_keeps_its_status() -> None:
    state = ExecutionState(
        execution_id="e1", runs={"fetch-1": StepRun(step="fetch", run_id="fetch-1", status="looping")}
    )
    assert summarize(state).steps == {"fetch": "looping"}
