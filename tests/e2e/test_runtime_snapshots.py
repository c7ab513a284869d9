"""A running execution's snapshot follows it even while nothing happens in it (real server)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from eventlog import replay_differences
from helpers import playbook, step_started
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError

from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import Completions
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import encode
from noetl_stream.runtime.local import Runtime

SLOW_FIRST_STEP = playbook(
    """
    - step: start
      tool:
        kind: python
        code: |
          import time
          def main():
              time.sleep(4)
              return "late"
    """
)


async def test_an_execution_quiet_in_its_first_step_is_snapshotted_while_it_runs(
    runtime: Runtime, js: JetStreamContext, topology: Topology
) -> None:
    """The fold that schedules the first step writes no snapshot (short executions write one, at the
    end). If the step runs long, the controller writes it about a second later anyway, once: the
    execution shows as running to `executions` and to ``nats kv get``."""
    kv = await js.key_value(topology.executions_bucket)
    async with Completions(runtime.nc, topology) as done:
        eid = await submit(runtime.nc, topology, request_for(SLOW_FIRST_STEP, "slow.yaml"))
        entry = None
        async with asyncio.timeout(4):
            while entry is None:
                try:
                    entry = await kv.get(eid)
                except KeyNotFoundError:
                    await asyncio.sleep(0.05)
        assert entry.value is not None
        snapshot = msgspec.json.decode(entry.value)
        assert snapshot["status"] == "running" and snapshot["runs"]["start-1"]["status"] == "scheduled"
        await asyncio.sleep(1.5)  # still in the step: nothing changed, nothing written again
        assert (await kv.get(eid)).revision == entry.revision
        final = await done.wait(eid, timeout=30)
    assert final.payload["status"] == "success"
    # The final snapshot follows the fold's events (playbook.processed among them).
    async with asyncio.timeout(10):
        while (last := msgspec.json.decode((await kv.get(eid)).value or b"{}"))["status"] == "running":
            await asyncio.sleep(0.02)
    assert last["status"] == "success" and last["results"]["start"] == "late"


TWO_STEPS = playbook(
    """
    - step: start
      tool: {kind: noop, result: first}
      next:
        arcs: [{step: second}]
    - step: second
      tool: {kind: noop, result: "{{ start }} and second"}
    """
)


async def final_snapshot(kv: Any, execution_id: str) -> dict[str, Any]:
    """The execution's final snapshot, once written: it follows ``playbook.processed`` (a short execution
    has none before it)."""
    async with asyncio.timeout(10):
        while True:
            try:
                state: dict[str, Any] = msgspec.json.decode((await kv.get(execution_id)).value or b"{}")
            except KeyNotFoundError:
                state = {"status": "running"}
            if state["status"] != "running":
                return state
            await asyncio.sleep(0.02)


async def test_a_late_event_of_a_finished_execution_leaves_its_final_snapshot_whole(
    runtime: Runtime, js: JetStreamContext, topology: Topology
) -> None:
    """A finished execution no longer in the controller's cache (evicted, or a new controller after a
    crash) is loaded from its final snapshot as a lean copy (no results, runs or joins) when a late event
    of it comes (a redelivery, a straggler). That copy must never replace the stored snapshot: the results
    would be lost to `executions`, ``nats kv get`` and ``replay --verify``."""
    kv = await js.key_value(topology.executions_bucket)
    runtime.controller.cache.size = 1  # each finished execution is evicted by the next one
    first = (await runtime.run_playbook(TWO_STEPS, "two.yaml", timeout=30)).execution_id
    final = await final_snapshot(kv, first)
    assert final["results"] == {"start": "first", "second": "first and second"}
    stored = (await kv.get(first)).revision
    await runtime.run_playbook(TWO_STEPS, "two.yaml", timeout=30)
    async with asyncio.timeout(10):  # evicted once the second one's final fold is done
        while first in runtime.controller.states:
            await asyncio.sleep(0.02)
    store = runtime.controller.snapshots.store
    assert store is not None and first not in store.revisions  # nothing of it stays in memory

    late = msgspec.structs.replace(
        step_started(first, "second"), event_id=f"{first}:late", name=E.STEP_DONE, status="success"
    )
    ack = await js.publish(topology.event_subject(first, E.STEP_DONE), encode(late))
    consumer = runtime.controller.topology.controller_events_consumer(topology.partition_of(first))
    async with asyncio.timeout(10):  # acked once folded, after whatever the fold writes
        while (await js.consumer_info(topology.events_stream, consumer)).ack_floor.stream_seq < ack.seq:
            await asyncio.sleep(0.02)
    cached = runtime.controller.states.get(first)
    assert cached is not None and cached.results == {} and cached.status == "success"  # loaded lean
    entry = await kv.get(first)
    assert entry.revision == stored
    assert msgspec.json.decode(entry.value or b"{}")["results"] == final["results"]
    assert await replay_differences(js, topology, [first]) == {}
