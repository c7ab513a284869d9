"""jspublish.Publisher and the Outbox on it, against a real nats-server: acks, errors, duplicates,
disconnects, restarts and a closed connection."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats.errors
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import APIError, BadRequestError, NoStreamResponseError

from noetl_stream.embedded import EmbeddedNats
from noetl_stream.jspublish import PubAck, publisher
from noetl_stream.kv.history import read_events
from noetl_stream.kv.provision import provision
from noetl_stream.natsconn import connect
from noetl_stream.outbox import Outbox
from noetl_stream.subjects import Topology
from noetl_stream.wire import Event, now_iso


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
