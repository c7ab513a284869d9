"""A 3-node JetStream cluster on loopback: R3 streams and buckets, a node SIGKILLed mid-run, nothing lost.

Three real ``nats-server`` processes (`EmbeddedCluster`: routes between free ports, a store per node),
``noetl-stream provision --replicas 3``, a controller and two workers as real processes connected to all
three URLs, 60 executions (a few steps and a loop each). When half of their first steps are done, the
node leading the events stream is killed with SIGKILL: the stream elects a new leader among the two left,
clients reconnect to them, and every execution must still finish exactly once, successfully, with its
result. Then the node comes back and catches up. ``make cluster-test`` runs only this file.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgspec
import pytest
from eventlog import count_by_execution, read_named, total, wait_processed
from faultbooks import submit_many
from helpers import playbook
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from procs import Processes, run_cli

from noetl_stream.jetstream.connection import connect
from noetl_stream.jetstream.embedded import EmbeddedCluster
from noetl_stream.kv.provision import provision, stream_names
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology

pytestmark = pytest.mark.cluster

EXECUTIONS = 60
ITEMS = [1, 2, 3, 4]

# start -> fan (a loop of four, two at a time) -> total: the sum of the doubled items, times workload.k.
BOOK = playbook(
    r"""
    - step: start
      tool:
        kind: python
        args: {k: "{{ workload.k }}"}
        code: |
          result = k
      next: {arcs: [{step: fan}]}
    - step: fan
      loop:
        in: "{{ workload.items }}"
        iterator: x
        spec: {mode: parallel, max_in_flight: 2}
      tool:
        kind: python
        args: {x: "{{ iter.x }}"}
        code: |
          import time
          time.sleep(0.05)
          result = x * 2
      next:
        arcs:
          - step: total
            when: "{{ event.name == 'loop.done' }}"
    - step: total
      tool:
        kind: python
        args: {values: "{{ fan }}", k: "{{ start }}"}
        code: |
          result = sum(values) * k
    """,
    workload={"k": 1, "items": ITEMS},
    name="clustered",
)


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(3, tmp_path_factory.mktemp("cluster")) as c:
        yield c


@pytest.fixture
def cluster(three_nodes: EmbeddedCluster) -> EmbeddedCluster:
    """The module's cluster with all three nodes up (a failed test may have left one down)."""
    three_nodes.start()
    return three_nodes


@pytest.fixture
async def topo(cluster: EmbeddedCluster) -> AsyncIterator[Topology]:
    """R3, and a short command AckWait: commands held by a worker cut off from its node come back soon."""
    t = Topology(prefix="c" + uuid.uuid4().hex[:10], replicas=3, command_ack_wait_s=3.0)
    yield t
    nc = await connect(cluster.url, name="pytest-cleanup", connect_wait_s=10)
    for name in stream_names(t):
        try:
            await nc.jetstream(timeout=10).delete_stream(name)
        except Exception:
            pass
    await nc.close()


@pytest.fixture
async def nc(cluster: EmbeddedCluster) -> AsyncIterator[NATS]:
    client = await connect(cluster.url, name="pytest-cluster", connect_wait_s=10)
    yield client
    await client.close()


async def _until_started(procs: Processes) -> None:
    deadline = time.monotonic() + 40
    marks = {"controller": '"controller.started"', "w1": '"worker.started"', "w2": '"worker.started"'}
    while not all(marks[p.name] in p.log_path.read_text() for p in procs.all):
        assert time.monotonic() < deadline, f"processes did not start\n{procs.logs(60)}"
        await asyncio.sleep(0.05)


async def _until_steps_done(js: JetStreamContext, topo: Topology, n: int, procs: Processes) -> int:
    """Wait until at least `n` ``step.done`` events are stored; how many there are."""
    deadline = time.monotonic() + 40
    while (done := await total(js, topo, E.STEP_DONE)) < n:
        assert time.monotonic() < deadline, f"fewer than {n} steps done\n{procs.logs(60)}"
        await asyncio.sleep(0.05)
    return done


async def test_r3_cluster_loses_a_node_mid_run_and_every_execution_completes_once(
    cluster: EmbeddedCluster, topo: Topology, nc: NATS, tmp_path: Path
) -> None:
    js = nc.jetstream(timeout=10)
    with Processes(cluster.url, topo, tmp_path / "logs") as procs:
        env = {**procs.env, "NOETL_REPLICAS": "1"}  # the flag wins over the environment
        code, out, err = await run_cli(env, "provision", "--replicas", "3", "--nats", cluster.url, timeout=60)
        assert code == 0, f"{out}{err}"
        assert json.loads(out)["created"], out
        for name in stream_names(topo):  # events, commands, requests, KV buckets, object store
            info = await js.stream_info(name)
            assert info.config.num_replicas == 3, name
            assert info.cluster is not None and len(info.cluster.replicas or []) == 2, name

        # Controller and workers as started without NOETL_REPLICAS (so R1): they must not scale R3 down.
        procs.env.pop("NOETL_REPLICAS")
        procs.controller()
        procs.worker("w1", concurrency=4)
        procs.worker("w2", concurrency=4)
        await _until_started(procs)  # a node lost while a process provisions at start is another story
        ids = await submit_many(nc, topo, [(BOOK, {"k": i}) for i in range(EXECUTIONS)], "clustered.yaml")

        leader = (await js.stream_info(topo.events_stream)).cluster
        assert leader is not None and leader.leader is not None
        victim = cluster.node(leader.leader)
        done = await _until_steps_done(js, topo, EXECUTIONS // 2, procs)
        victim.kill()
        print(f"killed {victim.server_name} (events stream leader) after {done} step.done events")

        try:
            counts = await wait_processed(js, topo, ids, timeout=60, tolerate_disconnects=True)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{procs.logs(60)}") from None
        assert {eid: counts[eid] for eid in ids} == dict.fromkeys(ids, 1)
        assert all(p.alive for p in procs.all), procs.logs(60)

        ends = {ev.execution_id: ev for _, ev in await read_named(js, topo, E.PLAYBOOK_PROCESSED)}
        failed = {eid: ends[eid].payload for eid in ids if ends[eid].payload.get("status") != "success"}
        assert not failed, failed
        finished = await count_by_execution(js, topo, E.WORKFLOW_FINISHED)
        assert {eid: finished.get(eid) for eid in ids} == dict.fromkeys(ids, 1)
        totals = {
            ev.execution_id: ev.payload.get("result")
            for _, ev in await read_named(js, topo, E.STEP_DONE)
            if ev.step == "total"
        }
        want = sum(x * 2 for x in ITEMS)
        assert {eid: totals.get(eid) for eid in ids} == {eid: want * k for k, eid in enumerate(ids)}
        # Every command settled: an ack lost with the killed node leaves its command pending until
        # AckWait, then it is redelivered and settled (at least once: docs/durability.md).
        deadline = time.monotonic() + 3 * topo.command_ack_wait_s + 10
        while True:
            pool = await js.consumer_info(topo.commands_stream, topo.pool_consumer("default"))
            if pool.num_pending == 0 and pool.num_ack_pending == 0:
                break
            assert time.monotonic() < deadline, (pool.num_pending, pool.num_ack_pending, procs.logs(30))
            await asyncio.sleep(0.2)
        for name in stream_names(topo):
            assert (await js.stream_info(name)).config.num_replicas == 3, name

    # The node comes back with its store and catches up: three current replicas again.
    await asyncio.to_thread(victim.start)
    await asyncio.to_thread(cluster.wait_healthy, 30)
    deadline = time.monotonic() + 30
    while True:
        info = (await js.stream_info(topo.events_stream)).cluster
        assert info is not None
        peers = info.replicas or []
        if len(peers) == 2 and all(p.current for p in peers):
            break
        assert time.monotonic() < deadline, f"replicas did not catch up: {info}"
        await asyncio.sleep(0.2)


async def test_runtime_provisioning_keeps_the_replicas_an_operator_chose(topo: Topology, nc: NATS) -> None:
    js = nc.jetstream(timeout=10)
    await provision(js, topo)  # R3, as `provision --replicas 3` does
    r1 = msgspec.structs.replace(topo, replicas=1)

    report = await provision(js, r1, keep_replicas=True)  # what a controller or worker does at start
    assert not report.changed, report
    assert {(await js.stream_info(n)).config.num_replicas for n in stream_names(topo)} == {3}

    report = await provision(js, r1)  # what `provision --replicas 1` does
    assert len(report.updated) == len(stream_names(topo)), report
    assert {(await js.stream_info(n)).config.num_replicas for n in stream_names(topo)} == {1}


def test_close_stops_every_node_and_removes_the_temp_dir() -> None:
    c = EmbeddedCluster(3)
    c.start()
    pids = [n.pid for n in c]
    assert len(set(pids)) == 3 and all(n.healthy for n in c)
    assert len(c.url.split(",")) == 3
    c.close()
    assert not any(n.running for n in c)
    assert not c.dir.exists()
    for pid in pids:
        assert pid is not None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        raise AssertionError(f"nats-server {pid} still runs")
