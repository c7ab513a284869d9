"""The controller's batch folds the executions of every partition held, in one task the controller owns.
When one of those partitions is lost while the batch is in the middle of a flush, the partition's stop
waits for the batch, then cancels it: the batch must forget every execution it was folding (its state
was advanced in place before the flush and may be ahead of what is stored), of whatever partition, and
hand their events back; and the stop must not return while a fold of its partition still runs.

Found in review: when the batch was the work of the first event's puller, a lost lease cancelled it
without forgetting the other partition's execution (CancelledError is no Exception); its redelivered
events were then skipped as already applied and its effects were lost for good.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import msgspec
import pytest
from helpers import playbook, requested, step_done
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from noetl_stream.control import commit
from noetl_stream.control.controller import Controller
from noetl_stream.jetstream.connection import connect
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.jetstream.outbox import Outbox
from noetl_stream.kv.history import read_events
from noetl_stream.kv.provision import provision
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event, encode

TTL_S = 2.0
GOOD = playbook("- step: start\n  tool: {kind: noop, result: 7}\n")


class Gate:
    """While closed, every outbox flush of the controller's batches waits (a flush slow to be acked: a
    stream electing a leader, NATS slow); `in_flush` holds the executions whose effects are waiting."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.open, self.blocked = asyncio.Event(), asyncio.Event()
        self.in_flush: set[str] = set()
        gate = self

        class GatedOutbox(Outbox):
            async def flush(self) -> None:
                eids = {s.split(".")[2] for s, _, _ in self._events}
                gate.in_flush.update(eids)
                try:
                    if not gate.open.is_set():
                        gate.blocked.set()
                        await gate.open.wait()
                    await super().flush()
                finally:
                    gate.in_flush.difference_update(eids)

        monkeypatch.setattr(commit, "Outbox", GatedOutbox)


def recorded_batches(ctl: Controller) -> list[list[str]]:
    """The executions each batch of `ctl` claims when it starts folding, as they start."""
    batches: list[list[str]] = []
    fold_all = ctl.folding.fold_all

    async def recording(batch: Any) -> None:
        batches.append(list(batch.claims))
        await fold_all(batch)

    ctl.folding.fold_all = recording  # type: ignore[method-assign]
    return batches


def one_of_each_partition(t: Topology, prefix: str) -> tuple[str, str]:
    x0 = next(f"{prefix}{i}x" for i in range(400) if t.partition_of(f"{prefix}{i}x") == 0)
    x1 = next(f"{prefix}{i}x" for i in range(400) if t.partition_of(f"{prefix}{i}x") == 1)
    return x0, x1


async def _names(js: JetStreamContext, t: Topology, eid: str) -> list[str]:
    return [ev.name async for _, ev in read_events(js, t, eid)]


async def _two_partitions(js: JetStreamContext, topology: Topology, ttl: float = TTL_S) -> Topology:
    t = msgspec.structs.replace(topology, partitions=2, lease_ttl_s=ttl, command_ack_wait_s=ttl)
    await provision(js, t)
    return t


async def _publish(nc: NATS, t: Topology, events: list[Event]) -> None:
    """Publish events as their writer does (their subject, their id as ``Nats-Msg-Id``)."""
    for ev in events:
        await nc.publish(
            t.event_subject(ev.execution_id, ev.name), encode(ev), headers={"Nats-Msg-Id": ev.event_id}
        )


async def _publish_into_one_read(url: str, js: JetStreamContext, t: Topology, events: list[Event]) -> None:
    """Publish `events` and return once the server has delivered each to the controller's consumer of its
    partition, from a thread of its own while this event loop (the controller's) is blocked: the
    controller then finds them all in its socket and reads them in one turn (one batch). Timing alone
    (publish, then block the loop for a while) did not do it on a loaded machine."""
    deadline = time.monotonic() + 10
    for partition in {t.partition_of(ev.execution_id) for ev in events}:  # its pull requests are waiting
        consumer = t.controller_events_consumer(partition)
        while not (await js.consumer_info(t.events_stream, consumer)).num_waiting:
            assert time.monotonic() < deadline, f"the controller does not pull partition {partition}"
            await asyncio.sleep(0.01)
    failure: list[BaseException] = []

    async def publish_and_wait() -> None:
        nc = await connect(url, name="pytest-one-read")
        try:
            js = nc.jetstream()
            seqs: dict[int, int] = {}
            for ev in events:
                subject = t.event_subject(ev.execution_id, ev.name)
                ack = await js.publish(subject, encode(ev), headers={"Nats-Msg-Id": ev.event_id})
                seqs[t.partition_of(ev.execution_id)] = ack.seq
            deadline = time.monotonic() + 10
            for partition, seq in seqs.items():
                consumer = t.controller_events_consumer(partition)
                while (await js.consumer_info(t.events_stream, consumer)).delivered.stream_seq < seq:
                    assert time.monotonic() < deadline, f"partition {partition}'s event was not delivered"
                    await asyncio.sleep(0.01)
            time.sleep(0.05)  # (the last bytes on their way into the controller's socket)
        except BaseException as exc:
            failure.append(exc)
        finally:
            await nc.close()

    thread = threading.Thread(target=asyncio.run, args=(publish_and_wait(),))
    thread.start()
    thread.join()  # (blocks the loop)
    if failure:
        raise failure[0]


async def test_a_lost_partition_does_not_lose_the_effects_of_another_partitions_execution_in_its_batch(
    nats_server: EmbeddedNats,
    nc: NATS,
    nc2: NATS,
    js: JetStreamContext,
    topology: Topology,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    t = await _two_partitions(js, topology)

    gate = Gate(monkeypatch)
    a = Controller(nc, t, controller_id="ctl-a")
    batches = recorded_batches(a)
    await a.start()
    try:
        assert sorted(a._fences) == [0, 1]
        x0, x1 = one_of_each_partition(t, "v")
        gate.open.set()
        run_ids: dict[str, str] = {}
        await _publish(nc2, t, [requested(eid, GOOD) for eid in (x0, x1)])  # running, their step scheduled
        deadline = time.monotonic() + 10
        while len(run_ids) < 2:
            assert time.monotonic() < deadline, run_ids
            for eid in (x0, x1):
                async for _, ev in read_events(js, t, eid):
                    if ev.name == E.STEP_SCHEDULED and ev.step_run_id and eid in a.states:
                        run_ids[eid] = ev.step_run_id
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        gate.open.clear()
        batches.clear()
        # Both step.done reach the controller's socket while its loop is busy: one read, one turn, one
        # batch (a task of the controller's own, folding the executions of both partitions).
        await _publish_into_one_read(
            nats_server.url, js, t, [step_done(eid, run_ids[eid], 7) for eid in (x0, x1)]
        )
        await asyncio.wait_for(gate.blocked.wait(), 5)
        assert any({x0, x1} <= set(b) for b in batches), f"not one batch: {batches}"
        owner, victim = 0, x1  # partition 0 is lost; partition 1, x1's, stays held
        assert a.states[victim].terminal, a.states[victim].status  # advanced in place, not stored yet

        assert a.leases is not None
        await a.leases.lost(owner)  # e.g. a fenced snapshot write: its stop ends the batch folding x0
        gate.open.set()

        # The victim's partition is still held: its step.done comes again (AckWait) and must be folded.
        deadline = time.monotonic() + 6 * TTL_S
        names: list[str] = []
        while time.monotonic() < deadline:
            names = await _names(js, t, victim)
            if E.WORKFLOW_FINISHED in names:
                break
            await asyncio.sleep(0.1)
        cached = a.states.get(victim)
        if E.WORKFLOW_FINISHED not in names:
            # Worse: a graceful stop writes the snapshot of the state the cancelled fold advanced (terminal
            # here), so the partition's next owner resumes nothing: the end is never written.
            await a.shutdown(grace_s=2)
            b = Controller(nc2, t, controller_id="ctl-b")
            await b.start()
            try:
                deadline = time.monotonic() + 4 * TTL_S
                while time.monotonic() < deadline and E.WORKFLOW_FINISHED not in names:
                    names = await _names(js, t, victim)
                    await asyncio.sleep(0.1)
            finally:
                await b.shutdown(grace_s=2)
        assert E.WORKFLOW_FINISHED in names, (
            f"execution {victim} (partition {1 - owner}, still held) never finished: its effects were "
            f"lost with the cancelled batch, also after another controller took over; stored events: "
            f"{names}; state cached by the first controller: status={getattr(cached, 'status', None)} "
            f"last_seq={getattr(cached, 'last_seq', None)}"
        )
    finally:
        gate.open.set()
        await a.shutdown(grace_s=2)


async def test_a_partitions_stop_returns_with_no_fold_of_it_still_running(
    nats_server: EmbeddedNats,
    nc: NATS,
    nc2: NATS,
    js: JetStreamContext,
    topology: Topology,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """test_leases.py's D3b property ("a lost lease stops its folds before another controller can take
    it") with the real intake and a batch across partitions: the stop of partition Q waits for the batch
    folding Q's execution (here stuck in a flush: the outbox retries one for up to 30 s), then cancels it,
    and returns only when no fold of Q runs (found in review: it returned while the fold went on,
    publishing Q's effects after the lease was gone)."""
    t = await _two_partitions(js, topology)
    gate = Gate(monkeypatch)
    a = Controller(nc, t, controller_id="ctl-a")
    batches = recorded_batches(a)
    await a.start()
    try:
        x0, x1 = one_of_each_partition(t, "w")
        await _publish_into_one_read(nats_server.url, js, t, [requested(eid, GOOD) for eid in (x0, x1)])
        await asyncio.wait_for(gate.blocked.wait(), 5)
        assert any({x0, x1} <= set(b) for b in batches), f"not one batch: {batches}"
        other, victim = 1, x1  # partition 1 is lost while the batch folding both flushes
        assert victim in gate.in_flush
        assert a.leases is not None
        await a.leases.lost(other)  # its stop returns: nothing of it may still be folded here
        still = victim in gate.in_flush
        assert not still, (
            f"partition {other}'s stop returned while a fold of its execution {victim} was still flushing"
        )
    finally:
        gate.open.set()
        await a.shutdown(grace_s=2)


async def test_a_shutdown_with_a_batch_stuck_in_a_flush_ends_within_its_grace_and_loses_nothing(
    nc: NATS, nc2: NATS, js: JetStreamContext, topology: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--grace` is the whole shutdown: a batch whose flush does not return is cancelled when the grace is
    over (it waited twice the grace before: past a pod's termination grace period), and its events are
    handed back, so the next controller folds them."""
    # A lease TTL (the controller consumers' AckWait) longer than B's wait below: only the nak of the
    # shutdown brings the events back in time.
    t = await _two_partitions(js, topology, ttl=30.0)
    gate = Gate(monkeypatch)
    a = Controller(nc, t, controller_id="ctl-a")
    await a.start()
    x0, x1 = one_of_each_partition(t, "g")
    try:
        await _publish(nc2, t, [requested(eid, GOOD) for eid in (x0, x1)])
        await asyncio.wait_for(gate.blocked.wait(), 5)
        grace = 3.0
        began = time.monotonic()
        await a.shutdown(grace_s=grace)
        took = time.monotonic() - began
        assert took < grace * 1.6, f"a shutdown with a {grace} s grace took {took:.1f} s"
    finally:
        gate.open.set()
        await a.shutdown(grace_s=2)
    for eid in (x0, x1):
        assert E.STEP_SCHEDULED not in await _names(js, t, eid)  # the stuck flush never published
    b = Controller(nc2, t, controller_id="ctl-b")
    await b.start()
    try:
        deadline = time.monotonic() + 6 * TTL_S
        scheduled: set[str] = set()
        while scheduled != {x0, x1}:
            assert time.monotonic() < deadline, f"only {scheduled} of {x0, x1} were taken up again"
            scheduled = {eid for eid in (x0, x1) if E.STEP_SCHEDULED in await _names(js, t, eid)}
            await asyncio.sleep(0.1)
    finally:
        await b.shutdown(grace_s=2)
