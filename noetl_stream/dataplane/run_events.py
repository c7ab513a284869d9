"""A command run's worker events: queued as they happen, fitted under the size limits, published.

`RunEvents.event` queues an event (and feeds the run's trace span, if any); the `Worker` (worker.py)
publishes the queue while the command runs and when it ends (`publish_pending`, or
`publish_pending_nowait` to join the turn's write), carrying a run's events inside its boundary's
message unless ``--task-events separate`` (`carried.py`); an event with a large result is fitted first
(`EventFitter`, fitting.py). A local loop's finished iteration is recorded before its slot takes the next
item (`record`), together with the others that finish in the same turn of the event loop: one message
for all of them (a group commit), so a killed worker's next delivery skips them, at the cost of one
write per turn rather than four messages per iteration.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from noetl_stream.dataplane.fitting import MAX_EVENT_BYTES, EventFitter
from noetl_stream.jetstream.outbox import Outbox
from noetl_stream.protocol import events as E
from noetl_stream.protocol.carried import ITERATIONS_MAX_BYTES, carry
from noetl_stream.protocol.wire import Command, Event, encode, make_event

if TYPE_CHECKING:
    from noetl_stream.dataplane.runparts import RunParts
    from noetl_stream.tracing import StepTrace


class RunEvents:
    """The worker events of one delivery of a command, from the queue to the events stream."""

    def __init__(
        self,
        parts: RunParts,
        cmd: Command,
        outbox: Outbox,
        fitter: EventFitter,
        trace: StepTrace | None,
        trace_id: str | None,
        id_suffix: str,
    ) -> None:
        self.parts = parts
        self.cmd = cmd
        self.outbox = outbox
        self.fitter = fitter
        self.trace = trace
        self.trace_id = trace_id
        self._id_suffix = id_suffix
        """Appended to each event's scope: a redelivery's events get ids of their own (`CommandRun`)."""
        self.pending: list[Event] = []
        self._unconfirmed: list[tuple[Event, bytes]] = []
        """What `publish_pending_nowait` published, kept until it is known to be stored."""
        self.local_loop = cmd.iteration is None and cmd.step_def is not None and cmd.step_def.loop is not None
        """A local loop's run (every iteration here): its iteration records may be carried (`carry`); a
        distributed loop's iteration boundaries never are (the controller folds them)."""
        self._waiter: asyncio.Future[None] | None = None
        """Settled when the records asked for in this turn are written (`record`)."""
        self._recording: asyncio.Future[None] | None = None
        """`record`'s writer: what is published after it waits for it (stream order)."""
        self._publishing: asyncio.Future[None] | None = None
        """`publish_pending` in progress: `record`'s writer waits for it (what it took is older)."""
        self._unrecorded: list[tuple[Event, bytes]] = []
        """Messages a failed `record` write did not publish: published first, as they were (a carrier's
        id names the same message on every try)."""

    def event(
        self,
        name: str,
        entity_type: str,
        entity_id: str,
        status: str,
        scope: str,
        payload: dict[str, Any],
        task_run_id: str | None = None,
        at: tuple[str, int] | None = None,
        *,
        of_step: bool = True,
    ) -> None:
        """Queue a worker event; `at` (ISO timestamp, epoch ns): when it happened, if not now (a held
        task event written later, `TaskEvents`); `of_step` false: an event of no step (a keychain check's
        answer), with the command's run id all the same."""
        cmd = self.cmd
        if self.trace is not None:
            self.trace.on_event(name, status, entity_id, payload, at[1] if at is not None else None)
        if status == "error" and name in _FAILURES:
            _log_failure(self.parts.log, name, payload)
        self.pending.append(
            make_event(
                cmd.execution_id,
                name,
                source="worker",
                entity_type=entity_type,
                entity_id=entity_id,
                status=status,
                scope=scope + self._id_suffix,
                payload=payload,
                timestamp=None if at is None else at[0],
                step=cmd.step if of_step else None,
                step_run_id=cmd.step_run_id,
                task_run_id=task_run_id,
                trace_id=self.trace_id,
                worker=self.parts.name,
            )
        )

    async def send_pending_now(self) -> None:
        await self._recorded()
        pending, self.pending = self.pending, []
        for ev in pending:
            fitted, data = await self.fitter.fit(ev)
            await self.outbox.send_now(fitted, data)

    async def record(self) -> None:
        """Publish what is queued (a local loop's finished iteration) with what the others that ask in the
        same turn of the event loop queued: one write, their events carried in one message. Returns once
        it is written, not acked (`Outbox.send_now`; the command's final flush confirms it), so that the
        loop's slot takes its next item only then: at most as many iterations as run at once are ever
        finished and not yet recorded."""
        waiter = self._waiter
        if waiter is None:
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            if self._recording is None:
                self._recording = loop.create_task(self._record())  # (it starts at the next turn)
        await asyncio.shield(waiter)

    async def _record(self) -> None:
        try:
            while (waiter := self._waiter) is not None:
                self._waiter = None
                try:
                    await self._write_records()
                except Exception as exc:  # (not the loop's: the command's final flush reports it)
                    self.parts.log.debug(
                        "worker.iteration_record_failed", error=str(exc) or type(exc).__name__
                    )
                finally:
                    if not waiter.done():
                        waiter.set_result(None)
        finally:
            self._recording = None

    async def _write_records(self) -> None:
        if self._publishing is not None:  # (what it took goes first: the stream keeps their order)
            await asyncio.shield(self._publishing)
        if self._unrecorded:
            return  # a write failed: what follows goes with the final flush, after it
        pending, self.pending = self.pending, []
        ready = await self._encoded(pending)
        if self.parts.carry:
            ready = carry(ready, MAX_EVENT_BYTES, ITERATIONS_MAX_BYTES, iterations=self.local_loop)
        for k, (ev, data) in enumerate(ready):
            try:
                await self.outbox.send_now(ev, data)
            except BaseException:  # (cancelled too)
                self._unrecorded = ready[k:]
                raise

    async def _recorded(self) -> None:
        """Wait for `record`'s writes in progress: what is published next comes after them."""
        if self._recording is not None:
            await asyncio.shield(self._recording)

    async def _encoded(self, events: list[Event]) -> list[tuple[Event, bytes]]:
        """Each event with its encoding, one with a large result fitted first (stored by reference)."""
        limit = self.fitter.inline_limit
        ready: list[tuple[Event, bytes]] = []
        for ev in events:
            data = encode(ev)
            if len(data) <= limit:  # the usual case, without a coroutine per event
                ready.append((ev, data))
            else:
                ready.append(await self.fitter.fit(ev, data))
        return ready

    def publish_pending_nowait(self) -> asyncio.Future[Any] | None:
        """`publish_pending` without waiting: the events join this turn's write, and the returned future
        settles when they are stored (or fails: then `publish_pending` them). None, having published
        nothing, when they need more first (a large result for the object store, progress sent before,
        a publisher that has not looked at the stream yet)."""
        outbox = self.outbox
        if outbox.sent or self._recording is not None or self._unrecorded:
            return None
        limit = self.fitter.inline_limit
        ready: list[tuple[Event, bytes]] = []
        for ev in self.pending:
            data = encode(ev)
            if len(data) > limit:
                return None
            ready.append((ev, data))
        if self.parts.carry:
            ready = carry(ready, MAX_EVENT_BYTES, iterations=self.local_loop)
        for ev, data in ready:
            outbox.event(ev, data)
        fut = outbox.flush_nowait()
        if fut is None:
            outbox.clear()
            return None
        self.pending = []
        self._unconfirmed = ready
        return fut

    async def publish_unconfirmed(self) -> None:
        """Publish again, waiting and retrying as `publish_pending`, what `publish_pending_nowait` published
        when its future failed (same ids: what was stored after all is dropped as a duplicate)."""
        ready, self._unconfirmed = self._unconfirmed, []
        for ev, data in ready:
            self.outbox.event(ev, data)
        await self.outbox.flush()

    async def publish_pending(self, *, progress: bool = False) -> None:
        """Publish what is queued and wait until it is stored. `progress` (the worker's watcher, while the
        command runs): nothing when `record`'s writer is busy — it publishes what is queued itself, and the
        watcher must not wait for a writer a busy loop keeps busy (its keep-alive comes after this)."""
        if progress and self._recording is not None:
            return
        await self._recorded()
        publishing = self._publishing = asyncio.get_running_loop().create_future()
        try:
            pending, self.pending = self.pending, []
            ready = await self._encoded(pending)
            if self.parts.carry:
                ready = carry(ready, MAX_EVENT_BYTES, iterations=self.local_loop)
            unrecorded, self._unrecorded = self._unrecorded, []
            for ev, data in unrecorded + ready:
                self.outbox.event(ev, data)
            try:
                await self.outbox.flush()
            except BaseException:
                # The next try publishes them again, as they were (the same ids name the same messages):
                # a progress publish that failed loses nothing the command's final flush could write.
                self._unrecorded = unrecorded + ready
                raise
        finally:
            self._publishing = None
            publishing.set_result(None)


_FAILURES = frozenset({E.STEP_FAILED, E.LOOP_ITERATION_FAILED, E.KEYCHAIN_FAILED})


def _log_failure(logger: Any, name: str, payload: dict[str, Any]) -> None:
    error = payload.get("error")
    if isinstance(error, dict):
        logger.warning(name, error_kind=error.get("kind"), error=error.get("message"))
    else:
        logger.warning(name, error=error)
