"""The reducer's own failures: a bug (here: a state that disagrees with its playbook, as a hand-edited or
corrupt snapshot would) fails the execution with ``internal_error`` instead of raising, the same way live,
on resume and in replay; only "load it first" is raised. Pure: the real reducer, no NATS."""

from __future__ import annotations

import msgspec
import pytest
from helpers import playbook, requested

from noetl_stream.control.core.plans import PlanCache
from noetl_stream.control.core.reducer import NotLoadedError, Reducer
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


def start_done(execution_id: str = "e1") -> Event:
    return Event(
        event_id=f"{execution_id}:start-1:step.done",
        execution_id=execution_id,
        name=E.STEP_DONE,
        source="worker",
        entity_type="step",
        entity_id="start",
        status="success",
        timestamp=now_iso(),
        step_run_id="start-1",
        payload={"result": 1},
    )


def started(reducer: Reducer) -> ExecutionState:
    state, _ = reducer.apply(None, requested("e1", TEXT), 1)
    assert state is not None and state.status == "running" and "start-1" in state.runs
    return state


def test_a_bug_in_the_fold_fails_the_execution_instead_of_raising() -> None:
    """A KeyError is a LookupError: the controller took it for "not loaded yet" and redelivered the
    event forever, the execution never ending."""
    reducer = Reducer(PlanCache())
    state = started(reducer)
    state.runs["start-1"].step = "ghost"  # a snapshot that disagrees with its playbook

    after, fx = reducer.apply(state, start_done(), 2)

    assert after is not None and after.status == "failed" and after.terminal
    assert after.error == {"kind": "internal_error", "message": "KeyError: 'ghost'"}
    assert [ev.name for ev in fx.events] == [E.WORKFLOW_FINISHED, E.PLAYBOOK_PROCESSED]
    assert isinstance(fx.error, KeyError)
    assert after.last_seq == 2
    again, fx_again = reducer.apply(after, start_done(), 3)  # a terminal execution folds nothing more
    assert again is after and not fx_again.events


def test_replaying_the_same_events_gives_the_same_failure() -> None:
    live, replayed = Reducer(PlanCache()), Reducer(PlanCache())
    request, done = requested("e1", TEXT), start_done()  # the same events (and times) for both
    results = []
    for reducer in (live, replayed):
        state, _ = reducer.apply(None, request, 1)
        assert state is not None
        state.runs["start-1"].step = "ghost"
        after, _ = reducer.apply(state, done, 2)
        results.append(msgspec.json.encode(after))
    assert results[0] == results[1]


def test_a_playbook_not_loaded_is_still_raised_so_the_event_comes_back() -> None:
    state = started(Reducer(PlanCache()))
    with pytest.raises(NotLoadedError):
        Reducer(PlanCache()).apply(state, start_done(), 2)  # another reducer: its cache is empty
