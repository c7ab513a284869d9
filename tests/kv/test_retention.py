"""Retention: a finished execution's snapshot expires with its history (the events stream's
``max_age``); a running execution's never does. On a real nats-server."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable

import msgspec
import pytest
from helpers import playbook, run
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import Completions
from noetl_stream.control.controller import Controller
from noetl_stream.control.core.state import ExecutionState
from noetl_stream.errors import StateConflictError
from noetl_stream.jetstream.connection import connect
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.provision import events_max_age_s, provision
from noetl_stream.kv.snapshots import SnapshotStore
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import local_runtime

TTL_HEADER = "Nats-TTL"
HOUR = 3600.0


async def stored(js: JetStreamContext, topology: Topology, eid: str) -> tuple[dict[str, str], bytes] | None:
    """The headers and value of the snapshot message as stored (None when there is no snapshot)."""
    bucket = topology.executions_bucket
    try:
        msg = await js.get_msg(f"KV_{bucket}", subject=f"$KV.{bucket}.{eid}")
    except NotFoundError:
        return None
    return dict(msg.headers or {}), msg.data or b""


async def test_a_snapshot_written_with_a_ttl_is_gone_after_it(
    js: JetStreamContext, topology: Topology, eventually: Callable[..., Awaitable[None]]
) -> None:
    await provision(js, topology)
    store = await SnapshotStore.open(js, topology, ExecutionState)
    await store.put("e-kept", ExecutionState(execution_id="e-kept", status="running"))
    await store.put("e-gone", ExecutionState(execution_id="e-gone", status="success"), ttl_s=1)
    assert (await store.get("e-gone")) is not None
    started = time.monotonic()

    async def gone() -> bool:
        return await store.get("e-gone", record=False) is None

    await eventually(gone, timeout=10)
    assert time.monotonic() - started >= 0.5  # expired, not refused
    kept = await store.get("e-kept", record=False)
    assert kept is not None and kept.status == "running"


async def test_the_events_retention_is_read_from_the_server(js: JetStreamContext, topology: Topology) -> None:
    assert await events_max_age_s(js, topology) == 0.0  # no stream yet
    await provision(js, msgspec.structs.replace(topology, events_max_age_s=2 * HOUR))
    assert await events_max_age_s(js, topology) == 2 * HOUR
    # Edited by hand below what a Topology accepts (the duplicate window): read as it is.
    info = await js.stream_info(topology.events_stream)
    await js.update_stream(dataclasses.replace(info.config, max_age=60.0, duplicate_window=30.0))
    assert await events_max_age_s(js, topology) == 60.0


@pytest.mark.parametrize(("max_age", "ttl"), [(HOUR, "3600"), (0.0, None)])
async def test_a_finished_executions_snapshot_expires_with_its_history(
    nats_server: EmbeddedNats,
    topology: Topology,
    eventually: Callable[..., Awaitable[None]],
    max_age: float,
    ttl: str | None,
) -> None:
    topo = msgspec.structs.replace(topology, events_max_age_s=max_age)
    async with local_runtime(nats_server.url, topology=topo) as rt:
        r = await run(rt, playbook("- step: start\n  tool: {kind: noop, result: 1}"))
        assert r.status == "success", r.summary.error
        js = rt.nc.jetstream()
        eid = r.summary.execution_id

        async def final() -> bool:
            msg = await stored(js, topo, eid)
            return msg is not None and b'"status":"success"' in msg[1]

        await eventually(final, timeout=10)
        msg = await stored(js, topo, eid)
        assert msg is not None
        assert msg[0].get(TTL_HEADER) == ttl


# One routing step whose arc is never taken: the controller alone runs it to the end (no worker).
ROUTE_ONLY = playbook(
    """
    - step: start
      next:
        arcs:
          - step: end
            when: "{{ false }}"
    - step: end
      tool: {kind: noop}
    """
)


async def test_a_changed_retention_applies_to_later_snapshots_without_a_restart(
    nats_server: EmbeddedNats, topology: Topology, eventually: Callable[..., Awaitable[None]]
) -> None:
    """An operator edits the events stream's ``max_age`` while the controller runs: the snapshots it writes
    from then on expire with the new retention."""
    topo = msgspec.structs.replace(topology, events_max_age_s=HOUR)
    nc = await connect(nats_server.url)
    try:
        js = nc.jetstream()
        await provision(js, topo)
        async with Controller(nc, topo, retention_refresh_s=0.05), Completions(nc, topo) as done:

            async def ttl_of_a_new_execution() -> str | None:
                eid = await submit(nc, topo, request_for(ROUTE_ONLY, "t.yaml"))
                assert (await done.wait(eid, timeout=10)).payload.get("status") == "success"

                async def final() -> bool:
                    msg = await stored(js, topo, eid)
                    return msg is not None and b'"status":"success"' in msg[1]

                await eventually(final, timeout=10)
                msg = await stored(js, topo, eid)
                assert msg is not None
                return msg[0].get(TTL_HEADER)

            assert await ttl_of_a_new_execution() == "3600"
            info = await js.stream_info(topo.events_stream)
            await js.update_stream(dataclasses.replace(info.config, max_age=2 * HOUR))

            async def two_hours() -> bool:
                return await ttl_of_a_new_execution() == "7200"

            await eventually(two_hours, timeout=10)
    finally:
        await nc.close()


async def test_a_running_executions_snapshot_has_no_ttl(
    nats_server: EmbeddedNats, topology: Topology
) -> None:
    topo = msgspec.structs.replace(topology, events_max_age_s=HOUR)
    async with local_runtime(nats_server.url, topology=topo, workers=0) as rt:
        eid = await submit(
            rt.nc, topo, request_for(playbook("- step: start\n  tool: {kind: noop}"), "t.yaml")
        )
        deadline = time.monotonic() + 10
        while eid not in rt.controller.states:  # its request is folded: the step is scheduled, no worker
            assert time.monotonic() < deadline, "the request was never folded"
            await asyncio.sleep(0.02)
    # Leaving the runtime shuts the controller down gracefully: it writes the running execution's snapshot.
    nc = await connect(nats_server.url)
    try:
        store = await SnapshotStore.open(nc.jetstream(), topo, ExecutionState)
        state = await store.get(eid, record=False)
        assert state is not None and state.status == "running"
        msg = await stored(nc.jetstream(), topo, eid)
        assert msg is not None and TTL_HEADER not in msg[0]
    finally:
        await nc.close()


async def test_a_snapshot_with_a_ttl_may_replace_a_deleted_one_but_never_a_newer_one(
    js: JetStreamContext, topology: Topology
) -> None:
    await provision(js, topology)
    store = await SnapshotStore.open(js, topology, ExecutionState)
    other = await SnapshotStore.open(js, topology, ExecutionState)
    await store.put("e1", ExecutionState(execution_id="e1", status="running"))
    await other.kv.delete("e1")  # e.g. removed by an operator
    store.forget("e1")
    await store.put("e1", ExecutionState(execution_id="e1", status="success"), ttl_s=HOUR)
    got = await other.get("e1")
    assert got is not None and got.status == "success"
    await other.put("e1", ExecutionState(execution_id="e1", status="success", events_applied=9), ttl_s=HOUR)
    with pytest.raises(StateConflictError):  # store last saw the revision before other's write
        await store.put("e1", ExecutionState(execution_id="e1", status="failed"), ttl_s=HOUR)
    final = await other.get("e1", record=False)
    assert final is not None and final.events_applied == 9
