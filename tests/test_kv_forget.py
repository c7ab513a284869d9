"""Removing a deadline-index key or a checkpoint leaves no message at all in the bucket's stream.

``KeyValue.delete``/``purge`` would publish a marker per removed key, kept forever: one per finished
execution with a deadline, one per checkpointed pipeline run.
"""

from __future__ import annotations

import time

import pytest
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from noetl_stream.control.state import ExecutionState
from noetl_stream.kv.checkpoints import KvCheckpoints
from noetl_stream.kv.deadlines import DeadlineIndex
from noetl_stream.kv.forget import forget_key
from noetl_stream.kv.provision import provision
from noetl_stream.kv.snapshots import SnapshotStore
from noetl_stream.subjects import Topology
from noetl_stream.wire import Checkpoint


async def _messages_on(js: JetStreamContext, bucket: str, key: str) -> int:
    """How many messages (values or markers) the bucket's stream holds on the key's subject."""
    subject = f"$KV.{bucket}.{key}"
    info = await js.stream_info(f"KV_{bucket}", subjects_filter=subject)
    return (info.state.subjects or {}).get(subject, 0)


async def _assert_no_message(js: JetStreamContext, bucket: str, key: str) -> None:
    assert await _messages_on(js, bucket, key) == 0
    with pytest.raises(NotFoundError):
        await js.get_last_msg(f"KV_{bucket}", f"$KV.{bucket}.{key}")


async def test_a_removed_deadline_leaves_no_marker(js: JetStreamContext, topology: Topology) -> None:
    await provision(js, topology, ("default",))
    bucket = topology.executions_bucket
    index = await DeadlineIndex.open(js, topology)
    eid, partition = "exec-1", 3
    key = DeadlineIndex.key(partition, eid)
    await index.add(partition, eid, time.time() + 60)
    await index.add(partition, "exec-2", time.time() + 60)
    assert await _messages_on(js, bucket, key) == 1
    assert eid in dict(await index.of_partition(partition))

    await index.remove(partition, eid)
    await _assert_no_message(js, bucket, key)
    assert [e for e, _ in await index.of_partition(partition)] == ["exec-2"]  # the other key stays

    await index.remove(partition, eid)  # already gone: fine
    await index.remove(partition, "never-added")
    await _assert_no_message(js, bucket, DeadlineIndex.key(partition, "never-added"))


async def test_an_index_made_from_a_bare_kv_forgets_too(js: JetStreamContext, topology: Topology) -> None:
    """The controller builds the index from its snapshot store's KeyValue handle."""
    await provision(js, topology, ("default",))
    store = await SnapshotStore.open(js, topology, ExecutionState)
    index = DeadlineIndex(store.kv)
    assert index.bucket == topology.executions_bucket
    await index.add(0, "e", time.time() + 60)
    await index.remove(0, "e")
    await _assert_no_message(js, topology.executions_bucket, DeadlineIndex.key(0, "e"))
    assert await index.of_partition(0) == []


async def test_a_cleared_checkpoint_leaves_no_marker(js: JetStreamContext, topology: Topology) -> None:
    await provision(js, topology, ("default",))
    bucket = topology.loops_bucket
    checkpoints = KvCheckpoints(js, topology, "exec-1")
    await checkpoints.save("run-1", Checkpoint(pc=1))
    await checkpoints.save("run-1", Checkpoint(pc=2, iter={"page": 2}))
    await checkpoints.save("run-2", Checkpoint(pc=1))
    loaded = await checkpoints.load("run-1")
    assert loaded is not None and loaded.pc == 2
    assert await _messages_on(js, bucket, "exec-1.run-1") >= 1

    await checkpoints.clear("run-1")
    await _assert_no_message(js, bucket, "exec-1.run-1")  # every revision went, and no purge marker
    assert await checkpoints.load("run-1") is None
    other = await checkpoints.load("run-2")
    assert other is not None and other.pc == 1

    await checkpoints.clear("run-1")  # already gone: fine
    await checkpoints.clear("never-saved")
    await _assert_no_message(js, bucket, "exec-1.never-saved")


@pytest.mark.parametrize("key", ["", "a.>", "a.*", ".a", "a.", "a..b", "a b"])
async def test_an_invalid_key_never_reaches_a_subject(js: JetStreamContext, key: str) -> None:
    with pytest.raises(ValueError):
        await forget_key(js, "bucket", key)


@pytest.mark.parametrize("bucket", ["", "a.b", "a*", "a>"])
async def test_an_invalid_bucket_never_reaches_a_subject(js: JetStreamContext, bucket: str) -> None:
    with pytest.raises(ValueError):
        await forget_key(js, bucket, "key")
