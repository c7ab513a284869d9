"""jspublish.Publisher and the Outbox on it, against a real nats-server: acks, errors, duplicates,
publishes only onto a subject with no message yet, disconnects, restarts and a closed connection."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import nats.errors
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig
from nats.js.errors import APIError, BadRequestError, NoStreamResponseError

from noetl_stream.dsl import load_playbook
from noetl_stream.embedded import EmbeddedCluster, EmbeddedNats
from noetl_stream.errors import StateConflictError
from noetl_stream.jspublish import (
    EXPECTED_LAST_SUBJECT_SEQUENCE,
    WRONG_LAST_SEQUENCE,
    Message,
    PubAck,
    Publisher,
    publisher,
)
from noetl_stream.kv.history import read_events
from noetl_stream.kv.provision import provision, stream_names
from noetl_stream.natsconn import ack_soon, connect
from noetl_stream.outbox import SENT_CONFIRM_EVERY, AlreadyStored, Outbox
from noetl_stream.services import provision_at_start
from noetl_stream.subjects import Topology
from noetl_stream.wire import Command, Event, now_iso


@pytest.fixture
async def stream(js: JetStreamContext) -> AsyncIterator[str]:
    """A stream of this test's own (``<name>.>``), 1 KiB max message size; its name is the subject root."""
    name = "PUB" + uuid.uuid4().hex[:8].upper()
    await js.add_stream(name=name, subjects=[f"{name}.>"], max_msg_size=1024, duplicate_window=120)
    yield name
    await js.delete_stream(name)


async def test_many_acks_in_flight_each_matches_its_own_publish(
    nc: NATS, js: JetStreamContext, stream: str
) -> None:
    pub = publisher(nc)
    assert publisher(nc) is pub  # one per connection
    n = 500
    futures = [await pub.acked(f"{stream}.s{i % 7}", f"m{i}".encode(), f"id-{i}") for i in range(n)]
    acks = await asyncio.gather(*futures)
    assert all(isinstance(a, PubAck) and a.stream == stream and not a.duplicate for a in acks)
    assert sorted(a.seq for a in acks) == list(range(1, n + 1))
    for i in (0, 1, 137, n - 1):  # the message stored under the sequence an ack names is that publish's
        stored = await js.get_msg(stream, acks[i].seq)
        assert stored.data == f"m{i}".encode()
        assert stored.subject == f"{stream}.s{i % 7}"
        assert stored.headers is not None and stored.headers["Nats-Msg-Id"] == f"id-{i}"
    assert pub.pending == 0


async def test_plain_publishes_are_stored_in_order_before_the_acked_one(
    nc: NATS, js: JetStreamContext, stream: str
) -> None:
    pub = publisher(nc)
    for i in range(20):
        await pub.publish(f"{stream}.a", f"{i}".encode(), f"plain-{i}")
    ack = await (await pub.acked(f"{stream}.a", b"last", "plain-last"))
    assert ack.seq == 21
    assert (await js.get_msg(stream, 5)).data == b"4"


async def test_a_duplicate_msg_id_is_acked_as_duplicate_and_stored_once(
    nc: NATS, js: JetStreamContext, stream: str
) -> None:
    pub = publisher(nc)
    first = await (await pub.acked(f"{stream}.d", b"one", "same-id"))
    again = await (await pub.acked(f"{stream}.d", b"two", "same-id"))
    assert (first.duplicate, again.duplicate) == (False, True)
    assert again.seq == first.seq
    info = await js.stream_info(stream)
    assert info.state.messages == 1


async def test_a_subject_no_stream_takes_fails_with_no_responders(nc: NATS) -> None:
    fut = await publisher(nc).acked(f"nostream{uuid.uuid4().hex}.x", b"{}", "x")
    with pytest.raises(NoStreamResponseError):
        await asyncio.wait_for(fut, 10)


async def test_an_api_error_in_the_ack_fails_the_future_with_the_servers_reason(
    nc: NATS, stream: str
) -> None:
    fut = await publisher(nc).acked(f"{stream}.big", b"x" * 2048, "too-big")
    with pytest.raises(BadRequestError) as info:  # nats-py's publish_async would leave it unanswered
        await asyncio.wait_for(fut, 10)
    assert isinstance(info.value, APIError) and info.value.code == 400
    assert "size" in (info.value.description or "")


async def test_header_and_subject_injection_is_refused(nc: NATS, stream: str) -> None:
    pub = publisher(nc)
    with pytest.raises(nats.errors.BadHeaderError):
        await pub.publish(f"{stream}.a", b"", "id\r\nX-Evil: 1")
    with pytest.raises(nats.errors.BadSubjectError):
        await pub.acked(f"{stream}.a 4\r\nPUB x", b"", "id")
    assert pub.pending == 0


# --- expect_new: stored only onto a subject with no message yet -------------------------------------


async def test_an_expect_new_publish_is_stored_once_and_refused_on_that_subject_after(
    nc: NATS, js: JetStreamContext, stream: str
) -> None:
    pub = publisher(nc)
    first = await (await pub.acked(f"{stream}.n", b"first", "n-1", expect_new=True))
    assert (first.seq, first.duplicate) == (1, False)
    # Another id, and the stored message's own id: refused both times (not acked as a duplicate).
    for msg_id in ("n-2", "n-1"):
        with pytest.raises(BadRequestError) as info:
            await asyncio.wait_for(await pub.acked(f"{stream}.n", b"again", msg_id, expect_new=True), 10)
        assert (info.value.code, info.value.err_code) == (400, WRONG_LAST_SEQUENCE)
        assert "wrong last sequence: 1" in (info.value.description or "")
    plain = await (await pub.acked(f"{stream}.n", b"plain", "n-3"))  # a normal publish still goes in
    other = await (await pub.acked(f"{stream}.m", b"other", "m-1", expect_new=True))  # another subject
    assert (plain.seq, other.seq) == (2, 3)
    stored = await js.get_msg(stream, 1)
    assert stored.data == b"first"
    assert stored.headers == {"Nats-Msg-Id": "n-1", EXPECTED_LAST_SUBJECT_SEQUENCE: "0"}
    assert (await js.stream_info(stream)).state.messages == 3
    assert pub.pending == 0


async def test_expect_new_among_plain_and_acked_publishes_of_one_send(
    nc: NATS, js: JetStreamContext, stream: str
) -> None:
    pub = publisher(nc)
    await (await pub.acked(f"{stream}.taken", b"earlier", "t-0"))
    messages = [
        (f"{stream}.a", b"plain", "s-0"),
        (f"{stream}.free", b"new", "s-1"),
        (f"{stream}.taken", b"refused", "s-2"),
        (f"{stream}.a", b"acked", "s-3"),
    ]
    futures = await pub.send(messages, 1, expect_new=(1, 2))
    results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 10)
    assert isinstance(results[0], PubAck) and isinstance(results[2], PubAck)
    assert isinstance(results[1], BadRequestError) and results[1].err_code == WRONG_LAST_SEQUENCE
    stored = [(await js.get_msg(stream, seq)).data for seq in range(1, 5)]
    assert stored == [b"earlier", b"plain", b"new", b"acked"]  # the refused one alone is missing


async def test_expect_new_on_a_publish_without_an_ack_is_refused_before_anything_is_sent(
    nc: NATS, js: JetStreamContext, stream: str
) -> None:
    pub = publisher(nc)
    messages = [(f"{stream}.a", b"x", "v-0"), (f"{stream}.b", b"y", "v-1")]
    with pytest.raises(ValueError, match="expect_new"):
        await pub.send(messages, 1, expect_new=(0,))  # its refusal would never be heard
    with pytest.raises(ValueError, match="expect_new"):
        await pub.send(messages, 1, expect_new=(2,))  # no such message
    assert pub.pending == 0
    await (await pub.acked(f"{stream}.c", b"z", "v-2"))
    assert (await js.stream_info(stream)).state.messages == 1


async def test_an_outbox_event_expected_new_raises_already_stored_without_a_retry(
    nc: NATS, js: JetStreamContext, topology: Topology
) -> None:
    await provision(js, topology, ("default",))
    subject = topology.event_subject("x1", "step.started")
    seen = await nc.subscribe(subject)  # every publish on the subject, stored or refused
    outbox = Outbox(js, topology, retry_s=30.0)
    outbox.event(_event("x1", "s0"), expect_new=True)
    outbox.event(_event("x2", "s0"))
    await outbox.flush()

    # A second event on the subject (another step: another id), then the first one again (the retry
    # of a flush that did store it): both refused, and the events queued after them still published.
    for refused in (_event("x1", "s1"), _event("x1", "s0")):
        after = _event("x3", refused.step or "")
        outbox.event(refused, expect_new=True)
        outbox.event(after)
        with pytest.raises(AlreadyStored) as info:
            await outbox.flush()
        assert isinstance(info.value, StateConflictError)
        assert (info.value.subject, info.value.msg_id) == (subject, refused.event_id)
        cause = info.value.__cause__
        assert isinstance(cause, BadRequestError) and cause.err_code == WRONG_LAST_SEQUENCE
        assert len(outbox) == 0

    await nc.flush()  # every publish the server relayed before its PONG is queued for `seen` now
    assert seen.pending_msgs == 3  # one publish per flush: AlreadyStored is not retried
    stored = [
        (ev.execution_id, ev.step) for x in ("x1", "x2", "x3") async for _, ev in read_events(js, topology, x)
    ]
    assert stored == [("x1", "s0"), ("x2", "s0"), ("x3", "s1"), ("x3", "s0")]
    await seen.unsubscribe()


async def test_closing_the_connection_fails_awaited_acks_and_later_publishes(
    nats_server: EmbeddedNats, stream: str
) -> None:
    nc = await connect(nats_server.url, name="pytest-close", connect_wait_s=10)
    pub = publisher(nc)
    await (await pub.acked(f"{stream}.c", b"warm", "c0"))
    futures = [await pub.acked(f"{stream}.c", b"x", f"c{i}") for i in range(1, 50)]
    await nc.close()
    results = await asyncio.gather(*futures, return_exceptions=True)
    # Acks that came before the close count; every other one fails with the close (none hangs).
    assert all(isinstance(r, PubAck | nats.errors.ConnectionClosedError) for r in results), results
    with pytest.raises(nats.errors.ConnectionClosedError):
        await pub.publish(f"{stream}.c", b"", "after")
    with pytest.raises(nats.errors.ConnectionClosedError):
        await pub.acked(f"{stream}.c", b"", "after")


# --- a server that freezes, dies and comes back ----------------------------------------------------


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(tmp_path / "nats") as server:
        yield server


async def test_an_ack_lost_with_the_connection_fails_at_once_and_publishing_works_after_the_restart(
    own_server: EmbeddedNats,
) -> None:
    disconnects: list[str] = []

    async def on_disconnected() -> None:
        disconnects.append("x")

    nc = await connect(
        own_server.url, name="pytest-restart", connect_wait_s=10, disconnected_cb=on_disconnected
    )
    try:
        js = nc.jetstream(timeout=10)
        await js.add_stream(name="R", subjects=["r.>"])
        pub = publisher(nc)
        await (await pub.acked("r.a", b"before", "r-before"))
        assert own_server.pid is not None
        os.kill(own_server.pid, signal.SIGSTOP)  # the publish reaches a socket nobody reads
        await asyncio.sleep(0.1)  # the stop takes effect
        lost = await pub.acked("r.a", b"lost", "r-lost")
        await asyncio.sleep(0.2)
        own_server.kill()
        with pytest.raises(nats.errors.ConnectionReconnectingError):
            await asyncio.wait_for(lost, 10)  # not after some timeout: when the connection dropped
        assert disconnects, "the connection's own disconnected_cb is still called"
        await asyncio.to_thread(own_server.start)
        # Published while reconnecting (buffered) or after: the ack comes on the replayed subscription.
        again = await asyncio.wait_for(await pub.acked("r.a", b"lost", "r-lost"), 20)
        assert again.stream == "R"
        after = await asyncio.wait_for(await pub.acked("r.a", b"after", "r-after"), 10)
        assert after.seq == again.seq + 1
    finally:
        await nc.close()


async def test_an_outbox_flush_across_a_server_restart_stores_each_event_once(
    own_server: EmbeddedNats,
) -> None:
    topo = Topology(prefix="flush")
    nc = await connect(own_server.url, name="pytest-flush", connect_wait_s=10)
    try:
        js = nc.jetstream(timeout=10)
        await provision(js, topo, ("default",))
        outbox = Outbox(js, topo, ack_timeout_s=5.0)
        events = [_event("e1", f"s{i}") for i in range(5)]
        assert own_server.pid is not None
        os.kill(own_server.pid, signal.SIGSTOP)
        await asyncio.sleep(0.1)
        for ev in events:
            outbox.event(ev)
        flush = asyncio.create_task(outbox.flush())
        await asyncio.sleep(0.3)
        own_server.kill()
        await asyncio.sleep(0.5)
        await asyncio.to_thread(own_server.start)
        await asyncio.wait_for(flush, 30)  # retried after the reconnect, same ids

        stored = [ev.event_id async for _, ev in read_events(js, topo, "e1")]
        assert stored == [ev.event_id for ev in events]  # in order, once each
        info = await js.stream_info(topo.events_stream)
        assert info.state.messages == len(events)  # duplicates of the retry were dropped
    finally:
        await nc.close()


async def test_an_event_sent_at_once_and_lost_with_the_connection_is_published_again_by_the_flush(
    own_server: EmbeddedNats,
) -> None:
    """`send_now` writes at once and leaves the confirmation to the next flush's ack. Written into a
    socket that died, it is gone, and the flush's ack (on the new connection) does not cover it: the
    flush publishes it again (same id, stored once) instead of reporting success without it."""
    topo = Topology(prefix="sendnow")
    nc = await connect(own_server.url, name="pytest-send-now", connect_wait_s=10)
    try:
        js = nc.jetstream(timeout=10)
        await provision(js, topo, ("default",))
        outbox = Outbox(js, topo, ack_timeout_s=5.0)
        assert own_server.pid is not None
        await outbox.send_now(_event("e1", "before"))  # confirmed by the first flush, no reconnect
        await outbox.flush()
        os.kill(own_server.pid, signal.SIGSTOP)
        await asyncio.sleep(0.1)
        await outbox.send_now(_event("e1", "progress"))  # like a loop.iteration.done
        await asyncio.sleep(0.3)  # in the socket, unread by the stopped server
        own_server.kill()
        await asyncio.sleep(0.5)
        await asyncio.to_thread(own_server.start)
        for _ in range(200):
            if nc.is_connected:
                break
            await asyncio.sleep(0.1)
        outbox.event(_event("e1", "final"))
        await asyncio.wait_for(outbox.flush(), 30)

        stored = [ev.event_id async for _, ev in read_events(js, topo, "e1")]
        assert stored == [_event("e1", s).event_id for s in ("before", "progress", "final")]
    finally:
        await nc.close()


async def test_events_sent_at_once_are_confirmed_every_so_often(nc: NATS, js: JetStreamContext) -> None:
    """A local loop sends one event per iteration at once; the outbox confirms them every
    `SENT_CONFIRM_EVERY` events (an ack), so what it keeps to publish again after a reconnect stays small."""
    topo = Topology(prefix="s" + uuid.uuid4().hex[:10])
    await provision(js, topo, ("default",))
    try:
        outbox = Outbox(js, topo)
        pub = publisher(nc)
        acks_before = pub._next
        for i in range(SENT_CONFIRM_EVERY * 2 + 3):
            await outbox.send_now(_event("many", f"i{i}"))
        assert pub._next - acks_before == 2  # two confirmations, one per SENT_CONFIRM_EVERY events
        assert len(outbox._sent) == 3
        await outbox.flush()  # nothing queued: confirms the last three
        assert outbox._sent == []
        stored = [ev.event_id async for _, ev in read_events(js, topo, "many")]
        assert stored == [_event("many", f"i{i}").event_id for i in range(SENT_CONFIRM_EVERY * 2 + 3)]
    finally:
        for name in stream_names(topo):
            with contextlib.suppress(Exception):
                await js.delete_stream(name)


async def test_confirm_all_publishes_every_group_or_none(nc: NATS, js: JetStreamContext, stream: str) -> None:
    """A flush's events and commands join the turn's write together: when the commands cannot be
    published (here one is over the server's max payload), the events are not written either."""
    pub = publisher(nc)
    events = [(f"{stream}.e", b"event", "all-e1")]
    with pytest.raises(nats.errors.MaxPayloadError):
        await pub.confirm_all(
            [(events, stream), ([(f"{stream}.c", b"x" * (nc.max_payload + 1), "all-c1")], stream)]
        )
    ok = await pub.confirm_all([(events, stream), ([(f"{stream}.c", b"command", "all-c2")], stream)])
    acks = await asyncio.wait_for(asyncio.gather(*ok), 10)
    assert [a.seq for a in acks] == [2, 2]  # one group per stream: the write's last message's ack for both
    assert (await js.stream_info(stream)).state.messages == 2  # the refused call wrote nothing


def _event(execution_id: str, step: str) -> Event:
    return Event(
        event_id=f"{execution_id}:{step}:step.started",
        execution_id=execution_id,
        name="step.started",
        source="worker",
        entity_type="step",
        entity_id=step,
        status="in_progress",
        timestamp=now_iso(),
        step=step,
    )


async def test_an_ack_that_never_comes_times_out_and_a_late_one_is_ignored(
    own_server: EmbeddedNats,
) -> None:
    nc = await connect(own_server.url, name="pytest-timeout", connect_wait_s=10)
    try:
        js = nc.jetstream(timeout=10)
        await js.add_stream(name="T", subjects=["t.>"])
        pub = publisher(nc)
        assert own_server.pid is not None
        os.kill(own_server.pid, signal.SIGSTOP)
        await asyncio.sleep(0.1)
        try:
            (fut,) = await pub.send([("t.a", b"slow", "t-slow")], 0, timeout_s=0.2)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(fut, 5)
            assert pub.pending == 0
        finally:
            os.kill(own_server.pid, signal.SIGCONT)
        # The server stores it and answers now: the answer is dropped, the connection goes on.
        ack = await asyncio.wait_for(await pub.acked("t.a", b"next", "t-next"), 10)
        assert ack.seq == 2
    finally:
        await nc.close()


# --- a clustered (R3) stream -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(3, tmp_path_factory.mktemp("cluster")) as c:
        yield c


@pytest.mark.cluster
async def test_racing_expect_new_events_on_a_cluster_settle_as_one_stored_and_the_others_refused(
    cluster: EmbeddedCluster,
) -> None:
    """While one is being stored, a clustered stream refuses the others with "wrong last sequence" and
    no number (not final); the outbox tries them again until the answer is: `AlreadyStored`."""
    topo = Topology(prefix="r" + uuid.uuid4().hex[:10], replicas=3)
    nc = await connect(cluster.url, name="pytest-race", connect_wait_s=10)
    js = nc.jetstream(timeout=10)
    try:
        await provision_at_start(nc, topo, ("default",))  # retries a cluster slow to answer, as processes do
        outboxes = [Outbox(js, topo) for _ in range(10)]
        for i, outbox in enumerate(outboxes):
            outbox.event(_event("race", f"s{i}"), expect_new=True)  # one subject, ten ids

        results = await asyncio.gather(*(o.flush() for o in outboxes), return_exceptions=True)

        assert results.count(None) == 1, results
        assert all(isinstance(r, AlreadyStored) for r in results if r is not None), results
        assert len([ev async for _, ev in read_events(js, topo, "race")]) == 1
    finally:
        for name in stream_names(topo):
            with contextlib.suppress(Exception):  # not created, if provisioning failed: keep its error
                await js.delete_stream(name)
        await nc.close()


# --- confirm: the confirms of one turn of the loop go out in one write, one ack per stream ---------


@pytest.fixture
async def other_stream(js: JetStreamContext) -> AsyncIterator[str]:
    """A second stream like `stream`'s (``<name>.>``, 1 KiB max message size)."""
    name = "PUB" + uuid.uuid4().hex[:8].upper()
    await js.add_stream(name=name, subjects=[f"{name}.>"], max_msg_size=1024, duplicate_window=120)
    yield name
    await js.delete_stream(name)


async def _warm(pub: Publisher, stream: str) -> None:
    """One confirmed message to `stream` (its seq 1): the publisher's ack subscription exists after it,
    so a `confirm` does not await anything and the confirms of one turn stay in that turn."""
    ack = await asyncio.wait_for(
        await pub.confirm([(f"{stream}.warm", b"warm", f"{stream}-warm")], stream), 10
    )
    assert ack.seq == 1


def _caller_messages(stream: str, caller: int) -> list[Message]:
    """The 1 to 3 messages of one caller; subject, payload and id name the caller and the message."""
    return [
        (f"{stream}.c{caller}", f"{caller}/{j}".encode(), f"{stream}-{caller}-{j}")
        for j in range(caller % 3 + 1)
    ]


async def _confirm_and_wait(pub: Publisher, messages: list[Message], stream: str) -> PubAck:
    return await asyncio.wait_for(await pub.confirm(messages, stream), 10)


async def test_the_confirms_of_one_turn_go_out_in_one_write_with_one_ack(
    nats_server: EmbeddedNats, nc: NATS, js: JetStreamContext, stream: str
) -> None:
    """Fifty tasks started by one gather confirm 1 to 3 messages each: they all run in one turn of the
    loop, so their messages go out in one write, in the order of the confirms, and only the last one
    asks for an ack (one reply token, one reply on the wire), whose PubAck settles every caller."""
    pub = publisher(nc)
    await _warm(pub, stream)
    watcher = await connect(nats_server.url, name="pytest-ack-watcher", connect_wait_s=10)
    try:
        replies = await watcher.subscribe(pub._prefix + "*")  # every ack the server sends to `pub`
        await watcher.flush()
        before = pub._next
        n = 50
        acks = await asyncio.gather(
            *(_confirm_and_wait(pub, _caller_messages(stream, i), stream) for i in range(n))
        )
        expected = [m for i in range(n) for m in _caller_messages(stream, i)]
        assert pub._next - before == 1  # one ack requested for the fifty callers
        await watcher.flush()  # a reply the server sent before this PONG is queued for `replies` now
        assert replies.pending_msgs == 1
        await replies.unsubscribe()
    finally:
        await watcher.close()
    assert all(a is acks[0] for a in acks)  # one PubAck, fanned out
    assert (acks[0].stream, acks[0].seq, acks[0].duplicate) == (stream, 1 + len(expected), False)
    assert (await js.stream_info(stream)).state.messages == 1 + len(expected)  # each once
    for seq, (subject, payload, msg_id) in enumerate(expected, 2):  # in the order of the confirms
        stored = await js.get_msg(stream, seq)
        assert (stored.subject, stored.data) == (subject, payload)
        assert stored.headers == {"Nats-Msg-Id": msg_id}
    assert pub.pending == 0


async def test_the_confirms_of_one_turn_to_two_streams_get_one_ack_each(
    nc: NATS, js: JetStreamContext, stream: str, other_stream: str
) -> None:
    """Callers of two streams interleaved in one turn: one ack request per stream, and each caller's
    future settles with its own stream's ack (the sequence of that stream's last message)."""
    pub = publisher(nc)
    await _warm(pub, stream)
    before = pub._next
    streams = [stream if i % 2 else other_stream for i in range(20)]
    acks = await asyncio.gather(
        *(_confirm_and_wait(pub, _caller_messages(s, i), s) for i, s in enumerate(streams))
    )
    assert pub._next - before == 2
    counts = {
        s: sum(len(_caller_messages(s, i)) for i, t in enumerate(streams) if t == s)
        for s in (stream, other_stream)
    }
    assert counts[stream] != counts[other_stream]  # a mixed-up ack would show in the sequence
    for s, warm in ((stream, 1), (other_stream, 0)):
        mine = [a for a, t in zip(acks, streams, strict=True) if t == s]
        assert all(a is mine[0] for a in mine)
        assert (mine[0].stream, mine[0].seq) == (s, warm + counts[s])
        assert (await js.stream_info(s)).state.messages == warm + counts[s]
    assert acks[0] is not acks[1]


async def test_confirms_in_different_turns_are_separate_writes_with_their_own_acks(
    nc: NATS, js: JetStreamContext, stream: str
) -> None:
    """A confirm after the turn of an earlier one ended (one ``sleep(0)``: the write went out, its ack
    has not come back) is another write with its own ack; so is one after the earlier ack came."""
    pub = publisher(nc)
    await _warm(pub, stream)
    before = pub._next
    first = await pub.confirm(_caller_messages(stream, 1), stream)  # 2 messages: seq 2, 3
    assert pub._next == before  # nothing written before the end of the turn
    await asyncio.sleep(0)  # the end of the turn: the write goes out
    assert pub._next == before + 1
    second = await pub.confirm(_caller_messages(stream, 2), stream)  # 3 messages: seq 4..6
    assert not first.done()  # the first ack cannot be back yet: two writes, two acks in flight
    a1, a2 = await asyncio.wait_for(asyncio.gather(first, second), 10)
    assert pub._next == before + 2
    assert (a1.seq, a2.seq) == (3, 6)
    a3 = await _confirm_and_wait(pub, _caller_messages(stream, 3), stream)  # after an ack: 1 message
    assert pub._next == before + 3
    assert a3.seq == 7
    assert (await js.stream_info(stream)).state.messages == 7


async def test_a_group_whose_last_message_no_stream_takes_fails_each_of_its_callers_only(
    nc: NATS, js: JetStreamContext, stream: str
) -> None:
    """The ack of a group's last message settles the whole group: no responders for it fails every
    caller of that group, and the group of another stream in the same turn is acked all the same."""
    pub = publisher(nc)
    await _warm(pub, stream)
    nowhere = "nowhere" + uuid.uuid4().hex
    lost_a = await pub.confirm([(f"{nowhere}.a", b"a", "nowhere-a")], nowhere)
    ok = await pub.confirm([(f"{stream}.ok", b"ok", "ok-1")], stream)
    lost_b = await pub.confirm([(f"{nowhere}.b", b"b", "nowhere-b")], nowhere)
    results = await asyncio.wait_for(asyncio.gather(lost_a, ok, lost_b, return_exceptions=True), 10)
    assert isinstance(results[0], NoStreamResponseError), results
    assert isinstance(results[2], NoStreamResponseError), results
    assert isinstance(results[1], PubAck) and (results[1].stream, results[1].seq) == (stream, 2)
    assert pub.pending == 0


async def test_a_group_whose_last_message_the_stream_refuses_fails_each_of_its_callers_only(
    nc: NATS, js: JetStreamContext, stream: str, other_stream: str
) -> None:
    """The last message of `stream`'s group is over its 1 KiB max message size: the API error fails
    every caller of the group, also the one whose messages were stored (publishing them again is
    acked as a duplicate), and not the caller of the other stream in the same turn."""
    pub = publisher(nc)
    await _warm(pub, stream)
    first = await pub.confirm([(f"{stream}.a", b"one", "a-1")], stream)
    other = await pub.confirm([(f"{other_stream}.x", b"x", "x-1")], other_stream)
    last = await pub.confirm([(f"{stream}.a", b"two", "a-2"), (f"{stream}.a", b"x" * 2048, "a-big")], stream)
    results = await asyncio.wait_for(asyncio.gather(first, other, last, return_exceptions=True), 10)
    for refused in (results[0], results[2]):
        assert isinstance(refused, BadRequestError) and refused.code == 400, results
        assert "size" in (refused.description or "")
    assert isinstance(results[1], PubAck) and (results[1].stream, results[1].seq) == (other_stream, 1)
    assert (await js.stream_info(stream)).state.messages == 3  # warm, one, two: only the big one refused
    again = await _confirm_and_wait(pub, [(f"{stream}.a", b"one", "a-1")], stream)
    assert (again.seq, again.duplicate) == (2, True)
    assert pub.pending == 0


@pytest.mark.xfail(
    strict=True,
    reason="confirm: a caller's message the stream refuses, followed in the same write by another "
    "caller's message it stores, settles as stored (the ack of the last message of the stream's group "
    "says nothing of the ones before it)",
)
async def test_a_caller_whose_only_message_the_stream_refuses_is_not_told_it_is_stored(
    nc: NATS, js: JetStreamContext, stream: str
) -> None:
    """`confirm`'s future "settles when they are stored": a caller whose one message is over the
    stream's max message size must not get a PubAck because another caller's message after it in the
    same turn was stored."""
    pub = publisher(nc)
    await _warm(pub, stream)
    big = await pub.confirm([(f"{stream}.a", b"x" * 2048, "big")], stream)
    small = await pub.confirm([(f"{stream}.a", b"small", "small")], stream)
    results = await asyncio.wait_for(asyncio.gather(big, small, return_exceptions=True), 10)
    assert isinstance(results[1], PubAck) and results[1].seq == 2
    assert (await js.stream_info(stream)).state.messages == 2  # the big one is not stored
    assert isinstance(results[0], APIError), results  # today: the small one's PubAck


async def test_a_message_the_client_refuses_fails_that_confirm_only_and_none_of_its_messages_go_out(
    nc: NATS, js: JetStreamContext, stream: str
) -> None:
    """Over the server's max payload, a ``Nats-Msg-Id`` with CR LF, a subject with a space: `confirm`
    raises to its caller at once, before any of that caller's messages joins the turn's write; the
    confirms before and after it in the same turn are written and acked (one ack for both)."""
    pub = publisher(nc)
    await _warm(pub, stream)
    before = pub._next
    good = (f"{stream}.ok", b"fine", "bad-caller-ok")  # what each bad caller sends before its bad message
    ahead = await pub.confirm([(f"{stream}.g", b"g1", "g-1")], stream)
    with pytest.raises(nats.errors.MaxPayloadError):
        await pub.confirm([good, (f"{stream}.b", b"x" * (nc.max_payload + 1), "b-1")], stream)
    with pytest.raises(nats.errors.BadHeaderError):
        await pub.confirm([good, (f"{stream}.b", b"b", "b-2\r\nX-Evil: 1")], stream)
    with pytest.raises(nats.errors.BadSubjectError):
        await pub.confirm([good, (f"{stream}.b 4\r\nPUB x", b"b", "b-3")], stream)
    with pytest.raises(ValueError, match="no messages"):
        await pub.confirm([], stream)
    behind = await pub.confirm([(f"{stream}.g", b"g2", "g-2")], stream)
    a1, a2 = await asyncio.wait_for(asyncio.gather(ahead, behind), 10)
    assert a1 is a2 and a1.seq == 3
    assert pub._next - before == 1
    assert (await js.stream_info(stream)).state.messages == 3  # warm, g1, g2: nothing of the bad callers
    assert [(await js.get_msg(stream, seq)).data for seq in (2, 3)] == [b"g1", b"g2"]


async def test_a_cancelled_confirm_does_not_disturb_the_other_callers_of_its_group(
    nc: NATS, js: JetStreamContext, stream: str
) -> None:
    """Callers cancel their futures, among them the one whose message carries the group's ack request,
    before the write and after it: the other callers' futures settle with the ack all the same (the
    cancelled callers' messages were written: cancelling stops the wait, not the publish)."""
    pub = publisher(nc)
    await _warm(pub, stream)
    f1 = await pub.confirm([(f"{stream}.a", b"1", "k-1")], stream)
    f2 = await pub.confirm([(f"{stream}.a", b"2", "k-2")], stream)
    f3 = await pub.confirm([(f"{stream}.a", b"3", "k-3")], stream)  # its message asks for the ack
    f2.cancel()
    f3.cancel()
    assert (await asyncio.wait_for(f1, 10)).seq == 4
    f4 = await pub.confirm([(f"{stream}.a", b"4", "k-4")], stream)
    f5 = await pub.confirm([(f"{stream}.a", b"5", "k-5")], stream)
    await asyncio.sleep(0)  # written, its ack on the way
    f5.cancel()
    assert (await asyncio.wait_for(f4, 10)).seq == 6
    assert f2.cancelled() and f3.cancelled() and f5.cancelled()
    assert (await js.stream_info(stream)).state.messages == 6
    assert pub.pending == 0


async def test_a_connection_closed_before_the_end_of_the_turn_fails_the_confirms_at_once(
    nats_server: EmbeddedNats, js: JetStreamContext, stream: str
) -> None:
    """``close()`` marks the connection closed before it first yields, so the turn's write finds it
    closed: each future of the turn fails with ConnectionClosedError when the turn ends (not after
    the ack timeout), nothing asks for an ack; a confirm on the closed connection raises at once."""
    own = await connect(nats_server.url, name="pytest-close-turn", connect_wait_s=10)
    pub = publisher(own)
    await _warm(pub, stream)
    before = pub._next
    futures = [await pub.confirm([(f"{stream}.c", b"c", f"c-{i}")], stream) for i in range(3)]
    await own.close()
    assert all(f.done() for f in futures)
    for fut in futures:
        with pytest.raises(nats.errors.ConnectionClosedError):
            await fut
    assert pub._next == before
    with pytest.raises(nats.errors.ConnectionClosedError):
        await pub.confirm([(f"{stream}.c", b"c", "c-after")], stream)
    assert (await js.stream_info(stream)).state.messages == 1  # the warm-up message alone


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
    hundred flushes asked for two acks (one for the events stream, one for the commands stream)."""
    await provision(js, topology, ("default",))
    pub = publisher(nc)
    before = pub._next
    outboxes = []
    for i in range(100):
        outbox = Outbox(js, topology)
        for s in range(3):
            outbox.event(_event(f"x{i}", f"s{s}"))
        outbox.command(_command(f"x{i}"))
        outboxes.append(outbox)
    await asyncio.wait_for(asyncio.gather(*(o.flush() for o in outboxes)), 30)
    assert pub._next - before == 2  # far below a hundred: the point of grouping
    assert all(len(o) == 0 for o in outboxes)
    assert pub.pending == 0
    assert (await js.stream_info(topology.events_stream)).state.messages == 300
    assert (await js.stream_info(topology.commands_stream)).state.messages == 100
    for x in ("x0", "x1", "x50", "x99"):
        stored = [ev.event_id async for _, ev in read_events(js, topology, x)]
        assert stored == [f"{x}:s{s}:step.started" for s in range(3)]


async def test_ack_soon_settles_a_pulled_delivery_once_without_awaiting(
    nc: NATS, js: JetStreamContext, stream: str, eventually: Callable[..., Awaitable[None]]
) -> None:
    """`natsconn.ack_soon` acks synchronously (the ack joins the outgoing buffer): the consumer has
    nothing pending and redelivers nothing after its 1 s ack wait; a second ack raises."""
    await js.publish(f"{stream}.k", b"k")
    sub = await js.pull_subscribe(
        f"{stream}.k", durable="soon", stream=stream, config=ConsumerConfig(ack_wait=1.0)
    )
    (msg,) = await sub.fetch(1, timeout=10)
    ack_soon(msg)
    assert msg.is_acked
    with pytest.raises(nats.errors.MsgAlreadyAckdError):
        ack_soon(msg)
    with pytest.raises(nats.errors.MsgAlreadyAckdError):
        await msg.ack()

    async def settled() -> bool:
        info = await js.consumer_info(stream, "soon")
        floor = info.ack_floor
        return info.num_ack_pending == 0 and floor is not None and floor.stream_seq == 1

    await eventually(settled)
    with pytest.raises(nats.errors.TimeoutError):  # twice the ack wait: no redelivery
        await sub.fetch(1, timeout=2.0)
    info = await js.consumer_info(stream, "soon")
    assert (info.num_redelivered, info.num_ack_pending, info.delivered.consumer_seq) == (0, 0, 1)
    with pytest.raises(nats.errors.NotJSMessageError):
        ack_soon(Msg(nc, subject=f"{stream}.k", reply="", data=b""))
    await sub.unsubscribe()
