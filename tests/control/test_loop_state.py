"""A distributed loop's controller state does not grow with its items or results.

The state keeps counters and a bitmap of settled iterations; the items are packed once (inline when
small, else in the object store); the results stay in their ``loop.iteration.done`` events and the
controller assembles the list once, for ``loop.done``. What a user sees is unchanged: the loop's result
in item order (``None`` for a failed iteration), a resumed controller that continues where the loop
was, and a replay equal to the live projection.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from textwrap import indent
from typing import Any

import msgspec
import nats.errors
import pytest
from helpers import JOURNAL_CODE, playbook, requested
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import follow
from noetl_stream.control import backoff
from noetl_stream.control.controller import Controller
from noetl_stream.control.core.items import INLINE_ITEMS_BYTES, ItemsMissingError, checksum
from noetl_stream.control.core.plans import PlanCache
from noetl_stream.control.core.reducer import Reducer
from noetl_stream.control.core.state import ExecutionState
from noetl_stream.control.deadlines import Deadlines
from noetl_stream.control.replay import verify
from noetl_stream.dataplane.worker import Worker
from noetl_stream.jetstream.outbox import Outbox
from noetl_stream.kv.deadlines import DeadlineIndex
from noetl_stream.kv.history import read_events, scan
from noetl_stream.kv.provision import provision
from noetl_stream.kv.results import ResultStore
from noetl_stream.kv.snapshots import SnapshotStore
from noetl_stream.protocol import events as E
from noetl_stream.protocol.refs import is_ref
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event, now_iso
from noetl_stream.runtime.local import Runtime

# --- the reducer alone ----------------------------------------------------------------------------

N = 100_000

BIG = playbook(
    """
    - step: start
      spec: {policy: {failure: {mode: best_effort}}}
      loop:
        in: "{{ range(workload.n) | list }}"
        iterator: item
        spec: {mode: parallel, max_in_flight: 100, policy: {exec: distributed}}
      tool: {kind: noop, result: "{{ iter.item }}"}
    """,
    workload={"n": N},
)


def _iteration(eid: str, run_id: str, index: Any, *, failed: bool = False, attempt: int = 1) -> Event:
    name = E.LOOP_ITERATION_FAILED if failed else E.LOOP_ITERATION_DONE
    payload = {"index": index, "error": {"kind": "boom", "index": index}} if failed else {"index": index}
    if not failed:
        payload["result"] = index
    return Event(
        event_id=f"{eid}:{run_id}.{index}:{name}:{attempt}",
        execution_id=eid,
        name=name,
        source="worker",
        entity_type="iteration",
        entity_id=f"{run_id}.{index}",
        status="error" if failed else "success",
        timestamp=now_iso(),
        payload=payload,
        step="start",
        step_run_id=run_id,
    )


def test_a_100k_item_loop_state_encodes_small_and_resumes_from_its_packed_items() -> None:
    eid = "bigloop1"
    reducer = Reducer(PlanCache())
    state, fx = reducer.apply(None, requested(eid, BIG), 1)
    assert state is not None
    (blob,) = fx.blobs  # the items, stored once
    assert blob.key == f"{eid}/start-1/items" and len(blob.data) > INLINE_ITEMS_BYTES
    assert [c.iteration.index for c in fx.commands if c.iteration] == list(range(100))
    seq = 1
    for i in range(1000):
        seq += 1
        state, fx = reducer.apply(state, _iteration(eid, "start-1", i, failed=i == 500), seq)
        (cmd,) = fx.commands
        assert cmd.iteration is not None and cmd.iteration.item == cmd.iteration.index == i + 100
    assert state is not None
    for duplicate in (_iteration(eid, "start-1", 3, attempt=2), _iteration(eid, "start-1", N)):
        seq += 1
        state, fx = reducer.apply(state, duplicate, seq)
        assert fx.commands == []  # a settled index and an index out of range change nothing
    lr = state.runs["start-1"].loop
    assert lr is not None
    assert (lr.next_index, lr.in_flight, lr.done, lr.failed) == (1100, 100, 999, 1)
    assert lr.first_error == {"kind": "boom", "index": 500}
    assert (lr.items_key, lr.items_checksum) == (blob.key, checksum(blob.data))

    data = msgspec.json.encode(state)
    # Items (589 KB packed) and 1,000 results used to be in it; a bitmap of 100k bits is 16.7 KB.
    assert len(data) < 24 * 1024, len(data)

    # A controller that resumes from this snapshot needs the items from the object store first.
    fresh = Reducer(PlanCache())
    fresh.plans.load(BIG, "t.yaml")
    resumed = msgspec.json.decode(data, type=ExecutionState)
    with pytest.raises(ItemsMissingError):
        fresh.apply(resumed, _iteration(eid, "start-1", 1000), seq + 1)
    resumed = msgspec.json.decode(data, type=ExecutionState)
    fresh.items.put(eid, "start-1", bytes(blob.data))
    resumed, fx = fresh.apply(resumed, _iteration(eid, "start-1", 1000), seq + 1)
    assert [c.iteration.item for c in fx.commands if c.iteration] == [1100]


def test_loop_done_asks_for_the_results_and_a_fail_fast_loop_reports_its_lowest_failure() -> None:
    text = playbook(
        """
        - step: start
          loop:
            in: "{{ workload['items'] }}"
            iterator: x
            spec: {mode: parallel, max_in_flight: 4, policy: {exec: distributed}}
          tool: {kind: noop}
        """,
        workload={"items": ["a", "b", "c", "d"]},
    )
    for mode, expect in (("best_effort", E.LOOP_DONE), ("fail_fast", E.STEP_FAILED)):
        eid = f"small{mode.replace('_', '')}"
        reducer = Reducer(PlanCache())
        book = text.replace(
            "- step: start\n", f"- step: start\n    spec: {{policy: {{failure: {{mode: {mode}}}}}}}\n"
        )
        state, fx = reducer.apply(None, requested(eid, book), 1)
        assert state is not None and fx.blobs == []  # small items stay in the state
        assert [c.iteration.item for c in fx.commands if c.iteration] == ["a", "b", "c", "d"]
        seq = 1
        for index, failed in ((3, True), (0, False), (1, True), (2, False)):
            seq += 1
            state, fx = reducer.apply(state, _iteration(eid, "start-1", index, failed=failed), seq)
        (end,) = [ev for ev in fx.events if ev.name in (E.LOOP_DONE, E.STEP_FAILED)]
        assert end.name == expect
        if expect == E.LOOP_DONE:
            assert "result" not in end.payload  # the controller fills it in from the stored events
            spec = fx.loop_results[end.event_id]
            assert (spec.step_run_id, spec.total, spec.after_seq) == ("start-1", 4, 0)
            assert (end.payload["done"], end.payload["failed"]) == (2, 2)
        else:
            assert end.payload["error"] == {"kind": "boom", "index": 1}
        assert len(reducer.items) == 0  # a finished loop's items are dropped


def test_a_loop_snapshot_of_the_earlier_layout_is_not_taken_for_an_empty_one() -> None:
    """A snapshot written before this layout kept items and results in the loop (no bitmap): decoded
    now, it must not look like a loop with nothing settled (the controller rebuilds it from events)."""
    loop = {"total": 3, "items": [1, 2, 3], "max_in_flight": 2, "next_index": 2, "in_flight": 1, "done": 1}
    run = {"step": "start", "run_id": "start-1", "status": "looping", "loop": {**loop, "results": {"0": 5}}}
    old = msgspec.json.encode({"execution_id": "e", "runs": {"start-1": run}})
    state = msgspec.json.decode(old, type=ExecutionState)
    decoded = state.runs["start-1"].loop
    assert decoded is not None and not decoded.compatible


# --- with a controller and a worker ---------------------------------------------------------------

LARGE = playbook(
    """
    - step: start
      spec: {policy: {failure: {mode: best_effort}}}
      loop:
        in: "{{ range(workload.n) | map('string') | list }}"
        iterator: item
        spec: {mode: parallel, max_in_flight: 50, policy: {exec: distributed}}
      tool:
        - name: echo
          kind: noop
          result: "{{ workload.pad ~ iter.item }}"
          spec:
            policy:
              rules:
                - when: "{{ iter.index % 1000 == 7 }}"
                  then: {do: fail}
                - else:
                    then: {do: continue}
      next:
        arcs: [{step: after}]
    - step: after
      tool:
        kind: noop
        result: {n: "{{ start | length }}", first: "{{ start[0] }}", failed: "{{ start[7] }}", last: "{{ start[-1] }}"}
    """,
    workload={"n": 3000, "pad": "x" * 200},
)


async def test_a_large_loop_result_is_in_item_order_with_failures_and_by_reference(
    runtime: Runtime,
) -> None:
    js = runtime.nc.jetstream()
    summary = await runtime.run_playbook(LARGE, "large.yaml", timeout=120)
    assert summary.status == "success", summary.error
    pad = "x" * 200
    assert summary.result == {"n": 3000, "first": pad + "0", "failed": None, "last": pad + "2999"}
    eid = summary.execution_id
    (done,) = [ev async for _, ev in read_events(js, runtime.topology, eid) if ev.name == E.LOOP_DONE]
    assert (done.payload["total"], done.payload["done"], done.payload["failed"]) == (3000, 2997, 3)
    assert is_ref(done.payload["result"])  # 600 KB: above the message limit
    results = await ResultStore(js, runtime.topology).get(done.payload["result"])
    assert results == [None if i % 1000 == 7 else pad + str(i) for i in range(3000)]

    async def snapshotted() -> ExecutionState | None:
        store = await SnapshotStore.open(js, runtime.topology, ExecutionState)
        state = await store.get(eid)
        return state if state is not None and state.terminal else None

    for _ in range(200):
        if (snap := await snapshotted()) is not None:
            break
        await asyncio.sleep(0.05)
    assert snap is not None and snap.results["start"] == done.payload["result"]
    # The packed items (20 KB) were stored once, outside the state, and deleted when the loop finished
    # (tests/control/test_loop_items_cleanup.py): nothing of them is left in the state.
    assert snap.items_keys == []
    diffs, _ = await verify(js, runtime.topology, eid)
    assert diffs == []
    # The controller keeps a lean copy of a finished execution (its status), not its results.
    cached = runtime.controller.states[eid]
    assert (cached.status, cached.results, cached.runs) == ("success", {}, {})


async def test_scan_reads_an_execution_history_in_order_and_stops_where_asked(
    js: JetStreamContext, topology: Topology
) -> None:
    """What the loop result is assembled with: every matching event in stream order, an early stop,
    and no wait at all when nothing matches."""
    await provision(js, topology)
    eid = "scan1"
    for i in range(300):
        ev = _iteration(eid, "start-1", i, failed=i % 7 == 3)
        await js.publish(topology.event_subject(eid, ev.name), msgspec.json.encode(ev))
    names = (E.LOOP_ITERATION_DONE, E.LOOP_ITERATION_FAILED)
    got: list[int] = []

    def take(data: bytes) -> bool:
        got.append(msgspec.json.decode(data)["payload"]["index"])
        return True

    await scan(js, topology, eid, take, names=names)
    assert got == list(range(300))
    got.clear()
    await scan(js, topology, eid, lambda d: take(d) and len(got) < 10, names=names, after_seq=100)
    assert got == list(range(100, 110))
    started = time.monotonic()
    await scan(js, topology, "nothing1", take, names=names)
    assert len(got) == 10 and time.monotonic() - started < 2


@pytest.fixture
async def topo(js: JetStreamContext, topology: Topology) -> AsyncIterator[Topology]:
    t = msgspec.structs.replace(topology, lease_ttl_s=2.0)
    await provision(js, t)
    yield t


async def _processed(js: JetStreamContext, topology: Topology, eid: str, timeout: float) -> Event:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        async for _, ev in read_events(js, topology, eid, names=(E.PLAYBOOK_PROCESSED,)):
            return ev
        await asyncio.sleep(0.1)
    raise AssertionError(f"{eid}: no playbook.processed within {timeout} s")


@pytest.mark.parametrize("layout", ["current", "earlier"])
async def test_a_controller_that_takes_over_mid_loop_finishes_it_without_rerunning_iterations(
    nc: NATS, js: JetStreamContext, topo: Topology, tmp_path: Path, layout: str
) -> None:
    """The first controller stops mid-loop without a final snapshot (as if it died after an older
    one); the next one resumes from that snapshot, loads the packed items from the object store, folds
    the iteration events stored after it, and finishes: every iteration ran once, results in order.
    A snapshot of the earlier layout (items and results in the loop) is rebuilt from the events."""
    n = 4000  # packed: 19 KB, above the inline limit
    text = playbook(
        f"""
        - step: start
          loop:
            in: "{{{{ range({n}) | list }}}}"
            iterator: item
            spec: {{mode: parallel, max_in_flight: 8, policy: {{exec: distributed}}}}
          tool:
            kind: python
            args: {{path: "{{{{ workload.journal }}}}", i: "{{{{ iter.item }}}}", hold: 0.002}}
            code: |
{indent(JOURNAL_CODE, "              ")}
        """
    )
    journal = tmp_path / "journal.txt"
    a = Controller(nc, topo, controller_id="ctl-a", snapshot_interval_s=0.05)
    await a.start()
    worker = Worker(nc, topo, concurrency=8, name="w1")
    await worker.start()
    b: Controller | None = None
    try:
        eid = await submit(nc, topo, request_for(text, "t.yaml", {"journal": str(journal)}))
        store = await SnapshotStore.open(js, topo, ExecutionState)

        async def mid_loop() -> bool:
            state = await store.get(eid, record=False)
            run = state.runs.get("start-1") if state is not None else None
            return run is not None and run.loop is not None and 200 <= run.loop.next_index < n - 200

        async with asyncio.timeout(60):
            while not await mid_loop():
                await asyncio.sleep(0.02)
        snap = await store.get(eid, record=False)
        assert snap is not None and snap.runs["start-1"].loop is not None
        assert snap.runs["start-1"].loop.items_key == f"{eid}/start-1/items"
        a.snapshots.written_at.clear()  # no final snapshot: the next owner folds what came after this one
        await a.shutdown(grace_s=5)
        if layout == "earlier":
            raw = msgspec.json.decode((await store.kv.get(eid)).value or b"{}")
            loop = raw["runs"]["start-1"]["loop"]
            for field in ("settled", "packed_items", "items_key", "items_checksum", "after_seq"):
                loop.pop(field, None)
            loop.update(
                items=list(range(n)), results={str(i): i * 10 for i in range(loop["done"])}, errors={}
            )
            await store.kv.put(eid, msgspec.json.encode(raw))
        b = Controller(nc, topo, controller_id="ctl-b")
        await b.start()
        end = await _processed(js, topo, eid, timeout=90)
        assert end.payload["status"] == "success", end.payload
        assert end.payload["result"] == [i * 10 for i in range(n)]
        starts = [int(line[1:]) for line in journal.read_text().split() if line.startswith("+")]
        assert sorted(starts) == list(range(n))  # each iteration ran exactly once
        diffs, _ = await verify(js, topo, eid)
        assert diffs == []
    finally:
        await worker.shutdown(grace_s=5)
        await a.shutdown(grace_s=5)
        if b is not None:
            await b.shutdown(grace_s=5)


async def test_a_deadline_fires_after_a_takeover_from_the_index(
    nc: NATS, js: JetStreamContext, topo: Topology
) -> None:
    """No worker runs the step and no event of the execution reaches the new owner: only the deadline
    index can re-arm its timer. When the execution ends, its key leaves the index."""
    text = playbook(
        """
        - step: start
          tool: {kind: noop}
        """
    ).replace("workflow:", "executor: {spec: {deadline_s: 3}}\nworkflow:")
    index = await DeadlineIndex.open(js, topo)
    a = Controller(nc, topo, controller_id="ctl-a")
    await a.start()
    b: Controller | None = None
    try:
        eid = await submit(nc, topo, request_for(text, "deadline.yaml"))
        partition = topo.partition_of(eid)
        async with asyncio.timeout(10):
            while eid not in dict(await index.of_partition(partition)):
                await asyncio.sleep(0.05)
        await a.shutdown(grace_s=5)  # its timer goes with it
        b = Controller(nc, topo, controller_id="ctl-b")
        await b.start()
        summary = await follow(nc, topo, eid, timeout=20)
        assert summary.status == "failed"
        assert summary.error is not None and summary.error["kind"] == "deadline_exceeded"
        async with asyncio.timeout(10):
            while eid in dict(await index.of_partition(partition)):
                await asyncio.sleep(0.05)
    finally:
        await a.shutdown(grace_s=5)
        if b is not None:
            await b.shutdown(grace_s=5)


async def test_rearming_waits_for_a_lease_that_is_not_valid_yet(
    js: JetStreamContext, topology: Topology, eventually: Any
) -> None:
    """A controller that acquires many partitions in one slow tick renews the first ones late: right
    after the acquisition a partition may be held without its lease being valid by our clock. Its
    timers are re-armed from the index once it is (they were skipped for good before)."""
    await provision(js, topology, ("default",))
    store = await SnapshotStore.open(js, topology, ExecutionState)
    index = DeadlineIndex(store.kv)
    eid = "late-lease"
    partition = topology.partition_of(eid)
    await index.add(partition, eid, time.time() + 3600)
    valid = False
    tasks: set[asyncio.Task[None]] = set()
    deadlines = Deadlines(
        js,
        topology,
        "ctl",
        fence_of=lambda p: 7 if valid and p == partition else None,
        is_terminal=lambda e: False,
        spawn=lambda coro: tasks.add(asyncio.create_task(coro)),
    )
    deadlines.open(index, topology)
    try:
        deadlines.acquired(partition)
        await asyncio.sleep(0.2)
        assert eid not in deadlines.timers  # not valid: not armed, and not given up either
        valid = True
        await eventually(lambda: eid in deadlines.timers)
        deadlines.release(partition)
        assert eid not in deadlines.timers
    finally:
        deadlines.cancel_all()
        await asyncio.gather(*tasks, return_exceptions=True)


def _held_deadlines(
    js: JetStreamContext, topology: Topology, partition: int, tasks: set[asyncio.Task[None]]
) -> Deadlines:
    deadlines = Deadlines(
        js,
        topology,
        "ctl",
        fence_of=lambda p: 7 if p == partition else None,
        is_terminal=lambda e: False,
        spawn=lambda coro: tasks.add(asyncio.create_task(coro)),
    )
    return deadlines


async def test_a_deadline_index_write_that_failed_is_written_again(
    js: JetStreamContext, topology: Topology, monkeypatch: pytest.MonkeyPatch, eventually: Any
) -> None:
    """An execution in one long task sends no event that would write its key again: the controller
    tries the write again itself, so the partition's next owner still re-arms its timer."""
    monkeypatch.setattr(backoff, "RETRY_DELAY_S", 0.1)
    await provision(js, topology, ("default",))
    store = await SnapshotStore.open(js, topology, ExecutionState)
    index = DeadlineIndex(store.kv)
    eid = "index-retried"
    partition = topology.partition_of(eid)
    failed: list[str] = []
    put = index.kv.put

    async def put_failing_twice(key: str, value: bytes, **kw: object) -> int:
        if len(failed) < 2:
            failed.append(key)
            raise nats.errors.TimeoutError  # the server did not answer in time
        return await put(key, value, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(index.kv, "put", put_failing_twice)
    tasks: set[asyncio.Task[None]] = set()
    deadlines = _held_deadlines(js, topology, partition, tasks)
    deadlines.open(index, topology)
    deadlines.acquired(partition)
    deadline_at = time.time() + 3600
    try:
        deadlines.track(ExecutionState(eid, deadline_at=deadline_at), False, False)
        async with asyncio.timeout(10):
            while await index.of_partition(partition) != [(eid, deadline_at)]:
                await asyncio.sleep(0.05)
        assert len(failed) == 2
        # the execution ends while its removal fails: removed in a moment all the same
        failed.clear()
        purge = index.kv.purge

        async def purge_failing_once(key: str, **kw: object) -> bool:
            if not failed:
                failed.append(key)
                raise nats.errors.TimeoutError
            return await purge(key, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(index.kv, "purge", purge_failing_once)
        deadlines.track(ExecutionState(eid, deadline_at=deadline_at, status="failed"), False, False)
        async with asyncio.timeout(10):
            while await index.of_partition(partition):
                await asyncio.sleep(0.05)
        assert failed
    finally:
        deadlines.cancel_all()
        await deadlines.stop()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_deadline_whose_event_could_not_be_published_fires_again(
    js: JetStreamContext, topology: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its execution may send no event for hours (one long task): the timer is armed again, not left
    for the execution's next event."""
    monkeypatch.setattr(backoff, "RETRY_DELAY_S", 0.1)
    await provision(js, topology, ("default",))
    eid = "fired-again"
    partition = topology.partition_of(eid)
    flushes: list[int] = []
    flush = Outbox.flush

    async def flush_failing_once(self: Outbox) -> None:
        flushes.append(1)
        if len(flushes) == 1:
            raise nats.errors.ConnectionClosedError
        await flush(self)

    monkeypatch.setattr(Outbox, "flush", flush_failing_once)
    tasks: set[asyncio.Task[None]] = set()
    deadlines = _held_deadlines(js, topology, partition, tasks)
    deadlines.acquired(partition)
    try:
        deadlines.arm(eid, time.time())
        async with asyncio.timeout(10):
            while not [
                e async for _, e in read_events(js, topology, eid, names=(E.EXECUTION_DEADLINE_EXCEEDED,))
            ]:
                await asyncio.sleep(0.05)
        assert len(flushes) == 2
    finally:
        deadlines.cancel_all()
        await asyncio.gather(*tasks, return_exceptions=True)
