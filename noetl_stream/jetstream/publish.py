"""JetStream publishes for the hot path, with a ``Nats-Msg-Id`` each, written as protocol bytes.

The outbox publishes every event and command with a ``Nats-Msg-Id`` and waits for one JetStream ack
per flush. nats-py's ``publish_async`` costs, per call, a random token, a semaphore acquired through
``asyncio.wait_for``, a done-callback, a regex check per header and, per ack, ``json.loads`` into a
dataclass (docs/performance.md, candidate 3). `Publisher` builds the ``HPUB`` line and its header as
bytes and writes them into the connection's outgoing buffer as ``Client.publish`` does (`fastpath.write`,
after the same checks), so ordering with the connection's other publishes and buffering while
reconnecting are nats-py's own; its acks are matched by a counter (`acks.Acks`), and a turn's
confirms share one write and one ack per stream (`Publisher.confirm`; which streams may not:
`streams`).

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
import time
import weakref
from collections.abc import Awaitable, Callable, Collection, Mapping

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS

from noetl_stream.jetstream.acks import (
    DUPLICATE_IN_PROCESS,
    WRONG_LAST_SEQUENCE,
    WRONG_LAST_SEQUENCE_PENDING,
    PubAck,
)
from noetl_stream.jetstream.confirm import (
    DEFAULT_TIMEOUT_S,
    HEADER_LEN,
    HPUB,
    HPUB_REPLY,
    MSG_ID,
    WRITE_AT,
    Confirms,
    Message,
    subject_bytes,
)
from noetl_stream.jetstream.fastpath import check_writable, require_client_internals, write

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "DUPLICATE_IN_PROCESS",
    "EXPECTED_LAST_SUBJECT_SEQUENCE",
    "EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT",
    "MSG_ID",
    "WRITE_AT",
    "WRONG_LAST_SEQUENCE",
    "WRONG_LAST_SEQUENCE_PENDING",
    "Message",
    "PubAck",
    "Publisher",
    "publish_stored",
    "publisher",
]

EXPECTED_LAST_SUBJECT_SEQUENCE = "Nats-Expected-Last-Subject-Sequence"
EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"

# The one-header HPUB with a second header line: store only if the subject has no message yet (acked
# publishes only).
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
_CONNECTED = NATS.CONNECTED


class Publisher(Confirms):
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
        super().__init__(nc)
        self._chain_disconnected(nc)

    @property
    def pending(self) -> int:
        """Callers awaiting an ack (futures not yet settled; those of the turn's write still to be made are
        not counted)."""
        return self.acks.pending

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
        acks = self.acks
        if ack_from < len(messages) and not acks.subscribed:
            await acks.subscribe(nc)
        max_payload = nc._max_payload
        loop = self._running_loop()
        deadline = loop.time() + timeout_s
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
                filt = subject_bytes(on) if on else b""
                # The server's limit counts the headers too, and it closes a connection that passes it.
                if (_HEADER_LEN_NEW_ON + len(filt) if filt else _HEADER_LEN_NEW) + len(mid) + n > max_payload:
                    raise nats.errors.MaxPayloadError
                size += n
                hlen = HEADER_LEN + len(mid)
                if i < ack_from:
                    parts.append(HPUB % (subject_bytes(subject), hlen, hlen + n, mid, payload))
                    continue
                fut: asyncio.Future[PubAck] = loop.create_future()
                futures.append(fut)
                reply = acks.reply(fut, deadline)
                if expect_new and i in expect_new:
                    if filt:
                        hlen = _HEADER_LEN_NEW_ON + len(mid) + len(filt)
                        parts.append(
                            _HPUB_REPLY_NEW_ON
                            % (subject_bytes(subject), reply, hlen, hlen + n, mid, filt, payload)
                        )
                        continue
                    hlen = _HEADER_LEN_NEW + len(mid)
                    parts.append(
                        _HPUB_REPLY_NEW % (subject_bytes(subject), reply, hlen, hlen + n, mid, payload)
                    )
                    continue
                parts.append(HPUB_REPLY % (subject_bytes(subject), reply, hlen, hlen + n, mid, payload))
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise
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
        if not self.acks.subscribed:
            await self.acks.subscribe(nc)
        loop = self._running_loop()
        fut: asyncio.Future[PubAck] = loop.create_future()
        reply = self.acks.reply(fut, loop.time() + timeout_s)
        line = b"HPUB %b %b %d %d\r\n" % (subject_bytes(subject), reply, hlen, hlen + n)
        await write(nc, b"".join((line, head, payload, b"\r\n")), 1, n)
        return fut

    # -- the connection ----------------------------------------------------------------------------
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
                me.streams.cancel()
                if conn.is_closed:  # its subscriptions are gone: subscribe again if it is reconnected
                    me.acks.fail_all(nats.errors.ConnectionClosedError(), closed=True)
                else:
                    me.acks.fail_all(nats.errors.ConnectionReconnectingError())
            if previous is not None:
                await previous()

        nc_ref = weakref.ref(nc)
        nc._disconnected_cb = on_disconnected


_ATTR = "_noetl_publisher"


def publisher(nc: NATS) -> Publisher:
    """The connection's `Publisher` (one per connection: one ack subscription, one counter), kept on the
    connection itself (it refers back to it weakly): every flush asks for it."""
    pub: Publisher | None = getattr(nc, _ATTR, None)
    if pub is None:
        require_client_internals(nc)  # connections not made by connection.connect are checked here
        pub = Publisher(nc)
        setattr(nc, _ATTR, pub)
    return pub


STORED_RETRY_S = 10.0
"""How long `publish_stored` publishes a message again after a failure that passes."""
_TRANSIENT = (
    nats.errors.ConnectionReconnectingError,
    nats.errors.TimeoutError,
    nats.js.errors.ServiceUnavailableError,
)


async def publish_stored(
    nc: NATS, subject: str, data: bytes, msg_id: str, within_s: float = STORED_RETRY_S
) -> None:
    """Publish one message and wait until it is stored. A publish whose ack was lost (a reconnect, no
    answer in time, a stream without a leader for a moment) may be stored all the same: it is published
    again with the same ``Nats-Msg-Id``, which the server stores once, for up to `within_s`."""
    deadline = time.monotonic() + within_s
    attempt = 0
    while True:
        try:
            await (await publisher(nc).acked(subject, data, msg_id))
            return
        except _TRANSIENT:
            delay = min(1.0, 0.1 * 2**attempt)
            if time.monotonic() + delay > deadline:
                raise
            attempt += 1
            await asyncio.sleep(delay)
