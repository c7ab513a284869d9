"""`set_ctx` from step runs that overlap in time: a write that would undo another run's change to the
same key is refused (003 §6.2: conflicting parallel writes are rejected), instead of the last writer
silently winning. Pure reducer cases first (the real reducer, no NATS), then end to end."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from helpers import playbook, requested, run, step_done

from noetl_stream.control.core.plans import PlanCache
from noetl_stream.control.core.reducer import Reducer
from noetl_stream.control.core.state import ExecutionState
from noetl_stream.protocol import events as E
from noetl_stream.protocol.wire import Event
from noetl_stream.runtime.local import Runtime

FAN_OUT = playbook(
    """
    - step: start
      tool: {kind: noop}
      next:
        spec: {mode: inclusive}
        arcs: [{step: a}, {step: b}]
    - step: a
      tool: {kind: noop}
    - step: b
      tool: {kind: noop}
    """
)

CHAIN = playbook(
    """
    - step: start
      tool: {kind: noop}
      next: {arcs: [{step: a}]}
    - step: a
      tool: {kind: noop}
      next: {arcs: [{step: b}]}
    - step: b
      tool: {kind: noop}
    """
)

_seq = itertools.count(2)


def done(run_id: str, *patches: dict[str, Any]) -> Event:
    return step_done("e1", run_id, run_id.rsplit("-", 1)[0], patches)


def fold(reducer: Reducer, state: ExecutionState, event: Event) -> tuple[ExecutionState, list[Event]]:
    after, fx = reducer.apply(state, event, next(_seq))
    assert after is not None and fx.ignored is None, fx.ignored
    return after, fx.events


def start(text: str, *patches: dict[str, Any]) -> tuple[Reducer, ExecutionState]:
    reducer = Reducer(PlanCache())
    state, _ = reducer.apply(None, requested("e1", text), 1)
    assert state is not None
    state, _ = fold(reducer, state, done("start-1", *patches))
    return reducer, state


def routed(events: list[Event]) -> Event:
    (ev,) = [e for e in events if e.name == E.NEXT_EVALUATED]
    return ev


@pytest.mark.parametrize("first", ["a", "b"])
def test_the_second_of_two_parallel_appends_to_one_key_is_refused_not_lost(first: str) -> None:
    """Both branches read ``log: []`` and append their own name: applying the second would drop the first
    one's append. It is refused whichever finishes first; the execution fails naming both runs."""
    second = "b" if first == "a" else "a"
    reducer, state = start(FAN_OUT, {"log": []})
    assert set(state.runs) == {"a-1", "b-1"}
    state, events = fold(reducer, state, done(f"{first}-1", {"log": [first]}))
    assert state.ctx == {"log": [first]} and routed(events).status == "success"

    state, events = fold(reducer, state, done(f"{second}-1", {"log": [second]}))

    assert state.ctx == {"log": [first]}, "the refused write changed ctx"
    assert not [e for e in events if e.name == E.CTX_PATCHED]
    nxt = routed(events)
    assert nxt.status == "error"
    error = nxt.payload["error"]
    assert error["kind"] == "ctx_conflict" and error["key"] == "log"
    assert (error["step_run_id"], error["other_step_run_id"]) == (f"{second}-1", f"{first}-1")
    assert f"sets ctx.log, which step run '{first}-1' changed" in error["message"]
    assert state.status == "failed" and state.error is not None and state.error["kind"] == "ctx_conflict"


def test_parallel_runs_setting_different_keys_or_the_same_value_both_apply() -> None:
    reducer, state = start(FAN_OUT, {"log": []})
    state, _ = fold(reducer, state, done("a-1", {"from_a": 1, "phase": "loaded"}))
    state, events = fold(reducer, state, done("b-1", {"from_b": 2, "phase": "loaded"}))
    assert state.ctx == {"log": [], "from_a": 1, "from_b": 2, "phase": "loaded"}
    assert routed(events).status == "success"
    assert state.status == "success", state.error


def test_a_run_scheduled_after_a_write_may_overwrite_it() -> None:
    """In a chain each step starts from the ctx its predecessor left: rewriting a key is no conflict."""
    reducer, state = start(CHAIN, {"n": 1})
    state, _ = fold(reducer, state, done("a-1", {"n": 2}, {"n": 3}))
    state, events = fold(reducer, state, done("b-1", {"n": 4}))
    assert state.ctx == {"n": 4} and routed(events).status == "success"
    assert state.status == "success", state.error


def test_a_write_of_a_key_changed_before_the_run_was_scheduled_is_no_conflict() -> None:
    """The fan-out's own write (``start`` sets log) comes before a and b start: they may overwrite it."""
    reducer, state = start(FAN_OUT, {"log": ["start"]})
    state, events = fold(reducer, state, done("a-1", {"log": ["start", "a"]}))
    assert state.ctx == {"log": ["start", "a"]} and routed(events).status == "success"


RACE = playbook(
    """
    - step: start
      tool:
        kind: noop
        spec: {policy: {rules: [{else: {then: {do: continue, set_ctx: {log: []}}}}]}}
      next:
        spec: {mode: inclusive}
        arcs: [{step: a}, {step: b}]
    - step: a
      tool:
        kind: noop
        spec: {policy: {rules: [{else: {then: {do: continue, set_ctx: {KEY_A: "{{ ctx.log + ['a'] }}"}}}}]}}
      next: {arcs: [{step: join}]}
    - step: b
      tool:
        kind: noop
        spec: {policy: {rules: [{else: {then: {do: continue, set_ctx: {KEY_B: "{{ ctx.log + ['b'] }}"}}}}]}}
      next: {arcs: [{step: join}]}
    - step: join
      tool: {kind: noop}
    """
)


async def test_two_branches_appending_to_one_ctx_list_fail_the_execution_with_ctx_conflict(
    runtime: Runtime,
) -> None:
    """The probe's case: each branch appends to ``ctx.log``; one append was silently lost and the
    execution succeeded."""
    r = await run(runtime, RACE.replace("KEY_A", "log").replace("KEY_B", "log"))
    assert r.status == "failed", r.summary
    assert r.summary.error is not None and r.summary.error["kind"] == "ctx_conflict", r.summary.error
    assert r.summary.ctx["log"] in (["a"], ["b"])


async def test_two_branches_appending_to_their_own_keys_succeed(runtime: Runtime) -> None:
    r = await run(runtime, RACE.replace("KEY_A", "log_a").replace("KEY_B", "log_b"))
    assert r.status == "success", r.summary.error
    assert r.summary.ctx == {"log": [], "log_a": ["a"], "log_b": ["b"]}
