"""JetStream publishes for the hot path: one ack inbox per connection, acks matched by a counter.

The outbox publishes every event and command with a ``Nats-Msg-Id`` and waits for one JetStream ack
per flush. nats-py's ``publish_async`` costs, per call, a random token (``secrets.token_hex``: a
``getrandom`` syscall), a semaphore acquired through ``asyncio.wait_for``, a done-callback, a regex
check per header and, per ack, ``json.loads`` into a dataclass (docs/performance.md, candidate 3).
`Publisher` does the same protocol work with less: the ``HPUB`` line and its one header are built as
bytes, reply tokens come from a counter, acks are decoded with msgspec as the read loop parses them
(`natsio.subscribe_inline`: no queue and task switch per ack). It also settles what
``publish_async`` leaves hanging: an API error in the ack (``{"error": {...}}``) fails its future
instead of being raised inside nats-py's callback, and a disconnect fails every ack still awaited
(the acks of a lost connection never come; the outbox publishes again, same ids, which the server
drops as duplicates).

It writes to the connection's outgoing buffer as ``Client.publish`` does (`natsio.write`, after the
same checks), so ordering with the connection's other publishes, buffering while reconnecting and the
flusher are nats-py's own.

A message can also be published on the condition that its subject holds no message yet (`send`'s
``expect_new``: the header ``Nats-Expected-Last-Subject-Sequence: 0``): an insert-if-absent without a
read round trip first, which holds beyond the duplicate window. The server checks the subject as
stored (after the stream's subject transform) and refuses the message with a 400 whose ``err_code`` is
`WRONG_LAST_SEQUENCE` ("wrong last sequence: N") when it holds one. nats-server 2.15 does so before
looking at the duplicate window on a single server (a message with the stored one's ``Nats-Msg-Id`` is
refused too), after it in a cluster (acked as a duplicate there). A clustered stream also answers
"not now" while another publish is being stored: `WRONG_LAST_SEQUENCE_PENDING` to a conditional one on
the same subject, `DUPLICATE_IN_PROCESS` to any with the same ``Nats-Msg-Id``; a moment later the
answer is final.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import weakref
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Protocol

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.errors import (
    APIError,
    BadRequestError,
    NoStreamResponseError,
    NotFoundError,
    ServerError,
    ServiceUnavailableError,
)

from noetl_stream.natsio import check_writable, require_client_internals, subscribe_inline, write, write_soon

__all__ = [
    "DUPLICATE_IN_PROCESS",
    "EXPECTED_LAST_SUBJECT_SEQUENCE",
    "EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT",
    "WRONG_LAST_SEQUENCE",
    "WRONG_LAST_SEQUENCE_PENDING",
    "PubAck",
    "Publisher",
    "publisher",
]

MSG_ID = "Nats-Msg-Id"
EXPECTED_LAST_SUBJECT_SEQUENCE = "Nats-Expected-Last-Subject-Sequence"
EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
WRONG_LAST_SEQUENCE = 10071
"""The ``err_code`` of a publish refused because its subject's last sequence is not the expected one."""
WRONG_LAST_SEQUENCE_PENDING = 10164
"""The ``err_code`` of a conditional publish a clustered stream refuses because another message on the
subject is being stored (it cannot tell the last sequence yet): the answer may differ a moment later."""
DUPLICATE_IN_PROCESS = 10158
"""The ``err_code`` (with a 409) of a publish a clustered stream refuses because a message with the same
``Nats-Msg-Id`` is being stored: a moment later it is acked as a duplicate (or stored, if that failed)."""

# HPUB <subject> [reply] <header bytes> <total bytes>, the header (one line: Nats-Msg-Id), the payload.
_HPUB = b"HPUB %b %d %d\r\nNATS/1.0\r\nNats-Msg-Id: %b\r\n\r\n%b\r\n"
_HPUB_REPLY = b"HPUB %b %b %d %d\r\nNATS/1.0\r\nNats-Msg-Id: %b\r\n\r\n%b\r\n"
_HEADER_LEN = len(b"NATS/1.0\r\nNats-Msg-Id: \r\n\r\n")
# The same with a second header line: store only if the subject has no message yet (acked publishes only).
_HPUB_REPLY_NEW = (
    b"HPUB %b %b %d %d\r\nNATS/1.0\r\nNats-Msg-Id: %b\r\nNats-Expected-Last-Subject-Sequence: 0\r\n\r\n%b\r\n"
)
_HEADER_LEN_NEW = len(b"NATS/1.0\r\nNats-Msg-Id: \r\nNats-Expected-Last-Subject-Sequence: 0\r\n\r\n")
# And with a third: the subjects checked are those matching a filter, not the message's own.
_HPUB_REPLY_NEW_ON = (
    b"HPUB %b %b %d %d\r\nNATS/1.0\r\nNats-Msg-Id: %b\r\nNats-Expected-Last-Subject-Sequence: 0\r\n"
    b"Nats-Expected-Last-Subject-Sequence-Subject: %b\r\n\r\n%b\r\n"
)
_HEADER_LEN_NEW_ON = _HEADER_LEN_NEW + len(b"Nats-Expected-Last-Subject-Sequence-Subject: \r\n")
_NO_RESPONDERS = "503"
_CONNECTED = NATS.CONNECTED
_TICK_S = 0.25
WRITE_AT = 48
"""A turn's batch is written as soon as it holds this many messages (the server starts on them while
the turn goes on), and at the end of the turn otherwise: under load a turn handles hundreds of
messages, and all of them waited for its end (measured: +5 % steps/s at 40-80, with no more CPU;
fewer than ~20 costs CPU in writes and acks)."""
DEFAULT_TIMEOUT_S = 10.0
_STREAM_INFO = "$JS.API.STREAM.INFO."  # the default JetStream API prefix, as the runtime's contexts use
_RECHECK_S = 60.0  # a stream's configuration is looked at again this long after (on use, without waiting)
_RETRY_S = 5.0  # after a failed look: "may refuse" meanwhile
_LOOKUP_TIMEOUT_S = 5.0


Message = tuple[str, bytes, str]
"""subject, payload, ``Nats-Msg-Id``"""


class AckTimeoutError(nats.errors.TimeoutError):
    """No JetStream ack came within the publish's deadline (a ``nats.errors.TimeoutError``, as nats-py's
    ``js.publish`` raises, which is a ``TimeoutError`` too)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ApiError(msgspec.Struct):
    code: int = 0
    err_code: int | None = None
    description: str = ""


class PubAck(msgspec.Struct):
    """The server's answer to a JetStream publish (``duplicate`` when ``Nats-Msg-Id`` was seen before)."""

    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    domain: str | None = None
    error: ApiError | None = None


_decode_ack = msgspec.json.Decoder(PubAck).decode


class _StreamConfig(msgspec.Struct):
    """What of a stream's configuration says whether it may refuse one message and store a later one."""

    max_msg_size: int = -1
    discard: str = "old"
    discard_new_per_subject: bool = False
    mirror: dict[str, object] | None = None


class _StreamInfo(msgspec.Struct):
    config: _StreamConfig | None = None
    error: ApiError | None = None


_decode_info = msgspec.json.Decoder(_StreamInfo).decode


def _may_refuse_one(config: _StreamConfig) -> bool:
    """Whether the stream may refuse one message of a connection and store a later one: only per-message
    limits do that, a maximum message size or a full limit with ``discard: new`` (``max_msgs``,
    ``max_bytes``, ``max_msgs_per_subject`` with ``discard_new_per_subject``). A mirror stores nothing
    published (its name is not where the messages go: nothing known). A sealed stream, or one whose
    every message the server refuses alike (no ack, counters), fails every caller of a group rightly."""
    return (
        config.max_msg_size > 0
        or config.discard == "new"
        or config.discard_new_per_subject
        or config.mirror is not None
    )


def api_error(err: ApiError) -> APIError:
    """nats-py's error for an API error (503 is ``ServiceUnavailableError``, as ``js.publish`` raises)."""
    cls = {503: ServiceUnavailableError, 500: ServerError, 404: NotFoundError, 400: BadRequestError}
    return cls.get(err.code, APIError)(code=err.code, err_code=err.err_code, description=err.description)


class _Settles(Protocol):
    """What an ack settles: one caller's future, or the `_Group` of callers one ack confirms."""

    def done(self) -> bool: ...
    def set_result(self, result: PubAck, /) -> None: ...
    def set_exception(self, exception: type | BaseException, /) -> None: ...


class _Group:
    """The callers of `Publisher.confirm` whose messages to one stream went out in one write: the ack of
    the write's last message to that stream settles each caller's future (those not cancelled)."""

    __slots__ = ("futures",)

    def __init__(self) -> None:
        self.futures: list[asyncio.Future[PubAck]] = []

    def done(self) -> bool:
        return all(f.done() for f in self.futures)

    def set_result(self, result: PubAck, /) -> None:
        for f in self.futures:
            if not f.done():
                f.set_result(result)

    def set_exception(self, exception: type | BaseException, /) -> None:
        for f in self.futures:
            if not f.done():
                f.set_exception(exception)


class _AllOf:
    """One caller's messages to a stream that may refuse one of them and store a later one: each asks for
    an ack, and the caller's future settles with the last stored message's `PubAck` once every ack came,
    or fails with the first refusal (a later message stored says nothing of an earlier one)."""

    __slots__ = ("future", "left", "result")

    def __init__(self, future: asyncio.Future[PubAck], messages: int) -> None:
        self.future, self.left = future, messages
        self.result: PubAck | None = None

    def done(self) -> bool:
        return self.future.done()

    def set_result(self, result: PubAck, /) -> None:
        self.left -= 1
        if self.result is None or result.seq > self.result.seq:
            self.result = result
        if self.left <= 0 and not self.future.done():
            self.future.set_result(self.result)

    def set_exception(self, exception: type | BaseException, /) -> None:
        if not self.future.done():
            self.future.set_exception(exception)


_Ready = tuple[bytes, bytes, bytes]
"""A checked message: subject, ``Nats-Msg-Id`` and payload, as bytes"""


class _Batch:
    """The messages `Publisher.confirm` collects during one turn of the event loop, written at its end."""

    __slots__ = ("alone", "deadline", "groups", "last", "messages", "size", "written")

    def __init__(self, deadline: float) -> None:
        self.written = False
        self.deadline = deadline
        self.size = 0  # payload bytes collected: the outgoing buffer's limit counts them before the write
        self.messages: list[_Ready] = []
        self.last: dict[str, int] = {}  # stream -> index of its last message: the one asking for the ack
        self.groups: dict[str, _Group] = {}
        # index of each message of a caller to a stream that may refuse one message -> that caller's acks
        self.alone: dict[int, _AllOf] = {}

    def add(
        self, messages: list[_Ready], size: int, stream: str, fut: asyncio.Future[PubAck], alone: bool
    ) -> None:
        """`size`: the payload bytes of `messages`."""
        self.size += size
        self.messages.extend(messages)
        if alone:  # its own acks: another message stored after one says nothing of that one
            settles = _AllOf(fut, len(messages))
            for i in range(len(self.messages) - len(messages), len(self.messages)):
                self.alone[i] = settles
            return
        self.last[stream] = len(self.messages) - 1
        group = self.groups.get(stream)
        if group is None:
            group = self.groups[stream] = _Group()
        group.futures.append(fut)


class Publisher:
    """Publishes with a ``Nats-Msg-Id`` on one connection; `acked` returns a future of the `PubAck`.

    Use `publisher(nc)` to get the connection's one instance. A future fails with
    ``NoStreamResponseError`` when no stream takes the subject, with nats-py's ``APIError`` (or a
    subclass) when the stream refuses the message, with ``ConnectionReconnectingError`` /
    ``ConnectionClosedError`` when the connection is lost before the ack came, with ``TimeoutError``
    when no ack came within ``timeout_s`` (checked by one timer per connection, a few times a second,
    instead of a timer per publish: the deadline is kept to within a quarter of a second). A caller may
    also cancel a future; an ack arriving later is then ignored.
    """

    def __init__(self, nc: NATS) -> None:
        self._nc_ref = weakref.ref(nc)  # the registry is keyed by the connection: no strong ref back
        self._prefix = ""  # reply subjects are <prefix><token>; set by the first acked publish
        self._prefix_b = b""
        self._next = 0
        self._futures: dict[str, _Settles] = {}
        # (deadline, token, future), a heap: callers may use different timeouts (the outbox's, a KV write's)
        self._deadlines: list[tuple[float, str, _Settles]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._batch: _Batch | None = None  # what `confirm` collects during this turn of the loop
        # stream -> (may it refuse one message and store a later one, when to look at its config again)
        self._streams: dict[str, tuple[bool, float]] = {}
        self._lookups: dict[str, asyncio.Task[None]] = {}  # stream -> its stream info request in flight
        self._init_lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        """The connection's event loop, kept: ``asyncio.get_running_loop()`` costs a ``getpid`` system call
        (a fork check), several times per flush otherwise."""
        self._chain_disconnected(nc)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    @property
    def pending(self) -> int:
        """Callers awaiting an ack (futures not yet settled; those of the turn's write still to be made are
        not counted)."""
        return sum(
            sum(1 for f in s.futures if not f.done()) if isinstance(s, _Group) else (0 if s.done() else 1)
            for s in self._futures.values()
        )

    def _conn(self) -> NATS:
        nc = self._nc_ref()
        if nc is None:
            raise nats.errors.ConnectionClosedError
        return nc

    # -- publishing ----------------------------------------------------------------------------------
    async def publish(self, subject: str, payload: bytes, msg_id: str) -> None:
        """Publish without asking for an ack (a later acked publish on this connection confirms it:
        JetStream stores one connection's messages to a stream in order)."""
        await self.send([(subject, payload, msg_id)], 1)

    async def acked(
        self,
        subject: str,
        payload: bytes,
        msg_id: str,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        *,
        expect_new: bool = False,
    ) -> asyncio.Future[PubAck]:
        """Publish with an ack request; the future settles when the server answers (see the class).
        With `expect_new`, only if the subject holds no message yet (see `send`)."""
        (fut,) = await self.send([(subject, payload, msg_id)], 0, timeout_s, (0,) if expect_new else ())
        return fut

    async def send(
        self,
        messages: list[Message],
        ack_from: int,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        expect_new: Collection[int] | Mapping[int, str] = (),
    ) -> list[asyncio.Future[PubAck]]:
        """Publish `messages` (subject, payload, ``Nats-Msg-Id``) in order, as one write to the
        connection's buffer; those from index `ack_from` on ask for an ack: their futures, in order,
        each failing with ``TimeoutError`` if its ack has not come after `timeout_s`.

        The messages at the indices `expect_new` are stored only if their subject (as stored) holds no
        message yet; the server refuses them otherwise, and their futures fail with a
        ``BadRequestError`` whose ``err_code`` is `WRONG_LAST_SEQUENCE` (or, on a cluster while another
        message on the subject is being stored, `WRONG_LAST_SEQUENCE_PENDING`). They must ask for an ack
        (an index from `ack_from` on): a refusal nobody hears of would be a message silently lost.
        Given as a mapping, an index's non-empty value is a subject filter (as stored, wildcards allowed):
        the message is stored only if no subject matching it holds a message (an insert-if-absent over
        several subjects: e.g. one execution's request and its rejection exclude each other)."""
        if expect_new and (min(expect_new) < ack_from or max(expect_new) >= len(messages)):
            raise ValueError(
                f"expect_new {sorted(expect_new)}: each index must be an acked message's "
                f"(from {ack_from} to {len(messages) - 1})"
            )
        nc = self._conn()
        check_writable(nc, sum(len(m[1]) for m in messages) if nc._status != _CONNECTED else 0)
        if ack_from < len(messages) and not self._prefix:
            await self._subscribe()
        max_payload = nc._max_payload
        loop = self._running_loop()
        deadline = loop.time() + timeout_s
        deadlines = self._deadlines
        futures: list[asyncio.Future[PubAck]] = []
        parts: list[bytes] = []
        size = 0
        try:
            for i, (subject, payload, msg_id) in enumerate(messages):
                n = len(payload)
                if not msg_id.isprintable():  # a CR or LF would end the header (or inject another)
                    raise nats.errors.BadHeaderError(MSG_ID)
                mid = msg_id.encode()
                on = expect_new.get(i, "") if isinstance(expect_new, Mapping) else ""
                filt = _subject(on) if on else b""
                # The server's limit counts the headers too, and it closes a connection that passes it.
                if (_HEADER_LEN_NEW_ON + len(filt) if filt else _HEADER_LEN_NEW) + len(mid) + n > max_payload:
                    raise nats.errors.MaxPayloadError
                size += n
                hlen = _HEADER_LEN + len(mid)
                if i < ack_from:
                    parts.append(_HPUB % (_subject(subject), hlen, hlen + n, mid, payload))
                    continue
                self._next += 1
                token = str(self._next)
                fut: asyncio.Future[PubAck] = loop.create_future()
                futures.append(fut)
                self._futures[token] = fut
                heapq.heappush(deadlines, (deadline, token, fut))
                reply = self._prefix_b + token.encode()
                if expect_new and i in expect_new:
                    if filt:
                        hlen = _HEADER_LEN_NEW_ON + len(mid) + len(filt)
                        parts.append(
                            _HPUB_REPLY_NEW_ON
                            % (_subject(subject), reply, hlen, hlen + n, mid, filt, payload)
                        )
                        continue
                    hlen = _HEADER_LEN_NEW + len(mid)
                    parts.append(_HPUB_REPLY_NEW % (_subject(subject), reply, hlen, hlen + n, mid, payload))
                    continue
                parts.append(_HPUB_REPLY % (_subject(subject), reply, hlen, hlen + n, mid, payload))
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise
        if futures and self._timer is None:
            self._timer = loop.call_later(min(_TICK_S, timeout_s / 4), self._expire)
        await write(nc, parts[0] if len(parts) == 1 else b"".join(parts), len(messages), size)
        return futures

    async def acked_with(
        self,
        subject: str,
        payload: bytes,
        headers: Mapping[str, str],
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> asyncio.Future[PubAck]:
        """Publish with these `headers` and an ack request (what ``js.publish(subject, payload,
        headers=...)`` does, without a request and an inbox of its own: a KV write's expected revision
        and TTL, say); the future settles as `send`'s do. Header names and values must be printable, names
        without ``:`` or spaces."""
        nc = self._conn()
        check_writable(nc, len(payload) if nc._status != _CONNECTED else 0)
        lines = []
        for name, value in headers.items():
            if not name or not name.isprintable() or ":" in name or " " in name or not value.isprintable():
                raise nats.errors.BadHeaderError(name)
            lines.append(f"{name}: {value}\r\n")
        head = f"NATS/1.0\r\n{''.join(lines)}\r\n".encode()
        hlen, n = len(head), len(payload)
        if hlen + n > nc._max_payload:  # the server closes a connection that passes it
            raise nats.errors.MaxPayloadError
        if not self._prefix:
            await self._subscribe()
        loop = self._running_loop()
        self._next += 1
        token = str(self._next)
        fut: asyncio.Future[PubAck] = loop.create_future()
        self._futures[token] = fut
        heapq.heappush(self._deadlines, (loop.time() + timeout_s, token, fut))
        if self._timer is None:
            self._timer = loop.call_later(min(_TICK_S, timeout_s / 4), self._expire)
        reply = self._prefix_b + token.encode()
        line = b"HPUB %b %b %d %d\r\n" % (_subject(subject), reply, hlen, hlen + n)
        await write(nc, b"".join((line, head, payload, b"\r\n")), 1, n)
        return fut

    # -- grouped confirmation ---------------------------------------------------------------------------
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
        if not self._prefix:
            await self._subscribe()
        now = asyncio.get_running_loop().time()
        deadline = now + timeout_s
        checked, size, stale = self._check(nc, groups, now)
        if stale:  # a stream not looked at yet is waited for; one looked at a minute ago, not
            check_writable(nc, 0)  # closed: no request
            checked = await self._look_up(checked, now, deadline)
        return self._enqueue(nc, checked, size, deadline)

    def confirm_all_nowait(
        self, groups: list[tuple[list[Message], str]], timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> list[asyncio.Future[PubAck]] | None:
        """`confirm_all` without a coroutine when nothing needs waiting for first (the ack subscription
        exists and every stream's configuration was looked at: every confirm but a connection's first
        few, each a coroutine less on the hot path); None otherwise, having published nothing: then
        `confirm_all` it. Raises what `confirm_all` raises for the messages themselves."""
        nc = self._conn()
        if not self._prefix:
            return None
        now = self._running_loop().time()
        checked, size, stale = self._check(nc, groups, now)
        if stale:
            for _, _, stream, _ in checked:
                looked = self._streams.get(stream)
                if looked is None:
                    return None  # waited for: `confirm_all`
                if looked[1] <= now:  # looked at a while ago: again, without waiting for it
                    check_writable(nc, 0)
                    self._start_lookup(nc, stream)
        return self._enqueue(nc, checked, size, now + timeout_s)

    def _check(
        self, nc: NATS, groups: list[tuple[list[Message], str]], now: float
    ) -> tuple[list[tuple[list[_Ready], int, str, bool]], int, bool]:
        """The groups' messages as bytes, each group's and the total payload size, and whether a stream's
        configuration is to be looked at (again); raises what nats-py would refuse, before any write."""
        if not groups or any(not messages for messages, _ in groups):
            raise ValueError("confirm: no messages")
        max_payload = nc._max_payload
        known = self._streams
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
                if _HEADER_LEN + len(mid) + n > max_payload:  # headers count (see `send`)
                    raise nats.errors.MaxPayloadError
                group_size += n
                ready.append((_subject(subject), mid, payload))
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
        acked: dict[int, _Settles] = {i: batch.groups[stream] for stream, i in batch.last.items()}
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
                hlen = _HEADER_LEN + len(mid)
                group = acked.get(i)
                if group is None:
                    parts.append(_HPUB % (subject, hlen, hlen + n, mid, payload))
                    continue
                self._next += 1
                token = str(self._next)
                self._futures[token] = group
                heapq.heappush(self._deadlines, (batch.deadline, token, group))
                reply = self._prefix_b + token.encode()
                parts.append(_HPUB_REPLY % (subject, reply, hlen, hlen + n, mid, payload))
            if self._timer is None:
                self._timer = self._running_loop().call_later(_TICK_S, self._expire)
            write_soon(nc, b"".join(parts), len(batch.messages), size, now=True)
        except Exception as exc:  # the connection is gone: each caller hears it (and publishes again)
            for settles in acked.values():
                if not settles.done():
                    settles.set_exception(exc)

    # -- stream configurations -----------------------------------------------------------------------
    async def _look_up(
        self, checked: list[tuple[list[_Ready], int, str, bool]], now: float, deadline: float
    ) -> list[tuple[list[_Ready], int, str, bool]]:
        """Look at the configuration of the streams of `checked` not looked at yet (awaited, until
        `deadline` at most) or a while ago (not awaited: the answer of then holds meanwhile); `checked`
        with what is known after. While the connection is not connected, nothing is requested: a stream
        not looked at yet counts as one that may refuse a message, for this confirm."""
        nc = self._conn()
        known = self._streams
        wait: set[asyncio.Task[None]] = set()
        for _, _, stream, _ in checked:
            k = known.get(stream)
            if k is not None and k[1] > now:
                continue
            task = self._start_lookup(nc, stream)
            if task is not None and k is None:
                wait.add(task)
        if not wait:
            return checked
        await asyncio.wait(wait, timeout=max(0.0, deadline - asyncio.get_running_loop().time()))
        return [
            (ready, size, stream, alone if (k := known.get(stream)) is None else k[0])
            for ready, size, stream, alone in checked
        ]

    def _start_lookup(self, nc: NATS, stream: str) -> asyncio.Task[None] | None:
        """The stream info request in flight for `stream`, started now if there is none (none while the
        connection is not connected)."""
        lookups = self._lookups
        task = lookups.get(stream)
        if task is None:
            if nc._status != _CONNECTED:
                return None
            task = lookups[stream] = asyncio.create_task(self._stream_info(stream))
            task.add_done_callback(functools.partial(_forget_lookup, lookups, stream))
        return task

    async def _stream_info(self, stream: str) -> None:
        """Request the stream's info and note whether it may refuse one message (yes if it cannot be
        fetched: looked at again in `_RETRY_S`)."""
        refuses, again = True, _RETRY_S
        try:
            msg = await self._conn().request(_STREAM_INFO + stream, b"", timeout=_LOOKUP_TIMEOUT_S)
            info = _decode_info(msg.data)
            if info.error is None and info.config is not None:
                refuses, again = _may_refuse_one(info.config), _RECHECK_S
        except Exception:  # no responders, a timeout, a bad name or answer, a closed connection
            pass
        self._streams[stream] = (refuses, asyncio.get_running_loop().time() + again)

    def _cancel_lookups(self) -> None:
        """A lost connection: its answers never come (confirms waiting for them go on as for a stream
        that may refuse a message)."""
        for task in list(self._lookups.values()):
            task.cancel()

    # -- acks ----------------------------------------------------------------------------------------
    async def _subscribe(self) -> None:
        """One wildcard subscription for every ack of this connection (nats-py replays it after a
        reconnect)."""
        async with self._init_lock:
            if self._prefix:
                return
            nc = self._conn()
            if nc.is_closed:
                raise nats.errors.ConnectionClosedError
            prefix = nc.new_inbox() + "."
            await subscribe_inline(nc, prefix + "*", self._on_ack)
            self._prefix, self._prefix_b = prefix, prefix.encode()

    def _on_ack(self, msg: Msg) -> None:
        fut = self._futures.pop(msg.subject[len(self._prefix) :], None)
        if fut is None or fut.done():
            return
        headers = msg.headers
        if headers and headers.get("Status") == _NO_RESPONDERS:
            fut.set_exception(NoStreamResponseError())
            return
        try:
            ack = _decode_ack(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            fut.set_exception(APIError(description=f"unreadable publish ack {msg.data[:200]!r}: {exc}"))
            return
        if ack.error is not None:
            fut.set_exception(api_error(ack.error))
        else:
            fut.set_result(ack)

    def _expire(self) -> None:
        """Forget settled futures and fail those past their deadline, oldest first; again in a moment
        while any is left."""
        self._timer = None
        deadlines, futures = self._deadlines, self._futures
        now = asyncio.get_running_loop().time()
        while deadlines:
            deadline, token, fut = deadlines[0]
            if not fut.done():
                if deadline > now:
                    break
                fut.set_exception(AckTimeoutError(f"no JetStream ack within the deadline (token {token})"))
            heapq.heappop(deadlines)
            futures.pop(token, None)
        if deadlines:
            self._timer = asyncio.get_running_loop().call_later(_TICK_S, self._expire)

    def _fail_all(self, exc: BaseException) -> None:
        futures, self._futures = self._futures, {}
        for fut in futures.values():
            if not fut.done():
                fut.set_exception(exc)

    def _chain_disconnected(self, nc: NATS) -> None:
        """Fail the awaited acks when the connection drops: a reply lost with the connection never comes,
        and the outbox should publish again after the reconnect rather than wait out its timeout.
        nats-py has one ``disconnected_cb``: ours runs first, then the one the connection was made with.
        """
        previous: Callable[[], Awaitable[None]] | None = nc._disconnected_cb
        ref = weakref.ref(self)

        async def on_disconnected() -> None:
            me, conn = ref(), nc_ref()
            if me is not None and conn is not None:
                me._cancel_lookups()
                if conn.is_closed:  # its subscriptions are gone: subscribe again if it is reconnected
                    me._prefix, me._prefix_b = "", b""
                    me._fail_all(nats.errors.ConnectionClosedError())
                else:
                    me._fail_all(nats.errors.ConnectionReconnectingError())
            if previous is not None:
                await previous()

        nc_ref = weakref.ref(nc)
        nc._disconnected_cb = on_disconnected


def _forget_lookup(lookups: dict[str, asyncio.Task[None]], stream: str, task: asyncio.Task[None]) -> None:
    if lookups.get(stream) is task:
        del lookups[stream]


@functools.lru_cache(maxsize=8192)  # an execution's subjects repeat, step after step
def _subject(subject: str) -> bytes:
    """What nats-py refuses in a subject (whitespace would end the protocol line), and control characters."""
    if not subject or " " in subject or not subject.isprintable():
        raise nats.errors.BadSubjectError
    return subject.encode()


_ATTR = "_noetl_publisher"


def publisher(nc: NATS) -> Publisher:
    """The connection's `Publisher` (one per connection: one ack subscription, one counter), kept on the
    connection itself (it refers back to it weakly): every flush asks for it."""
    pub: Publisher | None = getattr(nc, _ATTR, None)
    if pub is None:
        require_client_internals(nc)  # connections not made by natsconn.connect are checked here
        pub = Publisher(nc)
        setattr(nc, _ATTR, pub)
    return pub
