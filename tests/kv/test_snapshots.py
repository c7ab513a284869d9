"""Snapshots above the KV value limit live in the object store behind a pointer (real server)."""

from __future__ import annotations

import pytest
from nats.js import JetStreamContext

from noetl_stream.control.core.state import ExecutionState
from noetl_stream.errors import StateConflictError
from noetl_stream.kv.provision import provision
from noetl_stream.kv.snapshots import SnapshotStore
from noetl_stream.protocol.subjects import Topology


def _big(eid: str, n: int, last_seq: int) -> ExecutionState:
    """A state with a large ctx: well above the 1 MiB message limit for 100k rows."""
    return ExecutionState(execution_id=eid, ctx={"rows": [{"value": i} for i in range(n)]}, last_seq=last_seq)


async def _objects(js: JetStreamContext, topology: Topology) -> list[str]:
    """Every object name in the store, deleted-object markers included (a replaced snapshot's object
    leaves none: nothing of it stays in the stream)."""
    store = await js.object_store(topology.results_store)
    try:
        return sorted(o.name for o in await store.list())
    except Exception:  # nats-py raises when the bucket is empty
        return []


async def test_a_large_snapshot_round_trips_and_its_replaced_object_is_deleted(
    js: JetStreamContext, topology: Topology
) -> None:
    await provision(js, topology)
    store = await SnapshotStore.open(js, topology, ExecutionState)
    eid = "bigsnapshot1"
    first = _big(eid, 100_000, last_seq=10)
    await store.put(eid, first)
    entry = await (await js.key_value(topology.executions_bucket)).get(eid)
    assert entry.value is not None and entry.value.startswith(b'{"$snapshot":') and len(entry.value) < 400
    reader = await SnapshotStore.open(js, topology, ExecutionState)
    assert await reader.get(eid) == first
    (only,) = await _objects(js, topology)

    second = _big(eid, 100_000, last_seq=20)
    await store.put(eid, second)
    assert await reader.get(eid) == second
    (now,) = await _objects(js, topology)
    assert now != only  # a new object per write, the replaced one deleted

    small = ExecutionState(execution_id=eid, last_seq=30)  # back under the limit: inline again
    await store.put(eid, small)
    assert await reader.get(eid) == small
    assert await _objects(js, topology) == []


async def test_a_fenced_writer_of_a_large_snapshot_changes_nothing(
    js: JetStreamContext, topology: Topology
) -> None:
    """Compare-and-set stays on the KV key: a writer that lost the race leaves the owner's snapshot (and
    its object) as they are, and removes the object it uploaded."""
    await provision(js, topology)
    eid = "bigsnapshot2"
    old = await SnapshotStore.open(js, topology, ExecutionState)
    await old.put(eid, _big(eid, 100_000, last_seq=10))
    new = await SnapshotStore.open(js, topology, ExecutionState)
    await new.get(eid)
    owners = _big(eid, 100_000, last_seq=20)
    await new.put(eid, owners)
    (owners_object,) = await _objects(js, topology)
    with pytest.raises(StateConflictError):
        await old.put(eid, _big(eid, 100_000, last_seq=15))
    assert await _objects(js, topology) == [owners_object]
    assert await (await SnapshotStore.open(js, topology, ExecutionState)).get(eid) == owners


async def test_inspection_reads_a_large_snapshot_through_its_pointer_and_skips_an_unreadable_one(
    js: JetStreamContext, topology: Topology
) -> None:
    """`status`, `ctx` and the execution list of an execution the controller does not hold read its
    snapshot; one above the KV limit is a pointer to its object (they raised on it, and the list left
    the execution out). A value that is not a snapshot is skipped, not a failure of the whole list."""
    from noetl_stream.control.inspect import Inspector
    from noetl_stream.protocol.operations import ListExecutions

    await provision(js, topology)
    store = await SnapshotStore.open(js, topology, ExecutionState)
    big = _big("bigsnapshot2", 100_000, last_seq=7)
    big.status = "success"
    await store.put(big.execution_id, big)
    kv = await js.key_value(topology.executions_bucket)
    await kv.put("notasnapshot", b"{garbage")
    inspector = Inspector(js, topology)

    status = await inspector.status(big.execution_id)
    assert status is not None and (status.status, status.source, status.last_seq) == (
        "success",
        "snapshot",
        7,
    )
    ctx = await inspector.ctx(big.execution_id)
    assert ctx is not None and len(ctx.ctx["rows"]) == 100_000
    listed = await inspector.executions(ListExecutions())
    assert [s.execution_id for s in listed.items] == [big.execution_id]
    assert await inspector.status("notasnapshot") is None  # nothing in the stream either
