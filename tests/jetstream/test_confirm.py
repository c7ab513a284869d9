"""`Publisher.confirm`, against a real nats-server: the confirms of one turn of the event loop go out in
one write, only the last message to each stream asks for an ack, and that ack settles every caller (one
ack per caller for a stream that may refuse one message on its own: the publisher looks at its
configuration); what fails (a refusal, a bad message, a cancelled caller, a closed connection, a stream
whose configuration cannot be looked at) and whom it fails.

The `stream` and `other_stream` fixtures have a 1 KiB max message size: such a stream may refuse one
message and store the next, so each caller gets its own ack. `plain` and `other_plain` have no
per-message limits, as the runtime's events and commands streams: one ack per stream per turn."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import nats.errors
import pytest
from helpers import own_stream
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, StreamSource
from nats.js.errors import APIError, BadRequestError, NoStreamResponseError

from noetl_stream.jetstream import streams as jsstreams
from noetl_stream.jetstream.connection import connect
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.jetstream.publish import (
    WRITE_AT,
    Message,
    PubAck,
    Publisher,
    publisher,
)

MESSAGE_TOO_LARGE = 10054
"""JetStream's error code for a message over the stream's maximum message size (its text is the server's)."""


@pytest.fixture
async def plain(js: JetStreamContext) -> AsyncIterator[str]:
    """A stream without per-message limits, as the runtime's (``max_msg_size: -1``, ``discard: old``)."""
    async with own_stream(js, "CONF") as name:
        yield name


@pytest.fixture
async def other_plain(js: JetStreamContext) -> AsyncIterator[str]:
    """A second stream like `plain`'s."""
    async with own_stream(js, "CONF") as name:
        yield name


async def _warm(pub: Publisher, stream: str) -> None:
    """One confirmed message to `stream` (its seq 1): the publisher's ack subscription exists after it,
    and the stream's configuration has been looked at, so a `confirm` does not await anything and the
    confirms of one turn stay in that turn."""
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
    nats_server: EmbeddedNats, nc: NATS, js: JetStreamContext, plain: str
) -> None:
    """Twenty tasks started by one gather confirm 1 to 3 messages each (fewer than `WRITE_AT` in all) to a
    stream without per-message limits (as the runtime's): they all run in one turn of the loop, so their
    messages go out in one write, in the order of the confirms, and only the last one asks for an ack
    (one reply token, one reply on the wire), whose PubAck settles every caller."""
    stream = plain
    pub = publisher(nc)
    await _warm(pub, stream)
    watcher = await connect(nats_server.url, name="pytest-ack-watcher", connect_wait_s=10)
    try:
        replies = await watcher.subscribe(pub.acks.prefix + "*")  # every ack the server sends to `pub`
        await watcher.flush()
        before = pub.acks.issued
        n = 20
        acks = await asyncio.gather(
            *(_confirm_and_wait(pub, _caller_messages(stream, i), stream) for i in range(n))
        )
        expected = [m for i in range(n) for m in _caller_messages(stream, i)]
        assert len(expected) < WRITE_AT
        assert pub.acks.issued - before == 1  # one ack requested for the twenty callers
        # The server hands the reply to `pub` and to the watcher one after the other, so the watcher's
        # copy may still be on its way when `pub` has settled every caller: wait for it, then give a
        # second reply (there must be none) the time to arrive before counting.
        first = await replies.next_msg(timeout=10)
        assert first.subject.startswith(pub.acks.prefix)
        await asyncio.sleep(0.2)
        await watcher.flush()
        assert replies.pending_msgs == 0  # one reply on the wire
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


async def test_a_turn_writes_its_batch_whenever_it_reaches_write_at_messages(
    nc: NATS, js: JetStreamContext, plain: str
) -> None:
    """A busy turn does not hold everything until its end: its batch goes out each time it holds
    `WRITE_AT` messages (the server starts on them meanwhile), each write with its own ack, whose PubAck
    settles the callers of that write; the rest goes at the end of the turn. All stored once, in order."""
    stream = plain
    pub = publisher(nc)
    await _warm(pub, stream)
    before = pub.acks.issued
    n = 120
    acks = await asyncio.gather(
        *(_confirm_and_wait(pub, _caller_messages(stream, i), stream) for i in range(n))
    )
    # The writes, as the callers fill them: a write closes with the caller whose messages reach WRITE_AT.
    writes: list[list[int]] = [[]]
    size = 0
    for i in range(n):
        writes[-1].append(i)
        size += len(_caller_messages(stream, i))
        if size >= WRITE_AT:
            writes.append([])
            size = 0
    writes = [w for w in writes if w]
    assert len(writes) >= 4
    assert pub.acks.issued - before == len(writes)  # one ack per write
    seq = 1
    for callers in writes:
        seq += sum(len(_caller_messages(stream, i)) for i in callers)
        assert all(acks[i] is acks[callers[0]] for i in callers)  # one PubAck per write, fanned out
        assert acks[callers[0]].seq == seq  # the write's last message
    expected = [m for i in range(n) for m in _caller_messages(stream, i)]
    assert (await js.stream_info(stream)).state.messages == 1 + len(expected)
    for seq, (subject, payload, _) in enumerate(expected, 2):
        stored = await js.get_msg(stream, seq)
        assert (stored.subject, stored.data) == (subject, payload)
    assert pub.pending == 0


async def test_the_confirms_of_one_turn_to_two_streams_get_one_ack_each(
    nc: NATS, js: JetStreamContext, plain: str, other_plain: str
) -> None:
    """Callers of two streams interleaved in one turn: one ack request per stream, and each caller's
    future settles with its own stream's ack (the sequence of that stream's last message)."""
    stream, other_stream = plain, other_plain
    pub = publisher(nc)
    await _warm(pub, stream)
    await _warm(pub, other_stream)
    before = pub.acks.issued
    streams = [stream if i % 2 else other_stream for i in range(20)]
    acks = await asyncio.gather(
        *(_confirm_and_wait(pub, _caller_messages(s, i), s) for i, s in enumerate(streams))
    )
    assert pub.acks.issued - before == 2
    counts = {
        s: sum(len(_caller_messages(s, i)) for i, t in enumerate(streams) if t == s)
        for s in (stream, other_stream)
    }
    assert counts[stream] != counts[other_stream]  # a mixed-up ack would show in the sequence
    for s, warm in ((stream, 1), (other_stream, 1)):
        mine = [a for a, t in zip(acks, streams, strict=True) if t == s]
        assert all(a is mine[0] for a in mine)
        assert (mine[0].stream, mine[0].seq) == (s, warm + counts[s])
        assert (await js.stream_info(s)).state.messages == warm + counts[s]
    assert acks[0] is not acks[1]


async def test_confirms_in_different_turns_are_separate_writes_with_their_own_acks(
    nc: NATS, js: JetStreamContext, plain: str
) -> None:
    """A confirm after the turn of an earlier one ended (one ``sleep(0)``: the write went out, its ack
    has not come back) is another write with its own ack; so is one after the earlier ack came."""
    pub = publisher(nc)
    await _warm(pub, plain)
    before = pub.acks.issued
    first = await pub.confirm(_caller_messages(plain, 1), plain)  # 2 messages: seq 2, 3
    assert pub.acks.issued == before  # nothing written before the end of the turn
    await asyncio.sleep(0)  # the end of the turn: the write goes out
    assert pub.acks.issued == before + 1
    second = await pub.confirm(_caller_messages(plain, 2), plain)  # 3 messages: seq 4..6
    assert not first.done()  # the first ack cannot be back yet: two writes, two acks in flight
    a1, a2 = await asyncio.wait_for(asyncio.gather(first, second), 10)
    assert pub.acks.issued == before + 2
    assert (a1.seq, a2.seq) == (3, 6)
    a3 = await _confirm_and_wait(pub, _caller_messages(plain, 3), plain)  # after an ack: 1 message
    assert pub.acks.issued == before + 3
    assert a3.seq == 7
    assert (await js.stream_info(plain)).state.messages == 7


@pytest.mark.parametrize(("limited", "seqs"), [(False, [2, 2]), (True, [1, 2])])
async def test_confirm_all_publishes_every_group_or_none(
    nc: NATS, js: JetStreamContext, plain: str, stream: str, limited: bool, seqs: list[int]
) -> None:
    """A flush's events and commands join the turn's write together: when the commands cannot be
    published (here one is over the server's max payload), the events are not written either. Two groups
    bound for one stream share its ack (each has its own on a stream with a max message size)."""
    stream = stream if limited else plain
    pub = publisher(nc)
    events = [(f"{stream}.e", b"event", "all-e1")]
    with pytest.raises(nats.errors.MaxPayloadError):
        await pub.confirm_all(
            [(events, stream), ([(f"{stream}.c", b"x" * (nc.max_payload + 1), "all-c1")], stream)]
        )
    ok = await pub.confirm_all([(events, stream), ([(f"{stream}.c", b"command", "all-c2")], stream)])
    acks = await asyncio.wait_for(asyncio.gather(*ok), 10)
    assert [a.seq for a in acks] == seqs  # plain: the write's last message's ack for both
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
    """A max message size set since the publisher last looked at the stream (here: it is told the
    stream has none), so the stream's callers share one ack: the last message of the group is over the
    1 KiB limit, and the API error fails every caller of the group, also the one whose messages were
    stored (publishing them again is acked as a duplicate), and not the caller of the other stream in
    the same turn."""
    pub = publisher(nc)
    await _warm(pub, stream)
    await _warm(pub, other_stream)
    pub.streams.known[stream] = (False, math.inf)  # "no per-message limits", not looked at again
    first = await pub.confirm([(f"{stream}.a", b"one", "a-1")], stream)
    other = await pub.confirm([(f"{other_stream}.x", b"x", "x-1")], other_stream)
    last = await pub.confirm([(f"{stream}.a", b"two", "a-2"), (f"{stream}.a", b"x" * 2048, "a-big")], stream)
    results = await asyncio.wait_for(asyncio.gather(first, other, last, return_exceptions=True), 10)
    for refused in (results[0], results[2]):
        assert isinstance(refused, BadRequestError) and refused.code == 400, results
        assert "size" in (refused.description or "")
    assert isinstance(results[1], PubAck) and (results[1].stream, results[1].seq) == (other_stream, 2)
    assert (await js.stream_info(stream)).state.messages == 3  # warm, one, two: only the big one refused
    again = await _confirm_and_wait(pub, [(f"{stream}.a", b"one", "a-1")], stream)
    assert (again.seq, again.duplicate) == (2, True)
    assert pub.pending == 0


async def test_a_caller_whose_only_message_the_stream_refuses_is_not_told_it_is_stored(
    nc: NATS, js: JetStreamContext, stream: str
) -> None:
    """`confirm`'s future settles when its messages are stored: a caller whose one message is over the
    stream's max message size does not get a PubAck because another caller's message after it in the
    same turn was stored. The stream may refuse one message, so each caller has its own ack (two in
    the one write), settling its own future alone."""
    pub = publisher(nc)
    await _warm(pub, stream)
    before = pub.acks.issued
    big = await pub.confirm([(f"{stream}.a", b"x" * 2048, "big")], stream)
    small = await pub.confirm([(f"{stream}.a", b"small", "small")], stream)
    results = await asyncio.wait_for(asyncio.gather(big, small, return_exceptions=True), 10)
    assert pub.acks.issued - before == 2
    assert isinstance(results[1], PubAck) and (results[1].stream, results[1].seq) == (stream, 2)
    assert (await js.stream_info(stream)).state.messages == 2  # the big one is not stored
    assert isinstance(results[0], BadRequestError), results
    assert "size" in (results[0].description or "")
    assert pub.pending == 0


async def test_callers_of_a_full_discard_new_stream_are_each_told_whether_theirs_was_stored(
    nc: NATS, js: JetStreamContext
) -> None:
    """A stream holding one message at most, refusing new ones when full (``discard: new``): two callers
    in one turn, the first one's message stored and the second one's refused. Grouped, the second's
    refusal would fail both; each is told the truth instead (its own ack), and a third caller of the
    same turn, bound for a stream without per-message limits, shares nothing with them."""
    async with (
        own_stream(js, "CONF", max_msgs=1, discard=DiscardPolicy.NEW) as full,
        own_stream(js, "CONF") as other,
    ):
        pub = publisher(nc)
        await _warm(pub, other)
        before = pub.acks.issued
        first = await pub.confirm([(f"{full}.a", b"first", "first")], full)  # looks at `full`: awaited
        second = await pub.confirm([(f"{full}.b", b"second", "second")], full)  # the same turn
        third = await pub.confirm([(f"{other}.c", b"third", "third")], other)
        assert not first.done()  # the write is made at the end of this turn
        results = await asyncio.wait_for(asyncio.gather(first, second, third, return_exceptions=True), 10)
        assert pub.acks.issued - before == 3
        assert isinstance(results[0], PubAck) and (results[0].stream, results[0].seq) == (full, 1), results
        assert isinstance(results[1], APIError), results  # a 503, "maximum messages exceeded"
        assert "maximum messages" in (results[1].description or "")
        assert isinstance(results[2], PubAck) and (results[2].stream, results[2].seq) == (other, 2), results
        assert (await js.stream_info(full)).state.messages == 1
        assert pub.pending == 0


async def test_callers_of_a_stream_that_may_refuse_are_settled_each_with_their_own_ack_in_order(
    nc: NATS, js: JetStreamContext, stream: str
) -> None:
    """Twenty callers of a stream with a max message size in one turn, every third one's last message
    over it: an ack per message, in the order of the write; each stored caller gets the sequence of its
    own last message, each refused one its own API error."""
    pub = publisher(nc)
    await _warm(pub, stream)
    before = pub.acks.issued
    callers = [
        [
            *_caller_messages(stream, i)[:-1],
            (f"{stream}.c{i}", b"x" * 2048 if i % 3 == 0 else b"ok", f"l-{i}"),
        ]
        for i in range(20)
    ]
    futures = [await pub.confirm(messages, stream) for messages in callers]
    results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 10)
    assert pub.acks.issued - before == sum(len(messages) for messages in callers)
    seq = 1
    for i, (messages, result) in enumerate(zip(callers, results, strict=True)):
        seq += len(messages) - (i % 3 == 0)
        if i % 3 == 0:
            assert isinstance(result, BadRequestError), (i, result)
        else:
            assert isinstance(result, PubAck) and result.seq == seq, (i, result)
    assert (await js.stream_info(stream)).state.messages == seq


async def test_a_caller_whose_earlier_message_the_stream_refuses_is_not_told_it_is_stored(
    nc: NATS, js: JetStreamContext, stream: str
) -> None:
    """Within one caller's group too: its first message over the stream's max message size, its last
    one stored. The last one's ack says nothing of the first: the caller hears the refusal."""
    pub = publisher(nc)
    await _warm(pub, stream)
    fut = await pub.confirm(
        [(f"{stream}.a", b"x" * 2048, "big-first"), (f"{stream}.a", b"ok", "ok-last")], stream
    )
    other = await pub.confirm([(f"{stream}.b", b"fine", "fine")], stream)
    results = await asyncio.wait_for(asyncio.gather(fut, other, return_exceptions=True), 10)
    assert isinstance(results[0], BadRequestError) and results[0].err_code == MESSAGE_TOO_LARGE, results
    assert isinstance(results[1], PubAck) and results[1].seq == 3, results
    assert (await js.stream_info(stream)).state.messages == 3  # warm, ok-last, fine
    assert pub.pending == 0


@pytest.mark.parametrize(
    ("config", "may_refuse"),
    [
        ({}, False),
        ({"max_msgs": 10, "max_bytes": 10_000, "max_msgs_per_subject": 1, "max_age": 600}, False),
        ({"max_msg_size": 1024}, True),
        ({"discard": DiscardPolicy.NEW, "max_bytes": 10_000}, True),
        ({"discard": DiscardPolicy.NEW, "max_msgs_per_subject": 1, "discard_new_per_subject": True}, True),
    ],
)
async def test_the_publisher_looks_at_the_configuration_of_each_stream_once(
    nc: NATS, js: JetStreamContext, config: dict[str, Any], may_refuse: bool
) -> None:
    """Limits with ``discard: old`` drop old messages, never a new one: those streams share one ack per
    turn. A max message size or ``discard: new`` may refuse one message and store the next. The first
    confirm looks (one stream info request); the next ones use what it learned."""
    async with own_stream(js, "CONF", **config) as name:
        pub = publisher(nc)
        await _confirm_and_wait(pub, [(f"{name}.a", b"1", "look-1")], name)
        refuses, again = pub.streams.known[name]
        assert refuses is may_refuse
        assert again > asyncio.get_running_loop().time() + 50  # looked at again in a minute
        await _confirm_and_wait(pub, [(f"{name}.b", b"2", "look-2")], name)
        assert pub.streams.known[name] == (refuses, again) and not pub.streams.lookups


async def test_a_mirror_counts_as_a_stream_that_may_refuse(
    nc: NATS, js: JetStreamContext, plain: str
) -> None:
    """A mirror stores nothing published to it: a confirm naming it (the messages go to the stream that
    takes their subjects) cannot tell from its configuration, and gets an ack per caller."""
    name = plain + "M"
    await js.add_stream(name=name, mirror=StreamSource(name=plain))
    try:
        pub = publisher(nc)
        ack = await _confirm_and_wait(pub, [(f"{plain}.a", b"1", "m-1")], name)
        assert (ack.stream, ack.seq) == (plain, 1)
        assert pub.streams.known[name][0] is True
    finally:
        await js.delete_stream(name)


async def test_a_limit_set_on_a_stream_is_seen_when_its_configuration_is_looked_at_again(
    nc: NATS, js: JetStreamContext, plain: str
) -> None:
    """A max message size set on a stream the publisher looked at: until it looks again (a minute later,
    on use), its callers share one ack, and a refused message followed by a stored one is reported
    stored; the confirm that finds the answer old does not wait for the new one (it joins its turn),
    the confirms after it each get their own ack."""
    pub = publisher(nc)
    await _warm(pub, plain)
    info = await js.stream_info(plain)
    info.config.max_msg_size = 1024
    await js.update_stream(info.config)
    pub.streams.known[plain] = (False, 0.0)  # looked at a minute ago
    big = await pub.confirm([(f"{plain}.a", b"x" * 2048, "r-big-1")], plain)
    small = await pub.confirm([(f"{plain}.a", b"small", "r-small-1")], plain)
    assert pub.streams.lookups  # asked, not awaited: both joined the turn's write
    stale = await asyncio.wait_for(asyncio.gather(big, small, return_exceptions=True), 10)
    assert stale[0] is stale[1] and isinstance(stale[0], PubAck)  # the gap of the old answer
    if pub.streams.lookups:  # the answer may have come with the acks
        await asyncio.wait_for(asyncio.wait(set(pub.streams.lookups.values())), 10)
    assert pub.streams.known[plain][0] is True
    big = await pub.confirm([(f"{plain}.a", b"x" * 2048, "r-big-2")], plain)
    small = await pub.confirm([(f"{plain}.a", b"small", "r-small-2")], plain)
    results = await asyncio.wait_for(asyncio.gather(big, small, return_exceptions=True), 10)
    assert isinstance(results[0], BadRequestError), results
    assert isinstance(results[1], PubAck) and results[1].seq == 3, results


# --- a configuration that cannot be looked at ------------------------------------------------------


async def test_confirms_to_a_stream_that_does_not_exist_fail_as_before_and_are_looked_at_later(
    nc: NATS, js: JetStreamContext
) -> None:
    """No stream of that name (and none takes the subjects): the lookup's 404 does not fail the
    confirm; the stream counts as one that may refuse (an ack per caller), each caller fails with no
    responders, and the publisher looks again a few seconds later, not at each confirm."""
    pub = publisher(nc)
    nowhere = "nowhere" + uuid.uuid4().hex
    started = time.monotonic()
    lost = [await pub.confirm([(f"{nowhere}.{i}", b"x", f"nowhere-{i}")], nowhere) for i in range(3)]
    results = await asyncio.wait_for(asyncio.gather(*lost, return_exceptions=True), 10)
    assert time.monotonic() - started < 2
    assert all(isinstance(r, NoStreamResponseError) for r in results), results
    refuses, again = pub.streams.known[nowhere]
    assert refuses is True and again < asyncio.get_running_loop().time() + jsstreams.RETRY_S + 1
    assert not pub.streams.lookups and pub.pending == 0


async def test_a_stream_name_that_cannot_be_looked_at_still_confirms_its_messages(
    nc: NATS, js: JetStreamContext, plain: str
) -> None:
    """A key that is no stream's name (none of that name, or not even a valid subject token) while the
    subjects are stored in `plain`: the messages are stored, and each caller gets its own ack."""
    pub = publisher(nc)
    await _warm(pub, plain)
    for key in ("NOSUCH" + uuid.uuid4().hex, "not a subject"):
        futures = [
            await pub.confirm([(f"{plain}.k", f"{key}{i}".encode(), f"{key}-{i}")], key) for i in range(2)
        ]
        acks = await asyncio.wait_for(asyncio.gather(*futures), 10)
        assert acks[0] is not acks[1] and acks[1].seq == acks[0].seq + 1
        assert pub.streams.known[key][0] is True


async def test_a_stream_deleted_after_it_was_looked_at_fails_its_callers_with_no_responders(
    nc: NATS, js: JetStreamContext
) -> None:
    """The answer of before (no per-message limits) holds: the callers of one turn share one ack, which
    says no stream took the last message: every caller fails with no responders, at once."""
    async with own_stream(js, "CONF") as gone:
        pub = publisher(nc)
        await _warm(pub, gone)
        await js.delete_stream(gone)
        futures = [await pub.confirm([(f"{gone}.a", b"x", f"gone-{i}")], gone) for i in range(3)]
        results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 10)
        assert all(isinstance(r, NoStreamResponseError) for r in results), results
        assert pub.pending == 0


async def test_a_lookup_without_an_answer_delays_the_first_confirm_only_until_the_lookup_times_out(
    nc: NATS, js: JetStreamContext, plain: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream info request reaches a responder that never answers: the first confirm waits for the
    lookup's timeout, then is published as to a stream that may refuse (and stored); a confirm with a
    shorter timeout waits that long only."""
    blackhole = "blackhole" + uuid.uuid4().hex
    sub = await nc.subscribe(f"{blackhole}.>")  # takes the requests, answers none
    monkeypatch.setattr(jsstreams, "_STREAM_INFO", blackhole + ".")
    monkeypatch.setattr(jsstreams, "_LOOKUP_TIMEOUT_S", 0.5)
    pub = publisher(nc)
    started = time.monotonic()
    ack = await _confirm_and_wait(pub, [(f"{plain}.a", b"1", "bh-1")], plain)
    assert 0.4 < time.monotonic() - started < 3
    assert ack.seq == 1 and pub.streams.known[plain][0] is True
    del pub.streams.known[plain]
    started = time.monotonic()
    fut = await pub.confirm([(f"{plain}.a", b"2", "bh-2")], plain, timeout_s=0.2)
    assert time.monotonic() - started < 0.45
    with contextlib.suppress(TimeoutError):  # its deadline has passed when it joins a write
        await asyncio.wait_for(fut, 10)
    await sub.unsubscribe()


async def test_a_connection_closed_while_a_lookup_is_awaited_fails_the_confirm_at_once(
    nats_server: EmbeddedNats, js: JetStreamContext, plain: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lookup without an answer, awaited by a first confirm, when the connection closes: the lookup is
    dropped and the confirm raises ConnectionClosedError then, not after the lookup's timeout."""
    blackhole = "blackhole" + uuid.uuid4().hex
    monkeypatch.setattr(jsstreams, "_STREAM_INFO", blackhole + ".")
    monkeypatch.setattr(jsstreams, "_LOOKUP_TIMEOUT_S", 30.0)
    own = await connect(nats_server.url, name="pytest-close-lookup", connect_wait_s=10)
    await own.subscribe(f"{blackhole}.>")  # takes the requests, answers none
    await own.flush()
    pub = publisher(own)
    confirming = asyncio.ensure_future(pub.confirm([(f"{plain}.a", b"1", "cl-1")], plain, timeout_s=30))
    await asyncio.sleep(0.1)
    assert pub.streams.lookups and not confirming.done()
    started = time.monotonic()
    await own.close()
    with pytest.raises(nats.errors.ConnectionClosedError):
        await asyncio.wait_for(confirming, 5)
    assert time.monotonic() - started < 2
    assert not pub.streams.lookups


async def test_a_message_the_client_refuses_fails_that_confirm_only_and_none_of_its_messages_go_out(
    nc: NATS, js: JetStreamContext, plain: str
) -> None:
    """Over the server's max payload, a ``Nats-Msg-Id`` with CR LF, a subject with a space: `confirm`
    raises to its caller at once, before any of that caller's messages joins the turn's write; the
    confirms before and after it in the same turn are written and acked (one ack for both)."""
    stream = plain
    pub = publisher(nc)
    await _warm(pub, stream)
    before = pub.acks.issued
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
    assert pub.acks.issued - before == 1
    assert (await js.stream_info(stream)).state.messages == 3  # warm, g1, g2: nothing of the bad callers
    assert [(await js.get_msg(stream, seq)).data for seq in (2, 3)] == [b"g1", b"g2"]


async def test_a_cancelled_confirm_does_not_disturb_the_other_callers_of_its_group(
    nc: NATS, js: JetStreamContext, plain: str
) -> None:
    """Callers cancel their futures, among them the one whose message carries the group's ack request,
    before the write and after it: the other callers' futures settle with the ack all the same (the
    cancelled callers' messages were written: cancelling stops the wait, not the publish)."""
    stream = plain
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
    before = pub.acks.issued
    futures = [await pub.confirm([(f"{stream}.c", b"c", f"c-{i}")], stream) for i in range(3)]
    await own.close()
    assert all(f.done() for f in futures)
    for fut in futures:
        with pytest.raises(nats.errors.ConnectionClosedError):
            await fut
    assert pub.acks.issued == before
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
