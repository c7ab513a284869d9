"""The Outbox against a real nats-server: a flush is stored once whatever fails on the way (a restart, an
event sent at once into a dying socket, a cluster refusing for a moment), an ``expect_new`` event is
refused once stored (`AlreadyStoredError`, not retried), and the flushes of many handlers share one ack."""

from __future__ import annotations

import asyncio
import math
import os
import signal

import nats.errors
import pytest
from helpers import Clustered, LostAcks, own_connection, step_started
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import BadRequestError

from noetl_stream.dsl import load_playbook
from noetl_stream.errors import StateConflictError
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.jetstream.outbox import SENT_CONFIRM_EVERY, AlreadyStoredError, Outbox
from noetl_stream.jetstream.publish import (
    WRITE_AT,
    WRONG_LAST_SEQUENCE,
    publisher,
)
from noetl_stream.kv.history import read_events
from noetl_stream.kv.provision import provision
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Command


async def test_an_outbox_event_expected_new_raises_already_stored_without_a_retry(
    nc: NATS, js: JetStreamContext, topology: Topology
) -> None:
    await provision(js, topology, ("default",))
    subject = topology.event_subject("x1", "step.started")
    seen = await nc.subscribe(subject)  # every publish on the subject, stored or refused
    outbox = Outbox(js, topology, retry_s=30.0)
    outbox.event(step_started("x1", "s0"), expect_new=True)
    outbox.event(step_started("x2", "s0"))
    await outbox.flush()

    # A second event on the subject (another step: another id), then the first one again (the retry
    # of a flush that did store it): both refused, and the events queued after them still published.
    for refused in (step_started("x1", "s1"), step_started("x1", "s0")):
        after = step_started("x3", refused.step or "")
        outbox.event(refused, expect_new=True)
        outbox.event(after)
        with pytest.raises(AlreadyStoredError) as info:
            await outbox.flush()
        assert isinstance(info.value, StateConflictError)
        assert (info.value.subject, info.value.msg_id) == (subject, refused.event_id)
        cause = info.value.__cause__
        assert isinstance(cause, BadRequestError) and cause.err_code == WRONG_LAST_SEQUENCE
        assert len(outbox) == 0

    await nc.flush()  # every publish the server relayed before its PONG is queued for `seen` now
    assert seen.pending_msgs == 3  # one publish per flush: AlreadyStoredError is not retried
    stored = [
        (ev.execution_id, ev.step) for x in ("x1", "x2", "x3") async for _, ev in read_events(js, topology, x)
    ]
    assert stored == [("x1", "s0"), ("x2", "s0"), ("x3", "s1"), ("x3", "s0")]
    await seen.unsubscribe()


def _command(execution_id: str) -> Command:
    playbook = load_playbook(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: x, path: x}\n"
        "workflow:\n  - step: start\n    tool: {kind: noop, result: 1}\n"
    )
    return Command(
        command_id=f"{execution_id}:start-1",
        execution_id=execution_id,
        step="start",
        step_run_id="start-1",
        pool="default",
        step_def=playbook.workflow[0],
    )


async def test_concurrent_outbox_flushes_share_one_write_and_one_ack_per_stream(
    nc: NATS, js: JetStreamContext, topology: Topology
) -> None:
    """A hundred handlers flush at once (3 events and a command each, one execution each): every flush
    completes, every event and command is stored once, each execution's events in order, and the
    hundred flushes asked for two acks per write (one for the events stream, one for the commands
    stream), a write going out each `WRITE_AT` messages of the turn."""
    await provision(js, topology, ("default",))
    pub = publisher(nc)
    before = pub.acks.issued
    outboxes = []
    for i in range(100):
        outbox = Outbox(js, topology)
        for s in range(3):
            outbox.event(step_started(f"x{i}", f"s{s}"))
        outbox.command(_command(f"x{i}"))
        outboxes.append(outbox)
    await asyncio.wait_for(asyncio.gather(*(o.flush() for o in outboxes)), 30)
    writes = math.ceil(400 / WRITE_AT)
    assert pub.acks.issued - before == 2 * writes  # far below a hundred: the point of grouping
    assert all(len(o) == 0 for o in outboxes)
    assert pub.pending == 0
    assert (await js.stream_info(topology.events_stream)).state.messages == 300
    assert (await js.stream_info(topology.commands_stream)).state.messages == 100
    for x in ("x0", "x1", "x50", "x99"):
        stored = [ev.event_id async for _, ev in read_events(js, topology, x)]
        assert stored == [f"{x}:s{s}:step.started" for s in range(3)]


async def test_a_flush_without_waiting_joins_the_turns_write_and_settles_when_stored(
    nc: NATS, js: JetStreamContext, topology: Topology
) -> None:
    """`flush_nowait` (the worker's path): the outboxes of one turn share the write and its acks, each
    future settles once its messages are stored, and the outbox is empty at once."""
    await provision(js, topology, ("default",))
    warm = Outbox(js, topology)
    warm.event(step_started("w", "s0"))
    warm.command(_command("w"))
    await warm.flush()  # the publisher has looked at both streams now
    pub = publisher(nc)
    before = pub.acks.issued
    outboxes, futures = [], []
    for i in range(10):
        outbox = Outbox(js, topology)
        outbox.event(step_started(f"x{i}", "s0"))
        outbox.event(step_started(f"x{i}", "s1"))
        if i % 2:
            outbox.command(_command(f"x{i}"))
        fut = outbox.flush_nowait()
        assert fut is not None and len(outbox) == 0
        outboxes.append(outbox)
        futures.append(fut)
    await asyncio.wait_for(asyncio.gather(*futures), 10)
    assert pub.acks.issued - before == 2
    assert (await js.stream_info(topology.events_stream)).state.messages == 1 + 20
    assert (await js.stream_info(topology.commands_stream)).state.messages == 1 + 5


async def test_a_flush_without_waiting_publishes_nothing_it_cannot_confirm_at_once(
    own_server: EmbeddedNats,
) -> None:
    """A new connection's publisher has not looked at the streams yet, and conditional events need their
    own acks: `flush_nowait` says so (None) and leaves everything queued for `flush`."""
    async with own_connection(own_server, "nowait") as (_, js, topo):
        outbox = Outbox(js, topo)
        outbox.event(step_started("e1", "s0"))
        assert outbox.flush_nowait() is None and len(outbox) == 1
        await outbox.flush()
        outbox.event(step_started("e2", "s0"), expect_new=True)
        assert outbox.flush_nowait() is None and len(outbox) == 1
        await outbox.flush()
        assert (await js.stream_info(topo.events_stream)).state.messages == 2


# --- a server that freezes, dies and comes back ----------------------------------------------------


async def test_an_outbox_flush_across_a_server_restart_stores_each_event_once(
    own_server: EmbeddedNats, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flush's events are stored but its ack is lost, and the server dies and comes back: the flush
    publishes them again after the reconnect, with the same ids, and each is stored once."""
    lost = LostAcks(monkeypatch)
    async with own_connection(own_server, "flush") as (_, js, topo):
        outbox = Outbox(js, topo, ack_timeout_s=5.0)
        events = [step_started("e1", f"s{i}") for i in range(5)]
        for ev in events:
            outbox.event(ev)
        lost.dropping = True
        flush = asyncio.create_task(outbox.flush())
        await lost.stored_then_restart(own_server, js, topo.events_stream, len(events))
        await asyncio.wait_for(flush, 30)  # retried after the reconnect, same ids

        stored = [ev.event_id async for _, ev in read_events(js, topo, "e1")]
        assert stored == [ev.event_id for ev in events]  # in order, once each
        info = await js.stream_info(topo.events_stream)
        assert info.state.messages == len(events)  # the retry's copies were dropped as duplicates


async def test_an_event_sent_at_once_and_lost_with_the_connection_is_published_again_by_the_flush(
    own_server: EmbeddedNats,
) -> None:
    """`send_now` writes at once and leaves the confirmation to the next flush's ack. Written into a
    socket that died, it is gone, and the flush's ack (on the new connection) does not cover it: the
    flush publishes it again (same id, stored once) instead of reporting success without it."""
    async with own_connection(own_server, "sendnow") as (nc, js, topo):
        outbox = Outbox(js, topo, ack_timeout_s=5.0)
        assert own_server.pid is not None
        await outbox.send_now(step_started("e1", "before"))  # confirmed by the first flush, no reconnect
        await outbox.flush()
        os.kill(own_server.pid, signal.SIGSTOP)
        await asyncio.sleep(0.1)
        await outbox.send_now(step_started("e1", "progress"))  # like a loop.iteration.done
        await asyncio.sleep(0.3)  # in the socket, unread by the stopped server
        own_server.kill()
        await asyncio.sleep(0.5)
        await asyncio.to_thread(own_server.start)
        for _ in range(200):
            if nc.is_connected:
                break
            await asyncio.sleep(0.1)
        outbox.event(step_started("e1", "final"))
        await asyncio.wait_for(outbox.flush(), 30)

        stored = [ev.event_id async for _, ev in read_events(js, topo, "e1")]
        assert stored == [step_started("e1", s).event_id for s in ("before", "progress", "final")]


async def test_events_sent_at_once_are_confirmed_every_so_often(
    nc: NATS, js: JetStreamContext, topology: Topology
) -> None:
    """A local loop sends one event per iteration at once; the outbox confirms them every
    `SENT_CONFIRM_EVERY` events (an ack), so what it keeps to publish again after a reconnect stays small."""
    await provision(js, topology, ("default",))
    outbox = Outbox(js, topology)
    pub = publisher(nc)
    acks_before = pub.acks.issued
    n = SENT_CONFIRM_EVERY * 2 + 3
    for i in range(n):
        await outbox.send_now(step_started("many", f"i{i}"))
    assert pub.acks.issued - acks_before == 2  # two confirmations, one per SENT_CONFIRM_EVERY events
    assert len(outbox._sent) == 3
    await outbox.flush()  # nothing queued: confirms the last three
    assert outbox._sent == []
    stored = [ev.event_id async for _, ev in read_events(js, topology, "many")]
    assert stored == [step_started("many", f"i{i}").event_id for i in range(n)]


# --- a clustered (R3) stream -----------------------------------------------------------------------


@pytest.mark.cluster
async def test_racing_expect_new_events_on_a_cluster_settle_as_one_stored_and_the_others_refused(
    r3: Clustered,
) -> None:
    """While one is being stored, a clustered stream refuses the others with "wrong last sequence" and
    no number (not final); the outbox tries them again until the answer is: `AlreadyStoredError`."""
    outboxes = [Outbox(r3.js, r3.topology) for _ in range(10)]
    for i, outbox in enumerate(outboxes):
        outbox.event(step_started("race", f"s{i}"), expect_new=True)  # one subject, ten ids

    results = await asyncio.gather(*(o.flush() for o in outboxes), return_exceptions=True)

    assert results.count(None) == 1, results
    assert all(isinstance(r, AlreadyStoredError) for r in results if r is not None), results
    assert len([ev async for _, ev in read_events(r3.js, r3.topology, "race")]) == 1


async def test_what_a_flush_without_waiting_published_into_a_dying_server_is_stored_once_when_published_again(
    own_server: EmbeddedNats, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's no-wait path across a restart: the messages are stored but their ack is lost, and the
    server dies and comes back; the future fails (the acks of the old connection never come), the same
    messages are flushed again after the reconnect (same ids), and each is stored once."""
    lost = LostAcks(monkeypatch)
    async with own_connection(own_server, "nowaitdies") as (_, js, topo):
        warm = Outbox(js, topo)
        warm.event(step_started("w", "s0"))
        await warm.flush()  # the publisher has looked at the stream: flush_nowait can publish
        events = [step_started("e1", f"s{i}") for i in range(4)]
        outbox = Outbox(js, topo, ack_timeout_s=5.0)
        for ev in events:
            outbox.event(ev)
        lost.dropping = True
        fut = outbox.flush_nowait()
        assert fut is not None
        await lost.stored_then_restart(own_server, js, topo.events_stream, 1 + len(events))
        with pytest.raises((nats.errors.ConnectionReconnectingError, TimeoutError)):  # or the ack timeout
            await asyncio.wait_for(fut, 30)
        again = Outbox(js, topo, ack_timeout_s=5.0)
        for ev in events:
            again.event(ev)
        await asyncio.wait_for(again.flush(), 30)
        stored = [ev.event_id async for _, ev in read_events(js, topo, "e1")]
        assert stored == [ev.event_id for ev in events]
        info = await js.stream_info(topo.events_stream)
        assert info.state.messages == 1 + len(events)  # the copies published again were dropped
