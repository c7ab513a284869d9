"""Resuming an execution publishes exactly the effects that are not stored yet (real server).

The scene a dead controller leaves: it folded a request and published part of the effects before it
died. Whoever resumes the execution folds the stored input again and must publish the rest, and
nothing twice, however long ago the first attempt was (JetStream's duplicate window is not relied on).
"""

from __future__ import annotations

from helpers import playbook, requested
from nats.js import JetStreamContext

from noetl_stream.control.core.plans import PlanCache
from noetl_stream.control.core.reducer import Reducer
from noetl_stream.control.resume import queued_command_ids, resume
from noetl_stream.jetstream.outbox import Outbox
from noetl_stream.kv.history import read_events
from noetl_stream.kv.provision import provision
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event, event_id, now_iso

BOOK = playbook(
    """
    - step: start
      tool: {kind: noop}
    """
)


async def _names(js: JetStreamContext, topo: Topology, eid: str) -> list[str]:
    return [ev.name async for _, ev in read_events(js, topo, eid)]


async def test_resume_publishes_what_a_dead_controller_did_not_and_nothing_twice(
    js: JetStreamContext, topology: Topology
) -> None:
    await provision(js, topology)
    eid = "resume0execution"
    outbox = Outbox(js, topology)
    outbox.event(requested(eid, BOOK))
    await outbox.flush()
    # The dead controller's fold: it stored the first two of its three events, and not the command.
    _, fx = Reducer(PlanCache()).apply(None, requested(eid, BOOK), 1)
    names = [ev.name for ev in fx.events]
    assert names == [E.REQUEST_EVALUATED, E.WORKFLOW_STARTED, E.STEP_SCHEDULED] and len(fx.commands) == 1
    outbox = Outbox(js, topology)
    for ev in fx.events[:2]:
        outbox.event(ev)
    await outbox.flush()

    out = await resume(js, topology, Reducer(PlanCache()), eid, None, after=0)
    assert out.replayed == 1
    assert [ev.name for ev in out.events] == [E.STEP_SCHEDULED]
    assert [cmd.command_id for cmd in out.commands] == [fx.commands[0].command_id]
    assert await _names(js, topology, eid) == [E.EXECUTION_REQUESTED, *names]
    assert await queued_command_ids(js, topology, eid) == {fx.commands[0].command_id}

    # Resuming again finds everything stored: nothing is published.
    again = await resume(js, topology, Reducer(PlanCache()), eid, None, after=0)
    assert again.events == [] and again.commands == []
    assert await _names(js, topology, eid) == [E.EXECUTION_REQUESTED, *names]


async def test_a_command_a_worker_took_and_finished_is_not_sent_again(
    js: JetStreamContext, topology: Topology
) -> None:
    """The work queue forgets a command once a worker acks it; the worker's events remember it."""
    await provision(js, topology)
    eid = "resume1execution"
    outbox = Outbox(js, topology)
    outbox.event(requested(eid, BOOK))
    await outbox.flush()
    _, fx = Reducer(PlanCache()).apply(None, requested(eid, BOOK), 1)
    (cmd,) = fx.commands
    outbox = Outbox(js, topology)
    for ev in fx.events:
        outbox.event(ev)
    await outbox.flush()
    started = Event(
        event_id=event_id(eid, cmd.step_run_id, E.STEP_STARTED),
        execution_id=eid,
        name=E.STEP_STARTED,
        source="worker",
        entity_type="step",
        entity_id=cmd.step_run_id,
        status="in_progress",
        timestamp=now_iso(),
        step=cmd.step,
        step_run_id=cmd.step_run_id,
        worker="w1",
    )
    outbox = Outbox(js, topology)
    outbox.event(started)
    await outbox.flush()
    assert await queued_command_ids(js, topology, eid) == set()  # never queued, or taken and acked

    out = await resume(js, topology, Reducer(PlanCache()), eid, None, after=0)
    assert out.events == [] and out.commands == []
