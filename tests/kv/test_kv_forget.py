"""Removing a deadline-index key or a checkpoint leaves, once its marker's TTL has passed, no message
at all in the bucket's stream.

``KeyValue.delete``/``purge`` would publish a marker per removed key, kept forever: one per finished
execution with a deadline, one per checkpointed pipeline run. `forget_key` publishes a purge marker
with a per-message TTL: the key's values go at once, the marker after its TTL.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from noetl_stream.control.core.state import ExecutionState
from noetl_stream.kv import forget
from noetl_stream.kv.checkpoints import KvCheckpoints
from noetl_stream.kv.deadlines import DeadlineIndex
from noetl_stream.kv.forget import forget_key
from noetl_stream.kv.provision import provision
from noetl_stream.kv.snapshots import SnapshotStore
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Checkpoint


@pytest.fixture
def short_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    """Markers expire after 1 s (the server's minimum) instead of `forget.FORGET_TTL_S`."""
    monkeypatch.setattr(forget.forget_key, "__defaults__", (1,))


async def _messages_on(js: JetStreamContext, bucket: str, key: str) -> int:
    """How many messages (values or markers) the bucket's stream holds on the key's subject."""
    subject = f"$KV.{bucket}.{key}"
    info = await js.stream_info(f"KV_{bucket}", subjects_filter=subject)
    return (info.state.subjects or {}).get(subject, 0)


async def _only_the_marker(js: JetStreamContext, bucket: str, key: str) -> None:
    """The key's subject holds one message, the purge marker (every value went at once)."""
    assert await _messages_on(js, bucket, key) == 1
    last = await js.get_last_msg(f"KV_{bucket}", f"$KV.{bucket}.{key}")
    assert (last.headers or {}).get("KV-Operation") == "PURGE"
    assert not last.data


async def _nothing_left(js: JetStreamContext, bucket: str, key: str, within_s: float = 4.0) -> None:
    """The marker expires: soon the key's subject holds no message at all."""
    deadline = time.monotonic() + within_s
    while await _messages_on(js, bucket, key):
        assert time.monotonic() < deadline, f"a message is still left on {key!r} after {within_s} s"
        await asyncio.sleep(0.1)
    with pytest.raises(NotFoundError):
        await js.get_last_msg(f"KV_{bucket}", f"$KV.{bucket}.{key}")


async def test_a_removed_deadline_leaves_nothing_once_its_marker_expires(
    js: JetStreamContext, topology: Topology, short_ttl: None
) -> None:
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
    assert [e for e, _ in await index.of_partition(partition)] == ["exec-2"]  # gone at once; the other stays
    await _only_the_marker(js, bucket, key)

    await index.remove(partition, eid)  # already gone: fine
    await index.remove(partition, "never-added")
    await _nothing_left(js, bucket, key)
    await _nothing_left(js, bucket, DeadlineIndex.key(partition, "never-added"))
    assert [e for e, _ in await index.of_partition(partition)] == ["exec-2"]


async def test_an_index_made_from_a_bare_kv_forgets_too(
    js: JetStreamContext, topology: Topology, short_ttl: None
) -> None:
    """The controller builds the index from its snapshot store's KeyValue handle."""
    await provision(js, topology, ("default",))
    store = await SnapshotStore.open(js, topology, ExecutionState)
    index = DeadlineIndex(store.kv)
    await index.add(0, "e", time.time() + 60)
    await index.remove(0, "e")
    assert await index.of_partition(0) == []
    await _nothing_left(js, topology.executions_bucket, DeadlineIndex.key(0, "e"))


async def test_a_cleared_checkpoint_leaves_nothing_once_its_marker_expires(
    js: JetStreamContext, topology: Topology, short_ttl: None
) -> None:
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
    assert await checkpoints.load("run-1") is None  # at once
    await _only_the_marker(js, bucket, "exec-1.run-1")  # every revision went
    other = await checkpoints.load("run-2")
    assert other is not None and other.pc == 1

    await checkpoints.clear("run-1")  # already gone: fine
    await checkpoints.clear("never-saved")
    await _nothing_left(js, bucket, "exec-1.run-1")
    await _nothing_left(js, bucket, "exec-1.never-saved")
    assert await checkpoints.load("run-1") is None
    assert (await checkpoints.load("run-2")) == other


async def test_the_default_marker_ttl(js: JetStreamContext, topology: Topology) -> None:
    await provision(js, topology, ("default",))
    kv = await js.key_value(topology.loops_bucket)
    await kv.put("k", b"v")
    await forget_key(kv, "k")
    last = await js.get_last_msg(f"KV_{topology.loops_bucket}", f"$KV.{topology.loops_bucket}.k")
    assert (last.headers or {}).get("Nats-TTL") == str(forget.FORGET_TTL_S)


@pytest.mark.parametrize("key", ["", "a.>", "a.*", ".a", "a.", "a..b", "a b"])
async def test_an_invalid_key_never_reaches_a_subject(
    js: JetStreamContext, topology: Topology, key: str
) -> None:
    await provision(js, topology, ("default",))
    kv = await js.key_value(topology.loops_bucket)
    with pytest.raises(ValueError, match="invalid KV key"):
        await forget_key(kv, key)
    info = await js.stream_info(f"KV_{topology.loops_bucket}")
    assert info.state.messages == 0


async def test_a_ttl_under_a_second_is_refused(js: JetStreamContext, topology: Topology) -> None:
    await provision(js, topology, ("default",))
    kv = await js.key_value(topology.loops_bucket)
    with pytest.raises(ValueError, match="at least 1 s"):
        await forget_key(kv, "k", ttl_s=0.5)
