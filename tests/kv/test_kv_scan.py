"""Reading a bucket to its end (`noetl_stream.kv.scan`), against a real nats-server.

nats-py's ``KeyValue.watchall``/``keys`` may say "no more" before the first value when the server pushed
every value before it read its consumer's info (a few percent of reads with a few hundred keys): the
runtime's readers of whole buckets (deadlines on takeover, leases, the executions list, the catalog, the
keychain, prune) go through `scan`, whose pull consumer counts exactly what is left."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.kv import KeyValue

from noetl_stream.kv import scan
from noetl_stream.kv.deadlines import DeadlineIndex
from noetl_stream.kv.provision import provision
from noetl_stream.protocol.subjects import Topology


@pytest.fixture
async def kv(js: JetStreamContext) -> AsyncIterator[KeyValue]:
    bucket = f"scan_{uuid.uuid4().hex[:8]}"
    yield await js.create_key_value(KeyValueConfig(bucket=bucket, history=3))
    await js.delete_key_value(bucket)


async def consumers(js: JetStreamContext, kv: KeyValue) -> int:
    return (await js.stream_info(kv._stream)).state.consumer_count


async def fill(kv: KeyValue, live: int, gone: int) -> dict[str, bytes]:
    """`live` keys ``k.<i>`` with a value (every third one written twice), then `gone` more deleted
    and `gone` more purged; returns the keys that have a value, with their last values."""
    for i in range(live + 2 * gone):
        await kv.put(f"k.{i}", b"first")
        if i % 3 == 0:
            await kv.put(f"k.{i}", f"v{i}".encode())
    for i in range(live, live + gone):
        await kv.delete(f"k.{i}")
    for i in range(live + gone, live + 2 * gone):
        await kv.purge(f"k.{i}")
    return {f"k.{i}": (f"v{i}" if i % 3 == 0 else "first").encode() for i in range(live)}


async def test_every_key_with_a_value_is_read_every_time(js: JetStreamContext, kv: KeyValue) -> None:
    """600 keys written (some twice), 50 deleted and 50 purged: each of 20 reads in a row gives exactly
    the 500 that have a value, with their last values, and leaves no consumer behind."""
    expected = await fill(kv, 500, gone=50)

    for _ in range(20):
        assert sorted(await scan.keys(kv)) == sorted(expected)
        read = {e.key: e.value async for e in scan.entries(kv)}
        assert read == expected
    assert await consumers(js, kv) == 0


async def test_a_key_filter_reads_only_its_keys(js: JetStreamContext, kv: KeyValue) -> None:
    for p in range(3):
        for i in range(40):
            await kv.put(f"deadline.{p}.e{i}", b"{}")
    assert sorted(await scan.keys(kv, "deadline.1.*")) == sorted(f"deadline.1.e{i}" for i in range(40))
    entries = [e async for e in scan.entries(kv, "deadline.2.*")]
    assert {e.key for e in entries} == {f"deadline.2.e{i}" for i in range(40)}
    assert all(e.revision > 0 and e.created.tzinfo is not None for e in entries)


async def test_an_empty_bucket_reads_as_empty(js: JetStreamContext, kv: KeyValue) -> None:
    assert await scan.keys(kv) == []
    await kv.put("gone", b"x")
    await kv.delete("gone")
    assert await scan.keys(kv) == []
    assert [e async for e in scan.entries(kv)] == []
    assert await consumers(js, kv) == 0


async def test_a_read_left_early_removes_its_consumer(js: JetStreamContext, kv: KeyValue) -> None:
    for i in range(300):
        await kv.put(f"k.{i}", b"v")
    async with contextlib.aclosing(scan.entries(kv, batch=16)) as entries:
        async for _ in entries:
            break
    assert await consumers(js, kv) == 0


async def test_a_partitions_deadlines_are_all_found_every_time(
    js: JetStreamContext, topology: Topology
) -> None:
    """What a controller taking over a partition reads: every indexed execution of the partition."""
    await provision(js, topology, ("default",))
    index = await DeadlineIndex.open(js, topology)
    for i in range(400):
        await index.add(i % 4, f"exec-{i}", 1_000_000.0 + i)
    for _ in range(10):
        found = await index.of_partition(2)
        assert sorted(found) == sorted((f"exec-{i}", 1_000_000.0 + i) for i in range(2, 400, 4))


# --- one batched direct get (`direct_entries`): the leases' round, without a consumer ---------------


@pytest.fixture
async def direct_kv(js: JetStreamContext) -> AsyncIterator[KeyValue]:
    bucket = f"direct_{uuid.uuid4().hex[:8]}"
    yield await js.create_key_value(KeyValueConfig(bucket=bucket, history=1, direct=True))
    await js.delete_key_value(bucket)


async def test_a_direct_read_gives_what_a_consumer_read_gives_without_a_consumer(
    js: JetStreamContext, direct_kv: KeyValue
) -> None:
    kv = direct_kv
    await fill(kv, 200, gone=50)
    await kv.put("other.x", b"o")
    for _ in range(10):
        direct = await scan.direct_entries(kv)
        assert direct is not None
        by_consumer = [e async for e in scan.entries(kv)]
        assert sorted((e.key, e.value, e.revision) for e in direct) == sorted(
            (e.key, e.value, e.revision) for e in by_consumer
        )
        assert len(direct) == 201
        assert all(e.created.year >= 2024 and e.created.tzinfo is not None for e in direct)
    filtered = await scan.direct_entries(kv, "k.*")
    assert filtered is not None and len(filtered) == 200
    assert {e.revision for e in filtered} == {(await kv.get(e.key)).revision for e in filtered}
    assert await consumers(js, kv) == 0


async def test_a_direct_read_of_an_empty_bucket_or_filter_is_empty(direct_kv: KeyValue) -> None:
    assert await scan.direct_entries(direct_kv) == []
    await direct_kv.put("a.1", b"x")
    await direct_kv.delete("a.1")
    assert await scan.direct_entries(direct_kv) == []
    assert await scan.direct_entries(direct_kv, "b.>") == []


async def test_a_direct_read_the_server_cannot_answer_whole_is_none(
    js: JetStreamContext, kv: KeyValue, direct_kv: KeyValue
) -> None:
    """A bucket without direct gets (`kv`), or more keys than one batch holds (1,024): None, so the
    caller reads through a consumer instead; never a partial answer."""
    await kv.put("a", b"x")
    assert await scan.direct_entries(kv) is None
    for i in range(1025):
        await direct_kv.put(f"k.{i}", b"x")
    for i in range(3):
        await direct_kv.put(f"few.{i}", b"x")
    assert await scan.direct_entries(direct_kv) is None
    assert sorted(e.key for e in await scan.direct_entries(direct_kv, "few.>") or []) == [
        "few.0",
        "few.1",
        "few.2",
    ]
