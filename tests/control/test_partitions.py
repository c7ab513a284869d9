"""Several controllers: executions partitioned, each partition leased to one controller, with fencing.

The events stream stores every event under its execution's partition; each partition has its own
durable controller consumer, pulled only by the controller holding the partition's lease (a key in
the leases bucket with a TTL). These tests run real controllers (in-process and as processes) on a
real server: partitions spread over the controllers, a stopped or killed controller's partitions are
taken over, a controller whose snapshot write meets a newer owner's stops (fencing), and a kill under
load loses nothing and lets no execution be handled by two controllers at once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import time
from pathlib import Path

import msgspec
import pytest
from eventlog import (
    count_by_execution,
    histories,
    processed,
    read_named,
    replay_differences,
    scheduled_twice,
    wait_processed,
)
from faultbooks import STRESS_MIX, submit_many
from helpers import playbook
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, NoKeysError
from procs import Processes, replay_verify

from noetl_stream.control.controller import Controller
from noetl_stream.control.core.state import ExecutionState
from noetl_stream.control.leases import DuplicateControllerError
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.provision import provision
from noetl_stream.kv.snapshots import SnapshotStore
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event

TTL_S = 2.0


async def _eventually(check, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


@pytest.fixture
async def topo(js: JetStreamContext, topology: Topology) -> Topology:
    t = msgspec.structs.replace(topology, partitions=6, lease_ttl_s=TTL_S, command_ack_wait_s=TTL_S)
    await provision(js, t)
    return t


async def test_partitions_spread_over_controllers_and_move_when_one_stops(nc: NATS, topo: Topology) -> None:
    a = Controller(nc, topo, controller_id="ctl-a")
    b = Controller(nc, topo, controller_id="ctl-b")
    await a.start()
    assert sorted(a._fences) == list(range(6))  # alone: it holds every partition
    await b.start()
    try:
        # b joins: a gives up the partitions above its share, b takes them.
        await _eventually(lambda: len(a._fences) == 3 and len(b._fences) == 3, 10 * TTL_S, "a 3/3 split")
        assert set(a._fences).isdisjoint(b._fences)
        fences_before = dict(b._fences)
        await a.shutdown()  # graceful: the leases are deleted, b takes them at its next tick
        await _eventually(lambda: len(b._fences) == 6, 10 * TTL_S, "b to take every partition")
        assert all(b._fences[p] == f for p, f in fences_before.items())  # held on: same token
        taken = set(b._fences) - set(fences_before)
        assert taken and all(b._fences[p] > max(fences_before.values()) for p in taken)
    finally:
        await a.shutdown()
        await b.shutdown()


async def test_a_second_live_controller_with_the_same_id_is_refused(nc: NATS, topo: Topology) -> None:
    a = Controller(nc, topo, controller_id="same")
    await a.start()
    try:
        with pytest.raises(DuplicateControllerError, match="another controller with id 'same'"):
            await Controller(nc, topo, controller_id="same").start()
    finally:
        await a.shutdown()
    again = Controller(nc, topo, controller_id="same")  # once the first is gone, the id is free again
    await again.start()
    await again.shutdown()


async def test_a_controller_fenced_off_by_a_newer_owners_snapshot_stops_and_does_not_overwrite_it(
    nc: NATS, js: JetStreamContext, topology: Topology
) -> None:
    """Fencing: a snapshot records the lease revision of its writer; a controller whose compare-and-set
    fails against a snapshot written under a newer lease has lost the partition and stops pulling it.
    (A long lease TTL: the snapshot write, not a lease renewal, must be what notices.)"""
    topo = msgspec.structs.replace(topology, partitions=6, lease_ttl_s=60.0)
    await provision(js, topo)
    ctl = Controller(nc, topo, controller_id="ctl-old")
    await ctl.start()
    try:
        eid = "fenced0execution"
        p = topo.partition_of(eid)
        fence = ctl._fences[p]
        state = ExecutionState(execution_id=eid, last_seq=10)
        await ctl.snapshots.write(state)
        store = await SnapshotStore.open(js, topo, ExecutionState)
        assert (await store.get(eid)).fence == fence  # type: ignore[union-attr]
        # A newer owner (a later lease revision) wrote the snapshot meanwhile.
        await store.put_any(eid, ExecutionState(execution_id=eid, last_seq=12, fence=fence + 100))
        kv = await js.key_value(topo.leases_bucket)
        entry = await kv.get(f"partition.{p}")
        await kv.update(f"partition.{p}", b'{"owner":"ctl-new","acquired_at":0}', last=entry.revision)

        state.last_seq = 11
        await ctl.snapshots.write(state)
        await _eventually(lambda: p not in ctl._fences, 5, "the fenced controller to let go")
        current = await store.get(eid)
        assert current is not None and current.fence == fence + 100 and current.last_seq == 12
        assert p not in ctl._pullers
    finally:
        await ctl.shutdown()


KILL_MIX = ["chain", "distributed_ok", "local_ok", "retry", "handled_failure", "distributed_fail_fast"]


@pytest.mark.timeout(240)
async def test_killing_one_of_three_controllers_under_load_loses_nothing_and_no_execution_has_two_owners(
    nats_server: EmbeddedNats, js: JetStreamContext, nc: NATS, topo: Topology, tmp_path: Path
) -> None:
    rnd = random.Random(7)
    with Processes(nats_server.url, topo, tmp_path / "logs") as procs:
        controllers = [procs.controller(f"ctl-{i}") for i in range(3)]
        for i in range(2):
            procs.worker(f"w{i}", concurrency=8)
        leases = await js.key_value(topo.leases_bucket)

        async def owners() -> collections.Counter[str]:
            out: collections.Counter[str] = collections.Counter()
            with contextlib.suppress(NoKeysError):
                for key in await leases.keys():
                    if key.startswith("partition."):
                        with contextlib.suppress(KeyNotFoundError):
                            out[msgspec.json.decode((await leases.get(key)).value or b"{}")["owner"]] += 1
            return out

        # The three controllers share the six partitions two each once their leases settle.
        deadline = time.monotonic() + 30
        while sorted((await owners()).values()) != [2, 2, 2]:
            assert time.monotonic() < deadline, f"leases never settled: {await owners()}\n{procs.logs()}"
            await asyncio.sleep(0.1)
        expected: dict[str, str] = {}
        kinds = [k for k in KILL_MIX for _ in range(20)]
        rnd.shuffle(kinds)
        half = len(kinds) // 2
        for n, kind in enumerate(kinds[:half]):
            text, status = STRESS_MIX[kind]
            (eid,) = await submit_many(nc, topo, [(text + f"# {n}\n", {})], file=f"{kind}.yaml")
            expected[eid] = status
        # Mid-run: some executions are done, most of every partition's are in flight.
        deadline = time.monotonic() + 60
        while len(await count_by_execution(js, topo, E.PLAYBOOK_PROCESSED)) < half // 5:
            assert time.monotonic() < deadline, procs.logs()
            await asyncio.sleep(0.05)
        victim = controllers[1]
        # nats-py's `keys()` (an ordered consumer) can end before the bucket's first key under load:
        # read again until all six partitions are listed.
        deadline = time.monotonic() + 10
        while sum((held_at_kill := await owners()).values()) != 6 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert held_at_kill[victim.name] == 2, held_at_kill
        victim.kill()
        killed_at = time.time()
        for n, kind in enumerate(kinds[half:], start=half):
            text, status = STRESS_MIX[kind]
            (eid,) = await submit_many(nc, topo, [(text + f"# {n}\n", {})], file=f"{kind}.yaml")
            expected[eid] = status
        try:
            counts = await wait_processed(js, topo, expected, timeout=120)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{procs.logs(60)}") from None

        assert {e: n for e, n in counts.items() if n != 1} == {}
        ends = await processed(js, topo)
        assert {e: ends[e].payload.get("status") for e in expected} == expected

        # No execution handled by two controllers at once: in stream order, the lease revisions
        # (fencing tokens) stamped on the server events of an execution never go back, and each
        # revision belongs to one controller.
        owners_of: dict[int, set[str]] = collections.defaultdict(set)
        by_victim_after_kill = 0
        moved: set[str] = set()
        stored = await histories(js, topo, expected)
        for eid in expected:
            fences: list[int] = []
            writers: list[str] = []
            for _, ev in stored[eid]:
                if ev.source != "server" or ev.fence is None:
                    continue
                owners_of[ev.fence].add(str(ev.controller))
                if fences and ev.fence < fences[-1]:
                    raise AssertionError(
                        f"{eid}: an older owner wrote after a newer one: {[*fences, ev.fence]}"
                    )
                fences.append(ev.fence)
                writers.append(str(ev.controller))
                if ev.controller == victim.name and _epoch(ev) > killed_at + 0.5:
                    by_victim_after_kill += 1
            if victim.name in writers and writers[-1] != victim.name:
                moved.add(eid)
        assert {f: o for f, o in owners_of.items() if len(o) > 1} == {}
        assert by_victim_after_kill == 0
        assert moved, (
            "no execution the killed controller handled was finished by another controller: "
            f"writers {dict(collections.Counter(c for o in owners_of.values() for c in o))}, "
            f"leases at the kill {held_at_kill}"
        )

        scheduled = [ev for _, ev in await read_named(js, topo, E.STEP_SCHEDULED)]
        assert scheduled_twice(scheduled) == {}
        assert await replay_differences(js, topo, list(expected)) == {}
        await replay_verify(procs.env, rnd.sample(sorted(moved), min(3, len(moved))))


def _epoch(ev: Event) -> float:
    from noetl_stream.control.core.effects import _epoch as parse

    return parse(ev.timestamp)


async def test_one_controller_restarted_with_its_id_takes_its_partitions_back_at_once(
    nats_server: EmbeddedNats, js: JetStreamContext, nc: NATS, topology: Topology, tmp_path: Path
) -> None:
    """A restart of the same controller id (a crashed container in the same pod) does not wait for
    its old leases to expire: an execution started before the kill finishes soon after the restart."""
    topo = msgspec.structs.replace(topology, partitions=2, lease_ttl_s=60.0)
    await provision(js, topo)
    book = playbook(
        """
        - step: start
          tool: {kind: python, code: "import time; time.sleep(1.0); result = 1"}
          next: {arcs: [{step: end}]}
        - step: end
          tool: {kind: noop, result: done}
        """
    )
    with Processes(nats_server.url, topo, tmp_path / "logs") as procs:
        ctl = procs.controller("ctl-same")
        procs.worker("w1")
        (eid,) = await submit_many(nc, topo, [(book, {})])
        await asyncio.sleep(0.5)
        ctl.kill()
        ctl.start()
        try:
            await wait_processed(js, topo, [eid], timeout=30)  # far less than the 60 s lease TTL
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{procs.logs()}") from None
