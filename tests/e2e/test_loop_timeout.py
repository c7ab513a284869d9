"""A step's ``lifecycle.timeout_s`` bounds its whole loop whether the loop runs ``exec: local`` (one
command) or ``exec: distributed`` (a command per iteration): it bounded each distributed iteration
instead, so a distributed loop of six 0.4 s iterations with a 1 s timeout succeeded in 2.4 s."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from helpers import playbook, requested, run

from noetl_stream.control.core.plans import PlanCache
from noetl_stream.control.core.reducer import Reducer
from noetl_stream.control.core.state import ExecutionState
from noetl_stream.protocol import events as E
from noetl_stream.protocol.wire import Command, Event
from noetl_stream.runtime.local import Runtime

LOOP = """
    - step: start
      spec: {policy: {lifecycle: {timeout_s: TIMEOUT}}}
      loop:
        in: "{{ ITEMS }}"
        iterator: x
        spec: {mode: MODE, max_in_flight: 3, policy: {exec: EXEC}}
      tool:
        - name: t
          kind: python
          args: {x: "{{ iter.x }}"}
          code: |
            import time
            time.sleep(x)
            result = x
    """


def looping(exec_: str, mode: str, timeout: float, items: list[float]) -> str:
    text = LOOP.replace("TIMEOUT", str(timeout)).replace("ITEMS", str(items))
    return playbook(text.replace("MODE", mode).replace("EXEC", exec_))


@pytest.mark.parametrize("exec_", ["local", "distributed"])
async def test_a_sequential_loop_longer_than_its_step_timeout_fails_with_timeout(
    runtime: Runtime, exec_: str
) -> None:
    r = await run(runtime, looping(exec_, "sequential", 1.0, [0.4] * 6))
    assert r.status == "failed", r.summary
    error = r.summary.error
    assert error is not None and error["kind"] == "timeout", error
    assert "ran longer than its lifecycle.timeout_s (1.0 s)" in error["message"]
    ran = r.named(E.LOOP_ITERATION_DONE, E.LOOP_ITERATION_FAILED) if exec_ == "distributed" else []
    assert len(ran) <= 3, [e.payload for e in ran]


async def test_a_parallel_distributed_loop_of_short_iterations_past_its_step_timeout_fails(
    runtime: Runtime,
) -> None:
    """Each iteration (0.6 s) is within the 1 s limit; three waves of two are not. Best effort lets
    iterations fail; the step's time limit still fails the step."""
    text = looping("distributed", "parallel", 1.0, [0.6] * 6).replace(
        "max_in_flight: 3", "max_in_flight: 2, failure_mode: best_effort"
    )
    r = await run(runtime, text)
    assert r.status == "failed", r.summary
    assert r.summary.error is not None and r.summary.error["kind"] == "timeout", r.summary.error
    assert len(r.named(E.LOOP_ITERATION_DONE)) < 6


@pytest.mark.parametrize("exec_", ["local", "distributed"])
async def test_a_loop_within_its_step_timeout_succeeds(runtime: Runtime, exec_: str) -> None:
    r = await run(runtime, looping(exec_, "sequential", 30.0, [0, 0, 0]))
    assert r.status == "success", r.summary.error
    assert r.result == [0, 0, 0]


# --- the reducer alone: each iteration command gets the time the loop has left -----------------------

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def at(seconds: float) -> str:
    return (T0 + datetime.timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def iteration(index: int, seconds: float) -> Event:
    return Event(
        event_id=f"e1:start-1.{index}:{E.LOOP_ITERATION_DONE}:1",
        execution_id="e1",
        name=E.LOOP_ITERATION_DONE,
        source="worker",
        entity_type="iteration",
        entity_id=f"start-1.{index}",
        status="success",
        timestamp=at(seconds),
        payload={"index": index, "result": index},
        step="start",
        step_run_id="start-1",
    )


def fold(
    reducer: Reducer, state: ExecutionState, event: Event, seq: int
) -> tuple[list[Command], list[Event]]:
    after, fx = reducer.apply(state, event, seq)
    assert after is state
    return fx.commands, fx.events


def test_each_iteration_command_is_given_what_is_left_of_the_loops_time() -> None:
    reducer = Reducer(PlanCache())
    start: Any = requested("e1", looping("distributed", "sequential", 10.0, [1, 1, 1]))
    start.timestamp = at(0)
    state, fx = reducer.apply(None, start, 1)
    assert state is not None
    (first,) = fx.commands
    assert first.timeout_s == 10.0

    commands, _ = fold(reducer, state, iteration(0, 4.0), 2)
    (second,) = commands
    assert second.timeout_s == pytest.approx(6.0)

    commands, events = fold(reducer, state, iteration(1, 10.5), 3)  # past the loop's deadline
    assert commands == []
    (failed,) = [e for e in events if e.name == E.STEP_FAILED]
    assert failed.payload["error"]["kind"] == "timeout"
    assert (failed.payload["done"], failed.payload["total"]) == (2, 3)
