"""The controller's watch of running children (control/children.py, `ChildWatch`), on a real server, in the
orders of events that whole runtimes cannot force:

* a parent's end published while the controller's connection was down is not heard: after the connection
  comes back, the controller reads the end of every parent of a child it holds again, and cancels the
  children of one that did not succeed (`_watch_reconnects`). The controller's connection goes through a
  TCP proxy of the test's own, which cuts it (and refuses new connections) while the parent's
  ``workflow.finished`` is stored through another connection;
* a parent's end heard before it is stored, while none of its children is held yet: a child added right
  after reads no end, and is cancelled from the end heard (`_ended`);
* a child's index key whose write failed (a timeout) is written again, so that a next owner of its
  partition learns of the child even while it sends no event (one long task).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator

import nats.errors
import pytest
from eventlog import cancels
from helpers import free_port
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from noetl_stream.control import backoff, children
from noetl_stream.control.children import ChildWatch
from noetl_stream.control.core.effects import server_event
from noetl_stream.control.core.state import ExecutionState
from noetl_stream.jetstream.connection import connect
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.jetstream.outbox import Outbox
from noetl_stream.kv.children import ChildIndex
from noetl_stream.kv.provision import provision
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event, encode, new_execution_id


class Proxy:
    """Forwards TCP connections from a port of its own to the server's; `cut` closes them and refuses
    new ones until `restore`."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self.connections = 0

    async def restore(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        self._server = None
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        pipes = [
            asyncio.ensure_future(self._pipe(reader, up_writer)),
            asyncio.ensure_future(self._pipe(up_reader, writer)),
        ]
        self._pipes.update(pipes)
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pipe in pipes:
                pipe.cancel()
                self._pipes.discard(pipe)
            for w in (writer, up_writer):
                w.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()


@pytest.fixture
async def proxy(nats_server: EmbeddedNats) -> AsyncIterator[Proxy]:
    host, port = nats_server.url.removeprefix("nats://").rsplit(":", 1)
    p = Proxy(host, int(port))
    await p.restore()
    yield p
    with contextlib.suppress(AssertionError):
        await p.cut()


def _finished(execution_id: str, status: str) -> Event:
    """The ``workflow.finished`` of an execution that ended with `status`, as the controller writes it."""
    return server_event(
        execution_id, E.WORKFLOW_FINISHED, "workflow", execution_id, "error", "execution", {"status": status}
    )


async def _cancels(js: JetStreamContext, topo: Topology, eid: str) -> list[str]:
    return [reason for _, reason in await cancels(js, topo, eid)]


def _watch(nc: NATS, topology: Topology) -> ChildWatch:
    return ChildWatch(
        nc,
        topology,
        "ctl-test",
        fence_of=lambda partition: 1,
        held=lambda partition: True,
        is_terminal=lambda eid: False,
    )


async def test_a_parents_end_stored_while_the_connection_was_down_cancels_its_child_after_it_reconnects(
    js: JetStreamContext, topology: Topology, proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(children, "RECONNECT_POLL_S", 0.1)
    await provision(js, topology, ("default",))
    parent, child = new_execution_id(), new_execution_id()
    watched = await connect(
        f"nats://127.0.0.1:{proxy.port}", name="pytest-watch", connect_wait_s=10, reconnect_time_wait=0.1
    )
    watch = _watch(watched, topology)
    try:
        await watch.start()
        watch.note(ExecutionState(child, parent_execution_id=parent))
        # The child is held and its parent's end was read (none yet): the subscription is open.
        deadline = time.monotonic() + 10
        while watch._sub is None or watch._checker is not None:
            assert time.monotonic() < deadline, "the watch did not start listening"
            await asyncio.sleep(0.01)
        reconnects = watched.stats["reconnects"]

        await proxy.cut()
        outbox = Outbox(js, topology)
        outbox.event(_finished(parent, "failed"))
        await outbox.flush()  # stored while the watch's connection is down: it is not heard
        assert await _cancels(js, topology, child) == []
        await proxy.restore()

        deadline = time.monotonic() + 15
        while not await _cancels(js, topology, child):
            assert time.monotonic() < deadline, (
                f"no cancel of the child after the reconnect (reconnects {reconnects} -> "
                f"{watched.stats['reconnects']})"
            )
            await asyncio.sleep(0.05)
        assert watched.stats["reconnects"] > reconnects
        assert await _cancels(js, topology, child) == [f"parent execution {parent} ended (failed)"]
    finally:
        await watch.stop()
        await watched.close()


async def test_a_parents_end_heard_before_it_is_stored_cancels_a_child_added_right_after(
    nc: NATS, js: JetStreamContext, topology: Topology
) -> None:
    await provision(js, topology, ("default",))
    parent, child, other = new_execution_id(), new_execution_id(), new_execution_id()
    watch = _watch(nc, topology)
    try:
        await watch.start()
        # A child of another parent is held: the watch listens for ends.
        watch.note(ExecutionState(other, parent_execution_id=new_execution_id()))
        deadline = time.monotonic() + 10
        while watch._sub is None or watch._checker is not None:
            assert time.monotonic() < deadline, "the watch did not start listening"
            await asyncio.sleep(0.01)
        # The parent's end as it is delivered to the watch's subscription, before the server has stored
        # it (nothing is stored here: a read of the parent's end finds none).
        finished = _finished(parent, "failed")
        subject = topology.event_subject(parent, E.WORKFLOW_FINISHED)
        await watch._on_finished(Msg(_client=nc, subject=subject, data=encode(finished)))
        watch.note(ExecutionState(child, parent_execution_id=parent))

        deadline = time.monotonic() + 10
        while not await _cancels(js, topology, child):
            assert time.monotonic() < deadline, "the child added after its parent's end was heard runs on"
            await asyncio.sleep(0.05)
        assert await _cancels(js, topology, child) == [f"parent execution {parent} ended (failed)"]
        assert await _cancels(js, topology, other) == []
    finally:
        await watch.stop()


async def test_a_childs_index_key_whose_write_failed_is_written_again(
    nc: NATS, js: JetStreamContext, topology: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(backoff, "RETRY_DELAY_S", 0.1)  # (the controller's retry_delay)
    await provision(js, topology, ("default",))
    index = await ChildIndex.open(js, topology)
    parent, child = new_execution_id(), new_execution_id()
    partition = topology.partition_of(child)
    failed: list[str] = []
    put = index.kv.put

    async def put_failing_once(key: str, value: bytes, **kw: object) -> int:
        if not failed:
            failed.append(key)
            raise nats.errors.TimeoutError  # the server did not answer in time
        return await put(key, value, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(index.kv, "put", put_failing_once)
    watch = _watch(nc, topology)
    watch.open(index, topology)
    try:
        await watch.start()
        watch.note(ExecutionState(child, parent_execution_id=parent))
        deadline = time.monotonic() + 10
        while (child, parent) not in await index.of_partition(partition):
            assert time.monotonic() < deadline, f"the child's key was not written again after {failed}"
            await asyncio.sleep(0.05)
        assert failed == [ChildIndex.key(partition, child)]
    finally:
        await watch.stop()


async def test_a_parents_end_that_cannot_be_read_is_read_again_later_and_later(
    nc: NATS, js: JetStreamContext, topology: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While NATS does not answer, a parent's end is read again after 1 s doubling to 30 s (here 0.05 s
    doubling): one warning per try, not one a second for as long as the outage lasts. Once read, its
    child is cancelled."""
    monkeypatch.setattr(backoff, "RETRY_DELAY_S", 0.05)  # (the controller's retry_delay)
    await provision(js, topology, ("default",))
    parent, child = new_execution_id(), new_execution_id()
    await js.publish(topology.event_subject(parent, E.WORKFLOW_FINISHED), encode(_finished(parent, "failed")))
    reads: list[float] = []
    get_last_msg = JetStreamContext.get_last_msg

    async def failing_four_times(self: JetStreamContext, stream: str, subject: str) -> object:
        if parent in subject:
            reads.append(time.monotonic())
            if len(reads) <= 4:
                raise nats.errors.TimeoutError  # the server did not answer in time
        return await get_last_msg(self, stream, subject)

    monkeypatch.setattr(JetStreamContext, "get_last_msg", failing_four_times)
    watch = _watch(nc, topology)
    try:
        await watch.start()
        watch.note(ExecutionState(child, parent_execution_id=parent))
        deadline = time.monotonic() + 10
        while not await _cancels(js, topology, child):
            assert time.monotonic() < deadline, (
                f"the child runs on after {len(reads)} reads of its parent's end"
            )
            await asyncio.sleep(0.05)
        assert await _cancels(js, topology, child) == [f"parent execution {parent} ended (failed)"]
        assert len(reads) == 5
        gaps = [b - a for a, b in itertools.pairwise(reads)]
        for i, gap in enumerate(gaps):  # (a timer never fires early; it may fire late on a loaded machine)
            assert gap >= 0.05 * 2**i * 0.9, gaps
        assert gaps[3] >= 2 * gaps[0], f"the reads did not back off: {gaps}"  # 0.4 s against 0.05 s
        assert watch._check_failures == {}
    finally:
        await watch.stop()
