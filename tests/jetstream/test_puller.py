"""ContinuousPuller against a real server: delivery, settlement, concurrency, errors, shutdown."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from noetl_stream.jetstream.connection import connect
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.jetstream.fastpath import ack_soon
from noetl_stream.jetstream.puller import ContinuousPuller, Handler
from noetl_stream.kv.provision import provision
from noetl_stream.protocol.subjects import Topology

POOL = "default"
Eventually = Callable[..., Awaitable[None]]


async def _setup(js: JetStreamContext, topology: Topology, n: int, payload: bytes = b"{}") -> None:
    await provision(js, topology, pools=(POOL,))
    for i in range(n):
        await js.publish(topology.command_subject(POOL, f"e{i}"), payload)


def _puller(nc: NATS, topology: Topology, handler: Handler, **kw: int | float | None) -> ContinuousPuller:
    return ContinuousPuller(
        nc,
        topology.commands_stream,
        topology.pool_consumer(POOL),
        handler,
        **kw,  # type: ignore[arg-type]
    )


async def _info(js: JetStreamContext, topology: Topology) -> api.ConsumerInfo:
    info: api.ConsumerInfo = await js.consumer_info(topology.commands_stream, topology.pool_consumer(POOL))
    return info


async def test_receives_every_message_and_acks_settle_them(
    nc: NATS, js: JetStreamContext, topology: Topology, eventually: Eventually
) -> None:
    n = 250
    await _setup(js, topology, n)
    seen: list[int] = []

    async def handler(msg: Msg) -> None:
        assert isinstance(msg, Msg)
        seen.append(msg.metadata.sequence.stream)
        await msg.ack()

    async with _puller(nc, topology, handler, max_concurrency=8):
        await eventually(lambda: len(seen) == n)

        async def settled() -> bool:
            info = await _info(js, topology)
            return info.num_ack_pending == 0 and info.num_pending == 0

        await eventually(settled)
    assert sorted(seen) == list(range(1, n + 1))
    assert (await js.stream_info(topology.commands_stream)).state.messages == 0  # work queue drained


async def test_max_concurrency_is_honoured(
    nc: NATS, js: JetStreamContext, topology: Topology, eventually: Eventually
) -> None:
    await _setup(js, topology, 30)
    gate = asyncio.Event()
    running, peak, done = 0, 0, 0

    async def handler(msg: Msg) -> None:
        nonlocal running, peak, done
        running += 1
        peak = max(peak, running)
        try:
            await gate.wait()
            await msg.ack()
            done += 1
        finally:
            running -= 1

    async with _puller(nc, topology, handler, max_concurrency=3) as puller:
        await eventually(lambda: running == 3 and puller.queued > 0)
        gate.set()
        await eventually(lambda: done == 30)
    assert peak == 3


async def test_a_failing_handler_does_not_stop_the_puller(
    nc: NATS, js: JetStreamContext, topology: Topology, eventually: Eventually
) -> None:
    await _setup(js, topology, 10)
    deliveries: dict[int, int] = {}

    async def handler(msg: Msg) -> None:
        seq = msg.metadata.sequence.stream
        deliveries[seq] = msg.metadata.num_delivered
        if seq % 3 == 0 and msg.metadata.num_delivered == 1:
            raise RuntimeError("tool blew up")
        await msg.ack()

    async with _puller(nc, topology, handler, max_concurrency=4, error_nak_delay_s=0):
        await eventually(lambda: len(deliveries) == 10 and all(deliveries[s] == 2 for s in (3, 6, 9)))
        await eventually(lambda: _ack_pending_is(js, topology, 0))


async def test_in_progress_and_term_settle_through_the_inbox(
    nc: NATS, js: JetStreamContext, topology: Topology, eventually: Eventually
) -> None:
    await _setup(js, topology, 2)
    handled: list[int] = []

    async def handler(msg: Msg) -> None:
        await msg.in_progress()
        await msg.in_progress()
        await msg.term()
        handled.append(msg.metadata.num_delivered)

    async with _puller(nc, topology, handler):
        await eventually(lambda: len(handled) == 2)
        await eventually(lambda: _ack_pending_is(js, topology, 0))
    assert handled == [1, 1]
    assert (await _info(js, topology)).num_redelivered == 0


async def test_stop_waits_for_running_handlers_and_hands_back_queued_ones(
    nc: NATS, js: JetStreamContext, topology: Topology, eventually: Eventually
) -> None:
    await _setup(js, topology, 4)
    gate = asyncio.Event()
    order: list[str] = []

    async def slow(msg: Msg) -> None:
        order.append("started")
        await gate.wait()
        await msg.ack()
        order.append("acked")

    puller = _puller(nc, topology, slow, max_concurrency=1, batch=4)
    await puller.start()
    await eventually(lambda: puller.in_flight == 1 and puller.queued == 3)
    stopping = asyncio.create_task(puller.stop(timeout=30))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not stopping.done()
    gate.set()
    await stopping
    order.append("stopped")
    assert order == ["started", "acked", "stopped"]

    # The three queued messages were nak'ed, so a new puller gets them without waiting for AckWait.
    got: list[int] = []

    async def fast(msg: Msg) -> None:
        got.append(msg.metadata.sequence.stream)
        await msg.ack()

    async with _puller(nc, topology, fast):
        await eventually(lambda: len(got) == 3)


async def test_stop_cancels_handlers_that_outlive_the_timeout(
    nc: NATS, js: JetStreamContext, topology: Topology, eventually: Eventually
) -> None:
    await _setup(js, topology, 1)
    cancelled = asyncio.Event()

    async def stuck(msg: Msg) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    puller = _puller(nc, topology, stuck)
    await puller.start()
    await eventually(lambda: puller.in_flight == 1)
    await puller.stop(timeout=0.05)
    assert cancelled.is_set() and puller.in_flight == 0
    assert (await _info(js, topology)).num_ack_pending == 1  # unsettled: redelivered after AckWait


async def test_pulls_are_reissued_when_requests_expire(
    nc: NATS, js: JetStreamContext, topology: Topology, eventually: Eventually
) -> None:
    await _setup(js, topology, 0)
    got: list[bytes] = []

    async def handler(msg: Msg) -> None:
        got.append(msg.data)
        await msg.ack()

    async with _puller(nc, topology, handler, expires_s=0.5, heartbeat_s=0.2) as puller:
        await eventually(lambda: puller.pull_requests >= 3)  # the first requests expired unused
        await js.publish(topology.command_subject(POOL, "e1"), b"late")
        await eventually(lambda: got == [b"late"])


async def test_pulls_are_reissued_after_a_server_restart(eventually: Eventually) -> None:
    topology = Topology(prefix="restart")
    got: list[bytes] = []

    async def handler(msg: Msg) -> None:
        got.append(msg.data)
        await msg.ack()

    async with EmbeddedNats() as server:
        nc = await connect(server.url, connect_wait_s=10)
        js = nc.jetstream(timeout=10)
        await provision(js, topology, pools=(POOL,))
        async with _puller(nc, topology, handler, heartbeat_s=0.5, expires_s=5):
            await js.publish(topology.command_subject(POOL, "e1"), b"before")
            await eventually(lambda: got == [b"before"])
            await asyncio.to_thread(server.restart)
            await eventually(lambda: nc.is_connected)
            await js.publish(topology.command_subject(POOL, "e2"), b"after")
            await eventually(lambda: got == [b"before", b"after"], timeout=30)
        await nc.close()


async def _ack_pending_is(js: JetStreamContext, topology: Topology, n: int) -> bool:
    return (await _info(js, topology)).num_ack_pending == n


async def test_connect_gives_up_when_no_server_answers() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectionError, match="cannot connect"):
        await connect(f"nats://127.0.0.1:{port}", connect_wait_s=0.5)


async def test_an_intake_files_every_message_in_delivery_order(
    nc: NATS, js: JetStreamContext, topology: Topology, eventually: Eventually
) -> None:
    """With an ``intake`` (the controller's), each message is filed as it is parsed, in stream order,
    without a task of its own, and settled by the intake. (The controller files each event of an
    execution in its queue there; a later event filed before an older one was a lost event.) An intake
    that raises has its message handed back, delivered again."""
    n = 600
    await _setup(js, topology, n)
    filed: list[int] = []
    refused: set[int] = set()

    def intake(msg: Msg) -> None:
        seq = msg.metadata.sequence.stream
        if seq % 50 == 0 and seq not in refused:
            refused.add(seq)
            raise RuntimeError("refused once")
        filed.append(seq)
        ack_soon(msg)

    puller = ContinuousPuller(
        nc, topology.commands_stream, topology.pool_consumer(POOL), None, max_concurrency=4, intake=intake
    )
    async with puller:
        await eventually(lambda: len(set(filed)) == n)
    assert len(refused) == n // 50
    first_pass = [seq for seq in filed if seq not in refused]
    assert first_pass == sorted(first_pass) and len(set(filed)) == len(filed) == n
    await eventually(lambda: _ack_pending_is(js, topology, 0))


def test_a_puller_takes_a_handler_or_an_intake() -> None:
    with pytest.raises(ValueError, match="handler or an intake"):
        ContinuousPuller(None, "S", "c", None)  # type: ignore[arg-type]
