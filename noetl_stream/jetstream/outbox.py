"""Pipelined JetStream publishing with deterministic ``Nats-Msg-Id``s.

A handler collects its effects, then ``flush()`` publishes them in order and waits
for the acks that prove they are stored, before the handler settles its input.

The flushes of one turn of the event loop (under load, many handlers' flushes) go out
in one write at the end of the turn (`publish.Publisher.confirm`), and only the
LAST event and the LAST command of that write ask for a JetStream ack; the others are
plain publishes on the same connection. JetStream ingests one connection's messages
to one stream in order, so the ack of the last message to a stream confirms the ones
before it were processed too: two acks per write instead of one per event or command
(each ack is a message for the server to send and for Python to parse, and Python's
CPU is what bounds throughput: docs/performance.md). A failed ack fails every flush of the
write; each publishes its own messages again. Duplicates are dropped by the server
through ``Nats-Msg-Id`` either way (headers built once as bytes, acks matched by a
counter).

A flush that fails for a reason that passes by itself (a clustered stream electing a new leader
after its node died answers 503 "no responders" for several seconds; a reconnect, which fails the
acks still awaited; an ack that never came) publishes everything again, with the same
``Nats-Msg-Id``s, with backoff for up to ``retry_s``. Without that a worker would hand its command back and run the tool again, and a
command handed back ``max_deliver`` times during one election would fail its step.

An event queued with ``expect_new`` is stored only if its subject holds no message yet (an insert-if-
absent; with ``new_on``, only if no subject matching that filter holds one: e.g. an execution's one
``playbook.execution.requested`` or ``playbook.request.rejected``): it and every message after it
in the flush are published with an ack, and a refusal raises `AlreadyStoredError`, which is not retried; so
does an ``expect_new`` event acked as a duplicate (a cluster checks the ``Nats-Msg-Id`` first).

A clustered stream refuses a message for a moment while another with its ``Nats-Msg-Id`` (or, for an
``expect_new`` event, on its subject) is being stored: publishes of one deterministic id racing each
other, e.g. a request admitted twice at once. That is retried like the transient failures, and
settles as stored or `AlreadyStoredError`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import nats.errors
import structlog
from nats.js.client import JetStreamContext
from nats.js.errors import APIError, NoStreamResponseError, ServiceUnavailableError

from noetl_stream.errors import StateConflictError
from noetl_stream.jetstream.publish import (
    DUPLICATE_IN_PROCESS,
    MSG_ID,
    WRONG_LAST_SEQUENCE,
    WRONG_LAST_SEQUENCE_PENDING,
    PubAck,
    publisher,
)
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Command, Event, encode

__all__ = ["MSG_ID", "AlreadyStoredError", "Outbox"]

log = structlog.get_logger(__name__)

# Failures that pass by themselves: no stream leader yet (503), reconnecting, no ack in time.
_TRANSIENT = (
    NoStreamResponseError,
    ServiceUnavailableError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    TimeoutError,
)

Message = tuple[str, bytes, str]


class AlreadyStoredError(StateConflictError):
    """An event queued with ``expect_new`` was refused: a message is already stored on its subject (on
    one matching its ``new_on`` filter, for an event queued with one).

    Possibly by an earlier attempt of this same flush: an attempt that failed for a transient reason
    (no ack in time, a reconnect) may have stored it all the same, and the retry is refused. A single
    server refuses it even with the stored message's ``Nats-Msg-Id``; a cluster acks a message whose
    ``Nats-Msg-Id`` it stored within the duplicate window as a duplicate before it looks at the expected
    sequence, and that duplicate raises this too (whoever published that id first). Either way a
    message was there first: the caller reads what it is. The other messages of the flush were published too (the server
    refuses only that one), without a guarantee that they are stored: a caller queues with the event
    only what may be lost with it.
    """

    def __init__(self, subject: str, msg_id: str, description: str | None) -> None:
        super().__init__(f"a message is already stored on {subject} ({description or 'refused'})")
        self.subject = subject
        self.msg_id = msg_id


SENT_CONFIRM_EVERY = 256
"""`Outbox.send_now` events a flush confirms at least this often (what a reconnect would republish)."""


class Outbox:
    __slots__ = (
        "_commands",
        "_events",
        "_new",
        "_pub",
        "_sent",
        "_sent_reconnects",
        "ack_timeout_s",
        "js",
        "nc",
        "retry_s",
        "topology",
    )

    def __init__(
        self, js: JetStreamContext, topology: Topology, ack_timeout_s: float = 10.0, retry_s: float = 30.0
    ) -> None:
        self.js = js
        self.ack_timeout_s = ack_timeout_s
        self.retry_s = retry_s
        self.nc = js._nc
        self._pub = publisher(self.nc)
        self.topology = topology
        self._events: list[Message] = []
        self._commands: list[Message] = []
        # Indices in `_events` of the events queued with expect_new -> the subject filter checked ("": own).
        self._new: dict[int, str] = {}
        # What `send_now` wrote since the last flush, and the connection's reconnect count then: bytes
        # written before a reconnect may have died with the old socket, and are published again.
        self._sent: list[Message] = []
        self._sent_reconnects = 0

    def event(
        self, event: Event, data: bytes | None = None, *, expect_new: bool = False, new_on: str = ""
    ) -> None:
        """Queue an event (``data`` if the caller already encoded it). With `expect_new` it is stored only
        if its subject holds no message yet, or, given `new_on` (a stored-subject filter), if no subject
        matching `new_on` does; `flush` raises `AlreadyStoredError` otherwise."""
        subject = self.topology.event_subject(event.execution_id, event.name)
        if expect_new or new_on:
            self._new[len(self._events)] = new_on
        self._events.append((subject, data if data is not None else encode(event), event.event_id))

    def command(self, command: Command, data: bytes | None = None) -> None:
        subject = self.topology.command_subject(command.pool, command.execution_id)
        self._commands.append((subject, data if data is not None else encode(command), command.command_id))

    async def send_now(self, event: Event, data: bytes | None = None) -> None:
        """Publish one event at once, without waiting for its ack (progress that should not wait for
        the next flush; the flush's acked last event confirms it). If the connection reconnects before
        that ack, the flush publishes the event again (same id: stored once). Every `SENT_CONFIRM_EVERY`
        events a flush confirms them, so what is kept for that stays small."""
        message = (
            self.topology.event_subject(event.execution_id, event.name),
            data if data is not None else encode(event),
            event.event_id,
        )
        if not self._sent:
            self._sent_reconnects = self.nc.stats["reconnects"]
        self._sent.append(message)
        await self._pub.publish(*message)
        if len(self._sent) >= SENT_CONFIRM_EVERY:
            await self.flush()

    def __len__(self) -> int:
        return len(self._events) + len(self._commands)

    @property
    def sent(self) -> bool:
        """`send_now` published events that no flush has confirmed yet."""
        return bool(self._sent)

    def clear(self) -> None:
        """Forget what is queued (not what `send_now` published)."""
        self._events, self._commands, self._new = [], [], {}

    def flush_nowait(self) -> asyncio.Future[Any] | None:
        """`flush`'s first attempt, without waiting: what is queued joins this turn's write, and the future
        settles (with the last ack) once all of it is stored, or fails with the first failure. None,
        having published nothing, when it cannot be done so (conditional events, events `send_now`
        published, a publisher that has not looked at the streams yet): then `flush`. A failed future is
        not retried: `flush` the same messages again (kept by the caller) to retry."""
        if self._new or self._sent or (not self._events and not self._commands):
            return None
        groups = [(self._events, self.topology.events_stream)] if self._events else []
        if self._commands:
            groups.append((self._commands, self.topology.commands_stream))
        futures = self._pub.confirm_all_nowait(groups, self.ack_timeout_s)
        if futures is None:
            return None
        self._events, self._commands = [], []
        if len(futures) == 1:
            return futures[0]
        return asyncio.gather(*futures)

    async def flush(self) -> None:
        """Publish everything queued and wait until it is stored; raise on any failure (do not ack then).

        Transient failures are retried (everything again, same ids) for up to ``retry_s``, and so is a
        cluster's "the same id (or subject) is being stored"; a refused ``expect_new`` event is not
        (`AlreadyStoredError`).
        """
        events, self._events = self._events, []
        commands, self._commands = self._commands, []
        new = self._new
        if new:
            self._new = {}
        if not events and not commands:
            if not self._sent:
                return
            events = self._sent[-1:]  # published again with an ack: it confirms the ones before it
        deadline = time.monotonic() + self.retry_s  # (not the loop's clock: a getpid system call to find it)
        attempt = 0
        while True:
            try:
                if self._sent and self.nc.stats["reconnects"] != self._sent_reconnects:
                    # A reconnect since `send_now` wrote them: they go again, before the rest, same ids.
                    self._sent_reconnects = self.nc.stats["reconnects"]
                    new = {i + len(self._sent): on for i, on in new.items()}
                    events = self._sent + [m for m in events if m not in self._sent]
                if new:
                    await self._publish_new(events, commands, new)
                else:
                    await self._publish(events, commands)
                if self._sent and self.nc.stats["reconnects"] != self._sent_reconnects:
                    continue  # it reconnected while this flush waited: the old socket's bytes again
                self._sent = []
                return
            except Exception as exc:
                if not isinstance(exc, _TRANSIENT) and not _in_process(exc):
                    raise
                delay = min(2.0, 0.1 * 2**attempt)
                if time.monotonic() + delay > deadline:
                    raise
                attempt += 1
                log.warning(
                    "outbox.retry", error=str(exc) or type(exc).__name__, attempt=attempt, retry_in_s=delay
                )
                await asyncio.sleep(delay)

    async def _publish(self, events: list[Message], commands: list[Message]) -> None:
        # Joins the connection's write at the end of this turn of the event loop, with the other
        # handlers' flushes: one ack per stream for all of them (`Publisher.confirm`).
        futures: list[asyncio.Future[PubAck]] | None = None
        groups = [(events, self.topology.events_stream)] if events else []
        if commands:
            groups.append((commands, self.topology.commands_stream))
        ok = False
        try:
            # all of the flush, or nothing; without a coroutine once the publisher knows the streams
            futures = self._pub.confirm_all_nowait(groups, self.ack_timeout_s)
            if futures is None:
                futures = await self._pub.confirm_all(groups, self.ack_timeout_s)
            # Every ack was asked for already (no round trip each): wait for all, raise the first failure.
            # A publish the server never answers fails at the ack timeout (TimeoutError): not acked, the
            # caller's input is redelivered.
            first_error: BaseException | None = None
            for fut in futures:
                try:
                    await fut
                except Exception as exc:
                    first_error = first_error or exc
            if first_error is not None:
                raise first_error
            ok = True
        finally:
            if not ok and futures:
                _discard(futures)  # failed or cancelled: an ack that comes later is ignored

    async def _publish_new(self, events: list[Message], commands: list[Message], new: dict[int, str]) -> None:
        """A flush with ``expect_new`` events: on its own, each message from the first of them on acked."""
        futures: list[asyncio.Future[PubAck]] = []
        first_error: BaseException | None = None
        refused: AlreadyStoredError | None = None
        ok = False
        messages = events + commands
        ack_from = min(max(0, len(events) - 1), min(new))
        try:
            futures = await self._pub.send(messages, ack_from, self.ack_timeout_s, new)
            for i, fut in enumerate(futures, ack_from):
                try:
                    ack = await fut
                    if ack.duplicate and i in new and refused is None:
                        # Its Nats-Msg-Id was stored before (a cluster answers that before it looks at the
                        # expected sequence): stored already, as far as this caller can tell.
                        subject, _, msg_id = messages[i]
                        refused = AlreadyStoredError(subject, msg_id, "duplicate message id")
                except APIError as exc:
                    if exc.err_code == WRONG_LAST_SEQUENCE and refused is None:
                        subject, _, msg_id = messages[i]
                        refused = AlreadyStoredError(subject, msg_id, exc.description)
                        refused.__cause__ = exc
                    first_error = first_error or exc
                except Exception as exc:
                    first_error = first_error or exc
            ok = first_error is None
        finally:
            if not ok:
                _discard(futures)  # failed or cancelled: an ack that comes later is ignored
        if refused is not None:
            raise refused  # final, whatever else failed: no retry could store it
        if first_error is not None:
            raise first_error


def _in_process(exc: Exception) -> bool:
    """Refused while another publish of the same id, or on the same subject for an ``expect_new`` one,
    is being stored (a cluster's answer): not final."""
    return isinstance(exc, APIError) and exc.err_code in _IN_PROCESS


_IN_PROCESS = (DUPLICATE_IN_PROCESS, WRONG_LAST_SEQUENCE_PENDING)


def _discard(futures: list[asyncio.Future[PubAck]]) -> None:
    for fut in futures:
        if not fut.cancel() and not fut.cancelled():
            fut.exception()  # retrieved: no "exception was never retrieved" when it is collected
