"""Faults with real processes: workers and the controller killed by SIGKILL, nats-server restarted.

Every test runs ``noetl-stream controller`` and ``noetl-stream worker`` as child processes (tests/procs.py)
with a short command AckWait, crashes some of them at chosen points, and judges the outcome by what
is stored in JetStream: ``playbook.processed`` per execution, ``step.scheduled`` per step run, side
effects that python tasks append to files, and ``replay --verify`` against the live snapshot.

Worker events carry deterministic ``Nats-Msg-Id``s without the delivery attempt, so a rerun's
``step.started`` is dropped by the server's duplicate window: reruns are counted through side effects.
The randomized 500-execution run is in test_stress.py (``make stress``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import os
import random
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from eventlog import (
    count_by_execution,
    history,
    post_mortem,
    processed,
    read_named,
    replay_differences,
    scheduled_twice,
    total,
    wait_processed,
)
from faultbooks import (
    FAN,
    HOLD,
    LOOP,
    LOOP_IN_FLIGHT,
    LOOP_ITEMS,
    POISON,
    POISON_MAX_DELIVER,
    chain,
    hold_starts,
    submit_many,
)
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from procs import NoetlProcess, Processes, provisioned, replay_verify, run_cli

from noetl_stream.control.core.state import ExecutionState
from noetl_stream.jetstream.connection import connect
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.provision import provision
from noetl_stream.kv.snapshots import SnapshotStore
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology

ACK_WAIT_S = 2.0
LEASE_TTL_S = 3.0
"""For the tests that kill the controller: the events a killed controller had pulled and not acked come
back after its consumers' ack wait, which is the lease TTL (10 s by default)."""

# --- fixtures and small helpers -------------------------------------------------------------------


@pytest.fixture
def topo(topology: Topology, request: pytest.FixtureRequest) -> Topology:
    """The test's isolated topology with a short command AckWait (processes get it via NOETL_*), and
    the lease TTL of a ``lease_ttl`` mark."""
    mark = request.node.get_closest_marker("lease_ttl")
    ttl = {"lease_ttl_s": float(mark.args[0])} if mark is not None else {}
    return msgspec.structs.replace(topology, command_ack_wait_s=ACK_WAIT_S, **ttl)


@pytest.fixture
async def procs(
    nats_server: EmbeddedNats, js: JetStreamContext, topo: Topology, tmp_path: Path
) -> AsyncIterator[Processes]:
    """Controller/worker processes of this test."""
    async with provisioned(nats_server.url, js, topo, tmp_path / "logs") as p:
        yield p


async def until(check: Callable[[], Any], timeout: float, what: str, procs: Processes | None = None) -> None:
    """Poll a sync or async predicate every 20 ms until true; fail naming `what` (and process logs)."""
    deadline = time.monotonic() + timeout
    while True:
        ok = check()
        if not isinstance(ok, bool):
            ok = await ok
        if ok:
            return
        if time.monotonic() > deadline:
            logs = f"\n{procs.logs()}" if procs is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{logs}")
        await asyncio.sleep(0.02)


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


# --- a worker crashes in the middle of a task ---------------------------------------------------


async def test_worker_killed_mid_task_command_is_redelivered_and_execution_completes(
    procs: Processes, topo: Topology, js: JetStreamContext, tmp_path: Path
) -> None:
    runs = tmp_path / "runs.txt"
    book = tmp_path / "hold.yaml"
    book.write_text(HOLD)
    procs.controller()
    first = procs.worker("w1", concurrency=2)
    client = asyncio.create_task(
        run_cli(
            procs.env,
            "submit",
            str(book),
            "--payload",
            json.dumps({"path": str(runs), "hold": 3}),
            "--wait",
            "--json",
            timeout=50,
        )
    )
    await until(lambda: len(hold_starts(runs)) == 1, 30, "the task to start in w1", procs)

    async def recorded() -> bool:  # w1's step.started is stored (its progress watcher publishes it)
        info = await js.stream_info(
            topo.events_stream, subjects_filter=f"{topo.prefix}.events.*.*.task.started"
        )
        return bool(info.state.subjects)

    await until(recorded, 30, "w1's task.started to be stored", procs)
    first.kill()
    second = procs.worker("w2", concurrency=2)

    code, out, err = await client

    summary = json.loads(out)
    assert code == 0 and summary["status"] == "success", f"{out}{err}\n{procs.logs()}"
    assert hold_starts(runs) == [first.pid, second.pid]  # ran twice: the crashed run, the redelivery
    assert summary["result"] == second.pid
    events = await history(js, topo, summary["execution_id"])
    (done,) = [e for e in events if e.name == E.STEP_DONE]
    assert done.worker == "w2"
    assert [e.name for e in events].count(E.PLAYBOOK_PROCESSED) == 1
    # Both runs are on record: the redelivery's events have ids of their own (not dropped as duplicates).
    started = [e for e in events if e.name == E.STEP_STARTED and e.step_run_id == done.step_run_id]
    assert [(e.worker, e.payload.get("delivery")) for e in started] == [("w1", None), ("w2", 2)]
    assert len({e.event_id for e in started}) == 2
    tasks = [e.worker for e in events if e.name == E.TASK_STARTED and e.step_run_id == done.step_run_id]
    assert tasks == ["w1", "w2"]
    pending = await js.consumer_info(topo.commands_stream, topo.pool_consumer("default"))
    assert pending.num_ack_pending == 0 and pending.num_pending == 0


# --- a long task that keeps its command alive is not redelivered ----------------------------------


async def test_task_longer_than_ack_wait_with_in_progress_is_not_redelivered(
    procs: Processes, topo: Topology, js: JetStreamContext, nc: NATS, tmp_path: Path
) -> None:
    runs = tmp_path / "runs.txt"
    procs.controller()
    procs.worker("w1", concurrency=2)
    procs.worker("w2", concurrency=2)  # a redelivery would be picked up here, or by w1 again
    # Past two AckWaits: without its keep-alive, the command would be redelivered (and a second run
    # start) 2 s into the task, 3 s before its end.
    hold = 2.5 * ACK_WAIT_S

    (eid,) = await submit_many(nc, topo, [(HOLD, {"path": str(runs), "hold": hold})])
    await wait_processed(js, topo, [eid], timeout=hold + 30)

    events = await history(js, topo, eid)
    (end,) = [e for e in events if e.name == E.PLAYBOOK_PROCESSED]
    assert end.payload["status"] == "success", end.payload
    assert len(hold_starts(runs)) == 1, f"the task ran {len(hold_starts(runs))} times"
    info = await js.consumer_info(topo.commands_stream, topo.pool_consumer("default"))
    assert info.delivered.consumer_seq == 1, "the command was delivered more than once"
    assert info.num_redelivered == 0
    assert [e.name for e in events].count(E.STEP_STARTED) == 1


# --- the controller crashes at random points of a busy run ----------------------------------------


@pytest.mark.lease_ttl(LEASE_TTL_S)
async def test_controller_killed_at_random_points_nothing_scheduled_twice_and_replay_agrees(
    procs: Processes, topo: Topology, js: JetStreamContext, nc: NATS
) -> None:
    seed = int(os.environ.get("NOETL_FAULT_SEED", time.time_ns() % 1_000_000))
    rnd = random.Random(seed)
    print(f"NOETL_FAULT_SEED={seed}")
    executions, steps = 30, 10
    controller = procs.controller()
    procs.worker("w1", concurrency=6)
    procs.worker("w2", concurrency=6)
    ids = await submit_many(nc, topo, [(chain(steps, 0.05), {})] * executions)

    # Three crashes at random points of the run (a fraction of its steps done, plus up to 150 ms). The
    # last leaves a third of the steps or more to do: about half a second of work at the workers' pace
    # (12 at once, 50 ms each), so the run cannot end before it however fast the controller is.
    work = executions * steps
    marks = [rnd.uniform(0.1, 0.25), rnd.uniform(0.3, 0.45), rnd.uniform(0.5, 0.65)]
    for mark in marks:
        await until(
            functools.partial(_at_least, js, topo, E.STEP_DONE, int(mark * work)),
            45,
            f"{mark:.0%} of the steps done (seed {seed})",
            procs,
        )
        await asyncio.sleep(rnd.uniform(0, 0.15))
        controller.kill()
        finished = await total(js, topo, E.PLAYBOOK_PROCESSED)
        print(
            f"controller killed at {mark:.0%}: {await total(js, topo, E.STEP_DONE)} steps done, {finished} finished"
        )
        assert finished < executions, f"the run ended before the crash at {mark:.0%} (seed {seed})"
        controller.start()

    counts = await wait_processed(js, topo, ids, timeout=45)

    assert controller.starts == 4
    assert all(counts[eid] == 1 for eid in ids), counts
    ends = await processed(js, topo)
    assert {eid: ends[eid].payload["status"] for eid in ids} == dict.fromkeys(ids, "success")
    scheduled = [ev for _, ev in await read_named(js, topo, E.STEP_SCHEDULED)]
    assert scheduled_twice(scheduled) == {}, f"seed {seed}"
    per_step = collections.Counter((e.execution_id, e.step) for e in scheduled)
    assert len(per_step) == work and set(per_step.values()) == {1}, f"seed {seed}"
    assert await replay_differences(js, topo, ids) == {}, f"seed {seed}"
    await replay_verify(procs.env, rnd.sample(ids, 3))


async def _at_least(js: JetStreamContext, topology: Topology, name: str, n: int) -> bool:
    return await total(js, topology, name) >= n


async def test_controller_crash_with_an_unhandled_event_and_a_newer_one_of_the_same_execution(
    procs: Processes, topo: Topology, js: JetStreamContext, nc: NATS
) -> None:
    """The controller receives iteration 0's result and dies before publishing its effect (the command of
    iteration 2). A new controller starts; iteration 1's result (a later stream sequence) reaches it
    before iteration 0's is redelivered (after AckWait). Iteration 2 must still be scheduled.

    The test client plays the crashed controller: it pulls iteration 0's result from the ``controller``
    consumer and never acks it, which is exactly the consumer's view of a controller killed mid-event.
    """
    controller = procs.controller()
    procs.worker("w1", concurrency=4)
    (eid,) = await submit_many(nc, topo, [(FAN, {})])
    ctl_consumer = topo.controller_events_consumer(topo.partition_of(eid))

    async def idle() -> bool:
        info = await js.consumer_info(topo.events_stream, ctl_consumer)
        return bool(info.num_ack_pending == 0 and info.num_pending == 0)

    await until(lambda: _at_least(js, topo, E.LOOP_STARTED, 1), 20, "loop.started", procs)
    await until(idle, 20, "the controller to ack loop.started", procs)
    controller.kill()

    await until(lambda: _at_least(js, topo, E.LOOP_ITERATION_DONE, 1), 20, "iteration 0 done", procs)
    crashed = await js.pull_subscribe_bind(ctl_consumer, stream=topo.events_stream)
    (held,) = await crashed.fetch(1, timeout=5)
    assert held.subject.endswith(".loop.iteration.done")

    async def hold_it() -> None:  # the consumer must not redeliver it before the newer event is handled
        while True:
            await held.in_progress()
            await asyncio.sleep(ACK_WAIT_S / 4)

    async def newer_one_handled() -> bool:  # the new controller acked iteration 1's result
        info = await js.consumer_info(topo.events_stream, ctl_consumer)
        return bool(info.num_ack_pending == 1 and info.num_pending == 0 and info.delivered.consumer_seq >= 3)

    holder = asyncio.create_task(hold_it())
    try:
        await until(lambda: _at_least(js, topo, E.LOOP_ITERATION_DONE, 2), 20, "iteration 1 done", procs)
        controller.start()
        await until(newer_one_handled, 20, "the new controller to handle iteration 1", procs)
    finally:
        holder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await holder
    await held.nak()  # the crashed controller's delivery ends: redelivered to the new controller
    await crashed.unsubscribe()

    with contextlib.suppress(TimeoutError):
        await wait_processed(js, topo, [eid], timeout=8)
    events = await history(js, topo, eid)
    assert sorted(e.payload["index"] for e in events if e.name == E.LOOP_ITERATION_DONE) == [0, 1, 2]
    assert [e.name for e in events].count(E.PLAYBOOK_PROCESSED) == 1


async def test_controller_restart_resumes_an_execution_from_its_snapshot(
    procs: Processes, topo: Topology, js: JetStreamContext, nc: NATS
) -> None:
    """The controller snapshots a running chain (its second boundary comes more than a second after the
    first), dies, and a new controller process gets the next step's result. It must finish the run."""
    controller = procs.controller()
    procs.worker("w1", concurrency=2)
    (eid,) = await submit_many(nc, topo, [(chain(3, 1.2), {})])
    snapshots = await SnapshotStore.open(js, topo, ExecutionState)

    async def snapshotted() -> bool:
        state = await snapshots.get(eid)
        return state is not None and not state.terminal

    await until(snapshotted, 20, "a snapshot of the running execution", procs)
    controller.kill()
    controller.start()

    await wait_processed(js, topo, [eid], timeout=10)
    events = await history(js, topo, eid)
    (end,) = [e for e in events if e.name == E.PLAYBOOK_PROCESSED]
    assert end.payload["status"] == "success"
    assert [e.step for e in events if e.name == E.STEP_DONE] == ["start", "s1", "s2"]


# --- nats-server restarts with executions in flight ----------------------------------------------


@pytest.mark.parametrize("how", ["restart", "kill"])
async def test_nats_server_restart_with_50_executions_in_flight_all_complete(
    own_server: EmbeddedNats, tmp_path: Path, how: str
) -> None:
    topo = Topology(prefix="restart", command_ack_wait_s=ACK_WAIT_S)
    executions, steps = 50, 4
    nc = await connect(own_server.url, name="pytest-restart", connect_wait_s=10)
    try:
        js = nc.jetstream(timeout=10)
        await provision(js, topo, ("default",))
        with Processes(own_server.url, topo, tmp_path / "logs") as procs:
            procs.controller()
            procs.worker("w1", concurrency=6)
            procs.worker("w2", concurrency=6)
            ids = await submit_many(nc, topo, [(chain(steps, 0.2), {})] * executions)
            await until(
                lambda: _at_least(js, topo, E.STEP_DONE, executions), 45, "a quarter of the steps", procs
            )
            assert await total(js, topo, E.PLAYBOOK_PROCESSED) < executions, "restart came too late"

            if how == "kill":  # a crash: the file store is recovered from what reached the files
                own_server.kill()
                await asyncio.to_thread(own_server.start)
            else:  # SIGTERM, then start again on the same port and store
                await asyncio.to_thread(own_server.restart)

            try:
                counts = await wait_processed(js, topo, ids, timeout=30, tolerate_disconnects=True)
            except TimeoutError as exc:
                stuck = sorted(set(ids) - set(await count_by_execution(js, topo, E.PLAYBOOK_PROCESSED)))
                dump = await post_mortem(
                    js, topo, stuck, dict.fromkeys(ids, "chain"), [], tmp_path / "stuck.txt"
                )
                raise AssertionError(f"{exc}, see {dump}\n{procs.logs()}") from None
            assert all(p.alive for p in procs.all), "a process died instead of reconnecting"
            assert all(counts[eid] == 1 for eid in ids), counts
            ends = await processed(js, topo)
            assert {ends[eid].payload["status"] for eid in ids} == {"success"}
            assert scheduled_twice([ev for _, ev in await read_named(js, topo, E.STEP_SCHEDULED)]) == {}
            assert await replay_differences(js, topo, ids) == {}
    finally:
        await nc.close()


async def test_server_dies_with_a_publish_unanswered_the_worker_slot_is_not_lost(
    own_server: EmbeddedNats, tmp_path: Path
) -> None:
    """The server freezes (SIGSTOP) while a task runs, so the worker's boundary event sits unread in the
    socket when the server is killed. After the restart, the command must run again and the worker's
    only slot must serve the next execution."""
    topo = Topology(prefix="frozen", command_ack_wait_s=ACK_WAIT_S)
    runs = tmp_path / "runs.txt"
    nc = await connect(own_server.url, name="pytest-frozen", connect_wait_s=10)
    try:
        js = nc.jetstream(timeout=10)
        await provision(js, topo, ("default",))
        with Processes(own_server.url, topo, tmp_path / "logs") as procs:
            procs.controller()
            procs.worker("w1", concurrency=1)
            first, second = await submit_many(nc, topo, [(HOLD, {"path": str(runs), "hold": 1.0})] * 2)
            await until(lambda: len(hold_starts(runs)) == 1, 20, "the first task to start", procs)
            assert own_server.pid is not None
            os.kill(own_server.pid, signal.SIGSTOP)
            try:
                await until(lambda: len(lines(runs)) == 2, 10, "the first task to end", procs)
                await asyncio.sleep(0.3)  # the worker writes its step.done to the socket of a frozen server
            finally:
                own_server.kill()  # SIGKILL ends a stopped process too
            await asyncio.to_thread(own_server.start)

            try:
                # The step.done written into the frozen server's socket is never answered: the worker's
                # outbox gives up on it after its 10 s ack timeout and publishes it again.
                await wait_processed(js, topo, [first, second], timeout=40, tolerate_disconnects=True)
            except TimeoutError as exc:
                raise AssertionError(f"{exc}; task runs {lines(runs)}\n{procs.logs()}") from None
    finally:
        await nc.close()


# --- a worker crashes in a long local loop; a command that crashes every worker ----------------------


async def test_worker_killed_mid_local_loop_completed_iterations_are_not_run_again(
    procs: Processes, topo: Topology, js: JetStreamContext, nc: NATS, tmp_path: Path
) -> None:
    effects = tmp_path / "iterations.txt"
    procs.controller()
    first = procs.worker("w1", concurrency=2)
    (eid,) = await submit_many(nc, topo, [(LOOP, {"path": str(effects)})])
    await until(lambda: len(lines(effects)) >= 300, 45, "300 iterations in w1", procs)
    first.kill()
    at_kill = len(lines(effects))
    procs.worker("w2", concurrency=2)

    await wait_processed(js, topo, [eid], timeout=45)

    events = await history(js, topo, eid)
    (end,) = [e for e in events if e.name == E.PLAYBOOK_PROCESSED]
    assert end.payload["status"] == "success", end.payload
    assert end.payload["result"] == list(range(LOOP_ITEMS))
    runs = collections.Counter(int(x) for x in lines(effects))
    assert set(runs) == set(range(LOOP_ITEMS))
    repeated = sum(n - 1 for n in runs.values())
    print(f"killed after {at_kill} iterations; {repeated} ran again")
    assert at_kill < LOOP_ITEMS, "the loop finished before the kill"
    assert repeated <= LOOP_IN_FLIGHT, f"{repeated} iterations ran again after the crash at {at_kill}"


async def test_poison_command_reaches_max_deliver_and_the_execution_fails(
    nats_server: EmbeddedNats, topology: Topology, js: JetStreamContext, nc: NATS, tmp_path: Path
) -> None:
    # Each delivery crashes its worker at once and the next comes an AckWait later: a shorter one than
    # ACK_WAIT_S (still 3x the 0.5 s keep-alive of a command held by a worker or the controller).
    ack_wait = 1.5
    topo = msgspec.structs.replace(
        topology, command_ack_wait_s=ack_wait, command_max_deliver=POISON_MAX_DELIVER
    )
    await provision(js, topo, ("default",))
    runs = tmp_path / "runs.txt"
    with Processes(nats_server.url, topo, tmp_path / "logs") as procs:
        procs.controller()
        worker = procs.worker("w1", concurrency=2)
        (eid,) = await submit_many(nc, topo, [(POISON, {"path": str(runs)})])
        async with _restarting(worker):  # a supervisor brings the crashed worker back, as k8s would
            await until(lambda: len(lines(runs)) >= POISON_MAX_DELIVER, 40, "max_deliver crashes", procs)
            await wait_processed(js, topo, [eid], timeout=4 * ack_wait + 10)

        events = await history(js, topo, eid)
        (failed,) = [e for e in events if e.name == E.STEP_FAILED]
        assert failed.payload["error"]["kind"] == "max_deliver_exceeded", failed.payload
        (end,) = [e for e in events if e.name == E.PLAYBOOK_PROCESSED]
        assert end.payload["status"] == "failed"
        assert len(lines(runs)) == POISON_MAX_DELIVER
        counts = await count_by_execution(js, topo, E.PLAYBOOK_PROCESSED)
        assert counts == {eid: 1}
        # Not left behind either: the command is gone from the work queue.
        info = await js.consumer_info(topo.commands_stream, topo.pool_consumer("default"))
        assert (info.num_pending, info.num_ack_pending) == (0, 0)
        assert (await js.stream_info(topo.commands_stream)).state.messages == 0


class _restarting:
    """While active, restart `proc` whenever it has exited."""

    def __init__(self, proc: NoetlProcess) -> None:
        self.proc = proc
        self._task: asyncio.Task[None] | None = None

    async def _watch(self) -> None:
        while True:
            if not self.proc.alive:
                self.proc.start()
            await asyncio.sleep(0.05)

    async def __aenter__(self) -> _restarting:
        self._task = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
