"""Boundary events that name no running step run, or the wrong step, change nothing and say why (the
controller logs ``controller.event_ignored``): a late duplicate, a redelivered command's second run, or
a forged message. Pure: the real reducer, no NATS."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import playbook, requested

from noetl_stream.control.core.plans import PlanCache
from noetl_stream.control.core.reducer import Reducer
from noetl_stream.control.core.state import ExecutionState
from noetl_stream.protocol import events as E
from noetl_stream.protocol.wire import Event, now_iso

TEXT = playbook(
    """
    - step: start
      tool: {kind: noop, result: 1}
      next:
        arcs:
          - step: end
    - step: end
      tool: {kind: noop}
    """
)


def boundary(name: str, run_id: str, step: str | None = "start", **payload: Any) -> Event:
    return Event(
        event_id=f"e1:{run_id}:{name}:forged",
        execution_id="e1",
        name=name,
        source="worker",
        entity_type="step",
        entity_id=run_id,
        status="success",
        timestamp=now_iso(),
        step=step,
        step_run_id=run_id,
        payload={"result": 1, **payload},
    )


@pytest.fixture
def reducer() -> Reducer:
    return Reducer(PlanCache())


def started(reducer: Reducer) -> ExecutionState:
    state, _ = reducer.apply(None, requested("e1", TEXT), 1)
    assert state is not None and "start-1" in state.runs
    return state


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (boundary(E.STEP_DONE, "start-99"), "no step run 'start-99' was ever scheduled"),
        (boundary(E.STEP_DONE, "end-1", step="end"), "no step run 'end-1' was ever scheduled"),
        (boundary(E.STEP_DONE, "nosuch-1", step="nosuch"), "no step run 'nosuch-1' was ever scheduled"),
        (
            boundary(E.STEP_DONE, "start-1", step="end"),
            "it names step 'end', but step run 'start-1' is of step",
        ),
        (boundary(E.LOOP_DONE, "start-1"), "loop.done for step 'start', which has no loop"),
    ],
)
def test_a_boundary_of_no_running_step_run_changes_nothing_and_says_why(
    reducer: Reducer, event: Event, reason: str
) -> None:
    state = started(reducer)
    runs, results = dict(state.runs), dict(state.results)

    after, fx = reducer.apply(state, event, 2)

    assert after is state and state.runs == runs and state.results == results
    assert not fx.events and not fx.commands
    assert fx.ignored is not None and fx.ignored.startswith(reason), fx.ignored


def test_a_second_boundary_of_an_ended_run_is_told_apart_from_a_forged_one(reducer: Reducer) -> None:
    state = started(reducer)
    reducer.apply(state, boundary(E.STEP_DONE, "start-1"), 2)
    assert "end-1" in state.runs

    _, fx = reducer.apply(state, boundary(E.STEP_FAILED, "start-1"), 3)

    assert fx.ignored is not None and "has ended already" in fx.ignored and not fx.events


def test_ctx_patches_that_are_not_mappings_are_not_applied(reducer: Reducer) -> None:
    state = started(reducer)

    _, fx = reducer.apply(state, boundary(E.STEP_DONE, "start-1", ctx_patches="zz"), 2)

    assert state.ctx == {} and E.CTX_PATCHED not in [e.name for e in fx.events]
    assert fx.ignored is not None and "ctx_patches are not a list of mappings (str)" in fx.ignored
    assert "end-1" in state.runs  # the boundary itself stands: the step ended and was routed
