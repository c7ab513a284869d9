"""Graceful worker shutdown, as Kubernetes does it: SIGTERM, then (after the grace period) SIGKILL.

Real ``noetl-stream controller`` and ``worker`` processes (tests/procs.py). A worker that gets SIGTERM
stops pulling, lets its running command finish within ``--grace`` and acks it; with a grace shorter
than the task it leaves the command unacknowledged, and JetStream redelivers it to another worker
after the ack wait. Either way the execution completes exactly once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import msgspec
import pytest
from eventlog import wait_processed
from faultbooks import HOLD, hold_starts
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from procs import NoetlProcess, Processes, provisioned

from noetl_stream.client.submit import request_for, submit
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.history import read_events
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event

ACK_WAIT_S = 1.5


@pytest.fixture
def topo(topology: Topology) -> Topology:
    return msgspec.structs.replace(topology, command_ack_wait_s=ACK_WAIT_S)


@pytest.fixture
async def procs(
    nats_server: EmbeddedNats, js: JetStreamContext, topo: Topology, tmp_path: Path
) -> AsyncIterator[Processes]:
    async with provisioned(nats_server.url, js, topo, tmp_path / "logs") as p:
        yield p


async def until(check: Callable[[], bool], timeout: float, what: str, procs: Processes) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{procs.logs()}")
        await asyncio.sleep(0.02)


async def sigterm(proc: NoetlProcess, timeout: float) -> tuple[int, float]:
    """SIGTERM (by PID), as the kubelet does; wait for the exit. Returns (exit code, seconds it took)."""
    assert proc.popen is not None and proc.alive
    started = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    code = await asyncio.to_thread(proc.popen.wait, timeout)
    return code, time.monotonic() - started


async def history(js: JetStreamContext, topology: Topology, execution_id: str) -> list[Event]:
    return [ev async for _, ev in read_events(js, topology, execution_id)]


async def test_sigterm_with_enough_grace_finishes_the_running_task_and_acks_it(
    procs: Processes, topo: Topology, js: JetStreamContext, nc: NATS, tmp_path: Path
) -> None:
    runs, later_runs = tmp_path / "runs.txt", tmp_path / "later.txt"
    procs.controller()
    w1 = procs.worker("w1", concurrency=2, grace=10)
    first = await submit(nc, topo, request_for(HOLD, "hold.yaml", {"path": str(runs), "hold": 2}))
    await until(lambda: hold_starts(runs) == [w1.pid], 40, "the task to start in w1", procs)

    stopping = asyncio.create_task(sigterm(w1, timeout=30))
    await until(lambda: "worker.stopping" in w1.log_path.read_text(), 30, "w1 to stop pulling", procs)
    (said,) = [line for line in w1.log_path.read_text().splitlines() if '"worker.stopping"' in line]
    assert json.loads(said)["worker"] == "w1"  # which worker stops, among a pool's
    # w1 is finishing its task but takes nothing new: this one must wait for another worker.
    second = await submit(nc, topo, request_for(HOLD, "hold.yaml", {"path": str(later_runs), "hold": 0}))
    code, took = await stopping

    assert code == 0, procs.logs()
    assert took >= 1.0, "w1 exited before its 2 s task could have finished"
    await wait_processed(js, topo, [first], timeout=30)
    events = await history(js, topo, first)
    (done,) = [e for e in events if e.name == E.STEP_DONE]
    assert done.worker == "w1" and done.payload["result"] == w1.pid  # finished where it started
    (end,) = [e for e in events if e.name == E.PLAYBOOK_PROCESSED]
    assert end.payload["status"] == "success", end.payload
    assert hold_starts(runs) == [w1.pid], "the task ran more than once"
    assert hold_starts(later_runs) == [], "a worker that got SIGTERM took new work"

    w2 = procs.worker("w2", concurrency=2)
    await wait_processed(js, topo, [second], timeout=30)
    assert hold_starts(later_runs) == [w2.pid]
    info = await js.consumer_info(topo.commands_stream, topo.pool_consumer("default"))
    assert info.num_ack_pending == 0 and info.num_pending == 0
    assert (await history(js, topo, first)).count(end) == 1


async def test_sigterm_with_a_short_grace_hands_the_command_back_to_another_worker(
    procs: Processes, topo: Topology, js: JetStreamContext, nc: NATS, tmp_path: Path
) -> None:
    runs = tmp_path / "runs.txt"
    procs.controller()
    w1 = procs.worker("w1", concurrency=2, grace=0.5)
    eid = await submit(nc, topo, request_for(HOLD, "hold.yaml", {"path": str(runs), "hold": 2}))
    await until(lambda: hold_starts(runs) == [w1.pid], 40, "the task to start in w1", procs)

    code, _ = await sigterm(w1, timeout=30)
    assert code == 0, procs.logs()
    (said,) = [
        json.loads(ln) for ln in w1.log_path.read_text().splitlines() if '"worker.grace_expired"' in ln
    ]
    assert [(c["execution_id"], c["step"]) for c in said["commands"]] == [(eid, "start")]  # what it left
    names = [e.name for e in await history(js, topo, eid)]
    assert E.STEP_DONE not in names and E.PLAYBOOK_PROCESSED not in names  # w1 gave up, did not finish

    w2 = procs.worker("w2", concurrency=2)
    await wait_processed(js, topo, [eid], timeout=30)
    events = await history(js, topo, eid)
    (done,) = [e for e in events if e.name == E.STEP_DONE]
    assert done.worker == "w2" and done.payload["result"] == w2.pid
    assert [e.name for e in events].count(E.PLAYBOOK_PROCESSED) == 1
    (end,) = [e for e in events if e.name == E.PLAYBOOK_PROCESSED]
    assert end.payload["status"] == "success", end.payload
    assert hold_starts(runs) == [w1.pid, w2.pid]  # the interrupted run, then the redelivery
    info = await js.consumer_info(topo.commands_stream, topo.pool_consumer("default"))
    assert info.delivered.consumer_seq >= 2  # delivered to w1, then redelivered (to w2)
    assert info.num_ack_pending == 0 and info.num_pending == 0
