"""A turn's confirmed publishes: one write at the end of the turn, one ack per stream for all callers.

`Confirms.confirm` is how the outbox publishes (a group commit across handlers): the messages confirmed
during one turn of the event loop (under load, the flushes of many handlers) go out in one write at its
end, or each `WRITE_AT` messages, and only the last message of the write bound for each stream asks for
an ack. JetStream processes one connection's messages to one stream in order, so that ack says every
message of the write bound for the stream was processed, and settles every caller's future
(`acks.Group`). Processed is stored unless the stream refuses one message and stores the next: those
streams (`streams`) get one ack per message of a caller instead (`acks.AllOf`).

Also here: the bytes of a publish with a ``Nats-Msg-Id`` header, which `publish.Publisher` writes too.
"""

from __future__ import annotations

import asyncio
import functools
import weakref

import nats.errors
from nats.aio.client import Client as NATS

from noetl_stream.jetstream.acks import Acks, AllOf, Group, PubAck, Settles
from noetl_stream.jetstream.fastpath import check_writable, write_soon
from noetl_stream.jetstream.streams import StreamConfigs

__all__ = ["DEFAULT_TIMEOUT_S", "MSG_ID", "WRITE_AT", "Confirms", "Message", "subject_bytes"]

MSG_ID = "Nats-Msg-Id"
# HPUB <subject> [reply] <header bytes> <total bytes>, the header (one line: Nats-Msg-Id), the payload.
HPUB = b"HPUB %b %d %d\r\nNATS/1.0\r\nNats-Msg-Id: %b\r\n\r\n%b\r\n"
HPUB_REPLY = b"HPUB %b %b %d %d\r\nNATS/1.0\r\nNats-Msg-Id: %b\r\n\r\n%b\r\n"
HEADER_LEN = len(b"NATS/1.0\r\nNats-Msg-Id: \r\n\r\n")
WRITE_AT = 48
"""A turn's batch is written as soon as it holds this many messages (the server starts on them while
the turn goes on), and at the end of the turn otherwise: under load a turn handles hundreds of
messages, and all of them waited for its end (measured: +5 % steps/s at 40-80, with no more CPU;
fewer than ~20 costs CPU in writes and acks)."""
DEFAULT_TIMEOUT_S = 10.0

Message = tuple[str, bytes, str]
"""subject, payload, ``Nats-Msg-Id``"""

_Ready = tuple[bytes, bytes, bytes]
"""A checked message: subject, ``Nats-Msg-Id`` and payload, as bytes"""


class _Batch:
    """The messages `Confirms.confirm` collects during one turn of the event loop, written at its end."""

    __slots__ = ("alone", "deadline", "groups", "last", "messages", "size", "written")

    def __init__(self, deadline: float) -> None:
        self.written = False
        self.deadline = deadline
        self.size = 0  # payload bytes collected: the outgoing buffer's limit counts them before the write
        self.messages: list[_Ready] = []
        self.last: dict[str, int] = {}  # stream -> index of its last message: the one asking for the ack
        self.groups: dict[str, Group] = {}
        # index of each message of a caller to a stream that may refuse one message -> that caller's acks
        self.alone: dict[int, AllOf] = {}

    def add(
        self, messages: list[_Ready], size: int, stream: str, fut: asyncio.Future[PubAck], alone: bool
    ) -> None:
        """`size`: the payload bytes of `messages`."""
        self.size += size
        self.messages.extend(messages)
        if alone:  # its own acks: another message stored after one says nothing of that one
            settles = AllOf(fut, len(messages))
            for i in range(len(self.messages) - len(messages), len(self.messages)):
                self.alone[i] = settles
            return
        self.last[stream] = len(self.messages) - 1
        group = self.groups.get(stream)
        if group is None:
            group = self.groups[stream] = Group()
        group.futures.append(fut)


class Confirms:
    """The confirmed publishes of one connection (`publish.Publisher` adds single publishes to them)."""

    def __init__(self, nc: NATS) -> None:
        self._nc_ref = weakref.ref(nc)  # the connection keeps its publisher: no strong ref back
        self.acks = Acks()
        self.streams = StreamConfigs(nc)
        self._batch: _Batch | None = None  # what is collected during this turn of the loop
        self._loop: asyncio.AbstractEventLoop | None = None
        """Kept: ``asyncio.get_running_loop()`` costs a ``getpid`` system call (a fork check)."""

    def _conn(self) -> NATS:
        nc = self._nc_ref()
        if nc is None:
            raise nats.errors.ConnectionClosedError
        return nc

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    async def confirm(
        self, messages: list[Message], stream: str, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> asyncio.Future[PubAck]:
        """Publish `messages` (subject, payload, ``Nats-Msg-Id``), all bound for `stream`, in order; the
        future settles with the `PubAck` of the last message of the turn's write bound for `stream` (of
        this caller's own last message once every one of its messages is acked, for a stream that may
        refuse one message), or fails as `send`'s do.

        Messages confirmed during one turn of the event loop are written together at its end, and only
        the last one bound for each stream asks for an ack: JetStream processes one connection's
        messages to one stream in order, so that ack says every message of the write bound for the
        stream was processed, and every caller's future settles with it (a refusal or a timeout fails
        them all; each caller publishes its own messages again). Under load, when many handlers flush in
        the same turn, that is one ack for all of them instead of one each.

        Processed is stored unless the stream refuses one message on its own and stores the next: only
        per-message limits do that (``max_msg_size``, ``discard: new`` with a full limit). So the
        publisher looks at the configuration of `stream` the first time a confirm names it (one stream
        info request, which that confirm awaits, within its timeout) and again a minute later, on use,
        without waiting. A stream with such limits (or a mirror, or one whose info cannot be fetched:
        no such stream, no answer, not connected; looked at again a few seconds later) gets one ack per
        caller: each message of a caller's group asks for one, and they settle that caller's future
        alone, with its last `PubAck` or its first API error. The runtime's streams have no such limits
        (docs/architecture.md, "Group commit across handlers"). What remains: a limit set on the stream
        since its configuration was last looked at (up to a minute).

        `stream` must be the stream the subjects are stored in: the key that groups the messages under
        one ack, and the configuration looked at."""
        (fut,) = await self.confirm_all([(messages, stream)], timeout_s)
        return fut

    async def confirm_all(
        self, groups: list[tuple[list[Message], str]], timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> list[asyncio.Future[PubAck]]:
        """`confirm` for several (messages, stream) groups at once, all or nothing: either every group
        joins the turn's write (one future each, in order) or, if one of them cannot be published, none
        does and the error is raised (a flush's events are never written without its commands)."""
        futures = self.confirm_all_nowait(groups, timeout_s)
        if futures is not None:
            return futures
        nc = self._conn()
        if not self.acks.subscribed:
            await self.acks.subscribe(nc)
        now = self._running_loop().time()
        deadline = now + timeout_s
        checked, size, stale = self._check(nc, groups, now)
        if stale:  # a stream not looked at yet is waited for; one looked at a minute ago, not
            check_writable(nc, 0)  # closed: no request
            await self.streams.look_up(nc, (stream for _, _, stream, _ in checked), now, deadline)
            known = self.streams.known
            checked = [
                (ready, n, stream, alone if (k := known.get(stream)) is None else k[0])
                for ready, n, stream, alone in checked
            ]
        return self._enqueue(nc, checked, size, deadline)

    def confirm_all_nowait(
        self, groups: list[tuple[list[Message], str]], timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> list[asyncio.Future[PubAck]] | None:
        """`confirm_all` without a coroutine when nothing needs waiting for first (the ack subscription
        exists and every stream's configuration was looked at: every confirm but a connection's first
        few, each a coroutine less on the hot path); None otherwise, having published nothing: then
        `confirm_all` it. Raises what `confirm_all` raises for the messages themselves."""
        nc = self._conn()
        if not self.acks.subscribed:
            return None
        now = self._running_loop().time()
        checked, size, stale = self._check(nc, groups, now)
        if stale:
            for _, _, stream, _ in checked:
                looked = self.streams.known.get(stream)
                if looked is None:
                    return None  # waited for: `confirm_all`
                if looked[1] <= now:  # looked at a while ago: again, without waiting for it
                    check_writable(nc, 0)
                    self.streams.start(nc, stream)
        return self._enqueue(nc, checked, size, now + timeout_s)

    def _check(
        self, nc: NATS, groups: list[tuple[list[Message], str]], now: float
    ) -> tuple[list[tuple[list[_Ready], int, str, bool]], int, bool]:
        """The groups' messages as bytes, each group's and the total payload size, and whether a stream's
        configuration is to be looked at (again); raises what nats-py would refuse, before any write."""
        if not groups or any(not messages for messages, _ in groups):
            raise ValueError("confirm: no messages")
        max_payload = nc._max_payload
        known = self.streams.known
        checked: list[tuple[list[_Ready], int, str, bool]] = []
        stale = False
        size = 0
        for messages, stream in groups:  # what nats-py would refuse fails this caller only, before any write
            ready: list[_Ready] = []
            group_size = 0
            for subject, payload, msg_id in messages:
                if not msg_id.isprintable():  # a CR or LF would end the header (or inject another)
                    raise nats.errors.BadHeaderError(MSG_ID)
                mid = msg_id.encode()
                n = len(payload)
                if HEADER_LEN + len(mid) + n > max_payload:  # headers count (see `send`)
                    raise nats.errors.MaxPayloadError
                group_size += n
                ready.append((subject_bytes(subject), mid, payload))
            size += group_size
            looked = known.get(stream)  # (may it refuse one message, when to look again)
            if looked is None or looked[1] <= now:
                stale = True
            checked.append((ready, group_size, stream, True if looked is None else looked[0]))
        return checked, size, stale

    def _enqueue(
        self, nc: NATS, checked: list[tuple[list[_Ready], int, str, bool]], size: int, deadline: float
    ) -> list[asyncio.Future[PubAck]]:
        """Join the checked groups to this turn's write: one future each."""
        batch = self._batch
        # While reconnecting, writes are buffered: the limit counts what this turn collected so far too.
        check_writable(nc, size + (batch.size if batch is not None else 0))
        loop = self._running_loop()
        if batch is None:
            batch = self._batch = _Batch(deadline)
            loop.call_soon(self._write_batch, batch)
        elif deadline < batch.deadline:
            batch.deadline = deadline  # the shortest timeout of the turn's callers holds for the write
        futures: list[asyncio.Future[PubAck]] = []
        for ready, group_size, stream, alone in checked:
            fut: asyncio.Future[PubAck] = loop.create_future()
            batch.add(ready, group_size, stream, fut, alone)
            futures.append(fut)
        if len(batch.messages) >= WRITE_AT:
            self._write_batch(batch)  # (its call at the end of the turn finds it written)
        return futures

    def _write_batch(self, batch: _Batch) -> None:
        """The end of the turn (or `WRITE_AT` messages): write the messages confirmed during it, one ack
        request per stream (per caller for a stream that may refuse one message)."""
        if batch.written:
            return
        batch.written = True
        if self._batch is batch:
            self._batch = None
        acked: dict[int, Settles] = {i: batch.groups[stream] for stream, i in batch.last.items()}
        if batch.alone:
            acked.update(batch.alone)  # index -> what its ack settles
        parts: list[bytes] = []
        size = 0
        try:
            nc = self._conn()
            check_writable(nc, 0)  # closed since: fail now rather than at the deadline
            for i, (subject, mid, payload) in enumerate(batch.messages):
                n = len(payload)
                size += n
                hlen = HEADER_LEN + len(mid)
                group = acked.get(i)
                if group is None:
                    parts.append(HPUB % (subject, hlen, hlen + n, mid, payload))
                    continue
                reply = self.acks.reply(group, batch.deadline)
                parts.append(HPUB_REPLY % (subject, reply, hlen, hlen + n, mid, payload))
            write_soon(nc, b"".join(parts), len(batch.messages), size, now=True)
        except Exception as exc:  # the connection is gone: each caller hears it (and publishes again)
            for settles in acked.values():
                if not settles.done():
                    settles.set_exception(exc)


@functools.lru_cache(maxsize=8192)  # an execution's subjects repeat, step after step
def subject_bytes(subject: str) -> bytes:
    """What nats-py refuses in a subject (whitespace would end the protocol line), and control characters."""
    if not subject or " " in subject or not subject.isprintable():
        raise nats.errors.BadSubjectError
    return subject.encode()
