"""Child executions for ``kind: playbook`` tasks: submit once, then wait for the child's end (`run`) or
not (`start`, a fire-and-forget task).

The child's id is derived from the parent's execution, pipeline run, task and attempt, so a
parent command redelivered after a worker crash finds the same child (running or finished)
instead of starting another. While it waits, the parent gives its worker slot back (see
``WorkerServices.release_slot``): a pool with one slot still runs the child.

A wait cut short for any reason but the worker's shutdown (the task's ``timeout_s``, the step's
``lifecycle.timeout_s``, the parent's execution ending) cancels the child: no child runs on unwatched.
On shutdown (`handing_back`) the child keeps running: the parent's command is redelivered and waits for
it again. A parent that ends while no worker waits for its child (the worker was killed) has its
running children cancelled by the controllers that hold them (`control/children.py`). No child is
started for an execution that has ended (``stop_check``), nor from a request larger than a NATS message
(`ChildNotStartedError`).

Nested loops (003 §6.4): a child started from inside a loop iteration gets that iteration's ``iter``
in its request (``parent_iter``, recorded with ``playbook.execution.requested``), and its steps read
it as ``iter.parent``. The iteration running the task is `current_iteration` (set by the worker around
each iteration's pipeline); above `PARENT_ITER_INLINE` bytes it travels as a result reference.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from contextvars import ContextVar, Token
from typing import Any

import msgspec
import structlog
from nats.aio.client import Client as NATS
from nats.js import api
from nats.js.errors import NotFoundError

from noetl_stream.errors import NoetlError
from noetl_stream.jetstream.outbox import Outbox
from noetl_stream.jetstream.publish import publish_stored
from noetl_stream.kv.results import ResultStore
from noetl_stream.protocol import events as E
from noetl_stream.protocol.errorinfo import ErrorInfo
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import (
    Event,
    ExecutionRequest,
    control_event,
    decode_event,
    encode,
    parent_ended_cancel,
    request_msg_id,
)

log = structlog.get_logger(__name__)

STOP_POLL_S = 0.25
CANCEL_WITHIN_S = 5.0
"""How long a task cancelled while waiting for its child tries to publish the child's cancel."""
HEADER_ROOM = 1024
"""Bytes of a message's limit kept for headers, and for the intake's wrapping of a request into its
``playbook.execution.requested`` event (as the intake's own ``HEADER_ROOM``)."""
PARENT_ITER_INLINE = 16 * 1024
"""A parent iteration larger than this (encoded) goes to the results object store; the request carries
its reference (it is repeated in every command of the child)."""

current_iteration: ContextVar[dict[str, Any] | None] = ContextVar("noetl_current_iteration", default=None)
"""The ``iter`` of the loop iteration whose pipeline runs in this task (with ``parent`` when nested),
or, outside a loop, the nearest enclosing one (a child's ``iter.parent``); None when there is none."""


class in_iteration:  # used like a function: ``with in_iteration(scope):``
    """Run the body as (inside) the loop iteration `scope`: children it starts get it as ``iter.parent``.
    Nothing is set when `scope` is current already (every step outside a loop, a command's usual case)."""

    __slots__ = ("_scope", "_token")

    def __init__(self, scope: dict[str, Any] | None) -> None:
        self._scope = scope
        self._token: Token[dict[str, Any] | None] | None = None

    def __enter__(self) -> None:
        if current_iteration.get() is not self._scope:
            self._token = current_iteration.set(self._scope)

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            current_iteration.reset(self._token)


@contextlib.asynccontextmanager
async def _no_release() -> AsyncIterator[None]:
    yield


def _never() -> bool:
    return False


def _rejection(first: Event) -> dict[str, Any] | None:
    """The error of a child whose first record (`first`) rejects it; None for one that was accepted."""
    error: Any = None
    if first.name == E.EXECUTION_REQUESTED:
        error = first.payload.get("rejected")
    elif first.name == E.REQUEST_REJECTED or first.payload.get("status") == "rejected":
        error = first.payload.get("error") or ErrorInfo(kind="rejected", message="rejected").to_dict()
    return error if isinstance(error, dict) else None


class ChildNotStartedError(NoetlError):
    """The child was not requested: its parent's execution has ended (`kind` ``cancelled``) or the
    request does not fit in a NATS message (``payload_too_large``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class ChildRunner:
    """Starts child executions and waits for their ends.

    `release_slot` gives the waiting task's worker slot (and its place in the pull window) to other
    commands; `handing_back` is true while the worker is shutting down and cancels its running tasks
    (their commands are redelivered, so their children are left to run).
    """

    def __init__(
        self,
        nc: NATS,
        topology: Topology,
        release_slot: Callable[[], AbstractAsyncContextManager[Any]] | None = None,
        handing_back: Callable[[], bool] | None = None,
    ) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.topology = topology
        self.release_slot = release_slot or _no_release
        self.handing_back = handing_back or _never
        self._results: ResultStore | None = None

    async def run(
        self,
        request: ExecutionRequest,
        timeout: float | None = None,
        stop_check: Callable[[], str | None] | None = None,
    ) -> Event:
        """Start the child unless it was already requested; return its ``playbook.processed`` event.

        If the parent execution ends meanwhile (``stop_check`` gives a reason), the child is cancelled.
        """
        child_id, parent = request.execution_id, request.parent_execution_id
        assert child_id is not None
        done: asyncio.Future[Event] = asyncio.get_running_loop().create_future()

        async def on_msg(msg: Any) -> None:
            try:
                ev = decode_event(msg.data)
            except msgspec.DecodeError:
                return
            if not done.done():
                done.set_result(ev)

        subject = self.topology.stored_event_filter(child_id, E.PLAYBOOK_PROCESSED)
        sub = await self.js.subscribe(
            subject,
            stream=self.topology.events_stream,
            cb=on_msg,
            ordered_consumer=True,
            deliver_policy=api.DeliverPolicy.ALL,
        )
        requested = False
        try:
            if await self._already_requested(child_id):
                requested = True  # a redelivered command: wait for the child it started
            else:
                request = await self._with_parent_iter(request)
                data = encode(request)
                self._check_startable(request, data, stop_check)
                requested = True  # (if this is cut short, the child may exist all the same)
                await publish_stored(self.nc, self.topology.request_subject, data, request_msg_id(child_id))
            async with self.release_slot(), asyncio.timeout(timeout):
                while True:
                    try:
                        return await asyncio.wait_for(asyncio.shield(done), STOP_POLL_S)
                    except TimeoutError:
                        reason = stop_check() if stop_check is not None else None
                        if reason is not None:
                            await self.cancel(
                                child_id, f"parent execution {parent} ended: {reason}", parent_ended=True
                            )
                            return await done
        except asyncio.CancelledError:
            if requested and not self.handing_back():
                reason = stop_check() if stop_check is not None else None
                why = (
                    f"parent execution {parent} ended: {reason}"
                    if reason is not None
                    else "the parent task stopped waiting for it (its timeout_s or its step's "
                    "lifecycle.timeout_s ran out)"
                )
                await self._cancel_quietly(child_id, why, parent_ended=reason is not None)
            raise
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def start(
        self,
        request: ExecutionRequest,
        timeout: float | None = None,
        stop_check: Callable[[], str | None] | None = None,
    ) -> dict[str, Any] | None:
        """Start the child unless it was already requested, and wait until the controller has decided its
        request, not for its end (a fire-and-forget task): None once it is accepted, else the rejection's
        error. Until then the parent's task runs, so the parent has not ended: intake starts no child of
        an ended parent, even one that succeeded. Once accepted it runs to its end, unless its parent ends
        with any status but ``success`` while it runs (`control/children.py`)."""
        child_id = request.execution_id
        assert child_id is not None
        decided: asyncio.Future[Event] = asyncio.get_running_loop().create_future()

        async def on_msg(msg: Any) -> None:
            try:
                ev = decode_event(msg.data)
            except msgspec.DecodeError:
                return
            if not decided.done():
                decided.set_result(ev)

        sub = await self.js.subscribe(
            self.topology.execution_claim_filter(child_id),  # its first record decides it
            stream=self.topology.events_stream,
            cb=on_msg,
            ordered_consumer=True,
            deliver_policy=api.DeliverPolicy.ALL,
        )
        requested = False
        try:
            if await self._already_requested(child_id):
                requested = True  # a redelivered command: the child it started runs on
            else:
                request = await self._with_parent_iter(request)
                data = encode(request)
                self._check_startable(request, data, stop_check)
                requested = True
                await publish_stored(self.nc, self.topology.request_subject, data, request_msg_id(child_id))
            async with asyncio.timeout(timeout):
                ev = await decided
        except asyncio.CancelledError:
            if requested and not self.handing_back():
                why = "the parent task stopped before the child was started"
                await self._cancel_quietly(
                    child_id, why, parent_ended=stop_check is not None and stop_check() is not None
                )
            raise
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        return _rejection(ev)

    def _check_startable(
        self, request: ExecutionRequest, data: bytes, stop_check: Callable[[], str | None] | None
    ) -> None:
        """Raise `ChildNotStartedError` when the child must not be requested (just before it would be)."""
        reason = stop_check() if stop_check is not None else None
        if reason is not None:
            raise ChildNotStartedError("cancelled", f"not started: {reason}")
        limit = self.nc.max_payload - HEADER_ROOM
        if len(data) > limit:
            args = len(encode(request.payload))
            raise ChildNotStartedError(
                "payload_too_large",
                f"not started: its request is {len(data)} bytes (its args {args}) and a NATS message "
                f"takes at most {limit} (the server's max_payload, less {HEADER_ROOM} for headers). "
                "Keep the args small: pass the child a key, path or URL it reads the large value from, "
                "or produce the value in the child itself",
            )

    async def _cancel_quietly(self, child_id: str, reason: str, parent_ended: bool = False) -> None:
        """Cancel the child from a task being cancelled: shielded, bounded, errors only logged."""
        try:
            async with asyncio.timeout(CANCEL_WITHIN_S):
                await asyncio.shield(self.cancel(child_id, reason, parent_ended=parent_ended))
        except Exception as exc:  # NATS down: the child runs on, as after a worker crash
            log.warning(
                "child.cancel_failed", child_execution_id=child_id, error=str(exc) or type(exc).__name__
            )

    async def _with_parent_iter(self, request: ExecutionRequest) -> ExecutionRequest:
        """`request` with the iteration it is started from (`current_iteration`), unless it names one."""
        scope = current_iteration.get()
        if scope is None or request.parent_iter is not None:
            return request
        data = encode(scope)
        if len(data) <= PARENT_ITER_INLINE:
            return msgspec.structs.replace(request, parent_iter=scope)
        if self._results is None:
            self._results = ResultStore(self.js, self.topology)
        key = f"{request.parent_execution_id}/{request.parent_step_run_id}/{request.execution_id}/iter"
        return msgspec.structs.replace(request, parent_iter=await self._results.put_encoded(key, data))

    async def cancel(self, child_id: str, reason: str, *, parent_ended: bool = False) -> None:
        """Record the child's cancel. For the parent's end (`parent_ended`) it is the cancel the controller
        holding the child writes too (`parent_ended_cancel`): the first stored is the one recorded."""
        if parent_ended:
            ev = parent_ended_cancel(child_id, reason, source="worker")
        else:
            ev = control_event(child_id, E.EXECUTION_CANCEL_REQUESTED, reason, source="worker")
        outbox = Outbox(self.js, self.topology)
        outbox.event(ev)
        await outbox.flush()

    async def _already_requested(self, child_id: str) -> bool:
        subject = self.topology.stored_event_filter(child_id, E.EXECUTION_REQUESTED)
        try:
            await self.js.get_last_msg(self.topology.events_stream, subject)
        except NotFoundError:
            return False
        return True
