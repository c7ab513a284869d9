"""`Publisher.confirm`, against a real nats-server: the confirms of one turn of the event loop go out in
one write, only the last message to each stream asks for an ack, and that ack settles every caller; what
fails (a refusal, a bad message, a cancelled caller, a closed connection) and whom it fails."""

from __future__ import annotations

import asyncio
import uuid

import nats.errors
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import APIError, BadRequestError, NoStreamResponseError

from noetl_stream.embedded import EmbeddedNats
from noetl_stream.jspublish import (
    Message,
    PubAck,
    Publisher,
    publisher,
)
from noetl_stream.natsconn import connect


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


# --- what fails, and whom -------------------------------------------------------------------------


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


async def test_a_message_over_the_limit_only_with_its_headers_is_refused_before_it_is_written(
    nc: NATS, js: JetStreamContext, stream: str
) -> None:
    """The server's ``max_payload`` counts the headers (``Nats-Msg-Id``, ...) too, and it closes a
    connection that sends a message over it: `send` and `confirm` refuse it to their caller instead."""
    pub = publisher(nc)
    await _warm(pub, stream)
    body = b"x" * (nc.max_payload - 20)  # fits alone; with a header block of 30+ bytes it does not
    with pytest.raises(nats.errors.MaxPayloadError):
        await pub.confirm([(f"{stream}.a", body, "near-limit-1")], stream)
    with pytest.raises(nats.errors.MaxPayloadError):
        await pub.send([(f"{stream}.a", body, "near-limit-2")], 0)
    assert not nc.is_closed
    ack = await _confirm_and_wait(pub, [(f"{stream}.a", b"after", "after-1")], stream)
    assert ack.seq == 2 and not nc.is_closed
