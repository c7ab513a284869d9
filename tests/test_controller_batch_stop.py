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
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from helpers import playbook, requested
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from noetl_stream import events as E
from noetl_stream.control import groupcommit
from noetl_stream.control.controller import Controller
from noetl_stream.embedded import EmbeddedNats
from noetl_stream.kv.history import read_events
from noetl_stream.kv.provision import provision
from noetl_stream.natsconn import connect
from noetl_stream.outbox import Outbox
from noetl_stream.subjects import Topology
from noetl_stream.wire import Event, encode, now_iso

TTL_S = 2.0
GOOD = playbook("- step: start\n  tool: {kind: noop, result: 7}\n")


@pytest.fixture
async def nc2(nats_server: EmbeddedNats) -> AsyncIterator[NATS]:
    client = await connect(nats_server.url, name="pytest-2", connect_wait_s=10)
    yield client
    await client.close()


def _done(eid: str, run_id: str) -> Event:
    return Event(
        event_id=f"{eid}:{run_id}:1:step.done",
        execution_id=eid,
        name=E.STEP_DONE,
        source="worker",
        entity_type="step",
        entity_id=run_id,
        status="success",
        timestamp=now_iso(),
        step=run_id.rsplit("-", 1)[0],
        step_run_id=run_id,
        payload={"result": 7},
    )


async def _names(js: JetStreamContext, t: Topology, eid: str) -> list[str]:
    return [ev.name async for _, ev in read_events(js, t, eid)]


async def test_a_lost_partition_does_not_lose_the_effects_of_another_partitions_execution_in_its_batch(
    nc: NATS, nc2: NATS, js: JetStreamContext, topology: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = msgspec.structs.replace(topology, partitions=2, lease_ttl_s=TTL_S, command_ack_wait_s=TTL_S)
    await provision(js, t)

    gate, blocked = asyncio.Event(), asyncio.Event()

    class GatedOutbox(Outbox):  # a flush slow to be acked (a stream electing a leader, NATS slow)
        async def flush(self) -> None:
            if not gate.is_set():
                blocked.set()
                await gate.wait()
            await super().flush()

    monkeypatch.setattr(groupcommit, "Outbox", GatedOutbox)

    a = Controller(nc, t, controller_id="ctl-a")
    batches: list[list[str]] = []
    fold_all = a.folding.fold_all

    async def recording(batch: Any) -> None:
        batches.append(list(batch.claims))
        await fold_all(batch)

    a.folding.fold_all = recording  # type: ignore[method-assign]
    await a.start()
    try:
        assert sorted(a._fences) == [0, 1]
        x0 = next(f"v{i}x" for i in range(400) if t.partition_of(f"v{i}x") == 0)
        x1 = next(f"v{i}x" for i in range(400) if t.partition_of(f"v{i}x") == 1)
        gate.set()
        run_ids: dict[str, str] = {}
        for eid in (x0, x1):  # running, cached here, their step scheduled (no worker: it stays so)
            ev = requested(eid, GOOD)
            await js.publish(t.event_subject(eid, ev.name), encode(ev), headers={"Nats-Msg-Id": ev.event_id})
        deadline = time.monotonic() + 10
        while len(run_ids) < 2:
            assert time.monotonic() < deadline, run_ids
            for eid in (x0, x1):
                async for _, ev in read_events(js, t, eid):
                    if ev.name == E.STEP_SCHEDULED and ev.step_run_id and eid in a.states:
                        run_ids[eid] = ev.step_run_id
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        gate.clear()
        batches.clear()
        # Both step.done reach the controller's socket while its loop is busy: one read, one turn, one
        # batch (whose work is a task of the puller of the first one's partition).
        for eid in (x0, x1):
            ev = _done(eid, run_ids[eid])
            await nc2.publish(t.event_subject(eid, ev.name), encode(ev), headers={"Nats-Msg-Id": ev.event_id})
        for _ in range(3):
            await asyncio.sleep(0)
        time.sleep(0.5)
        await asyncio.wait_for(blocked.wait(), 5)
        assert any({x0, x1} <= set(b) for b in batches), f"not one batch: {batches}"
        owner, victim = 0, x1  # partition 0 is lost; partition 1, x1's, stays held
        assert a.states[victim].status == "completed" or a.states[victim].terminal, a.states[victim].status

        assert a.leases is not None
        await a.leases.lost(owner)  # e.g. a fenced snapshot write: its stop ends the batch folding x0
        gate.set()

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
        gate.set()
        await a.shutdown(grace_s=2)


async def test_a_partitions_stop_returns_with_no_fold_of_it_still_running(
    nc: NATS, nc2: NATS, js: JetStreamContext, topology: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    """test_leases.py's D3b property ("a lost lease stops its folds before another controller can take
    it") with the real intake and a batch across partitions: the stop of partition Q waits for the batch
    folding Q's execution (here stuck in a flush: the outbox retries one for up to 30 s), then cancels it,
    and returns only when no fold of Q runs (found in review: it returned while the fold went on,
    publishing Q's effects after the lease was gone)."""
    t = msgspec.structs.replace(topology, partitions=2, lease_ttl_s=TTL_S, command_ack_wait_s=TTL_S)
    await provision(js, t)
    gate, blocked = asyncio.Event(), asyncio.Event()
    in_flush: set[str] = set()

    class GatedOutbox(Outbox):
        async def flush(self) -> None:
            eids = {s.split(".")[2] for s, _, _ in self._events}
            in_flush.update(eids)
            try:
                if not gate.is_set():
                    blocked.set()
                    await gate.wait()
                await super().flush()
            finally:
                in_flush.difference_update(eids)

    monkeypatch.setattr(groupcommit, "Outbox", GatedOutbox)
    a = Controller(nc, t, controller_id="ctl-a")
    batches: list[list[str]] = []
    fold_all = a.folding.fold_all

    async def recording(batch: Any) -> None:
        batches.append(list(batch.claims))
        await fold_all(batch)

    a.folding.fold_all = recording  # type: ignore[method-assign]
    await a.start()
    try:
        x0 = next(f"w{i}x" for i in range(400) if t.partition_of(f"w{i}x") == 0)
        x1 = next(f"w{i}x" for i in range(400) if t.partition_of(f"w{i}x") == 1)
        for eid in (x0, x1):
            ev = requested(eid, GOOD)
            await nc2.publish(t.event_subject(eid, ev.name), encode(ev), headers={"Nats-Msg-Id": ev.event_id})
        for _ in range(3):
            await asyncio.sleep(0)
        time.sleep(0.5)
        await asyncio.wait_for(blocked.wait(), 5)
        assert any({x0, x1} <= set(b) for b in batches), f"not one batch: {batches}"
        other, victim = 1, x1  # partition 1 is lost while the batch folding both flushes
        assert victim in in_flush
        assert a.leases is not None
        await a.leases.lost(other)  # its stop returns: nothing of it may still be folded here
        still = victim in in_flush
        assert not still, (
            f"partition {other}'s stop returned while a fold of its execution {victim} was still flushing"
        )
    finally:
        gate.set()
        await a.shutdown(grace_s=2)
