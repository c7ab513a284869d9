"""Stored messages that are not what they should be, against a real nats-server: a non-event in an
execution's history, a snapshot that does not decode.

Anyone who may publish on ``noetl.events.>`` can store one (a typo, a buggy tool). The controller's
consumer terminates it (``controller.bad_event``); every reader of the history must skip it the same
way. Before: a distributed loop with one in its window never finished (``controller.batch_failed``
every second, for ever), a running execution with one was stuck after a controller restart, and
``status``, ``events``, ``replay`` printed a traceback. Anything that may write the executions bucket can
leave a value that is not a snapshot (``nats kv put``, a bad restore): the snapshot is only a shortcut, so
the execution is rebuilt from its events (before, the controller retried it every second, for ever).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from eventlog import running_snapshot, wait_processed
from faultbooks import chain, submit_many
from helpers import playbook
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from procs import Processes, provisioned, replay_verify, run_cli

from noetl_stream.control.core.state import ExecutionState
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.history import read_events
from noetl_stream.kv.provision import provision
from noetl_stream.kv.snapshots import SnapshotStore
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event
from noetl_stream.runtime.local import Runtime

GARBAGE = b"{not an event"

DISTRIBUTED = playbook(
    """
    - step: start
      loop:
        in: "{{ range(6) | list }}"
        iterator: i
        spec: {mode: parallel, max_in_flight: 2, policy: {exec: distributed}}
      tool:
        kind: python
        args: {i: "{{ iter.i }}"}
        code: |
          import time
          time.sleep(0.2)
          result = i * 10
    """,
    name="distributed",
)


async def test_reading_a_history_skips_a_stored_non_event(js: JetStreamContext, topology: Topology) -> None:
    await provision(js, topology, ("default",))
    ev = Event(
        event_id="h:1",
        execution_id="h",
        name=E.STEP_STARTED,
        source="worker",
        entity_type="step",
        entity_id="start",
        status="in_progress",
        timestamp="2026-01-01T00:00:00Z",
    )
    await js.publish(topology.event_subject("h", E.STEP_STARTED), msgspec.json.encode(ev))
    await js.publish(topology.event_subject("h", E.STEP_DONE), GARBAGE)
    await js.publish(topology.event_subject("h", E.STEP_DONE), b'{"event_id": "x", "status": "completed"}')
    await js.publish(topology.event_subject("h", E.STEP_STARTED), msgspec.json.encode(ev))

    assert [e.event_id async for _, e in read_events(js, topology, "h")] == ["h:1", "h:1"]


async def test_a_distributed_loop_with_a_non_event_among_its_iterations_finishes(
    runtime: Runtime, topology: Topology
) -> None:
    js = runtime.nc.jetstream()
    published: list[asyncio.Task[object]] = []

    def on_event(ev: Event) -> None:
        if ev.name == E.LOOP_STARTED and not published:
            subject = topology.event_subject(ev.execution_id, E.LOOP_ITERATION_DONE)
            published.append(asyncio.ensure_future(js.publish(subject, GARBAGE)))

    summary = await runtime.run_playbook(DISTRIBUTED, on_event=on_event, timeout=30)

    assert published and published[0].done()
    assert summary.status == "success"
    assert summary.result == [0, 10, 20, 30, 40, 50]


@pytest.fixture
async def procs(
    nats_server: EmbeddedNats, js: JetStreamContext, topology: Topology, tmp_path: Path
) -> AsyncIterator[Processes]:
    async with provisioned(nats_server.url, js, topology, tmp_path / "logs") as p:
        yield p


async def test_a_running_execution_with_a_non_event_resumes_after_a_controller_restart(
    procs: Processes, nats_server: EmbeddedNats, topology: Topology, js: JetStreamContext, nc: NATS
) -> None:
    controller = procs.controller()
    procs.worker("w1", concurrency=2)
    (eid,) = await submit_many(nc, topology, [(chain(3, 1.2), {})])
    await running_snapshot(js, topology, eid)
    await js.publish(topology.event_subject(eid, E.STEP_DONE), GARBAGE)
    controller.kill()
    controller.start()

    await wait_processed(js, topology, [eid], timeout=30)
    env = procs.env
    await replay_verify(env, [eid])
    for command in ("status", "events"):
        code, out, err = await run_cli(env, command, eid)
        assert code == 0 and "Traceback" not in err, f"{command}: exit {code}\n{out}{err}"


async def test_an_unreadable_snapshot_is_rebuilt_from_the_events_after_a_controller_restart(
    procs: Processes, topology: Topology, js: JetStreamContext, nc: NATS
) -> None:
    controller = procs.controller()
    procs.worker("w1", concurrency=2)
    (eid,) = await submit_many(nc, topology, [(chain(3, 1.2), {})])
    await running_snapshot(js, topology, eid)
    controller.kill()
    kv = await js.key_value(topology.executions_bucket)
    await kv.put(eid, b"{not a snapshot")
    controller.start()

    await wait_processed(js, topology, [eid], timeout=30)
    events = [ev async for _, ev in read_events(js, topology, eid)]
    (end,) = [e for e in events if e.name == E.PLAYBOOK_PROCESSED]
    assert end.payload["status"] == "success"
    assert [e.step for e in events if e.name == E.STEP_DONE] == ["start", "s1", "s2"]
    await replay_verify(procs.env, [eid])
    # The rebuilt execution's final snapshot replaced the unreadable value.
    reader = await SnapshotStore.open(js, topology, ExecutionState)
    for _ in range(500):
        with contextlib.suppress(ValueError):
            final = await reader.get(eid)
            if final is not None and final.terminal:
                break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError(f"the unreadable snapshot was never replaced\n{procs.logs()}")
    assert final.status == "success"
