"""jetstream.publish.Publisher's own publishes (`send`, `acked`, `publish`) against a real nats-server: acks
matched to their publishes, errors, duplicates, publishes only onto a subject with no message yet, a
closed connection, a server that freezes, dies and comes back. `Publisher.confirm` is in test_confirm.py,
the Outbox on it in test_outbox.py."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid

import nats.errors
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import APIError, BadRequestError, NoStreamResponseError

from noetl_stream.jetstream.connection import connect
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.jetstream.publish import (
    EXPECTED_LAST_SUBJECT_SEQUENCE,
    WRONG_LAST_SEQUENCE,
    PubAck,
    publisher,
)


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


async def test_a_publish_with_headers_stores_them_and_a_wrong_expected_sequence_is_refused(
    nc: NATS, js: JetStreamContext, stream: str
) -> None:
    """`acked_with` (a KV write's path): the headers are stored as given, a conditional publish whose
    expected last subject sequence is not the subject's is refused with the server's error, and header
    names or values that would end the header block are refused before anything is written."""
    pub = publisher(nc)
    subject = f"{stream}.kv"
    first = await (
        await pub.acked_with(subject, b"v1", {EXPECTED_LAST_SUBJECT_SEQUENCE: "0", "X-Tag": "a b"})
    )
    stored = await js.get_msg(stream, first.seq)
    assert stored.data == b"v1" and stored.headers is not None and stored.headers["X-Tag"] == "a b"
    second = await (await pub.acked_with(subject, b"v2", {EXPECTED_LAST_SUBJECT_SEQUENCE: str(first.seq)}))
    assert second.seq == first.seq + 1
    stale = await pub.acked_with(subject, b"v3", {EXPECTED_LAST_SUBJECT_SEQUENCE: str(first.seq)})
    with pytest.raises(BadRequestError) as info:
        await asyncio.wait_for(stale, 10)
    assert info.value.err_code == WRONG_LAST_SEQUENCE
    for bad in ({"X-Evil": "1\r\nX-More: 2"}, {"Bad Name": "1"}, {"A:B": "1"}, {"": "1"}):
        with pytest.raises(nats.errors.BadHeaderError):
            await pub.acked_with(subject, b"v4", bad)
    assert (await js.stream_info(stream)).state.messages == 2
    assert pub.pending == 0


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


# --- a server that freezes, dies and comes back ----------------------------------------------------


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


async def test_a_short_deadline_behind_a_long_one_still_expires_on_time(nc: NATS) -> None:
    """Callers use different timeouts (the outbox 10 s, a KV write the JetStream context's): an ack
    awaited with a short one must fail at its own deadline, not after the longer one queued before it;
    and it is a ``nats.errors.TimeoutError``, as nats-py's ``js.publish`` raises (a ``TimeoutError``)."""
    subject = f"noreply{uuid.uuid4().hex}.x"
    silent = await nc.subscribe(subject)  # a responder that never answers: no 503, no ack
    try:
        pub = publisher(nc)
        slow = await pub.acked(subject, b"a", "long-1", timeout_s=30)
        started = asyncio.get_running_loop().time()
        short = await pub.acked_with(subject, b"b", {"X-Tag": "short"}, timeout_s=0.3)
        with pytest.raises(nats.errors.TimeoutError) as info:
            await asyncio.wait_for(short, 5)
        assert isinstance(info.value, TimeoutError)
        assert "no JetStream ack" in str(info.value)
        assert asyncio.get_running_loop().time() - started < 2.0
        assert not slow.done()
        slow.cancel()
    finally:
        await silent.unsubscribe()
