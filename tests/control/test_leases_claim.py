"""A controller id is claimed once (a refused duplicate leaves the member key alone, three processes
with one id started together run one, a halted duplicate leaves the id, a lingering subscription of a
dead process does not hold it), and how a lease round reads the leases bucket."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from noetl_stream.control.leases import DuplicateControllerError, Leases, LeaseValue
from noetl_stream.jetstream.connection import connect
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.provision import provision
from noetl_stream.protocol.subjects import Topology


async def _noop(*_: Any) -> None:
    pass


async def _topo(js: JetStreamContext, topology: Topology, partitions: int = 2, ttl: float = 4.0) -> Topology:
    t = msgspec.structs.replace(topology, partitions=partitions, lease_ttl_s=ttl)
    await provision(js, t)
    return t


async def test_a_refused_duplicate_leaves_the_live_controllers_member_key(
    nc: NATS, js: JetStreamContext, topology: Topology
) -> None:
    """`Controller.start` stops its leases when their start fails: the refused one deleted the member
    key of the live one (other controllers then stopped counting it, and recomputed their shares)."""
    t = await _topo(js, topology)
    kv = await js.key_value(t.leases_bucket)
    a = Leases(nc, t, 2, "same", _noop, _noop)
    await a.start()
    try:
        before = await kv.get("member.same")
        b = Leases(nc, t, 2, "same", _noop, _noop)
        with pytest.raises(DuplicateControllerError):
            await b.start()
        await b.stop()
        after = await kv.get("member.same")
        assert after.revision == before.revision and after.value == before.value
        assert sorted(a.owned) == [0, 1]
    finally:
        await a.stop()
    with pytest.raises(NotFoundError):  # the live one's own stop removes it
        await kv.get("member.same")


class _Gated(Leases):
    """The first question of A and B together (both hear "no responders"); B's claim written late."""

    barrier: asyncio.Barrier
    gate: asyncio.Event | None = None
    asked = False

    async def _refuse_if_alive(self, alive: str) -> None:
        await super()._refuse_if_alive(alive)
        if not self.asked:
            self.asked = True
            await self.barrier.wait()
            if self.gate is not None:
                assert self._kv is not None
                real, gate = self._kv.update, self.gate

                async def late(*args: Any, **kwargs: Any) -> int:
                    await gate.wait()
                    return await real(*args, **kwargs)

                self._kv.update = late  # type: ignore[method-assign]


async def test_three_processes_with_one_id_started_together_run_one(
    nats_server: EmbeddedNats, js: JetStreamContext, topology: Topology
) -> None:
    """A and B ask before either subscribes; A claims; C, started next, is refused and stops (which
    deleted the key); B's claim, written last against the revision it read first, must fail: it used
    to be written over the delete marker (nats-py's `create`), and B ran beside A."""
    t = await _topo(js, topology)
    conns = [await connect(nats_server.url, name=f"same-{i}", connect_wait_s=10) for i in range(3)]
    barrier, gate = asyncio.Barrier(2), asyncio.Event()
    a = _Gated(conns[0], t, 2, "same", _noop, _noop)
    b = _Gated(conns[1], t, 2, "same", _noop, _noop)
    a.barrier = b.barrier = barrier
    b.gate = gate
    started_b = asyncio.create_task(b.start())
    try:
        await a.start()
        c = Leases(conns[2], t, 2, "same", _noop, _noop)
        with pytest.raises(DuplicateControllerError):
            await c.start()
        await c.stop()
        gate.set()
        with pytest.raises(DuplicateControllerError):
            await started_b
        await asyncio.sleep(0.5)
        assert sorted(a.owned) == [0, 1] and not a.halted and not b.owned
    finally:
        gate.set()
        if not started_b.done():
            started_b.cancel()
        await asyncio.gather(started_b, return_exceptions=True)
        await b.stop()
        await a.stop()
        for conn in conns:
            await conn.close()


async def test_a_halted_duplicate_leaves_the_id_and_its_share_to_the_others(
    nats_server: EmbeddedNats, js: JetStreamContext, topology: Topology
) -> None:
    """B runs with A's id without asking (as when A was unreachable: a split cluster), takes A's leases
    and A halts. When B then dies, A used to stay a member (its share of the partitions unowned for
    good) and to answer for the id (its restart refused). Halted, it leaves both."""
    t = await _topo(js, topology, 4, 2.0)
    conns = [await connect(nats_server.url, name=f"halt-{i}", connect_wait_s=10) for i in range(4)]
    a = Leases(conns[0], t, 4, "x", _noop, _noop)
    b = Leases(conns[1], t, 4, "x", _noop, _noop)
    y = Leases(conns[2], t, 4, "y", _noop, _noop)
    restarted = Leases(conns[3], t, 4, "x", _noop, _noop)
    try:
        await a.start()

        async def unreachable(alive: str) -> None:
            pass

        b._refuse_if_alive = unreachable  # type: ignore[method-assign]
        await b.start()
        await asyncio.sleep(2.0)
        assert a.halted and not a.owned and sorted(b.owned) == [0, 1, 2, 3]
        await conns[1].close()  # B dies
        await y.start()
        await asyncio.sleep(5.0)  # B's keys expire (2 s); y's rounds take them
        assert sorted(y.owned) == [0, 1, 2, 3] and not a.owned
        await restarted.start()  # A no longer answers for the id
    finally:
        for x in (restarted, y, a):
            await x.stop()
        for task in (b._task, b._guard):
            if task is not None:
                task.cancel()
        for conn in conns:
            with contextlib.suppress(Exception):
                await conn.close()


async def test_a_member_key_rewritten_by_another_process_halts_this_one_and_a_lost_answer_does_not(
    nc: NATS, js: JetStreamContext, topology: Topology
) -> None:
    """Membership was renewed with an unconditional put: a process back from being cut off for longer
    than the TTL overwrote the member key of the id's restart, and both ran. Renewals are now
    compare-and-set: a key rewritten with this process's own value (an answer that was lost) is taken
    as its own; one written by another process with the id halts this one."""
    t = await _topo(js, topology)
    kv = await js.key_value(t.leases_bucket)
    releases: list[tuple[int, bool]] = []

    async def on_release(p: int, graceful: bool) -> None:
        releases.append((p, graceful))

    a = Leases(nc, t, 2, "same", _noop, on_release)
    await a.start()
    try:
        await kv.put("member.same", a._value())  # as if A's own write landed and its answer was lost
        await asyncio.sleep(a.interval * 2.5)
        assert not a.halted and sorted(a.owned) == [0, 1]
        assert a._member_rev == (await kv.get("member.same")).revision
        other = msgspec.json.decode(a._value(), type=LeaseValue)
        other = msgspec.structs.replace(other, incarnation="another-process")
        await kv.put("member.same", msgspec.json.encode(other))
        deadline = asyncio.get_running_loop().time() + 4 * a.interval
        while not a.halted:
            assert asyncio.get_running_loop().time() < deadline, "the rewritten member key went unnoticed"
            await asyncio.sleep(0.05)
        assert msgspec.json.decode((await kv.get("member.same")).value, type=LeaseValue) == other
        assert not a.owned  # given back, for the other process (or anyone) to take
        # at once, folds aborted (the other process may hold them already), and their keys deleted
        assert sorted(releases) == [(0, False), (1, False)]
        for p in (0, 1):
            with pytest.raises(NotFoundError):
                await kv.get(f"partition.{p}")
    finally:
        await a.stop()


async def test_a_dead_processs_lingering_subscription_does_not_refuse_its_restart(
    nats_server: EmbeddedNats, nc: NATS, js: JetStreamContext, topology: Topology
) -> None:
    """A host that crashed leaves its connection half-open: the server keeps the dead process's
    `.alive` subscription until its ping timeout (minutes), and the question times out. That was
    taken for a busy live process, and the restart was refused until then. With no member key (not
    renewed for a TTL, so its leases are gone too) the id is free; with one, it is still refused."""
    t = await _topo(js, topology)
    kv = await js.key_value(t.leases_bucket)

    async def silent(msg: Msg) -> None:  # subscribed, never answers
        pass

    nc2 = await connect(nats_server.url, name="dead-host", connect_wait_s=10)
    stale = await nc2.subscribe(t.controller_alive_subject("same"), cb=silent)
    await nc2.flush()
    try:
        await kv.put("member.same", b"{}")  # a member renewed less than a TTL ago: maybe just busy
        busy = Leases(nc, t, 2, "same", _noop, _noop)
        with pytest.raises(DuplicateControllerError, match="did not answer within 1 s"):
            await busy.start()
        await busy.stop()
        await kv.purge("member.same")  # as its expiry leaves it
        restarted = Leases(nc, t, 2, "same", _noop, _noop)
        await restarted.start()
        try:
            assert sorted(restarted.owned) == [0, 1]
        finally:
            await restarted.stop()
    finally:
        await stale.unsubscribe()
        await nc2.close()


# --- how a lease round reads the bucket: one batched direct get, no consumer ------------------------
# A round runs every ``ttl / 4`` on every controller. It used to read the bucket through an ephemeral
# consumer (created, read, deleted: on a cluster each creation is a proposal to the meta group) plus
# one get per partition. A bucket provisioned before it allowed direct gets is still read, through a
# consumer.

TTL_S = 2.0


class Creations:
    """Consumer-create requests on a stream, seen on the JetStream API subjects."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def note(self, msg: Msg) -> None:
        self.seen.append(msg.subject)


async def test_lease_rounds_create_no_consumer(nc: NATS, js: JetStreamContext, topology: Topology) -> None:
    t = await _topo(js, topology, 4, TTL_S)
    stream = f"KV_{t.leases_bucket}"
    assert (await js.stream_info(stream)).config.allow_direct
    created = Creations()
    sub = await nc.subscribe(f"$JS.API.CONSUMER.CREATE.{stream}.>", cb=created.note)
    sub2 = await nc.subscribe(f"$JS.API.CONSUMER.CREATE.{stream}", cb=created.note)
    a, b = Leases(nc, t, 4, "ctl-a", _noop, _noop), Leases(nc, t, 4, "ctl-b", _noop, _noop)
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
    t = await _topo(js, topology, 4, TTL_S)
    stream = f"KV_{t.leases_bucket}"
    config = (await js.stream_info(stream)).config
    config.allow_direct = False
    await js.update_stream(config)
    created = Creations()
    sub = await nc.subscribe(f"$JS.API.CONSUMER.CREATE.{stream}.>", cb=created.note)
    a, b = Leases(nc, t, 4, "ctl-a", _noop, _noop), Leases(nc, t, 4, "ctl-b", _noop, _noop)
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
