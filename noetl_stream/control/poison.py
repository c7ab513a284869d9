"""Commands JetStream gave up on (``max_deliver`` reached) become step failures, never silent losses.

A command whose every delivery crashed its worker or timed out is reported by the server as a
max-deliveries advisory, captured in the advisories stream. For each one the controller reads the
command back, writes the failure boundary its worker never wrote (``step.failed``, or
``loop.iteration.failed`` for an iteration of a distributed loop, ``keychain.failed`` for a keychain
check) with ``error.kind: max_deliver_exceeded``, and removes the command from the work queue.
"""

from __future__ import annotations

from typing import Any

import msgspec
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from noetl_stream.jetstream.outbox import Outbox
from noetl_stream.jetstream.puller import ContinuousPuller
from noetl_stream.protocol import events as E
from noetl_stream.protocol.errorinfo import ErrorInfo
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Command, Event, decode_command, decode_json, make_event

log = structlog.get_logger(__name__)


def failure_for(cmd: Command, deliveries: int) -> Event:
    error: dict[str, Any] = ErrorInfo(
        kind="max_deliver_exceeded",
        retryable=False,
        message=f"step '{cmd.step}': its command was delivered {deliveries} times and never completed "
        "(the worker crashed or exceeded the ack wait every time); giving up",
    ).to_dict()
    step: str | None = cmd.step
    payload: dict[str, Any]
    if cmd.keychain_check:  # the check, not a step: written as its worker would have (no step)
        error["message"] = (
            f"the keychain check was delivered {deliveries} times and never completed (the worker crashed "
            "or exceeded the ack wait every time); giving up"
        )
        scope, name, entity, payload = cmd.step_run_id, E.KEYCHAIN_FAILED, "workflow", {"error": error}
        step = None
    elif cmd.iteration is not None:
        scope = f"{cmd.step_run_id}.{cmd.iteration.index}"
        name, entity, payload = (
            E.LOOP_ITERATION_FAILED,
            "loop",
            {"index": cmd.iteration.index, "error": error},
        )
    else:
        scope, name, entity, payload = cmd.step_run_id, E.STEP_FAILED, "step", {"error": error}
    return make_event(
        cmd.execution_id,
        name,
        source="server",
        entity_type=entity,
        entity_id=cmd.execution_id if step is None else scope,
        status="error",
        scope=scope,
        payload=payload,
        step=step,
        step_run_id=cmd.step_run_id,
        trace_id=cmd.trace_id,
    )


class PoisonHandler:
    def __init__(self, nc: NATS, topology: Topology) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.topology = topology
        self._puller: ContinuousPuller | None = None

    async def start(self) -> None:
        self._puller = ContinuousPuller(
            self.nc,
            self.topology.advisories_stream,
            self.topology.controller_advisories_consumer,
            self._handle,
            max_concurrency=8,
        )
        await self._puller.start()

    async def stop(self, timeout: float = 30.0) -> None:
        if self._puller is not None:
            await self._puller.stop(timeout=timeout)
            self._puller = None

    async def _handle(self, msg: Msg) -> None:
        try:
            advisory: Any = decode_json(msg.data, object)
            seq = int(advisory["stream_seq"])
            deliveries = int(advisory.get("deliveries") or 0)
        except (ValueError, KeyError, TypeError) as exc:  # msgspec.DecodeError included
            log.error("controller.bad_advisory", error=str(exc))
            await msg.term()
            return
        stream = self.topology.commands_stream
        try:
            raw = await self.js.get_msg(stream, seq)
        except NotFoundError:
            await msg.ack()  # already removed (handled before a crash, or acked late by a worker)
            return
        try:
            cmd = decode_command(raw.data or b"")
        except msgspec.DecodeError as exc:  # ValidationError, invalid UTF-8, nested too deeply included
            log.error("controller.poison_unreadable", seq=seq, error=str(exc))
            await self.js.delete_msg(stream, seq)
            await msg.ack()
            return
        event = failure_for(cmd, deliveries)
        outbox = Outbox(self.js, self.topology)
        outbox.event(event)
        await outbox.flush()
        log.warning(
            "controller.poison_command",
            execution_id=cmd.execution_id,
            step_run_id=cmd.step_run_id,
            deliveries=deliveries,
        )
        try:
            await self.js.delete_msg(stream, seq)
        except NotFoundError:
            pass
        await msg.ack()
