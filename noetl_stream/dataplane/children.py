"""Child executions for ``kind: playbook`` tasks: submit once, wait for the child's end.

The child's id is derived from the parent's execution, pipeline run, task and attempt, so a
parent command redelivered after a worker crash finds the same child (running or finished)
instead of starting another. While it waits, the parent gives its worker slot back (see
``WorkerServices.release_slot``): a pool with one slot still runs the child.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.js import api
from nats.js.errors import NotFoundError

from noetl_stream import events as E
from noetl_stream.subjects import Topology
from noetl_stream.wire import Event, ExecutionRequest, decode_event, encode


@contextlib.asynccontextmanager
async def _no_release() -> AsyncIterator[None]:
    yield


class ChildRunner:
    def __init__(
        self,
        nc: NATS,
        topology: Topology,
        release_slot: Callable[[], AbstractAsyncContextManager[Any]] | None = None,
    ) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.topology = topology
        self.release_slot = release_slot or _no_release

    async def run(self, request: ExecutionRequest, timeout: float | None = None) -> Event:
        """Start the child unless it was already requested; return its ``playbook.processed`` event."""
        child_id = request.execution_id
        assert child_id is not None
        done: asyncio.Future[Event] = asyncio.get_running_loop().create_future()

        async def on_msg(msg: Any) -> None:
            try:
                ev = decode_event(msg.data)
            except msgspec.DecodeError:
                return
            if not done.done():
                done.set_result(ev)

        subject = self.topology.event_subject(child_id, E.PLAYBOOK_PROCESSED)
        sub = await self.js.subscribe(
            subject,
            stream=self.topology.events_stream,
            cb=on_msg,
            ordered_consumer=True,
            deliver_policy=api.DeliverPolicy.ALL,
        )
        try:
            if not await self._already_requested(child_id):
                await self.js.publish(
                    self.topology.request_subject,
                    encode(request),
                    headers={"Nats-Msg-Id": f"request:{child_id}"},
                )
            async with self.release_slot(), asyncio.timeout(timeout):
                return await done
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _already_requested(self, child_id: str) -> bool:
        subject = self.topology.event_subject(child_id, E.EXECUTION_REQUESTED)
        try:
            await self.js.get_last_msg(self.topology.events_stream, subject)
        except NotFoundError:
            return False
        return True
