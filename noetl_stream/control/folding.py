"""The controller's input events, filed as they arrive and folded by batches.

Each event is filed in its execution's queue as nats-py parses it (`Folding.file`, the partitions'
pullers' intake: stream order, no task per event). The first event filed in a turn of the event loop
starts a batch, a task of the controller's that, at the next turn, folds every execution that got
events meanwhile, of every partition held, and commits them as a group (`Folding.fold_all`, then
`commit.GroupCommit.run`). An execution being folded stays claimed: its later events wait in its queue,
folded right after. A partition's stop waits for the batches
folding its executions, then cancels them (`end_batches_of`); a cancelled batch forgets what it was
folding and hands its events back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import structlog
from nats.aio.msg import Msg

from noetl_stream.control.commit import CommitParts, GroupCommit, Item
from noetl_stream.control.core.reducer import ITERATION_RESULTS, folds
from noetl_stream.jetstream.fastpath import ack_soon, nak_soon, stream_seq, term_soon
from noetl_stream.protocol.wire import decode_event

log = structlog.get_logger(__name__)

__all__ = ["Folding"]


class _Batch:
    """A turn's work: the executions it folds, each with its claimed queue (the one in `_queues` while it
    is this batch's), and its task."""

    __slots__ = ("claims", "task")

    def __init__(self) -> None:
        self.claims: dict[str, list[Item]] = {}
        self.task: asyncio.Task[None] | None = None


def _nak_quietly(msg: Msg) -> None:
    """Hand a delivery back at once (one not settled yet; a closed connection: it comes back anyway)."""
    with contextlib.suppress(Exception):
        if not msg._ackd:
            nak_soon(msg)


class Folding:
    """A controller's filed events and the batches folding them."""

    def __init__(self, parts: CommitParts) -> None:
        self.parts = parts
        self.commit = GroupCommit(parts)
        self.queues: dict[str, list[Item]] = {}
        """Executions whose events a batch folds (claimed), and the events queued for it meanwhile."""
        self.ready: _Batch | None = None
        """The batch that folds, at the next turn, the executions that got events in this one."""
        self.batches: set[_Batch] = set()
        """Batches running (controller-owned tasks): a partition's stop waits for those folding its
        executions."""
        self.loop: asyncio.AbstractEventLoop | None = None
        """Set when the controller starts (kept: ``asyncio.get_running_loop()`` costs a system call)."""

    async def write_quietly(self, eid: str, write: Callable[[], Awaitable[Any]]) -> None:
        """Run `write` (a quiet execution's snapshot) with the execution claimed, so no fold runs meanwhile;
        what comes during the write is folded right after, by a batch of its own."""
        if eid in self.queues:
            return  # being folded: its fold writes it
        queue: list[Item] = []
        self.queues[eid] = queue
        try:
            await write()
        finally:
            if self.queues.get(eid) is queue:  # (a partition's stop may have taken it back)
                if queue:
                    self.start_batch().claims[eid] = queue
                else:
                    del self.queues[eid]

    def unclaim_partition(self, partition: int) -> None:
        """Forget the claims left on a partition that was stopped (a quiet write's: its writer sees the
        claim is no longer its own) and hand back what was filed behind them (a nak: redelivered to the
        next owner at once, not after AckWait)."""
        partition_of = self.parts.topology.partition_of
        for eid in [e for e in self.queues if partition_of(e) == partition]:
            for msg, _, _ in self.queues.pop(eid):
                _nak_quietly(msg)

    async def end_batches_of(self, partition: int, deadline: float, lost: asyncio.Event) -> None:
        """Wait for the batches folding executions of `partition` until `deadline` (loop time), or until
        `lost` is set (the partition's lease is gone), then cancel those still running."""
        partition_of = self.parts.topology.partition_of
        loop = asyncio.get_running_loop()
        cut: asyncio.Task[Any] | None = None
        try:
            while True:
                tasks = [
                    b.task
                    for b in self.batches
                    if b.task is not None and any(partition_of(e) == partition for e in b.claims)
                ]
                if not tasks:
                    return
                left = deadline - loop.time()
                if left <= 0 or lost.is_set():
                    for task in tasks:
                        task.cancel()
                    await asyncio.wait(tasks)
                    return
                cut = cut or loop.create_task(lost.wait())
                await asyncio.wait([*tasks, cut], timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if cut is not None:
                cut.cancel()

    # -- filing -----------------------------------------------------------------------------------
    def file(self, msg: Msg) -> None:
        """File an input event in its execution's queue as it is parsed (the puller's intake: stream
        order, no task per event). The first event filed in a turn of the event loop starts the batch that
        folds, at the next turn, every execution that got events meanwhile (`fold_all`)."""
        try:
            event = decode_event(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.error("controller.bad_event", subject=msg.subject, error=str(exc))
            term_soon(msg)
            return
        eid = event.execution_id
        named = self.parts.topology.stored_event_names(msg.subject)
        if named is not None and named != (eid, event.name):  # the subject is what consumers filter on
            log.error(
                "controller.bad_event",
                subject=msg.subject,
                error=f"the message is event {event.name!r} of execution {eid!r}, not what its subject names",
            )
            term_soon(msg)
            return
        if (
            event.name in ITERATION_RESULTS
            and (state := self.parts.cache.states.get(eid)) is not None
            and not folds(state, event)
        ):
            # A local loop's iteration (most of a local loop's traffic here): nothing to fold or publish.
            # The state is current for it: the fold that made a loop distributed ran before its commands.
            ack_soon(msg)
            return
        item = (msg, event, stream_seq(msg))
        queue = self.queues.get(eid)
        if queue is not None:
            queue.append(item)  # the batch folding this execution takes it next
            return
        queue = self.queues[eid] = [item]
        batch = self.ready
        if batch is None:
            batch = self.ready = self.start_batch()  # it starts at the next turn: this one's events join
        batch.claims[eid] = queue

    def start_batch(self) -> _Batch:
        """A batch the controller owns (not a partition's puller: it folds executions of every partition
        held, and one partition's stop must not cancel another's folds), started at the next turn."""
        batch = _Batch()
        loop = self.loop
        assert loop is not None  # (started)
        batch.task = loop.create_task(self.fold_all(batch))
        self.batches.add(batch)
        batch.task.add_done_callback(functools.partial(self._batch_done, batch))
        return batch

    def _batch_done(self, batch: _Batch, task: asyncio.Task[None]) -> None:
        """A batch ended (also one cancelled before it started): nothing of it stays claimed."""
        self.batches.discard(batch)
        if self.ready is batch:
            self.ready = None
        self._unclaim(batch)
        if not task.cancelled() and task.exception() is not None:
            log.error("controller.batch_crashed", error=repr(task.exception()))

    def _unclaim(self, batch: _Batch) -> None:
        """Release the batch's claims (only the queues it still owns) and hand back what they hold: those
        events were not folded (unacked; a nak brings them back at once instead of after AckWait)."""
        for eid, queue in batch.claims.items():
            if self.queues.get(eid) is queue:
                del self.queues[eid]
            for msg, _, _ in queue:
                _nak_quietly(msg)
        batch.claims.clear()

    async def fold_all(self, batch: _Batch) -> None:
        """Fold what has queued up for each execution the batch claims, publish every effect with one
        flush, then ack; again for those that got more meanwhile. Under load this is a group commit: the
        events of many executions, of every partition held, cost one flush.

        An execution whose effects need the object store (a large result, a loop's assembled result, a
        large command) is flushed on its own after the others, so no other execution waits for it.
        Cancelled (a partition's stop, a shutdown), the executions it was folding are forgotten (their
        state may be ahead of what is stored: rebuilt from the snapshot and the stream) and their events
        handed back."""
        if self.ready is batch:
            self.ready = None  # closed: events filed from now on start another batch
        claims = batch.claims
        taken: dict[str, list[Item]] = {}
        try:
            eids = list(claims)
            while eids:
                for eid in eids:
                    queue = claims[eid]
                    taken[eid] = list(queue)
                    queue.clear()
                await self.commit.run(list(taken.items()))
                eids = []
                for eid in taken:
                    queue = claims[eid]
                    if queue:
                        eids.append(eid)  # more came meanwhile: still claimed, folded next
                    else:
                        if self.queues.get(eid) is queue:
                            del self.queues[eid]
                        del claims[eid]
                taken = {}
        except BaseException:
            for eid, items in taken.items():
                self.parts.cache.drop(eid)
                for msg, _, _ in items:
                    _nak_quietly(msg)
            raise
