"""Replay: fold an execution's stored input events with the controller's reducer.

The state a replay produces must equal the controller's live projection (its snapshot):
``verify`` compares them field by field.
"""

from __future__ import annotations

from typing import Any

import msgspec
from nats.js.client import JetStreamContext

from noetl_stream.control.core.plans import PlanCache
from noetl_stream.control.core.reducer import Reducer
from noetl_stream.control.core.state import ExecutionState
from noetl_stream.kv.history import read_events
from noetl_stream.kv.snapshots import SnapshotStore
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology


async def replay(
    js: JetStreamContext,
    topology: Topology,
    execution_id: str,
    *,
    until_seq: int | None = None,
    until_time: str | None = None,
    reducer: Reducer | None = None,
) -> ExecutionState | None:
    """The state after folding the input events up to ``until_seq`` (inclusive) or ``until_time``."""
    reducer = reducer or Reducer(PlanCache())
    state: ExecutionState | None = None
    before = until_seq + 1 if until_seq is not None else None
    async for seq, event in read_events(
        js, topology, execution_id, names=E.CONTROLLER_INPUT_EVENTS, before_seq=before
    ):
        if until_time is not None and event.timestamp > until_time:
            break
        state, _ = reducer.apply(state, event, seq)
    return state


_NOT_FOLDED = frozenset({"fence"})
"""Snapshot fields that record who wrote the snapshot, not what the events say."""


def differences(a: ExecutionState | None, b: ExecutionState | None) -> list[str]:
    """Human-readable field differences between two states (empty when equal)."""
    if a is None or b is None:
        return [] if a is b else [f"one state is missing (replayed={a is not None}, live={b is not None})"]
    da: dict[str, Any] = msgspec.to_builtins(a)
    db: dict[str, Any] = msgspec.to_builtins(b)
    out = []
    for key in sorted((set(da) | set(db)) - _NOT_FOLDED):
        if da.get(key) != db.get(key):
            out.append(f"{key}: replayed={da.get(key)!r} live={db.get(key)!r}")
    return out


async def verify(
    js: JetStreamContext, topology: Topology, execution_id: str
) -> tuple[list[str], ExecutionState | None]:
    """Replay up to the live snapshot's sequence and compare. Returns (differences, live state)."""
    store = await SnapshotStore.open(js, topology, ExecutionState)
    live = await store.get(execution_id)
    if live is None:
        return [f"no live snapshot for execution {execution_id}"], None
    replayed = await replay(js, topology, execution_id, until_seq=live.last_seq)
    return differences(replayed, live), live
