"""Golden replays: executions recorded by our own runs (tests/replays/, README.md there) fold to the state
the controller that ran them recorded.

Each ``<name>.jsonl`` is an execution's stored events in stream order; its controller input events
(`events.CONTROLLER_INPUT_EVENTS`) are folded with a fresh reducer, event by event with their stream
sequence, as `control.replay.replay` and resuming an execution fold them. The result must equal
``<name>.state.json``, the controller's final snapshot, field by field. Nothing is normalised but the
snapshot's ``fence`` (who wrote it, not what the events say: `replay.differences` leaves it out too);
every time in the state is an event's own timestamp, so a replay is deterministic.

A reducer change that fails this test would fold an execution recorded by an older release to another
state than the one it ran to: resuming or replaying it would go wrong. Re-recording is a decision about
the event format, not a way to make this test pass.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from noetl_stream.control.core.plans import PlanCache
from noetl_stream.control.core.reducer import Reducer
from noetl_stream.control.core.state import ExecutionState
from noetl_stream.control.replay import differences
from noetl_stream.protocol import events as E
from noetl_stream.protocol.wire import Event

REPLAYS = Path(__file__).resolve().parent.parent / "replays"
NAMES = sorted(p.name.removesuffix(".jsonl") for p in REPLAYS.glob("*.jsonl"))


def fold(name: str) -> ExecutionState | None:
    reducer = Reducer(PlanCache())
    state: ExecutionState | None = None
    for line in (REPLAYS / f"{name}.jsonl").read_text().splitlines():
        record = json.loads(line)
        event = msgspec.convert(record["event"], Event)
        if event.name in E.CONTROLLER_INPUT_EVENTS:
            state, _ = reducer.apply(state, event, record["seq"])
    return state


def test_every_case_is_recorded() -> None:
    assert {"cancel", "chain", "cycle", "failure", "loops", "pause_resume", "retry"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_a_recorded_execution_folds_to_its_recorded_state(name: str) -> None:
    recorded: dict[str, Any] = json.loads((REPLAYS / f"{name}.state.json").read_text())
    state = fold(name)
    assert state is not None
    folded: dict[str, Any] = json.loads(msgspec.json.encode(state))  # its JSON form, as a snapshot stores it
    folded.pop("fence", None)
    assert sorted(folded) == sorted(recorded), "the state's fields changed"
    for key in sorted(recorded):
        assert folded[key] == recorded[key], key
    assert differences(state, msgspec.convert(recorded, ExecutionState)) == []


def test_a_fold_without_a_clock_mints_the_same_effects_twice() -> None:
    """Without a clock (replay), what a fold mints is stamped with the folded event's timestamp."""

    def minted(name: str) -> list[bytes]:
        reducer = Reducer(PlanCache())
        state: ExecutionState | None = None
        out: list[bytes] = []
        for line in (REPLAYS / f"{name}.jsonl").read_text().splitlines():
            record = json.loads(line)
            event = msgspec.convert(record["event"], Event)
            if event.name in E.CONTROLLER_INPUT_EVENTS:
                state, fx = reducer.apply(state, event, record["seq"])
                # stamped with the folded event's time, not read from a clock (that would differ by run)
                assert {e.timestamp for e in fx.events} <= {event.timestamp}, (name, event.name)
                assert {c.issued_at for c in fx.commands} <= {event.timestamp}, (name, event.name)
                out += [msgspec.json.encode(e) for e in fx.events]
                out += [msgspec.json.encode(c) for c in fx.commands]
        return out

    for name in NAMES:
        first = minted(name)
        assert first and first == minted(name), name


CLOCKS = (
    "now_iso(",
    "time.time(",
    "time.time_ns(",
    "time.monotonic(",
    "time.perf_counter(",
    "datetime.now(",
    "datetime.datetime.now(",
    "utcnow(",
)


def test_the_reducer_reads_no_clock() -> None:
    """The pure core's modules (`control/core/`, the reducer's) take their time from the folded events or
    the clock the controller passes."""
    core = Path(__file__).resolve().parents[2] / "noetl_stream" / "control" / "core"
    modules = sorted(core.glob("*.py"))
    assert {"reducer.py", "transitions.py", "routing.py", "loops.py"} <= {m.name for m in modules}
    for module in modules:
        assert not [c for c in CLOCKS if c in module.read_text()], module.name
