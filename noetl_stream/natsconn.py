"""NATS connections with production options, and a continuous pull consumer.

`ContinuousPuller` is what ``Consume()`` is in the Go client (nats-py 2.16 only has ``fetch()``):
one inbox subscription, pull requests kept topped up at 50 % of a window, messages handed to an
async handler with bounded concurrency. perf/README.md: 3-4x faster than one ``fetch()`` per message.

Messages given to the handler are plain ``nats.aio.msg.Msg`` objects whose ``reply`` is the
``$JS.ACK...`` subject of the delivery, so ``ack()``, ``nak(delay=)``, ``in_progress()``,
``term()`` and ``metadata`` work exactly as for ``fetch()``. The handler settles the message.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import os
import random
import re
import ssl
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from types import TracebackType
from typing import Any, Self

import msgspec
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
    "ContinuousPuller",
    "Handler",
    "UnsupportedClientError",
    "ack",
    "ack_soon",
    "check_writable",
    "connect",
    "nats_tls_context",
    "num_delivered",
    "refusal",
    "require_client_internals",
    "stream_seq",
    "subscribe_inline",
    "write",
    "write_soon",
]

log = structlog.get_logger(__name__)

Handler = Callable[[Msg], Awaitable[None]]

_ACK_PREFIX = "$JS.ACK."
_CONNECTED = NATS.CONNECTED
_PENDING_MSGS = "Nats-Pending-Messages"


# --- the nats-py internals this module and jspublish.py use ----------------------------------------
# The hot path writes protocol bytes into nats-py's outgoing buffer, acks without a coroutine and gets
# messages through a subscription's future (`write`, `write_soon`, `ack_soon`, `subscribe_inline`,
# `jspublish.Publisher`). These names are private to nats-py: pyproject.toml pins the minor version
# they were written against, and every connection is checked once for these names, so a different
# nats-py missing one fails at start instead of misbehaving under load. What names cannot show (that a
# subscription's future is handed each message, that writes join the flusher's buffer) is pinned by
# tests/test_natsconn.py and tests/test_jspublish.py, which a nats-py upgrade has to pass.
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
)
_MSG_ATTRS = ("_ackd", "_client")
_checked: weakref.WeakSet[NATS] = weakref.WeakSet()


class UnsupportedClientError(RuntimeError):
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
    _checked.add(nc)


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


def write_soon(nc: NATS, data: bytes, messages: int, payload_bytes: int) -> None:
    """`write` for code that cannot await (a loop callback): the bytes join the outgoing buffer now and
    the flusher task is woken; the buffer-full forced flush `write` may wait for is left to the flusher."""
    stats = nc.stats
    stats["out_msgs"] += messages
    stats["out_bytes"] += payload_bytes
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
        queue.put_nowait(asyncio.get_running_loop().create_future())


async def ack(msg: Msg) -> None:
    """``msg.ack()`` without nats-py's per-publish work (see `write`): the delivery is settled."""
    ack_soon(msg)


def ack_soon(msg: Msg) -> None:
    """`ack` for code that need not await: the ack joins the outgoing buffer now (`write_soon`)."""
    if msg._ackd:
        raise MsgAlreadyAckdError(msg)
    if not msg.reply:
        raise NotJSMessageError
    nc = msg._client
    check_writable(nc, 4)
    write_soon(nc, b"PUB %b 4\r\n+ACK\r\n" % msg.reply.encode(), 1, 4)
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


class _Queued:
    """A delivered message waiting for a free handler, and when it last reset its AckWait."""

    __slots__ = ("msg", "since")

    def __init__(self, msg: Msg, since: float) -> None:
        self.msg, self.since = msg, since


def _backoff(attempt: int, base: float = 0.1, cap: float = 5.0) -> float:
    """Exponential backoff with full jitter in [d/2, d]."""
    d = min(cap, base * 2.0 ** min(attempt, 16))
    return d / 2 + random.random() * d / 2


def _pick_server(servers: list[Any], _info: dict[str, Any]) -> tuple[Any, float]:
    s = min(servers, key=lambda srv: srv.reconnects)
    return s, _backoff(s.reconnects)


_USERINFO = re.compile(r"(?<=://)[^/@\s,]*@")


def refusal(nc: NATS) -> str | None:
    """The server's last refusal of a publish or subscription of this connection (a permissions
    violation), or None. A refused request is otherwise only a timeout: nothing ever answers it."""
    err = nc.last_error
    text = str(err) if err is not None else ""
    return text.removeprefix("nats: ") if "permissions violation" in text.lower() else None


# Per-identity connection settings from the environment (deploy/: each role has its own NATS user).
CREDS_ENV = "NOETL_NATS_CREDS"
"""A ``.creds`` file (user JWT and NKey seed) to authenticate with."""
CA_ENV = "NOETL_NATS_CA"
"""A PEM file of the CA certificate(s) that signed the NATS servers' certificates (a private CA)."""
INBOX_PREFIX_ENV = "NOETL_NATS_INBOX_PREFIX"


def _readable(variable: str, path: str) -> str:
    try:
        with open(path, "rb"):
            return path
    except OSError as exc:
        raise ConfigurationError(f"{variable}={path}: cannot read it ({exc.strerror or exc})") from None


def nats_tls_context(ca_file: str) -> ssl.SSLContext:
    """The TLS context of the NATS connection for servers signed by a private CA: it trusts the CA
    certificates in `ca_file` (PEM) and nothing else, as ``nats --tlsca`` does, and verifies the server's
    host name. Only the NATS connection uses it: every other TLS connection of the process (a worker's
    ``http`` tasks, databases) keeps the system's CAs. (Setting ``SSL_CERT_FILE`` to the private CA
    instead made Python's default context trust that CA alone, for every connection of the process.)"""
    try:
        return ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=_readable(CA_ENV, ca_file))
    except ssl.SSLError as exc:
        raise ConfigurationError(
            f"{CA_ENV}={ca_file}: no PEM CA certificate in it ({exc.reason or exc})"
        ) from None


def _environment_options() -> dict[str, Any]:
    """`connect` options from ``NOETL_NATS_CREDS``, ``NOETL_NATS_CA`` and ``NOETL_NATS_INBOX_PREFIX``."""
    opts: dict[str, Any] = {}
    if creds := os.environ.get(CREDS_ENV):
        opts["user_credentials"] = _readable(CREDS_ENV, creds)
    if ca_file := os.environ.get(CA_ENV):
        opts["tls"] = nats_tls_context(ca_file)
    if inbox_prefix := os.environ.get(INBOX_PREFIX_ENV):
        opts["inbox_prefix"] = inbox_prefix.encode()
    return opts


def redact_urls(text: str) -> str:
    """`text` with the user, password or token of every ``scheme://user:pass@host`` URL replaced (an error
    message must not carry them)."""
    return _USERINFO.sub("***@", text)


async def connect(
    url: str | Sequence[str],
    *,
    name: str = "noetl-stream",
    max_reconnect_attempts: int = -1,
    connect_wait_s: float | None = 30.0,
    pending_size: int = 64 * 1024 * 1024,
    **options: Any,
) -> NATS:
    """Connect to one server or a cluster with reconnect-forever (jittered exponential backoff)
    and logging callbacks.

    From the environment: ``NOETL_NATS_CREDS`` (a ``.creds`` file), ``NOETL_NATS_CA`` (the CA of
    servers with certificates of a private CA, for this connection only: `nats_tls_context`) and
    ``NOETL_NATS_INBOX_PREFIX``; a file that cannot be read raises `ConfigurationError`.
    `connect_wait_s` bounds the first connection (None waits forever, for components started
    before their server). Extra `options` go to ``nats.connect``.
    """
    nc = NATS()
    bound = log.bind(nats_client=name)
    # Until the first connection: each distinct error logged once (a server not up yet fails the same
    # way every second), the last one named in the error raised if no connection is made in time.
    connecting = True
    seen: set[str] = set()
    last_error = ""

    async def on_error(e: Exception) -> None:
        nonlocal last_error
        error = str(e) or type(e).__name__
        if connecting:
            last_error = error
            # A bounded first connection names its last error when it gives up: no line before that.
            if error in seen or connect_wait_s is not None:
                bound.debug("nats.error", error=error, kind=type(e).__name__)
                return
            seen.add(error)
        bound.warning("nats.error", error=error, kind=type(e).__name__)

    async def on_disconnected() -> None:
        if nc.is_closed:  # our own close()
            bound.debug("nats.disconnected")
        else:
            bound.warning("nats.disconnected")

    async def on_reconnected() -> None:
        bound.info("nats.reconnected", server=nc.connected_url.netloc if nc.connected_url else None)

    async def on_closed() -> None:
        bound.info("nats.closed")

    opts: dict[str, Any] = {
        "name": name,
        "error_cb": on_error,
        "disconnected_cb": on_disconnected,
        "reconnected_cb": on_reconnected,
        "closed_cb": on_closed,
        "allow_reconnect": True,
        "max_reconnect_attempts": max_reconnect_attempts,
        "reconnect_time_wait": 1,
        "ping_interval": 20,
        "max_outstanding_pings": 3,
        "pending_size": pending_size,
    }
    if "reconnect_to_server_handler" in inspect.signature(NATS.connect).parameters:
        opts["reconnect_to_server_handler"] = _pick_server
    # Per-identity settings from the environment (deploy/: each role has its own NATS user); explicit
    # `options` win.
    opts.update(_environment_options())
    opts.update(options)
    # One URL, a comma-separated list (``nats://a:4222,nats://b:4222``, as NOETL_NATS_URL takes
    # them), or a sequence: the client connects to any of them and fails over to the others.
    servers = [u.strip() for u in url.split(",") if u.strip()] if isinstance(url, str) else list(url)
    try:
        async with asyncio.timeout(connect_wait_s):
            await nc.connect(servers, **opts)
    except TimeoutError:
        await nc.close()
        shown = redact_urls(", ".join(servers))
        reason = f" (last error: {last_error})" if last_error else ""
        raise ConnectionError(f"cannot connect to NATS at {shown} within {connect_wait_s}s{reason}") from None
    connecting = False
    try:
        require_client_internals(nc)
    except UnsupportedClientError:
        await nc.close()
        raise
    return nc


class ContinuousPuller:
    """Continuous pull from a durable consumer into an async handler, at most `max_concurrency` at once.

    `batch` is the window of messages requested or in hand (queued or being handled); a new pull
    request tops it up when half is used (default ``2 * max_concurrency``). Messages waiting for a
    free handler get ``in_progress()`` so their AckWait does not expire while queued. Handler
    exceptions are logged and the message is nak'ed (after `error_nak_delay_s`) if still unsettled.
    Pulls are re-issued after a reconnect, an expired request or missed idle heartbeats.
    A puller is started once and stopped once.

    With `ordered`, handlers START in delivery order (each message gets a task of its own, and tasks
    run in creation order): a handler whose synchronous prefix files the message (the controller
    queues it per execution) sees messages in stream order. Without it, a handler task that finishes
    one message takes the next queued one itself, which can overtake a task created earlier for an
    older message that has not started yet.
    """

    def __init__(
        self,
        nc: NATS,
        stream: str,
        consumer: str,
        handler: Handler,
        *,
        max_concurrency: int = 100,
        batch: int | None = None,
        expires_s: float = 30.0,
        heartbeat_s: float = 5.0,
        error_nak_delay_s: float | None = 1.0,
        api_prefix: str = "$JS.API",
        ordered: bool = False,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        if not 0 < heartbeat_s * 2 <= expires_s:
            raise ValueError("need 0 < 2 * heartbeat_s <= expires_s")
        self._nc, self.stream, self.consumer, self._handler = nc, stream, consumer, handler
        self.max_concurrency = max_concurrency
        self.batch = batch or 2 * max_concurrency
        self._expires_ns = int(expires_s * 1e9)
        self._hb_s = heartbeat_s
        self._nak_delay = error_nak_delay_s
        self._ordered = ordered
        self._next_subject = f"{api_prefix}.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self._log = log.bind(stream=stream, consumer=consumer)

        self._sub: Subscription | None = None
        self._inbox = ""
        self._outstanding = 0  # requested, not yet delivered
        self._held = 0  # delivered, not yet handled (queued or running)
        self._running = 0
        self._queue: collections.deque[_Queued] = collections.deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self._aux: set[asyncio.Task[None]] = set()  # intake's asynchronous work (statuses, hand-backs)
        self._watchdog: asyncio.Task[None] | None = None
        self._stopping = False
        self._needs_reset = False
        self._last_activity = 0.0
        self._reconnects = 0
        self._progress_every = 10.0
        self._pulls = 0

    @property
    def in_flight(self) -> int:
        """Handlers running now."""
        return self._running

    @property
    def pull_requests(self) -> int:
        """Pull requests issued so far."""
        return self._pulls

    @contextlib.asynccontextmanager
    async def released_slot(self) -> AsyncIterator[None]:
        """Give the calling handler's slot to others while it waits on work this puller must run.

        A handler that waits for something only another message of the same consumer can bring
        about (a parent task waiting for its child execution) would otherwise deadlock a pool with
        one slot. On exit the slot is taken back even if that briefly exceeds ``max_concurrency``.
        """
        self._running -= 1
        self._dispatch()
        await self._top_up()
        try:
            yield
        finally:
            self._running += 1

    @property
    def queued(self) -> int:
        """Messages delivered and waiting for a free handler."""
        return len(self._queue)

    async def start(self) -> None:
        """Check the consumer exists, subscribe and issue the first pull."""
        if self._sub is not None:
            return
        info = await self._nc.jetstream().consumer_info(self.stream, self.consumer)
        ack_wait = info.config.ack_wait or 30.0
        self._progress_every = max(0.5, ack_wait / 3)
        loop = asyncio.get_running_loop()
        self._last_activity = loop.time()
        self._reconnects = self._nc.stats["reconnects"]
        self._inbox = self._nc.new_inbox()
        self._sub = await subscribe_inline(self._nc, self._inbox, self._on_msg)
        await self._top_up()
        self._watchdog = asyncio.create_task(self._watch(), name=f"puller-watchdog:{self.consumer}")

    async def stop(self, timeout: float = 30.0) -> None:
        """Stop pulling, hand back queued messages (nak), wait up to `timeout` for running handlers.

        Handlers still running after `timeout` are cancelled; their messages stay unsettled and
        are redelivered after AckWait.
        """
        if self._sub is None or self._stopping:
            return
        self._stopping = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            await asyncio.wait([self._watchdog])
        while self._queue:
            self._held -= 1
            await self._hand_back(self._queue.popleft().msg)
        try:  # unsubscribe, but let messages already received reach _on_msg (which naks them)
            async with asyncio.timeout(timeout):
                await self._sub.drain()  # type: ignore[no-untyped-call]
        except Exception as e:  # closed or reconnecting connection: nothing more will arrive
            self._log.debug("puller.drain_failed", error=repr(e))
        if self._aux:
            await asyncio.wait(set(self._aux), timeout=timeout)
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
            if pending:
                self._log.warning("puller.stop_timeout", cancelled=len(pending))
                for t in pending:
                    t.cancel()
                await asyncio.wait(pending)

    def abort(self) -> None:
        """Cancel the running handlers now (their messages stay unsettled: redelivered after AckWait).
        Cuts short a `stop()` in progress that is waiting for them."""
        for task in list(self._tasks):
            task.cancel()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # --- intake -----------------------------------------------------------------------------------
    def _on_msg(self, msg: Msg) -> None:
        """Called in the connection's read loop (`subscribe_inline`): file the message, start handlers."""
        self._last_activity = asyncio.get_running_loop().time()
        if not msg.reply.startswith(_ACK_PREFIX):
            self._spawn(self._on_status(msg))
            return
        if self._outstanding > 0:
            self._outstanding -= 1
        if self._stopping:
            self._spawn(self._hand_back(msg))
            return
        # A delivery moves a message from requested to held: the window is unchanged, no pull to top up.
        self._held += 1
        self._queue.append(_Queued(msg, self._last_activity))
        self._dispatch()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run the rare asynchronous part of intake (a status, a hand-back) as a task stop() waits for."""
        task = asyncio.create_task(coro)
        self._aux.add(task)
        task.add_done_callback(self._aux.discard)

    async def _on_status(self, msg: Msg) -> None:
        headers = msg.headers or {}
        status = headers.get("Status", "")
        if status == "100":  # idle heartbeat (flow control carries a reply: answer it)
            if msg.reply:
                await self._nc.publish(msg.reply)
            return
        pending = headers.get(_PENDING_MSGS)
        if pending is not None and pending.isdigit():
            self._outstanding = max(0, self._outstanding - int(pending))
            await self._top_up()
        elif status not in ("404", "408"):
            # A request the server dropped without saying how much: re-pull from the watchdog,
            # which also rate-limits retries of errors such as "Exceeded MaxWaiting".
            self._needs_reset = True
        if status not in ("404", "408"):
            self._log.warning("puller.status", status=status, description=headers.get("Description", ""))

    def _pull_size(self) -> int:
        """How many messages a pull request should ask for now; 0 while the window is over half full."""
        in_hand = self._outstanding + self._held
        if self._stopping or in_hand > self.batch // 2 or not self._nc.is_connected:
            return 0
        return self.batch - in_hand

    async def _top_up(self) -> None:
        n = self._pull_size()
        if n:
            await self._pull(n)

    async def _pull(self, n: int) -> None:
        req = {"batch": n, "expires": self._expires_ns, "idle_heartbeat": int(self._hb_s * 1e9)}
        self._outstanding += n
        try:
            await self._nc.publish(self._next_subject, msgspec.json.encode(req), reply=self._inbox)
            self._pulls += 1
        except Exception as e:
            self._outstanding -= n
            self._needs_reset = True
            self._log.warning("puller.pull_failed", error=repr(e))

    async def _hand_back(self, msg: Msg) -> None:
        try:
            await msg.nak()
        except Exception as e:
            self._log.debug("puller.nak_failed", error=repr(e))

    # --- handlers ---------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        """Start handlers for queued messages while there is a free slot."""
        while self._queue and self._running < self.max_concurrency and not self._stopping:
            self._running += 1
            task = asyncio.create_task(self._work(self._queue.popleft().msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _work(self, msg: Msg) -> None:
        """Handle `msg`, then keep taking queued messages while there are any."""
        try:
            while True:
                try:
                    await self._handler(msg)
                except Exception:
                    await self._failed(msg)
                finally:
                    self._held -= 1
                if self._stopping or not self._queue or self._ordered:
                    break
                msg = self._queue.popleft().msg
                if n := self._pull_size():
                    await self._pull(n)
        finally:
            self._running -= 1
        if self._ordered:
            self._dispatch()  # queued messages start in delivery order, each in a task of its own
        if n := self._pull_size():
            await self._pull(n)

    async def _failed(self, msg: Msg) -> None:
        self._log.exception("puller.handler_failed", subject=msg.subject)
        if self._nak_delay is not None and not msg.is_acked:
            try:
                await msg.nak(delay=self._nak_delay)
            except Exception as e:
                self._log.warning("puller.nak_failed", error=repr(e))

    # --- watchdog ---------------------------------------------------------------------------------
    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        tick = min(1.0, self._hb_s / 2)
        while True:
            await asyncio.sleep(tick)
            try:
                await self._check(loop.time())
            except Exception:
                self._log.exception("puller.watchdog_failed")

    async def _check(self, now: float) -> None:
        self._dispatch()  # in case a handler task was cancelled from outside
        if not self._nc.is_connected:
            return
        reconnects = self._nc.stats["reconnects"]
        stale = self._outstanding > 0 and now - self._last_activity > 2 * self._hb_s
        if reconnects != self._reconnects or stale or self._needs_reset:
            self._log.info("puller.repull", reconnected=reconnects != self._reconnects, stale=stale)
            self._reconnects, self._needs_reset, self._outstanding = reconnects, False, 0
            self._last_activity = now
        await self._top_up()
        await self._keep_queued_alive(now)

    async def _keep_queued_alive(self, now: float) -> None:
        for q in [q for q in self._queue if now - q.since >= self._progress_every]:
            q.since = now
            if not q.msg.is_acked:
                try:
                    await q.msg.in_progress()
                except Exception as e:
                    self._log.debug("puller.progress_failed", error=repr(e))
