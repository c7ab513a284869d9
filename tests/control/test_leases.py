"""Partition leases under the timings that break naive leases, against a real nats-server.

Each test states a property of partitioned controllers ("two controllers never pull one partition at
once", "a live duplicate id is refused", "a lost lease stops its folds before another controller can
take it", ...) and drives two lease holders or controllers into the situation that would break it: a
simultaneous start under one id, a busy event loop, a slow release, a hanging renewal, a stalled loop.
They were written as a review of the first version (each failed on it). Short lease TTLs keep them
to a few seconds; the comments give the arithmetic with the default TTL (10 s) and the JetStream
client timeout (5 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import msgspec
import nats.errors
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from noetl_stream.control.commit import Item
from noetl_stream.control.controller import Controller
from noetl_stream.control.core.state import ExecutionState
from noetl_stream.control.leases import DuplicateControllerError, Leases
from noetl_stream.jetstream.connection import connect
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.jetstream.fastpath import ack_soon
from noetl_stream.kv.deadlines import DeadlineIndex
from noetl_stream.kv.history import read_events
from noetl_stream.kv.provision import provision
from noetl_stream.kv.snapshots import SnapshotStore
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event, encode, now_iso

TTL_S = 2.0


async def _topo(js: JetStreamContext, topology: Topology, partitions: int) -> Topology:
    t = msgspec.structs.replace(topology, partitions=partitions, lease_ttl_s=TTL_S, command_ack_wait_s=TTL_S)
    await provision(js, t)
    return t


class Pulling:
    """Which controller pulls which partition: from on_acquire until its on_release has returned
    (a graceful release keeps folding in-flight events until then). Records every overlap."""

    def __init__(self) -> None:
        self.by: dict[str, set[int]] = {}
        self.overlaps: list[tuple[int, str, str]] = []
        self.acquisitions = 0
        self.lost: dict[str, list[int]] = {}
        """The partitions each controller gave up without a graceful release (a lease lost or taken)."""
        self.slow_releases = True  # off for a test's clean-up, once what it checks is decided

    def quick_releases(self) -> None:
        """From now on releases are not slowed down (the clean-up's own releases need not wait)."""
        self.slow_releases = False

    def callbacks(self, name: str, release_delay: float = 0.0):  # type: ignore[no-untyped-def]
        self.by[name] = set()
        self.lost[name] = []

        async def on_acquire(p: int, fence: int) -> None:
            self.acquisitions += 1
            for other, held in self.by.items():
                if other != name and p in held:
                    self.overlaps.append((p, other, name))
            self.by[name].add(p)

        async def on_release(p: int, graceful: bool) -> None:
            if not graceful:
                self.lost[name].append(p)
            if release_delay and graceful and self.slow_releases:
                await asyncio.sleep(release_delay)  # e.g. puller.stop(timeout=ttl) waiting for a fold
            self.by[name].discard(p)

        return on_acquire, on_release


# --- D1: a slow graceful release (rebalancing) blocks the renewal of every other lease ---------------


async def test_slow_rebalance_release_lets_another_controller_take_a_partition_still_pulled(
    nc: NATS, nc2: NATS, js: JetStreamContext, topology: Topology
) -> None:
    """tick() holds the lock across _release -> on_release. The controller's on_release is
    puller.stop(timeout=ttl) (drain, then up to ttl again for running folds) plus one snapshot write
    per execution of the partition: it can take more than the TTL, and no other lease is renewed
    meanwhile. Here A gives partition 1 to B (B joined) and its release takes 1.5 TTL: A's lease on
    partition 0 expires on the server while A still pulls it, and B takes it."""
    t = await _topo(js, topology, 2)
    pulling = Pulling()
    a = Leases(nc, t, 2, "ctl-a", *pulling.callbacks("ctl-a", release_delay=1.5 * TTL_S))
    b = Leases(nc2, t, 2, "ctl-b", *pulling.callbacks("ctl-b"))
    await a.start()
    assert sorted(a.owned) == [0, 1]
    await b.start()
    try:
        deadline = time.monotonic() + 4 * TTL_S
        while time.monotonic() < deadline and not pulling.overlaps:
            await asyncio.sleep(0.05)
        assert pulling.overlaps == [], f"two controllers pulled one partition at once: {pulling.overlaps}"
    finally:
        pulling.quick_releases()
        await b.stop()
        await a.stop()


# --- D2: shutdown releases sequentially with the renewal task already cancelled ----------------------


async def test_shutdown_does_not_renew_partitions_waiting_for_their_turn_to_be_released(
    nc: NATS, nc2: NATS, js: JetStreamContext, topology: Topology
) -> None:
    """Leases.stop() cancels the renewal task, then releases the partitions one after another. A
    release that takes a while (in-flight folds, one snapshot write per execution) leaves the
    partitions after it unrenewed: they expire while still pulled and another controller takes them."""
    t = await _topo(js, topology, 4)
    pulling = Pulling()
    a = Leases(nc, t, 4, "ctl-a", *pulling.callbacks("ctl-a", release_delay=0.8 * TTL_S))
    await a.start()
    assert sorted(a.owned) == [0, 1, 2, 3]
    b = Leases(nc2, t, 4, "ctl-b", *pulling.callbacks("ctl-b"))
    await b.start()
    stopping = asyncio.create_task(a.stop())  # SIGTERM on A (a rolling update)
    try:
        deadline = time.monotonic() + 5 * TTL_S
        while time.monotonic() < deadline and not pulling.overlaps and not stopping.done():
            await asyncio.sleep(0.05)
        assert pulling.overlaps == [], f"two controllers pulled one partition at once: {pulling.overlaps}"
    finally:
        await stopping
        await b.stop()


# --- D3: a renewal that hangs (client timeout 5 s) is not bounded by the lease ----------------------


async def test_a_hanging_renewal_keeps_pulling_after_the_lease_expired_on_the_server(
    nc: NATS, nc2: NATS, js: JetStreamContext, topology: Topology
) -> None:
    """LOSE_AFTER is checked only after `await kv.update(...)` returns, one partition after another.
    An update that times out takes the JetStream client timeout (5 s; half of the default 10 s TTL):
    the first partition is given up late, the next ones later still. Two real controllers: A's
    renewals hang for 0.5 TTL each (the default ratio), B takes A's partitions when they expire on
    the server, and both have a running puller on the same durable consumer; events of the
    partition are then delivered to both."""
    t = await _topo(js, topology, 4)
    got: dict[str, list[int]] = {"a": [], "b": []}

    def recorder(name: str):  # type: ignore[no-untyped-def]
        def file(msg: Msg) -> None:
            got[name].append(msg.metadata.sequence.stream)
            ack_soon(msg)

        return file

    a = Controller(nc, t, controller_id="ctl-a")
    a.folding.file = recorder("a")  # type: ignore[method-assign]  # each event: recorded and acked
    await a.start()
    assert sorted(a._fences) == [0, 1, 2, 3]
    assert a.leases is not None and a.leases._kv is not None

    async def hanging_update(*args: object, **kwargs: object) -> int:
        await asyncio.sleep(0.5 * TTL_S)
        raise nats.errors.TimeoutError

    a.leases._kv.update = hanging_update  # type: ignore[method-assign]
    b = Controller(nc2, t, controller_id="ctl-b")
    b.folding.file = recorder("b")  # type: ignore[method-assign]
    await b.start()
    try:
        both: set[int] = set()
        deadline = time.monotonic() + 4 * TTL_S
        while time.monotonic() < deadline and not both:
            both = set(a._pullers) & set(b._pullers)
            await asyncio.sleep(0.02)
        if not both:  # no moment at which both had a running puller for one partition
            assert b._fences, "B took no partition: nothing was tested"
            return
        p = min(both)
        # Both pull p now: publish events of p's executions and see who gets them.
        eids = [f"e{i}x" for i in range(400) if t.partition_of(f"e{i}x") == p][:30]
        for eid in eids:
            ev = Event(
                event_id=f"{eid}:review",
                execution_id=eid,
                name=E.STEP_DONE,
                source="worker",
                entity_type="step",
                entity_id="s",
                status="success",
                timestamp=now_iso(),
            )
            await js.publish(t.event_subject(eid, E.STEP_DONE), encode(ev))
        await asyncio.sleep(0.5)
        raise AssertionError(
            f"A and B both had a running puller for partition {p}; of 30 events published then, A got "
            f"{len(got['a'])} and B got {len(got['b'])}"
        )
    finally:
        await b.shutdown()
        await a.shutdown()


# --- D4: duplicate controller ids --------------------------------------------------------------------


async def test_two_controllers_with_the_same_id_started_together_are_not_both_accepted(
    nc: NATS, nc2: NATS, js: JetStreamContext, topology: Topology
) -> None:
    """Two processes with the same id (the default id is the host name) started at the same moment
    both asked `<prefix>.controllers.<id>.alive` before either subscribed: both heard "no responders"
    and both ran, each taking the other's leases back through the 'previous run of this id' path
    until one noticed. The id's claim (a compare-and-set of its member key, written after subscribing)
    lets exactly one of them run, every time, with the member key left by the previous round."""
    t = await _topo(js, topology, 2)
    for round_ in range(8):
        pulling = Pulling()
        x1 = Leases(nc, t, 2, "same", *pulling.callbacks("x1"))
        x2 = Leases(nc2, t, 2, "same", *pulling.callbacks("x2"))
        results = await asyncio.gather(x1.start(), x2.start(), return_exceptions=True)
        started = [x for x, r in zip((x1, x2), results, strict=True) if not isinstance(r, BaseException)]
        try:
            refused = [r for r in results if isinstance(r, BaseException)]
            assert len(started) == 1, f"round {round_}: {len(started)} controllers with id 'same' started"
            assert isinstance(refused[0], DuplicateControllerError), refused
            assert pulling.overlaps == [] and len(started[0].owned) == 2
        finally:
            for x in started:
                await x.stop()
            if round_ % 2:  # half the rounds find the member key still there (a crashed previous run)
                kv = await js.key_value(t.leases_bucket)
                await kv.put("member.same", b"{}")


async def test_a_live_but_busy_controller_is_not_taken_for_dead(
    nc: NATS, nc2: NATS, js: JetStreamContext, topology: Topology
) -> None:
    """The alive check treats a *timeout* (1 s) like "no responders": a live controller whose event
    loop is busy for a second (a large replay, a big playbook compiled in the loop) is declared dead
    and a second process with its id takes all its leases at once, without waiting for the TTL.
    A timeout means somebody is subscribed: only NoRespondersError says nobody is."""
    t = await _topo(js, topology, 2)
    pulling = Pulling()
    a = Leases(nc, t, 2, "same", *pulling.callbacks("a"))
    await a.start()
    # A's loop is busy for 1.5 s when the request arrives (simulated on its alive subscription only).
    await a._alive.unsubscribe()

    async def busy(msg: Msg) -> None:
        await asyncio.sleep(1.5)
        await msg.respond(b"alive")

    a._alive = await nc.subscribe(t.controller_alive_subject("same"), cb=busy)
    await nc.flush()  # the server has the subscription before b, on another connection, asks
    b = Leases(nc2, t, 2, "same", *pulling.callbacks("b"))
    try:
        with pytest.raises(DuplicateControllerError):
            await b.start()
    finally:
        with contextlib.suppress(Exception):
            await b.stop()
        await a.stop()
    assert pulling.overlaps == []


# --- D5: deadline timers armed from the index survive the release of their partition ------------


async def test_deadline_timers_of_a_released_partition_are_cancelled(
    nc: NATS, js: JetStreamContext, topology: Topology
) -> None:
    """Re-arming arms timers from the deadline index without putting the states in `self.states`;
    a release that cancelled only the timers of states in memory left them armed: after the partition
    moved, the old owner still fired `execution.deadline.exceeded` for it, unfenced (no controller/fence)."""
    t = await _topo(js, topology, 2)
    eid = next(f"d{i}x" for i in range(100) if t.partition_of(f"d{i}x") == 1)
    store = await SnapshotStore.open(js, t, ExecutionState)
    deadline_at = time.time() + 1.5
    await store.put_any(eid, ExecutionState(execution_id=eid, status="running", deadline_at=deadline_at))
    await (await DeadlineIndex.open(js, t)).add(1, eid, deadline_at)
    a = Controller(nc, t, controller_id="ctl-a")
    await a.start()
    b = Leases(nc, t, 2, "ctl-b", *Pulling().callbacks("ctl-b"))  # folds nothing, writes nothing
    try:
        deadline = time.monotonic() + 5
        while eid not in a.deadlines.timers:
            assert time.monotonic() < deadline, "timer never armed"
            await asyncio.sleep(0.02)
        await b.start()  # B joins: A hands partition 1 over at its next tick (rebalancing)
        deadline = time.monotonic() + 4 * TTL_S
        while not (1 in b.owned and 1 not in a._fences):
            assert time.monotonic() < deadline, "partition 1 never moved to B"
            await asyncio.sleep(0.02)
        await asyncio.sleep(2.0)  # past the deadline
        written = [ev async for _, ev in read_events(js, t, eid) if ev.name == E.EXECUTION_DEADLINE_EXCEEDED]
        assert written == [], (
            f"{[(ev.name, ev.controller, ev.fence) for ev in written]} written for an execution of "
            f"partition 1, held by ctl-b (which writes nothing here), by ctl-a; timers left: {list(a.deadlines.timers)}"
        )
    finally:
        await b.stop()
        await a.shutdown()


# --- D6: a snapshot written under an OLDER fence wins over the owner's ---------------------------------


async def test_a_snapshot_written_under_an_older_fence_does_not_replace_the_owners_state(
    nc: NATS, js: JetStreamContext, topology: Topology
) -> None:
    """A compare-and-set conflict against a snapshot with a *smaller* fence can only come from a
    controller that lost the partition (we read the snapshot after acquiring it). snapshots.write
    nevertheless drops the owner's state ("superseded") when that snapshot has a larger last_seq,
    and the fenced-off controller's snapshot stays; the owner then resumes from it."""
    t = await _topo(js, topology, 1)
    ctl = Controller(nc, t, controller_id="ctl-new")
    await ctl.start()
    try:
        eid = "zombie0execution"
        fence = ctl._fences[0]
        state = ExecutionState(execution_id=eid, last_seq=10)
        ctl.states[eid] = state
        await ctl.snapshots.write(state)
        store = await SnapshotStore.open(js, t, ExecutionState)
        # The previous owner (fence - 1), still running after it lost the lease, writes its snapshot.
        await store.put_any(eid, ExecutionState(execution_id=eid, last_seq=12, fence=fence - 1))
        state.last_seq = 11
        await ctl.snapshots.write(state)
        current = await store.get(eid)
        assert current is not None
        assert (current.fence, eid in ctl.states) == (fence, True), (
            f"the owner (fence {fence}) gave way to a snapshot written under fence {current.fence}"
        )
    finally:
        await ctl.shutdown()


# --- D7: an event-loop stall longer than the TTL --------------------------------------------------


async def test_after_a_stall_longer_than_the_ttl_a_controller_does_not_still_count_itself_owner(
    nc: NATS, nc2: NATS, js: JetStreamContext, topology: Topology
) -> None:
    """Ownership is `p in Controller._fences`, cleared only by the lease task. After the event loop
    was blocked past the TTL (GC, a CPU-bound fold), folds already woken up run before the lease task
    notices: _fold has no time-based check. Here B holds the partition and A still folds for it."""
    t = await _topo(js, topology, 1)
    a = Controller(nc, t, controller_id="ctl-a")
    await a.start()
    b = Leases(nc2, t, 1, "ctl-b", *Pulling().callbacks("ctl-b"))
    try:
        time.sleep(TTL_S + 0.5)
        await b.start()  # B, elsewhere, takes the expired lease
        assert 0 in b.owned
        # What A's handlers see when they resume before A's lease task runs:
        holds = getattr(a, "_holds", lambda p: p in a._fences)  # (a proposed fix adds _holds)
        assert not holds(0), "A still folds partition 0 although B holds it"
    finally:
        await b.stop()
        await a.shutdown()


# --- D8: an error while releasing leaves the controller believing it still holds the partition -------


async def test_a_failing_snapshot_read_during_release_does_not_leave_the_partition_fenced_as_ours(
    nc: NATS, js: JetStreamContext, topology: Topology
) -> None:
    """In SnapshotWriter.write the `store.get` of the conflict branch runs inside `except
    StateConflictError:`, so its errors (a timeout) are not caught by the `except Exception` below it.
    Raised from _stop_partition, it skips the rest of the partition's executions and
    `self._fences.pop(partition)`; Leases logs "partition_stop_failed" and frees the lease anyway.
    The controller keeps a fence for a partition another controller now holds, and its timers."""
    t = await _topo(js, topology, 1)
    ctl = Controller(nc, t, controller_id="ctl-a")
    await ctl.start()
    try:
        assert ctl.snapshots.store is not None and ctl.leases is not None
        for eid in ("one0execution", "two0execution"):
            ctl.states[eid] = ExecutionState(execution_id=eid, last_seq=5)
            ctl.snapshots.written_at[eid] = 0.0
            ctl.snapshots.store.revisions[eid] = 999_999  # someone wrote since: the put conflicts

        async def timeout(*args: object, **kwargs: object) -> None:
            raise nats.errors.TimeoutError

        ctl.snapshots.store.get = timeout  # type: ignore[method-assign]
        async with ctl.leases._lock:
            await ctl.leases._release(0, graceful=True)  # rebalancing: give partition 0 away
        assert 0 not in ctl.leases.owned
        assert (0 in ctl._fences, sorted(ctl.states)) == (False, []), (
            f"lease released, but the controller still has fence {ctl._fences} and states "
            f"{sorted(ctl.states)} of partition 0"
        )
    finally:
        ctl.snapshots.store.get = SnapshotStore.get.__get__(ctl.snapshots.store)  # type: ignore[method-assign,union-attr]
        await ctl.shutdown()


# --- D9: a renewal stored, whose answer came too late ---------------------------------------------------


async def test_a_renewal_stored_but_answered_too_late_is_not_a_lost_lease(
    nc: NATS, js: JetStreamContext, topology: Topology
) -> None:
    """A renewal times out here (a slow server) although the server stored it: the lease's next renewal,
    against the revision before it, is refused. Found by CI under load: that was read as "taken by
    another controller" and the partition given up, with nobody else holding it. The key holds this
    process's own lease: its revision is adopted and the lease kept."""
    t = await _topo(js, topology, 1)
    pulling = Pulling()
    a = Leases(nc, t, 1, "ctl-a", *pulling.callbacks("ctl-a"))
    await a.start()
    lost = pulling.lost["ctl-a"]
    kv = a._kv
    assert kv is not None and sorted(a.owned) == [0]
    real_update = kv.update
    unheard: list[int] = []

    async def update(key: str, value: bytes, last: int | None = None, **kw: object) -> int:
        rev = await real_update(key, value, last=last, **kw)  # type: ignore[arg-type]
        if key == a._key(0) and not unheard:
            unheard.append(rev)
            raise nats.errors.TimeoutError  # stored; its answer lost
        return rev

    kv.update = update  # type: ignore[method-assign]
    try:
        deadline = time.monotonic() + 4 * TTL_S
        while not unheard:
            assert time.monotonic() < deadline, "no renewal of partition 0"
            await asyncio.sleep(0.05)
        while not (lost or (0 in a.owned and a.owned[0].revision > unheard[0])):  # the renewals after it
            assert time.monotonic() < deadline, "not renewed past the write whose answer was lost"
            await asyncio.sleep(0.05)
        assert (lost, sorted(a.owned)) == ([], [0]), f"A gave up {lost}, holds {sorted(a.owned)}"
        assert pulling.by["ctl-a"] == {0}
    finally:
        kv.update = real_update  # type: ignore[method-assign]
        await a.stop()


# --- D4, end to end: what two live controllers with one id do to executions -------------------------


@pytest.mark.timeout(180)
async def test_end_to_end_two_controllers_with_one_id_leave_executions_unfinished(
    nats_server: EmbeddedNats, js: JetStreamContext, nc: NATS, topology: Topology
) -> None:
    """Two controllers with the same id that reach the alive check at the same moment (simulated:
    their `request` waits on a barrier) both run, steal each other's leases every tick and pull both
    partitions at once. Each one's in-memory states miss the events the other folded: a boundary of
    a step run a stale state does not know is ignored by the reducer (`on_boundary`: run is None) and
    acked. Executions are left without playbook.processed, for ever (the inputs are acked)."""
    import random

    from eventlog import wait_processed
    from faultbooks import STRESS_MIX, submit_many

    from noetl_stream.dataplane.worker import Worker

    t = msgspec.structs.replace(topology, partitions=2, lease_ttl_s=TTL_S, command_ack_wait_s=5.0)
    await provision(js, t)
    conns = [await connect(nats_server.url, name=f"ctl-{i}", connect_wait_s=10) for i in range(3)]
    ctls = [Controller(conns[i], t, controller_id="same") for i in range(2)]
    barrier = asyncio.Barrier(2)
    asked: set[object] = set()
    for c in ctls:
        real = c.nc.request

        async def request(subject: str, *args: object, _real=real, **kwargs: object):  # type: ignore[no-untyped-def]
            if subject.endswith(".alive") and _real not in asked:  # the first question of each, together
                asked.add(_real)
                await barrier.wait()
            return await _real(subject, *args, **kwargs)

        c.nc.request = request  # type: ignore[method-assign]
    worker = Worker(conns[2], t, concurrency=16)
    try:
        results = await asyncio.gather(*(c.start() for c in ctls), return_exceptions=True)
        running = [c for c, r in zip(ctls, results, strict=True) if r is None]
        await worker.start()
        rnd = random.Random(3)
        kinds = [
            k for k in ("chain", "distributed_ok", "local_ok", "retry", "handled_failure") for _ in range(8)
        ]
        rnd.shuffle(kinds)
        ids = []
        for n, kind in enumerate(kinds):
            text, _ = STRESS_MIX[kind]
            ids += await submit_many(nc, t, [(text + f"# {n}\n", {})], file=f"{kind}.yaml")
            await asyncio.sleep(0.05)
        try:
            await wait_processed(js, t, ids, timeout=45)
        except TimeoutError as exc:
            raise AssertionError(f"{len(running)} controllers with id 'same' ran: {exc}") from None
    finally:
        await worker.shutdown()
        for c in ctls:
            if c.leases is not None and c.leases._kv is not None:
                await c.shutdown()
        for conn in conns:
            await conn.close()


# --- D3b: a lost lease is given up too slowly when folds are in flight ------------------------------


async def test_a_lost_lease_stops_its_folds_before_another_controller_can_take_it(
    nc: NATS, nc2: NATS, js: JetStreamContext, topology: Topology
) -> None:
    """When renewals fail, a partition is given up at >= 0.6 TTL, then _stop_partition calls
    puller.stop(timeout=0.3 * ttl), which waits up to that long TWICE (drain, then running handlers)
    before cancelling folds; the partitions are given up one after another. A fold that is slow (an
    outbox flush retries for up to 30 s while a stream elects a leader) is still running when the
    next owner starts on the partition. Here every partition has one such fold: the commit of the
    controller's real batches is made slow. B's arrival also starts a graceful stop (rebalancing) of the
    partitions A gives it; their leases are then lost during that stop, which must be cut short (found
    when this test moved from a stand-in for the fold to the real batches: the graceful stop went on
    waiting for the batches, up to twice the 30 s grace, while B took the partitions)."""
    t = await _topo(js, topology, 4)
    running: dict[int, int] = {}  # partition -> folds of it running in A

    async def slow(batches: list[tuple[str, list[Item]]]) -> None:
        ps = [t.partition_of(eid) for eid, _ in batches]
        for p in ps:
            running[p] = running.get(p, 0) + 1
        try:
            await asyncio.sleep(10 * TTL_S)
            for _, items in batches:
                for msg, _, _ in items:
                    ack_soon(msg)
        finally:
            for p in ps:
                running[p] -= 1

    a = Controller(nc, t, controller_id="ctl-a")
    a.folding.commit.run = slow  # type: ignore[method-assign]  # each batch's commit is slow
    await a.start()
    for p in range(4):
        eid = next(f"s{i}x" for i in range(400) if t.partition_of(f"s{i}x") == p)
        ev = Event(
            event_id=f"{eid}:slow",
            execution_id=eid,
            name=E.STEP_DONE,
            source="worker",
            entity_type="step",
            entity_id="s",
            status="success",
            timestamp=now_iso(),
        )
        await js.publish(t.event_subject(eid, E.STEP_DONE), encode(ev))
    deadline = time.monotonic() + 5
    while sum(running.values()) < 4:
        assert time.monotonic() < deadline, running
        await asyncio.sleep(0.02)
    assert a.leases is not None and a.leases._kv is not None

    async def hanging_update(*args: object, **kwargs: object) -> int:
        await asyncio.sleep(0.5 * TTL_S)
        raise nats.errors.TimeoutError

    a.leases._kv.update = hanging_update  # type: ignore[method-assign]
    b = Leases(nc2, t, 4, "ctl-b", *Pulling().callbacks("ctl-b"))
    await b.start()
    try:
        overlap: list[tuple[int, int]] = []
        deadline = time.monotonic() + 5 * TTL_S
        while time.monotonic() < deadline and not overlap and len(b.owned) < 4:
            overlap = [(p, running.get(p, 0)) for p in b.owned if running.get(p, 0)]
            await asyncio.sleep(0.02)
        overlap = overlap or [(p, running.get(p, 0)) for p in b.owned if running.get(p, 0)]
        assert overlap == [], f"B took partitions while A still folded them (partition, folds): {overlap}"
        assert sorted(b.owned) == [0, 1, 2, 3], f"B took only {sorted(b.owned)}: not all of it was tested"
    finally:
        await b.stop()
        await a.shutdown()


async def test_a_slow_rebalance_release_does_not_cost_the_controller_its_other_partitions(
    nc: NATS, nc2: NATS, js: JetStreamContext, topology: Topology
) -> None:
    """Same situation as D1 (A hands partition 1 to B and the release takes a while). With renewal
    done inside the tick, under the lock, nothing renews partition 0 meanwhile: either it expires on
    the server while A pulls it (3447d52) or a watchdog gives it up (baa496d), cutting its in-flight
    folds short. A healthy controller should keep it."""
    t = await _topo(js, topology, 2)
    pulling = Pulling()
    a = Leases(nc, t, 2, "ctl-a", *pulling.callbacks("ctl-a", release_delay=0.8 * TTL_S))
    await a.start()
    lost = pulling.lost["ctl-a"]
    b = Leases(nc2, t, 2, "ctl-b", *pulling.callbacks("ctl-b"))
    await b.start()
    try:
        deadline = time.monotonic() + 4 * TTL_S
        while time.monotonic() < deadline and 1 not in b.owned:
            await asyncio.sleep(0.05)
        await asyncio.sleep(TTL_S)
        assert (lost, sorted(a.owned)) == ([], [0]), f"A gave up {lost} (lease lost), holds {sorted(a.owned)}"
    finally:
        pulling.quick_releases()
        await b.stop()
        await a.stop()
