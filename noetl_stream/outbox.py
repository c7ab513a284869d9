"""Pipelined JetStream publishing with deterministic ``Nats-Msg-Id``s.

A handler collects its effects, then ``flush()`` publishes them in order and waits
for the acks that prove they are stored, before the handler settles its input.

Only the LAST event of a flush is published with a JetStream ack request; the
events before it go out as plain publishes on the same connection. JetStream
ingests one connection's messages to one stream in order, so the ack of the last
event confirms the ones before it were processed too: one ack round trip (and one
ack message to parse) per flush instead of one per event, which is what bounds
throughput in Python (perf/README.md). Commands are acked individually: each one
is a unit of work that must not be lost. Duplicates are dropped by the server
through ``Nats-Msg-Id`` either way.
"""

from __future__ import annotations

import asyncio
from typing import Any

from nats.js.client import JetStreamContext

from noetl_stream.subjects import Topology
from noetl_stream.wire import Command, Event, encode

MSG_ID = "Nats-Msg-Id"


class Outbox:
    __slots__ = ("_commands", "_events", "ack_timeout_s", "js", "nc", "topology")

    def __init__(self, js: JetStreamContext, topology: Topology, ack_timeout_s: float = 10.0) -> None:
        self.js = js
        self.ack_timeout_s = ack_timeout_s
        self.nc = js._nc
        self.topology = topology
        self._events: list[tuple[str, bytes, str]] = []
        self._commands: list[tuple[str, bytes, str]] = []

    def event(self, event: Event, data: bytes | None = None) -> None:
        """Queue an event (``data`` if the caller already encoded it)."""
        subject = self.topology.event_subject(event.execution_id, event.name)
        self._events.append((subject, data if data is not None else encode(event), event.event_id))

    def command(self, command: Command, data: bytes | None = None) -> None:
        subject = self.topology.command_subject(command.pool, command.execution_id)
        self._commands.append((subject, data if data is not None else encode(command), command.command_id))

    async def send_now(self, event: Event, data: bytes | None = None) -> None:
        """Publish one event at once, without waiting for its ack (progress that should not wait for
        the next flush; the flush's acked last event confirms it)."""
        subject = self.topology.event_subject(event.execution_id, event.name)
        await self.nc.publish(
            subject, data if data is not None else encode(event), headers={MSG_ID: event.event_id}
        )

    def __len__(self) -> int:
        return len(self._events) + len(self._commands)

    async def flush(self) -> None:
        """Publish everything queued and wait until it is stored; raise on any failure (do not ack then)."""
        events, self._events = self._events, []
        commands, self._commands = self._commands, []
        futures: list[asyncio.Future[Any]] = []
        if events:
            for subject, data, msg_id in events[:-1]:
                await self.nc.publish(subject, data, headers={MSG_ID: msg_id})
            subject, data, msg_id = events[-1]
            futures.append(await self.js.publish_async(subject, data, headers={MSG_ID: msg_id}))
        for subject, data, msg_id in commands:
            futures.append(await self.js.publish_async(subject, data, headers={MSG_ID: msg_id}))
        first_error: BaseException | None = None
        for fut in futures:  # all were sent already: awaiting them one by one costs no extra round trip
            try:
                # A publish the server never answers (it died mid-request) must not hang the handler:
                # after the timeout the caller does not ack, and the input is redelivered.
                await asyncio.wait_for(fut, self.ack_timeout_s)
            except Exception as exc:
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
