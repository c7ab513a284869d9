"""Fast paths around nats-py: protocol bytes written into its outgoing buffer, acks without a
coroutine, messages handed to a plain function as they are parsed, and a delivery's fields read from its
reply subject alone. They use nats-py internals, checked once per connection (`require_client_internals`).
"""

from __future__ import annotations

import asyncio
import re
import weakref
from collections.abc import Callable

import structlog
from nats.aio.client import Client as NATS
from nats.aio.client import __version__ as NATS_PY_VERSION
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import (
    ConnectionClosedError,
    ConnectionDrainingError,
    MsgAlreadyAckdError,
    NotJSMessageError,
    OutboundBufferLimitError,
)

from noetl_stream.errors import ConfigurationError

__all__ = [
    "NATS_PY_TESTED",
    "UnsupportedClientError",
    "ack",
    "ack_soon",
    "check_writable",
    "nak_soon",
    "num_delivered",
    "num_pending",
    "parse_header_lines",
    "require_client_internals",
    "stream_seq",
    "subscribe_inline",
    "term_soon",
    "write",
    "write_soon",
]

log = structlog.get_logger(__name__)

_CONNECTED = NATS.CONNECTED


# --- the nats-py internals this module and jetstream/publish.py use ----------------------------------------
# The hot path writes protocol bytes into nats-py's outgoing buffer, acks without a coroutine and gets
# messages through a subscription's future (`write`, `write_soon`, `ack_soon`, `subscribe_inline`,
# `publish.Publisher`). These names are private to nats-py: pyproject.toml pins the minor version
# they were written against, and every connection is checked once for these names, so a different
# nats-py missing one fails at start instead of misbehaving under load. What names cannot show (that a
# subscription's future is handed each message, that writes join the flusher's buffer) is pinned by
# tests/jetstream/test_connection.py and tests/jetstream/test_publish.py, which a nats-py upgrade has to pass.
NATS_PY_TESTED = "2.16"
_CLIENT_ATTRS = (
    "_status",
    "_pending",
    "_pending_data_size",
    "_max_pending_size",
    "_flush_queue",
    "_flusher_task",
    "_transport",
    "_max_payload",
    "_disconnected_cb",
    "_send_command",
    "_flush_pending",
    "_parse_header_lines",
)
_MSG_ATTRS = ("_ackd", "_client")
_checked: weakref.WeakSet[NATS] = weakref.WeakSet()
_WHITESPACE = re.compile(r"\s")
_CRLF = b"\r\n"


def parse_header_lines(raw: bytes) -> dict[str, str]:
    """nats-py's ``Client._parse_header_lines`` (``Name: Value`` per line, names without whitespace, values
    decoded with ``errors="replace"``), with one regex search per name instead of a generator step per
    character: every delivered event and command carries its ``Nats-Msg-Id``, so this runs for each one.
    tests/jetstream/test_fastpath_headers.py holds it to nats-py's own on arbitrary bytes."""
    out: dict[str, str] = {}
    for line in raw.split(_CRLF):
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        try:
            key = name.strip().decode("ascii")
        except UnicodeDecodeError:
            continue
        if _WHITESPACE.search(key) is not None:
            continue
        out[key] = value.strip().decode("utf-8", "replace")
    return out


class UnsupportedClientError(ConfigurationError, RuntimeError):
    """The installed nats-py lacks internals the runtime's hot path uses."""


def require_client_internals(nc: NATS) -> None:
    """Raise `UnsupportedClientError` naming what is missing if `nc` (a nats-py client) lacks the
    private attributes the hot path uses; checked once per connection."""
    if nc in _checked:
        return
    missing = [f"Client.{a}" for a in _CLIENT_ATTRS if not hasattr(nc, a)]
    probe = Msg(nc)
    missing += [f"Msg.{a}" for a in _MSG_ATTRS if not hasattr(probe, a)]
    if getattr(nc.jetstream(), "_nc", None) is not nc:  # the outbox reaches the connection through it
        missing.append("JetStreamContext._nc")
    if missing:
        raise UnsupportedClientError(
            f"nats-py {NATS_PY_VERSION} lacks {', '.join(missing)}, which noetl-stream "
            f"uses on its hot path; install nats-py {NATS_PY_TESTED}.x (pyproject.toml pins it)"
        )
    # Its header parser, on this connection only: the static method is looked up through the instance.
    nc._parse_header_lines = parse_header_lines  # type: ignore[method-assign]
    _bind_flush_queue(nc)
    _checked.add(nc)


def _bind_flush_queue(nc: NATS) -> None:
    """The flusher waits on its queue after every write it is woken for, and ``asyncio.Queue.get`` looks
    up the running loop each time (``asyncio.get_running_loop()``: a ``getpid`` system call, a fork check):
    the connection's queue (made once, at connect) is given its loop once instead. A connection and its
    queue live on one loop (the queue refuses any other anyway)."""
    queue = nc._flush_queue
    if queue is None:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # checked outside a loop: nothing to bind
        return
    queue._get_loop = lambda: loop  # type: ignore[attr-defined]


class _Inline(asyncio.Future[Msg]):
    """A "future" that never completes: each ``set_result(msg)`` calls `callback` instead."""

    def __init__(self, callback: Callable[[Msg], None], subject: str) -> None:
        super().__init__()
        self._callback, self._subject = callback, subject

    def set_result(self, result: Msg, /) -> None:
        try:
            self._callback(result)
        except Exception:  # raised into nats-py's read loop, it would end the connection's reading
            log.exception("nats.inline_callback_failed", subject=self._subject)


async def subscribe_inline(nc: NATS, subject: str, callback: Callable[[Msg], None]) -> Subscription:
    """Subscribe with a plain function called in nats-py's read loop, as each message is parsed.

    nats-py hands the messages of a callback subscription to a task of the subscription through a
    queue (a put, a get and a task switch per message); a subscription made with ``future=`` (the path
    of its single-response requests) gets each one through the future's ``set_result`` instead, at
    once. `callback` must be quick and must not block: it runs between two messages of the socket.
    Its exceptions are logged. Unsubscribe and drain as usual.
    """
    return await nc.subscribe(subject, future=_Inline(callback, subject))


# --- writing protocol commands without nats-py's per-publish work ----------------------------------
# nats-py's ``Client.publish`` validates the subject with a regex, builds the command with an f-string
# and, with headers, checks each header name with a regex: a few microseconds per message on the hot
# path. `write` puts ready-made protocol bytes into the same outgoing buffer the same way
# (``_send_command``, then a kick of the flusher task), after the same checks (`check_writable`).


def check_writable(nc: NATS, size: int) -> None:
    """Raise what ``Client.publish`` raises when `size` more payload bytes cannot be written now
    (closed, draining, or reconnecting with a full buffer). While reconnecting, writes are buffered."""
    if nc._status == _CONNECTED:
        return
    if nc.is_closed:
        raise ConnectionClosedError
    if nc.is_draining_pubs:
        raise ConnectionDrainingError
    if not nc.is_connected and (
        nc._max_pending_size <= 0 or size + nc._pending_data_size > nc._max_pending_size
    ):
        raise OutboundBufferLimitError


async def write(nc: NATS, data: bytes, messages: int, payload_bytes: int) -> None:
    """Queue protocol commands (`messages` of them, `payload_bytes` of payload) for the flusher."""
    stats = nc.stats
    stats["out_msgs"] += messages
    stats["out_bytes"] += payload_bytes
    await nc._send_command(data)
    queue = nc._flush_queue
    if queue is not None and queue.empty():
        await nc._flush_pending()


DIRECT_WRITE_LIMIT = 1 << 20
"""`write_soon` writes to the socket itself while the transport holds less than this unsent (a server that
reads slowly): above it, the bytes wait for the flusher, which waits for the socket to drain."""


def _write_direct(nc: NATS, data: bytes) -> bool:
    """Write what the connection has buffered and then `data` to the socket now (True), unless it is not
    connected or the socket holds too much unsent already (then the flusher does, after draining it).
    Through the flusher, bytes go out a turn of the event loop later (its task wakes at the next turn),
    and a busy turn is milliseconds."""
    if nc._status != _CONNECTED:
        return False
    writer = getattr(nc._transport, "_io_writer", None)  # (a websocket transport has none: the flusher)
    if writer is None or writer.transport.get_write_buffer_size() >= DIRECT_WRITE_LIMIT:
        return False
    pending = nc._pending
    if pending:
        writer.writelines([*pending, data])
        nc._pending = []
        nc._pending_data_size = 0
    else:
        writer.write(data)
    return True


def write_soon(nc: NATS, data: bytes, messages: int, payload_bytes: int, *, now: bool = False) -> None:
    """`write` for code that cannot await (a loop callback): the bytes join the outgoing buffer and the
    flusher task is woken; the buffer-full forced flush `write` may wait for is left to the flusher.
    With `now`, they go to the socket at once with what is buffered before them (a turn's batch of
    publishes: the hop of a step waited a turn for the flusher otherwise), unless the socket holds too
    much unsent already. Either way they go out after everything written before them."""
    stats = nc.stats
    stats["out_msgs"] += messages
    stats["out_bytes"] += payload_bytes
    if now and _write_direct(nc, data):
        return
    nc._pending.append(data)
    nc._pending_data_size += len(data)
    queue = nc._flush_queue
    if queue is not None and queue.empty() and nc.is_connected:
        flusher = nc._flusher_task
        transport = nc._transport
        if flusher is None or flusher.done():  # as nats-py's _flush_pending: no flusher, write it now
            if transport is None:
                return
            transport.writelines(nc._pending[:])
            nc._pending = []
            nc._pending_data_size = 0
            return
        queue.put_nowait(_settled(nc))


_SETTLED = "_noetl_settled"


def _settled(nc: NATS) -> asyncio.Future[None]:
    """The connection's one settled future: what `write_soon` hands the flusher, which only looks whether
    it is done (a new one per write cost a ``getpid`` system call, in ``asyncio.get_running_loop``)."""
    fut: asyncio.Future[None] | None = getattr(nc, _SETTLED, None)
    if fut is None:
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        setattr(nc, _SETTLED, fut)
    return fut


async def ack(msg: Msg) -> None:
    """``msg.ack()`` without nats-py's per-publish work (see `write`): the delivery is settled."""
    ack_soon(msg)


def ack_soon(msg: Msg) -> None:
    """`ack` for code that need not await: the ack joins the outgoing buffer now (`write_soon`)."""
    _settle_soon(msg, b"+ACK")


def nak_soon(msg: Msg) -> None:
    """``msg.nak()`` for code that cannot await: redelivered at once (`ack_soon`'s way)."""
    _settle_soon(msg, b"-NAK")


def term_soon(msg: Msg) -> None:
    """``msg.term()`` for code that cannot await: the delivery is never redelivered (`ack_soon`'s way)."""
    _settle_soon(msg, b"+TERM")


def _settle_soon(msg: Msg, reply: bytes) -> None:
    """Answer a JetStream delivery (`reply`: ``+ACK``, ``-NAK``, ``+TERM``) without a coroutine, once."""
    if msg._ackd:
        raise MsgAlreadyAckdError(msg)
    if not msg.reply:
        raise NotJSMessageError
    nc = msg._client
    n = len(reply)
    check_writable(nc, n)
    write_soon(nc, b"PUB %b %d\r\n%b\r\n" % (msg.reply.encode(), n, reply), 1, n)
    msg._ackd = True


def _ack_tokens(msg: Msg) -> tuple[list[str], int]:
    """The reply subject's tokens and where the delivery fields start: ``$JS.ACK.<stream>.<consumer>.
    <delivered>.<stream seq>.<consumer seq>.<time>.<pending>``, or with ``<domain>.<account hash>``
    after ``ACK`` (then 2 later, and a random token at the end)."""
    tokens = (msg.reply or "").split(".")
    n = len(tokens)
    if (n == 9 or n >= 11) and tokens[0] == "$JS" and tokens[1] == "ACK":
        return tokens, 4 if n == 9 else 6
    raise NotJSMessageError


def stream_seq(msg: Msg) -> int:
    """The stream sequence of a JetStream delivery, read from its reply subject alone (``msg.metadata``
    builds dataclasses and a datetime for every field: a few microseconds per message)."""
    tokens, at = _ack_tokens(msg)
    return int(tokens[at + 1])


def num_delivered(msg: Msg) -> int:
    """How many times this message was delivered (1 the first time), from the reply subject alone."""
    tokens, at = _ack_tokens(msg)
    return int(tokens[at])


def num_pending(msg: Msg) -> int:
    """How many messages of the consumer are still to come after this one, from the reply subject alone."""
    tokens, at = _ack_tokens(msg)
    return int(tokens[at + 4])
