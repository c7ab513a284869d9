"""jetstream.connection helpers against a real server: delivery fields from the reply subject, inline subscriptions."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable

import nats.errors
import pytest
from helpers import free_port
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import MsgAlreadyAckdError, NotJSMessageError
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig

from noetl_stream.jetstream.connection import connect
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.jetstream.fastpath import (
    UnsupportedClientError,
    ack,
    ack_soon,
    nak_soon,
    num_delivered,
    num_pending,
    require_client_internals,
    stream_seq,
    subscribe_inline,
    term_soon,
)
from noetl_stream.jetstream.publish import publisher

Eventually = Callable[..., Awaitable[None]]


async def test_stream_seq_and_num_delivered_agree_with_nats_py_metadata(
    nc: NATS, js: JetStreamContext
) -> None:
    name = "MD" + uuid.uuid4().hex[:8].upper()
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    try:
        for i in range(3):
            await js.publish(f"{name}.x", f"{i}".encode())
        sub = await js.pull_subscribe(f"{name}.x", durable="d", stream=name)
        first = await sub.fetch(3, timeout=5)
        for msg in first[1:]:
            await msg.nak()
        again = await sub.fetch(2, timeout=5)
        for msg in [*first, *again]:
            meta = msg.metadata
            assert (stream_seq(msg), num_delivered(msg), num_pending(msg)) == (
                meta.sequence.stream,
                meta.num_delivered,
                meta.num_pending,
            )
        assert [num_pending(m) for m in first] == [2, 1, 0]
        assert [num_delivered(m) for m in again] == [2, 2]
    finally:
        await js.delete_stream(name)


def test_the_domain_form_of_the_reply_subject_is_read_too() -> None:
    # $JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<time>.<pending>.<token>
    msg = Msg(_client=None, subject="s", reply="$JS.ACK.hub.ACC.S.C.4.812.33.1700000000000000000.7.abc")  # type: ignore[arg-type]
    assert (stream_seq(msg), num_delivered(msg), num_pending(msg)) == (812, 4, 7)
    assert num_pending(msg) == msg.metadata.num_pending
    assert (stream_seq(msg), num_delivered(msg)) == (msg.metadata.sequence.stream, msg.metadata.num_delivered)
    with pytest.raises(NotJSMessageError):
        stream_seq(Msg(_client=None, subject="s", reply="_INBOX.abc"))  # type: ignore[arg-type]


async def test_an_inline_callback_sees_every_message_in_order_and_its_errors_do_not_stop_the_connection(
    nc: NATS, eventually: Eventually
) -> None:
    subject = "inline." + uuid.uuid4().hex
    seen: list[bytes] = []

    def on_msg(msg: Msg) -> None:
        seen.append(msg.data)
        if msg.data == b"3":
            raise RuntimeError("a bug in a callback")

    sub = await subscribe_inline(nc, subject, on_msg)
    for i in range(200):
        await nc.publish(subject, str(i).encode())
    await eventually(lambda: len(seen) == 200)
    assert seen == [str(i).encode() for i in range(200)]

    # The connection still reads: a request round trip works, and so does unsubscribing.
    async def respond(msg: Msg) -> None:
        await msg.respond(msg.data)

    echo = await nc.subscribe(subject + ".echo", cb=respond)
    reply = await nc.request(subject + ".echo", b"ping", timeout=5)
    assert reply.data == b"ping"
    await sub.unsubscribe()
    await echo.unsubscribe()
    await nc.publish(subject, b"after")
    await nc.flush()
    await asyncio.sleep(0.05)
    assert seen[-1] == b"199"


async def test_ack_settles_a_delivery_like_msg_ack(
    nc: NATS, js: JetStreamContext, eventually: Eventually
) -> None:
    name = "ACK" + uuid.uuid4().hex[:8].upper()
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    try:
        for i in range(5):
            await js.publish(f"{name}.x", f"{i}".encode())
        sub = await js.pull_subscribe(f"{name}.x", durable="d", stream=name)
        msgs = await sub.fetch(5, timeout=5)
        for msg in msgs:
            await ack(msg)
            assert msg.is_acked
        with pytest.raises(MsgAlreadyAckdError):
            await ack(msgs[0])

        async def settled() -> bool:
            info = await js.consumer_info(name, "d")
            return info.num_ack_pending == 0 and info.num_pending == 0 and info.ack_floor.stream_seq == 5

        await eventually(settled)
    finally:
        await js.delete_stream(name)


async def test_ack_soon_settles_a_pulled_delivery_once_without_awaiting(
    nc: NATS, js: JetStreamContext, stream: str, eventually: Callable[..., Awaitable[None]]
) -> None:
    """`jetstream.fastpath.ack_soon` acks synchronously (the ack joins the outgoing buffer): the consumer has
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


async def test_nak_soon_redelivers_at_once_and_term_soon_never(
    nc: NATS, js: JetStreamContext, stream: str
) -> None:
    """`jetstream.fastpath.nak_soon` hands a delivery back at once (long before its 30 s ack wait); `term_soon` ends it:
    never delivered again, and the server says it was terminated (an ack would end it too, silently).
    Each settles the message once."""
    seq = (await js.publish(f"{stream}.n", b"n")).seq
    sub = await js.pull_subscribe(
        f"{stream}.n", durable="nak", stream=stream, config=ConsumerConfig(ack_wait=30)
    )
    terminated = await nc.subscribe(f"$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.{stream}.nak")
    (msg,) = await sub.fetch(1, timeout=10)
    nak_soon(msg)
    with pytest.raises(nats.errors.MsgAlreadyAckdError):
        nak_soon(msg)
    (again,) = await sub.fetch(1, timeout=5)  # at once, not after the ack wait
    assert again.data == b"n" and num_delivered(again) == 2
    term_soon(again)
    with pytest.raises(nats.errors.MsgAlreadyAckdError):
        term_soon(again)
    with pytest.raises(nats.errors.TimeoutError):
        await sub.fetch(1, timeout=1.5)
    # A term, not an ack: the server's advisory of it (none for an ack), one, of this delivery.
    advisory = json.loads((await terminated.next_msg(timeout=5)).data)
    assert (advisory["stream"], advisory["consumer"], advisory["stream_seq"]) == (stream, "nak", seq)
    assert advisory["deliveries"] == 2
    await nc.flush()  # an advisory the server sent before its PONG is queued for `terminated` now
    assert terminated.pending_msgs == 0
    await terminated.unsubscribe()
    await sub.unsubscribe()


async def test_a_client_without_the_internals_of_the_hot_path_is_refused_by_name(
    nats_server: EmbeddedNats,
) -> None:
    good = await connect(nats_server.url, name="pytest-internals", connect_wait_s=10)
    try:
        require_client_internals(good)  # the pinned nats-py has them all
        publisher(good)
    finally:
        await good.close()
    # A client of a nats-py that renamed one of them: refused at once, naming it, before any publish.
    bad = NATS()
    del bad._flush_queue
    with pytest.raises(UnsupportedClientError, match=r"Client\._flush_queue.*2\.16\.x"):
        require_client_internals(bad)
    with pytest.raises(UnsupportedClientError):
        publisher(bad)


async def test_a_server_that_never_answers_is_one_error_naming_the_last_reason_without_credentials() -> None:
    """Nothing listens on the port: the client fails the same way every attempt. With a bounded wait
    nothing is logged above debug (the caller reports the failure: `run` printed a warning line before
    its error line), and the error raised when the wait ends names the last reason and the server,
    without the URL's password."""
    import structlog

    from noetl_stream.jetstream.connection import connect

    port = free_port()
    with structlog.testing.capture_logs() as logs, pytest.raises(ConnectionError) as raised:
        await connect(f"nats://admin:s3cret@127.0.0.1:{port}", name="t", connect_wait_s=2.5)
    message = str(raised.value)
    assert "s3cret" not in message and f"nats://***@127.0.0.1:{port}" in message
    assert "last error:" in message
    assert [e for e in logs if e["log_level"] not in ("debug", "info")] == [], logs
    assert not any("s3cret" in str(e) for e in logs)


async def test_waiting_for_a_server_without_a_limit_warns_once_per_distinct_error() -> None:
    """A controller or worker started before its server waits without a limit: each distinct reason is a
    warning once (not once a second) naming the servers it tries (without credentials), repeats are
    debug."""
    import structlog

    from noetl_stream.jetstream.connection import connect

    port = free_port()
    with structlog.testing.capture_logs() as logs, pytest.raises(TimeoutError):
        async with asyncio.timeout(3.5):
            await connect(f"nats://admin:s3cret@127.0.0.1:{port}", name="t", connect_wait_s=None)
    warnings = [e for e in logs if e["log_level"] == "warning"]
    # About one attempt a second, each failing alike: one warning per distinct error. (Repeats go to debug,
    # which a logging configuration made by an earlier test may drop before capture.)
    assert len(warnings) == len({e["error"] for e in warnings}) >= 1, logs
    assert {e["event"] for e in warnings} == {"nats.cannot_connect"}, warnings
    assert all(e["servers"] == f"nats://***@127.0.0.1:{port}" for e in warnings), warnings
    assert not any("s3cret" in str(e) for e in logs)
