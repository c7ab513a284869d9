"""The packed items of a distributed loop above the inline limit are stored once in the results object
store (`control/core/items.py`); once the execution is over and its final snapshot is written, the
controller deletes them, leaving no message of them in the bucket's stream. Step results stay.
"""

from __future__ import annotations

import asyncio
import base64

import msgspec
import pytest
from helpers import playbook
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError, ObjectNotFoundError

from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import follow
from noetl_stream.control.core.state import ExecutionState
from noetl_stream.control.replay import verify
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.jetstream.outbox import Outbox
from noetl_stream.kv.history import read_events
from noetl_stream.kv.provision import provision
from noetl_stream.kv.results import ResultStore
from noetl_stream.kv.snapshots import SnapshotStore
from noetl_stream.protocol import events as E
from noetl_stream.protocol.refs import is_ref
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event, control_event
from noetl_stream.runtime.local import Runtime, local_runtime

# --- what the bucket's stream holds ------------------------------------------------------------------


def _stream(topology: Topology) -> str:
    return f"OBJ_{topology.results_store}"


def _meta_subject(topology: Topology, key: str) -> str:
    return f"$O.{topology.results_store}.M.{base64.urlsafe_b64encode(key.encode()).decode()}"


async def _subjects(js: JetStreamContext, topology: Topology, subjects_filter: str) -> dict[str, int]:
    info = await js.stream_info(_stream(topology), subjects_filter=subjects_filter)
    return dict(info.state.subjects or {})


async def _messages_of(js: JetStreamContext, topology: Topology, key: str) -> int:
    """Messages the stream holds for ``key``: its meta messages, and the chunks its last meta names."""
    meta = _meta_subject(topology, key)
    count = (await _subjects(js, topology, meta)).get(meta, 0)
    try:
        last = await js.get_last_msg(_stream(topology), meta)
    except NotFoundError:
        return count
    nuid = msgspec.json.decode(last.data or b"{}").get("nuid")
    chunks = f"$O.{topology.results_store}.C.{nuid}"
    return count + (await _subjects(js, topology, chunks)).get(chunks, 0)


async def _orphan_chunks(js: JetStreamContext, topology: Topology) -> set[str]:
    """Chunk subjects no live object's meta names (what a deletion could leave behind)."""
    live: set[str] = set()
    for meta in await _subjects(js, topology, f"$O.{topology.results_store}.M.>"):
        info = msgspec.json.decode((await js.get_last_msg(_stream(topology), meta)).data or b"{}")
        if not info.get("deleted"):
            live.add(str(info["nuid"]))
    chunks = await _subjects(js, topology, f"$O.{topology.results_store}.C.>")
    return {subject for subject in chunks if subject.rsplit(".", 1)[1] not in live}


async def _assert_gone(js: JetStreamContext, topology: Topology, key: str, timeout: float = 15.0) -> None:
    """Deleted (after the final snapshot, a moment after the execution's last event), without a trace."""
    store = await js.object_store(topology.results_store)
    async with asyncio.timeout(timeout):
        while await _messages_of(js, topology, key):
            await asyncio.sleep(0.05)
    with pytest.raises(ObjectNotFoundError):
        await store.get_info(key, show_deleted=True)
    assert await _orphan_chunks(js, topology) == set()


async def _final_snapshot(js: JetStreamContext, topology: Topology, eid: str) -> ExecutionState:
    store = await SnapshotStore.open(js, topology, ExecutionState)
    async with asyncio.timeout(15):
        while (state := await store.get(eid, record=False)) is None or not state.terminal:
            await asyncio.sleep(0.05)
    return state


# --- the store alone ---------------------------------------------------------------------------------


async def test_delete_leaves_no_message_of_the_object_and_is_idempotent(
    js: JetStreamContext, topology: Topology
) -> None:
    await provision(js, topology)
    results = ResultStore(js, topology)
    data = b"x" * (300 * 1024)  # three chunks
    await results.put_encoded("e1/start-1/items", data)
    kept = await results.put("e1/kept/result", {"a": 1})
    assert await _messages_of(js, topology, "e1/start-1/items") == 4

    assert await results.delete("e1/start-1/items") is True
    assert await _messages_of(js, topology, "e1/start-1/items") == 0
    assert await _orphan_chunks(js, topology) == set()
    assert await results.delete("e1/start-1/items") is False  # already gone: not an error
    assert await results.delete("never/stored") is False
    assert await results.get(kept) == {"a": 1}  # other objects untouched

    # An attempt cut short after nats-py's delete (a "deleted" meta marker kept forever) is finished.
    await results.put_encoded("e1/start-2/items", data)
    await (await js.object_store(topology.results_store)).delete("e1/start-2/items")
    assert await _messages_of(js, topology, "e1/start-2/items") == 1
    assert await results.delete("e1/start-2/items") is True
    assert await _messages_of(js, topology, "e1/start-2/items") == 0

    # The key can be stored again afterwards.
    await results.put_encoded("e1/start-1/items", b"again")
    assert await results.get_encoded("e1/start-1/items") == b"again"


# --- end to end ----------------------------------------------------------------------------------------

TWO_LOOPS = playbook(
    """
    - step: start
      loop:
        in: "{{ range(workload.n) | map('string') | list }}"
        iterator: item
        spec: {mode: parallel, max_in_flight: 50, policy: {exec: distributed}}
      tool: {kind: noop, result: "{{ workload.pad ~ iter.item }}"}
      next:
        arcs: [{step: again}]
    - step: again
      loop:
        in: "{{ range(workload.n) | map('string') | list }}"
        iterator: item
        spec: {mode: parallel, max_in_flight: 50, policy: {exec: distributed}}
      tool: {kind: noop, result: "{{ iter.item }}"}
      next:
        arcs: [{step: after}]
    - step: after
      tool:
        kind: noop
        result: {n: "{{ start | length }}", last: "{{ start[-1] }}", again: "{{ again | length }}"}
    """,
    workload={"n": 3000, "pad": "x" * 200},
)


async def test_a_finished_execution_leaves_no_loop_items_but_keeps_its_results(runtime: Runtime) -> None:
    js = runtime.nc.jetstream()
    topology = runtime.topology
    summary = await runtime.run_playbook(TWO_LOOPS, "two.yaml", timeout=120)
    assert summary.status == "success", summary.error
    assert summary.result == {"n": 3000, "last": "x" * 200 + "2999", "again": 3000}
    eid = summary.execution_id
    keys = [f"{eid}/start-1/items", f"{eid}/again-1/items"]

    snap = await _final_snapshot(js, topology, eid)
    assert snap.items_keys == []  # each left the state when its loop finished
    started = [ev async for _, ev in read_events(js, topology, eid) if ev.name == E.LOOP_STARTED]
    assert [ev.step_run_id for ev in started] == ["start-1", "again-1"]
    for key in keys:  # both had been stored out of line (packed: 19 KB, above INLINE_ITEMS_BYTES)
        await _assert_gone(js, topology, key)

    # The loops' results (by reference, in the same store) are execution results: kept.
    (done, _) = [ev async for _, ev in read_events(js, topology, eid) if ev.name == E.LOOP_DONE]
    assert is_ref(done.payload["result"])
    assert await ResultStore(js, topology).get(done.payload["result"]) == [
        "x" * 200 + str(i) for i in range(3000)
    ]
    assert snap.results["start"] == done.payload["result"]
    diffs, _ = await verify(js, topology, eid)
    assert diffs == []
    cached = runtime.controller.states[eid]
    assert (cached.status, cached.runs, cached.items_keys) == ("success", {}, [])


LOOP_THEN_WAIT = playbook(
    """
    - step: start
      loop:
        in: "{{ range(workload.n) | map('string') | list }}"
        iterator: item
        spec: {mode: parallel, max_in_flight: 50, policy: {exec: distributed}}
      tool: {kind: noop, result: "{{ iter.item }}"}
      next:
        arcs: [{step: wait}]
    - step: wait
      tool:
        kind: python
        code: |
          import time
          time.sleep(2)
          result = "waited"
    """,
    workload={"n": 4000},  # packed: 23 KB
)


async def test_a_loop_s_items_go_when_the_loop_finishes_not_when_the_execution_does(
    runtime: Runtime,
) -> None:
    """A long execution (or one that re-enters a big loop) does not keep every loop's items till its end."""
    js = runtime.nc.jetstream()
    topology = runtime.topology
    loop_done = asyncio.Event()
    ids: list[str] = []

    def on_event(ev: Event) -> None:
        if ev.name == E.LOOP_DONE:
            ids.append(ev.execution_id)
            loop_done.set()

    run = asyncio.create_task(
        runtime.run_playbook(LOOP_THEN_WAIT, "wait.yaml", on_event=on_event, timeout=60)
    )
    async with asyncio.timeout(30):
        await loop_done.wait()
    eid = ids[0]
    key = f"{eid}/start-1/items"
    await _assert_gone(js, topology, key, timeout=1.5)  # gone within 0.1 s; the wait step takes 2 s
    assert not run.done(), "the execution ended before the items were checked: the check proves nothing"
    assert runtime.controller.states[eid].items_keys == []
    summary = await run
    assert summary.status == "success", summary.error
    assert summary.execution_id == eid
    diffs, _ = await verify(js, topology, eid)
    assert diffs == []


SLOW_LOOP = playbook(
    """
    - step: start
      loop:
        in: "{{ range(workload.n) | list }}"
        iterator: item
        spec: {mode: parallel, max_in_flight: 4, policy: {exec: distributed}}
      tool:
        kind: python
        args: {i: "{{ iter.item }}"}
        code: |
          import time
          def main(i):
              time.sleep(0.2)
              return i
    """,
    workload={"n": 4000},  # packed: 19 KB
)

FAILING_LOOP = playbook(
    """
    - step: start
      loop:
        in: "{{ range(workload.n) | list }}"
        iterator: item
        spec: {mode: parallel, max_in_flight: 20, policy: {exec: distributed}}
      tool:
        - name: echo
          kind: noop
          result: "{{ iter.item }}"
          spec:
            policy:
              rules:
                - when: "{{ iter.index == 100 }}"
                  then: {do: fail}
                - else:
                    then: {do: continue}
    """,
    workload={"n": 4000},
)


async def _first(js: JetStreamContext, topology: Topology, eid: str, name: str) -> Event:
    async with asyncio.timeout(30):
        while True:
            async for _, ev in read_events(js, topology, eid, names=(name,)):
                return ev
            await asyncio.sleep(0.05)


async def test_a_cancelled_execution_mid_loop_leaves_no_loop_items(runtime: Runtime) -> None:
    js = runtime.nc.jetstream()
    topology = runtime.topology
    eid = await submit(runtime.nc, topology, request_for(SLOW_LOOP, "slow.yaml"))
    await _first(js, topology, eid, E.LOOP_ITERATION_DONE)
    key = f"{eid}/start-1/items"
    assert await _messages_of(js, topology, key) > 0  # stored while the loop runs
    reply = await runtime.nc.request(
        topology.api_subject("cancel"),
        msgspec.json.encode({"execution_id": eid, "reason": "operator"}),
        timeout=10,
    )
    assert not (reply.headers or {}).get("Nats-Service-Error")
    summary = await follow(runtime.nc, topology, eid, timeout=30)
    assert summary.status == "cancelled"
    snap = await _final_snapshot(js, topology, eid)
    assert snap.items_keys == [key]
    await _assert_gone(js, topology, key)
    diffs, _ = await verify(js, topology, eid)
    assert diffs == []


async def test_a_failed_execution_leaves_no_loop_items(runtime: Runtime) -> None:
    js = runtime.nc.jetstream()
    topology = runtime.topology
    summary = await runtime.run_playbook(FAILING_LOOP, "failing.yaml", timeout=60)
    assert summary.status == "failed"
    eid = summary.execution_id
    snap = await _final_snapshot(js, topology, eid)
    assert snap.items_keys == []  # the loop stopped at its first failure: finished, its items dropped
    await _assert_gone(js, topology, f"{eid}/start-1/items")
    diffs, _ = await verify(js, topology, eid)
    assert diffs == []


async def test_a_controller_that_loads_a_finished_execution_deletes_items_left_behind(
    nats_server: EmbeddedNats, topology: Topology
) -> None:
    """A controller that stopped between the final snapshot and the delete leaves the items; the next one
    to load that snapshot (here a fresh controller folding a late cancel request) deletes them."""
    async with local_runtime(nats_server.url, topology=topology, workers=1, concurrency=16) as rt:
        js = rt.nc.jetstream()
        eid = await submit(rt.nc, topology, request_for(SLOW_LOOP, "slow.yaml"))
        await _first(js, topology, eid, E.LOOP_ITERATION_DONE)
        await rt.nc.request(
            topology.api_subject("cancel"), msgspec.json.encode({"execution_id": eid}), timeout=10
        )
        assert (await follow(rt.nc, topology, eid, timeout=30)).status == "cancelled"
        key = f"{eid}/start-1/items"
        assert (await _final_snapshot(js, topology, eid)).items_keys == [key]
        await _assert_gone(js, topology, key)
        await ResultStore(js, topology).put_encoded(key, b"left behind by a controller that stopped")

    async with local_runtime(nats_server.url, topology=topology, workers=1, concurrency=16) as rt:
        js = rt.nc.jetstream()
        assert eid not in rt.controller.states
        # The API refuses a cancel of a finished execution; a worker cancelling a child that has just
        # finished still writes one (`dataplane/children.py`), and the controller folds it.
        outbox = Outbox(js, topology)
        outbox.event(control_event(eid, E.EXECUTION_CANCEL_REQUESTED, "late", source="worker"))
        await outbox.flush()
        await _assert_gone(js, topology, key)
        assert rt.controller.states[eid].status == "cancelled"
