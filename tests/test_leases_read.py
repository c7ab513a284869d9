"""How a lease round reads the leases bucket: one batched direct get, no consumer.

A round runs every ``ttl / 4`` on every controller. It used to read the bucket through an ephemeral
consumer (created, read, deleted: on a cluster each creation is a proposal to the meta group, several
a second with a few controllers) plus one get per partition. Now it is one request. A bucket
provisioned before it allowed direct gets is still read, through a consumer."""

from __future__ import annotations

import asyncio

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from noetl_stream.control.leases import Leases
from noetl_stream.kv.provision import provision
from noetl_stream.subjects import Topology

TTL_S = 2.0


async def _topo(js: JetStreamContext, topology: Topology, partitions: int) -> Topology:
    t = msgspec.structs.replace(topology, partitions=partitions, lease_ttl_s=TTL_S)
    await provision(js, t)
    return t


class Creations:
    """Consumer-create requests on a stream, seen on the JetStream API subjects."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def note(self, msg: Msg) -> None:
        self.seen.append(msg.subject)


def _leases(nc: NATS, t: Topology, name: str) -> Leases:
    async def on_acquire(p: int, fence: int) -> None:
        pass

    async def on_release(p: int, graceful: bool) -> None:
        pass

    return Leases(nc, t, t.partitions, name, on_acquire, on_release)


async def test_lease_rounds_create_no_consumer(nc: NATS, js: JetStreamContext, topology: Topology) -> None:
    t = await _topo(js, topology, 4)
    stream = f"KV_{t.leases_bucket}"
    assert (await js.stream_info(stream)).config.allow_direct
    created = Creations()
    sub = await nc.subscribe(f"$JS.API.CONSUMER.CREATE.{stream}.>", cb=created.note)
    sub2 = await nc.subscribe(f"$JS.API.CONSUMER.CREATE.{stream}", cb=created.note)
    a, b = _leases(nc, t, "ctl-a"), _leases(nc, t, "ctl-b")
    await a.start()
    await b.start()
    try:
        await asyncio.sleep(1.5 * TTL_S)  # about six rounds each
        assert sorted([*a.owned, *b.owned]) == [0, 1, 2, 3] and len(a.owned) == len(b.owned) == 2
        assert created.seen == []
    finally:
        await b.stop()
        await a.stop()
        await sub.unsubscribe()
        await sub2.unsubscribe()


async def test_a_bucket_without_direct_gets_is_read_through_a_consumer(
    nc: NATS, js: JetStreamContext, topology: Topology
) -> None:
    """A leases bucket provisioned by an earlier version (no direct gets): the rounds still see every
    member and owner, so two controllers share the partitions and never hold one twice."""
    t = await _topo(js, topology, 4)
    stream = f"KV_{t.leases_bucket}"
    config = (await js.stream_info(stream)).config
    config.allow_direct = False
    await js.update_stream(config)
    created = Creations()
    sub = await nc.subscribe(f"$JS.API.CONSUMER.CREATE.{stream}.>", cb=created.note)
    a, b = _leases(nc, t, "ctl-a"), _leases(nc, t, "ctl-b")
    await a.start()
    await b.start()
    try:
        await asyncio.sleep(1.5 * TTL_S)
        assert sorted([*a.owned, *b.owned]) == [0, 1, 2, 3] and len(a.owned) == len(b.owned) == 2
        assert created.seen, "the rounds read through consumers"
    finally:
        await b.stop()
        await a.stop()
        await sub.unsubscribe()
