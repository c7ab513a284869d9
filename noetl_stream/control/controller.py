"""The controller: a thin NATS loop around the pure reducer.

For each input event (stream order, one execution at a time): load the execution's
state (memory, else snapshot + replay of the events after it), reduce, publish the
effects with deterministic ids, wait for their acks, snapshot, then ack the input.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import msgspec
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from noetl_stream import events as E
from noetl_stream.control.cache import ExecutionCache
from noetl_stream.control.children import ChildWatch
from noetl_stream.control.deadlines import Deadlines
from noetl_stream.control.intake import Intake
from noetl_stream.control.leases import Leases, default_controller_id
from noetl_stream.control.loopresults import SAFE_MESSAGE_BYTES, complete, fit
from noetl_stream.control.poison import PoisonHandler
from noetl_stream.control.pools import PoolWatch
from noetl_stream.control.reducer import (
    ITERATION_RESULTS,
    Effects,
    PlanCache,
    Reducer,
    folds,
)
from noetl_stream.control.snapshotting import RETENTION_REFRESH_S, SnapshotWriter
from noetl_stream.control.state import ExecutionState
from noetl_stream.kv.children import ChildIndex
from noetl_stream.kv.deadlines import DeadlineIndex
from noetl_stream.kv.provision import provisioned_topology
from noetl_stream.kv.results import ResultStore, is_ref
from noetl_stream.logs import bound
from noetl_stream.natsio import ack_soon, nak_soon, num_delivered, stream_seq, term_soon
from noetl_stream.outbox import Outbox
from noetl_stream.puller import ContinuousPuller
from noetl_stream.subjects import Topology
from noetl_stream.wire import Command, Event, decode_event, encode

log = structlog.get_logger(__name__)

__all__ = ["SAFE_MESSAGE_BYTES", "Controller"]


class _Batch:
    """A turn's work: the executions it folds, each with its claimed queue (the one in `_queues` while it
    is this batch's), and its task."""

    __slots__ = ("claims", "task")

    def __init__(self) -> None:
        self.claims: dict[str, list[tuple[Msg, Event, int]]] = {}
        self.task: asyncio.Task[None] | None = None


def _nak_quietly(msg: Msg) -> None:
    """Hand a delivery back at once (one not settled yet; a closed connection: it comes back anyway)."""
    with contextlib.suppress(Exception):
        if not msg._ackd:
            nak_soon(msg)


class _Folded:
    """One execution's fold of a batch: its state after, what to publish, and what it was before."""

    __slots__ = ("before", "effects", "ended_before", "state", "was_terminal")

    def __init__(self, before: tuple[int, int, int, str], was_terminal: bool, ended_before: bool) -> None:
        self.before = before
        self.was_terminal = was_terminal
        self.ended_before = ended_before
        self.state: ExecutionState | None = None
        self.effects: list[Effects] = []


class PartitionReleased(LookupError):
    """The execution's partition is not (validly) held here any more: a stop or a lost lease while its
    events were in flight. Nothing is acked; the partition's next owner folds them."""


def _released(partition: int) -> PartitionReleased:
    return PartitionReleased(f"partition {partition}: its lease is not (validly) held here")


class Controller:
    def __init__(
        self,
        nc: NATS,
        topology: Topology,
        *,
        default_pool: str = "default",
        concurrency: int = 256,
        snapshot_interval_s: float = 1.0,
        cache_size: int = 10_000,
        extensions: Iterable[str] = (),
        controller_id: str | None = None,
        retention_refresh_s: float = RETENTION_REFRESH_S,
    ) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.topology = topology
        self.reducer = Reducer(PlanCache(default_pool))
        self.concurrency = concurrency
        self.snapshot_interval_s = snapshot_interval_s
        self._queues: dict[str, list[tuple[Msg, Event, int]]] = {}
        """Executions whose events a handler folds (claimed), and the events queued for it meanwhile."""
        self._ready: _Batch | None = None
        """The batch that folds, at the next turn, the executions that got events in this one."""
        self._batches: set[_Batch] = set()
        """Batches running (controller-owned tasks): a partition's stop waits for those folding its
        executions."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self.controller_id = controller_id or default_controller_id()
        self._pullers: dict[int, ContinuousPuller] = {}
        self._fences: dict[int, int] = {}
        """Partitions this controller holds, and the fencing token (lease revision) of each."""
        self._partition_locks: dict[int, asyncio.Lock] = {}
        self._stopping: dict[int, ContinuousPuller] = {}
        """Partitions whose puller is being stopped (a lost lease aborts it)."""
        self.leases: Leases | None = None
        self.snapshots = SnapshotWriter(
            self.js,
            snapshot_interval_s,
            retention_refresh_s,
            self._fences,
            lambda partition: self.leases is None or self.leases.valid(partition),
            self._fenced_off,
        )
        self.results = ResultStore(self.js, topology)
        self.cache = ExecutionCache(
            self.js, self.reducer, self.results, self.snapshots, self.controller_id, self._fences, cache_size
        )
        self.states = self.cache.states
        self.intake = Intake(
            nc, topology, self.states, self.cache.changed, extensions=extensions, plans=self.reducer.plans
        )
        self.observer: Callable[[Event | None, list[Event], ExecutionState | None], None] | None = None
        """Called with each folded input event and the events the reducer wrote for it (metrics); with
        None and the effects a resume published (`ExecutionCache.on_resumed`)."""
        self.cache.on_resumed = self._observe_resumed
        self.poison = PoisonHandler(nc, topology)
        self.deadlines = Deadlines(
            self.js,
            topology,
            self.controller_id,
            fence_of=self._fence_of,
            is_terminal=self._is_terminal,
            spawn=self._spawn,
        )
        self.pools = PoolWatch(self.js, self._spawn)
        self.children = ChildWatch(
            nc,
            topology,
            self.controller_id,
            fence_of=self._fence_of,
            held=self._fences.__contains__,
            is_terminal=self._is_terminal,
        )
        self.cache.children = self.children
        self._background: set[asyncio.Task[None]] = set()
        self._stopped = asyncio.Event()
        self._grace_s = 30.0

    async def __aenter__(self) -> Controller:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def start(self) -> None:
        if self.leases is not None:
            return
        self._loop = asyncio.get_running_loop()
        # The partition count and lease TTL are the installation's (read from the server), not ours.
        self.topology = await provisioned_topology(self.js, self.topology)
        await self.snapshots.open(self.topology)
        self.cache.topology = self.topology
        assert self.snapshots.store is not None
        self.deadlines.open(DeadlineIndex(self.snapshots.store.kv), self.topology)
        self.children.open(ChildIndex(self.snapshots.store.kv), self.topology)
        self.pools.topology = self.topology
        await self.intake.start()
        await self.poison.start()
        await self.children.start()
        self.leases = Leases(
            self.nc,
            self.topology,
            self.topology.partitions,
            self.controller_id,
            self._start_partition,
            self._stop_partition,
        )
        try:
            await self.leases.start()
        except BaseException:  # e.g. a live controller with this id: leave nothing running
            await self.leases.stop()
            self.leases = None
            await self.intake.stop()
            await self.poison.stop()
            await self.children.stop()
            raise
        self._spawn(self.snapshots.refresh_retention())
        self._spawn(self._save_quiet())
        log.info(
            "controller.started",
            prefix=self.topology.prefix,
            controller=self.controller_id,
            partitions=sorted(self._fences),
            of=self.topology.partitions,
        )

    def _holds(self, partition: int) -> bool:
        """Ours, and by our clock nobody else can hold it yet (a stalled loop or failing renewals
        make this false before the watchdog has released the partition)."""
        return partition in self._fences and (self.leases is None or self.leases.valid(partition))

    def _observe_resumed(self, written: list[Event], state: ExecutionState | None) -> None:
        if self.observer is not None:
            self.observer(None, written, state)

    def holds_execution(self, eid: str) -> bool:
        """Whether this controller holds the partition of execution `eid` (metrics count only those)."""
        return self._holds(self.topology.partition_of(eid))

    def _partition_lock(self, partition: int) -> asyncio.Lock:
        """Starting a partition waits for the end of its previous stop (a lease lost and taken back)."""
        return self._partition_locks.setdefault(partition, asyncio.Lock())

    async def _start_partition(self, partition: int, fence: int) -> None:
        """This controller now holds ``partition``: pull its events (resuming what they lead to)."""
        async with self._partition_lock(partition):
            puller = ContinuousPuller(
                self.nc,
                self.topology.events_stream,
                self.topology.controller_events_consumer(partition),
                None,
                max_concurrency=self.concurrency,
                intake=self._file,  # an execution's events are filed in stream order as they arrive
            )
            self._fences[partition] = fence
            try:
                await puller.start()
            except BaseException:
                self._fences.pop(partition, None)
                await puller.stop(timeout=1.0)  # nothing half-started keeps pulling
                raise
            self._pullers[partition] = puller
        self.deadlines.acquired(partition)
        self.children.acquired(partition)

    async def _stop_partition(self, partition: int, graceful: bool) -> None:
        """Stop pulling ``partition`` and forget its executions (their next owner rebuilds them).

        Graceful on shutdown and rebalancing (the lease is still ours: in-flight folds finish and
        snapshots are written); otherwise the lease is lost and we stop before it can expire.
        """
        if not graceful and partition in self._stopping:
            self._stopping[partition].abort()  # a graceful stop in progress: its lease is gone now
        async with self._partition_lock(partition):
            # No new fold starts from here (they find no fence and hand their events back); the
            # folds already running finish (graceful, within the shutdown grace) or are cut short
            # well before the lease can expire on the server.
            fence = self._fences.pop(partition, None)
            puller = self._pullers.pop(partition, None)
            wait = self._grace_s if graceful else self.topology.lease_ttl_s * 0.1
            deadline = asyncio.get_running_loop().time() + 2 * wait  # (puller.stop may take 2 waits)
            if puller is not None:
                self._stopping[partition] = puller
                ttl = self.topology.lease_ttl_s
                # (no renewal runs meanwhile: even a graceful stop ends well before the key expires)
                # Graceful: the lease is renewed until we return. Lost: stop.timeout applies twice
                # (drain, then running handlers), and the folds check the lease themselves.
                try:
                    await puller.stop(timeout=self._grace_s if graceful else ttl * 0.1)
                finally:
                    self._stopping.pop(partition, None)
            self.deadlines.release(partition)
            self.children.release(partition)  # (a fold still running adds none: the fence is gone)
            # Batches fold executions of every partition held: wait for those folding this one's (they
            # find no fence now and hand the events back, or finish what they published), then cancel
            # what still runs (its executions are forgotten and their events handed back, whatever their
            # partition: rebuilt from the snapshot and the stream). No fold of this partition runs once
            # this returns.
            await self._end_batches_of(partition, deadline)
            for eid in [e for e in self._queues if self.topology.partition_of(e) == partition]:
                del self._queues[eid]  # a quiet snapshot's claim (its writer sees it is no longer its own)
            for eid in [e for e in self.states if self.topology.partition_of(e) == partition]:
                state = self.states.get(eid)
                try:
                    if (
                        state is not None
                        and graceful
                        and fence is not None
                        and eid in self.snapshots.written_at
                    ):
                        await self.snapshots.write(state, fence)
                except Exception as exc:  # whatever happens, nothing of the partition stays in memory
                    log.warning("controller.snapshot_failed", execution_id=eid, error=str(exc))
                finally:
                    self.cache.drop(eid)

    async def _end_batches_of(self, partition: int, deadline: float) -> None:
        partition_of = self.topology.partition_of
        loop = asyncio.get_running_loop()
        while True:
            tasks = [
                b.task
                for b in self._batches
                if b.task is not None and any(partition_of(e) == partition for e in b.claims)
            ]
            if not tasks:
                return
            left = deadline - loop.time()
            if left <= 0:
                for task in tasks:
                    task.cancel()
                await asyncio.wait(tasks)
                return
            await asyncio.wait(tasks, timeout=left)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def run(self) -> None:
        await self.start()
        await self._stopped.wait()

    async def shutdown(self, grace_s: float = 30.0) -> None:
        if self._stopped.is_set():
            return
        self._grace_s = grace_s
        self.deadlines.cancel_all()
        for task in list(self._background):
            task.cancel()
        await self.intake.stop()
        await self.poison.stop()
        if self.leases is not None:
            await self.leases.stop()  # each partition: stop pulling, write snapshots, free the lease
        await self.children.stop()
        await self._flush_snapshots()
        self._stopped.set()

    # -- one input event --------------------------------------------------------------------------
    def _file(self, msg: Msg) -> Coroutine[Any, Any, None] | None:
        """File an input event in its execution's queue as it is parsed (the puller's intake: stream
        order, no task per event). The first event of a partition in a turn of the event loop returns the
        work that folds, at the next turn, every execution that got events meanwhile (`_fold_all`)."""
        try:
            event = decode_event(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.error("controller.bad_event", subject=msg.subject, error=str(exc))
            term_soon(msg)
            return None
        eid = event.execution_id
        named = self.topology.stored_event_names(msg.subject)
        if named is not None and named != (eid, event.name):  # the subject is what consumers filter on
            log.error(
                "controller.bad_event",
                subject=msg.subject,
                error=f"the message is event {event.name!r} of execution {eid!r}, not what its subject names",
            )
            term_soon(msg)
            return None
        if (
            event.name in ITERATION_RESULTS
            and (state := self.states.get(eid)) is not None
            and not folds(state, event)
        ):
            # A local loop's iteration (most of a local loop's traffic here): nothing to fold or publish.
            # The state is current for it: the fold that made a loop distributed ran before its commands.
            ack_soon(msg)
            return None
        item = (msg, event, stream_seq(msg))
        queue = self._queues.get(eid)
        if queue is not None:
            queue.append(item)  # the batch folding this execution takes it next
            return None
        queue = self._queues[eid] = [item]
        batch = self._ready
        if batch is None:
            batch = self._ready = self._start_batch()  # it starts at the next turn: this one's events join
        batch.claims[eid] = queue
        return None

    def _start_batch(self) -> _Batch:
        """A batch the controller owns (not a partition's puller: it folds executions of every partition
        held, and one partition's stop must not cancel another's folds), started at the next turn."""
        batch = _Batch()
        loop = self._loop
        assert loop is not None  # (started)
        batch.task = loop.create_task(self._fold_all(batch))
        self._batches.add(batch)
        batch.task.add_done_callback(functools.partial(self._batch_done, batch))
        return batch

    def _batch_done(self, batch: _Batch, task: asyncio.Task[None]) -> None:
        """A batch ended (also one cancelled before it started): nothing of it stays claimed."""
        self._batches.discard(batch)
        if self._ready is batch:
            self._ready = None
        self._unclaim(batch)
        if not task.cancelled() and task.exception() is not None:
            log.error("controller.batch_crashed", error=repr(task.exception()))

    def _unclaim(self, batch: _Batch) -> None:
        """Release the batch's claims (only the queues it still owns) and hand back what they hold: those
        events were not folded (unacked; a nak brings them back at once instead of after AckWait)."""
        for eid, queue in batch.claims.items():
            if self._queues.get(eid) is queue:
                del self._queues[eid]
            for msg, _, _ in queue:
                _nak_quietly(msg)
        batch.claims.clear()

    async def _fold_all(self, batch: _Batch) -> None:
        """Fold what has queued up for each execution the batch claims, publish every effect with one
        flush, then ack; again for those that got more meanwhile. Under load this is a group commit: the
        events of many executions, of every partition held, cost one flush.

        An execution whose effects need the object store (a large result, a loop's assembled result, a
        large command) is flushed on its own after the others, so no other execution waits for it.
        Cancelled (a partition's stop, a shutdown), the executions it was folding are forgotten (their
        state may be ahead of what is stored: rebuilt from the snapshot and the stream) and their events
        handed back."""
        if self._ready is batch:
            self._ready = None  # closed: events filed from now on start another batch
        claims = batch.claims
        taken: dict[str, list[tuple[Msg, Event, int]]] = {}
        try:
            eids = list(claims)
            while eids:
                for eid in eids:
                    queue = claims[eid]
                    taken[eid] = list(queue)
                    queue.clear()
                await self._fold_batches(list(taken.items()))
                eids = []
                for eid in taken:
                    queue = claims[eid]
                    if queue:
                        eids.append(eid)  # more came meanwhile: still claimed, folded next
                    else:
                        if self._queues.get(eid) is queue:
                            del self._queues[eid]
                        del claims[eid]
                taken = {}
        except BaseException:
            for eid, items in taken.items():
                self.cache.drop(eid)
                for msg, _, _ in items:
                    _nak_quietly(msg)
            raise

    async def _fold_batches(self, batches: list[tuple[str, list[tuple[Msg, Event, int]]]]) -> None:
        partition_of = self.topology.partition_of
        folded: list[
            tuple[str, list[tuple[Msg, Event, int]], _Folded, int, list[tuple[Event | Command, bytes]]]
        ] = []
        alone: list[tuple[str, list[tuple[Msg, Event, int]], _Folded, int]] = []
        for eid, batch in batches:
            partition = partition_of(eid)
            fence = self._fence_of(partition)
            if fence is None:  # released while these were in flight: its next owner takes them
                await self._failed(eid, batch, _released(partition))
                continue
            with bound(execution_id=eid):  # on every log line of the fold
                try:
                    f = await self._fold(eid, batch)
                    ready = self._effects_now(f, fence)
                except Exception as exc:
                    await self._failed(eid, batch, exc)
                    continue
            if ready is not None:
                folded.append((eid, batch, f, fence, ready))
            else:
                alone.append((eid, batch, f, fence))
        if folded:
            # Checked again just before the write (the folds' loads and replays can take long), all without
            # a pause (no lease can be lost between a check and the write): nothing of a partition no
            # longer held is published; its executions are handed back after the write.
            outbox = Outbox(self.js, self.topology)
            publish, released = [], []
            for entry in folded:
                eid, _, _, fence, ready = entry
                if self._fence_of(partition_of(eid)) != fence:
                    released.append(entry)
                    continue
                self._queue_effects_now(eid, ready, outbox)
                publish.append(entry)
            if publish:
                try:
                    await outbox.flush()
                except Exception as exc:
                    for eid, batch, *_ in publish:
                        with bound(execution_id=eid):
                            await self._failed(eid, batch, exc)
                    publish = []
            for eid, batch, *_ in released:
                await self._failed(eid, batch, _released(partition_of(eid)))
            for eid, batch, f, fence, _ in publish:
                with bound(execution_id=eid):
                    try:
                        if self._fence_of(partition_of(eid)) != fence:
                            # not acked: the next owner re-derives the same (deduplicated) effects
                            raise _released(partition_of(eid))
                        await self._after(eid, batch, f, fence)
                    except Exception as exc:
                        await self._failed(eid, batch, exc)
        for eid, batch, f, fence in alone:
            with bound(execution_id=eid):
                try:
                    outbox = Outbox(self.js, self.topology)
                    await self._queue_effects(eid, f, fence, outbox)
                    if self._fence_of(partition_of(eid)) != fence:
                        raise _released(partition_of(eid))
                    await outbox.flush()
                    if self._fence_of(partition_of(eid)) != fence:
                        raise _released(partition_of(eid))
                    await self._after(eid, batch, f, fence)
                except Exception as exc:
                    await self._failed(eid, batch, exc)

    async def _failed(self, eid: str, batch: list[tuple[Msg, Event, int]], exc: Exception) -> None:
        """The batch's effects may not be stored: forget the in-memory state (it is rebuilt from the
        snapshot and the stream) and let JetStream redeliver the batch."""
        self.cache.drop(eid)
        delay = RETRY_DELAY_S
        if isinstance(exc, PartitionReleased):
            # The partition was released (a stop, a lost lease) while the batch was in flight: its next
            # owner folds it. Expected at every handover, not a failure.
            log.info("controller.batch_handed_back", execution_id=eid, events=len(batch))
        else:
            attempt = max(num_delivered(m) for m, _, _ in batch)
            delay = _retry_delay(attempt)
            log.warning(
                "controller.batch_failed",
                execution_id=eid,
                error=str(exc) or type(exc).__name__,
                attempt=attempt,
                retry_in_s=delay,
            )
        for msg, _, _ in batch:
            with contextlib.suppress(Exception):
                await msg.nak(delay=delay)

    async def _fold(self, eid: str, batch: list[tuple[Msg, Event, int]]) -> _Folded:
        """Load the execution (if it is not in memory) and fold the batch into it: what to publish."""
        first = batch[0][1]
        # A request delivered for the first time starts a new execution. A redelivered one may belong to an
        # execution whose later events a previous controller already handled: rebuild it from the stream.
        new = first.name == E.EXECUTION_REQUESTED and num_delivered(batch[0][0]) == 1
        state = self.states.get(eid)
        cached = state is not None
        if state is not None:  # (the usual case, without a coroutine)
            self.states.move_to_end(eid)
        else:
            state = await self.cache.load(eid, new)
        if state is None and first.name == E.EXECUTION_REQUESTED and "rejected" not in first.payload:
            request = first.payload.get("request")  # compiled off the loop when long (intake did)
            if isinstance(request, dict) and isinstance(text := request.get("playbook"), str):
                file = request.get("file") or request.get("path") or "<playbook>"
                exts = request.get("extensions")
                extensions = [e for e in exts if isinstance(e, str)] if isinstance(exts, list) else ()
                await self.reducer.plans.load_off_loop(text, str(file), extensions)
        if state is not None and not state.terminal and not self.cache.ready(state):
            await self.cache.ensure_plan(state)  # the plan cache may have evicted it
            await self.cache.ensure_items(state)
        # A state loaded from its snapshot may have folded later events already (resume): as changed.
        f = _Folded(
            before=_version(state if cached else None),
            was_terminal=cached and state is not None and state.terminal,
            ended_before=state is not None and state.terminal,  # loaded so (a late event): not a change
        )
        for _, event, seq in batch:
            if state is not None and seq and seq <= state.last_seq:
                continue  # already applied (a redelivery after a crash)
            # Raises only what says "load it first" (the batch is not acked and comes back); a reducer bug
            # fails the execution instead (`Reducer.apply`).
            state, fx = self.reducer.apply(state, event, seq)
            if fx.ignored is not None:
                log.info(
                    "controller.event_ignored",
                    event_name=event.name,
                    event_id=event.event_id,
                    step_run_id=event.step_run_id,
                    reason=fx.ignored,
                )
            if fx.error is not None:
                log.error(
                    "controller.reducer_error", execution_id=eid, event_name=event.name, exc_info=fx.error
                )
            if self.observer is not None:
                self.observer(event, fx.events, state)
            f.effects.append(fx)
        f.state = state
        return f

    def _effects_now(self, f: _Folded, fence: int) -> list[tuple[Event | Command, bytes]] | None:
        """The fold's effects encoded, if none needs the object store first (the usual case); None
        otherwise (`_queue_effects`)."""
        ready: list[tuple[Event | Command, bytes]] = []
        for fx in f.effects:
            if fx.blobs or fx.loop_results:
                return None
            for ev in fx.events:
                ev.controller, ev.fence = self.controller_id, fence
                data = encode(ev)
                if len(data) > SAFE_MESSAGE_BYTES:
                    return None
                ready.append((ev, data))
            for cmd in fx.commands:
                data = encode(cmd)
                if len(data) > SAFE_MESSAGE_BYTES:
                    return None
                ready.append((cmd, data))
        return ready

    def _queue_effects_now(
        self, eid: str, ready: list[tuple[Event | Command, bytes]], outbox: Outbox
    ) -> None:
        for item, data in ready:
            if isinstance(item, Event):
                outbox.event(item, data)
            else:
                outbox.command(item, data)
                self.pools.scheduled(item.pool, eid, item.step)

    async def _queue_effects(self, eid: str, f: _Folded, fence: int, outbox: Outbox) -> None:
        """Queue the fold's effects in `outbox`, storing first what goes to the object store."""
        for fx in f.effects:
            for blob in fx.blobs:  # before anything that depends on it is published or snapshotted
                await self.results.put_encoded(blob.key, blob.data)
            for ev in fx.events:
                ev.controller, ev.fence = self.controller_id, fence
                spec = fx.loop_results.get(ev.event_id)
                if spec is not None:
                    async with self.cache.replays:  # it reads the loop's events back (a consumer)
                        ev = await complete(self.js, self.topology, self.results, ev, spec)
                data = encode(ev)
                if len(data) > SAFE_MESSAGE_BYTES:  # a large result goes by reference
                    ev, data = await fit(self.results, ev, data)
                outbox.event(ev, data)
            for cmd in fx.commands:
                data = encode(cmd)
                if len(data) > SAFE_MESSAGE_BYTES:
                    cmd = await self._offload_command(cmd)
                    data = encode(cmd)
                outbox.command(cmd, data)
                self.pools.scheduled(cmd.pool, eid, cmd.step)

    async def _after(self, eid: str, batch: list[tuple[Msg, Event, int]], f: _Folded, fence: int) -> None:
        """The fold's effects are stored: record the state, index its deadline, write its snapshot when
        due, delete what it no longer needs, and ack the batch."""
        state = f.state
        if state is not None and _version(state) != f.before:
            if not f.ended_before:
                self.cache.changed[eid] = time.time()
            self.cache.remember(state)
            self.deadlines.arm_state(state)
            if state.deadline_at is not None:
                deadline = any(ev.name == E.EXECUTION_DEADLINE_EXCEEDED for _, ev, _ in batch)
                await self.deadlines.track(state, f.was_terminal, deadline)
            # Under the lease this fold published with. A final snapshot stored: keep a lean copy.
            if (
                not self.snapshots.after_fold_nowait(state)
                and await self.snapshots.after_fold(state, fence)
                and self.states.get(eid) is state
            ):
                keys = state.items_keys
                self.cache.retire(state)  # its results and loops are in the snapshot and the events
                await self.cache.delete_items(eid, keys)
        dropped = [key for fx in f.effects for key in fx.dropped]
        if dropped:  # a finished loop's items: what needs them now is rebuilt from the events
            await self.cache.delete_items(eid, dropped)
        for msg, _, _ in batch:
            ack_soon(msg)

    # -- reference-first --------------------------------------------------------------------------
    async def _offload_command(self, cmd: Command) -> Command:
        """Large step results a command would carry travel as references the worker resolves."""
        results = dict(cmd.results)
        for name, value in cmd.results.items():
            if not is_ref(value) and len(encode(value)) > 16 * 1024:
                results[name] = await self.results.put(f"{cmd.execution_id}/results/{name}", value)
        return msgspec.structs.replace(cmd, results=results)

    # -- deadlines --------------------------------------------------------------------------------
    def _fence_of(self, partition: int) -> int | None:
        return self._fences.get(partition) if self._holds(partition) else None

    def _is_terminal(self, execution_id: str) -> bool:
        state = self.states.get(execution_id)
        return state is not None and state.terminal

    async def _save_quiet(self) -> None:
        """Write the snapshots of executions that changed and then went quiet (`SnapshotWriter.quiet`).
        One being folded is left to its fold. One being written takes no fold meanwhile: its queue is
        claimed, and what comes in the meantime is folded right after the write."""
        while True:
            await asyncio.sleep(self.snapshots.interval_s / 2)
            for eid in self.snapshots.quiet():
                if eid in self._queues:
                    continue
                state = self.states.get(eid)
                if state is None or state.terminal:  # dropped, or its fold writes it
                    self.snapshots.unsaved.pop(eid, None)
                    continue
                queue: list[tuple[Msg, Event, int]] = []
                self._queues[eid] = queue
                try:
                    with bound(execution_id=eid):
                        if await self.snapshots.write(state):  # (logs its own failures: tried again)
                            self.snapshots.saved(eid)
                finally:
                    if self._queues.get(eid) is queue:  # (a partition's stop may have taken it back)
                        if queue:  # events that came during the write: a batch of their own
                            batch = self._start_batch()
                            batch.claims[eid] = queue
                        else:
                            del self._queues[eid]

    def _fenced_off(self, execution_id: str, partition: int | None) -> None:
        """A newer snapshot of the execution is stored: forget ours; a newer owner has the partition."""
        self.cache.drop(execution_id)
        if partition is not None and self.leases is not None:
            self._spawn(self.leases.lost(partition))

    async def _flush_snapshots(self) -> None:
        for eid in list(self.snapshots.written_at):
            state = self.states.get(eid)
            if state is not None:
                await self.snapshots.write(state)

    def status(self, execution_id: str) -> dict[str, Any] | None:
        state = self.states.get(execution_id)
        return None if state is None else msgspec.to_builtins(state)


RETRY_DELAY_S = 1.0
MAX_RETRY_DELAY_S = 30.0


def _retry_delay(attempt: int) -> float:
    """How long a batch whose fold failed waits before it is delivered again: 1 s after the first
    attempt, doubling to at most 30 s. A cause that lasts (a bucket deleted, a bug) costs one attempt
    and one log line per execution every 30 s, not every second; a brief one (NATS failing over) is
    retried soon."""
    return min(MAX_RETRY_DELAY_S, RETRY_DELAY_S * 2.0 ** max(0, attempt - 1))


def _version(state: ExecutionState | None) -> tuple[int, int, int, str]:
    """What changes when a fold applies something (a fold that applied nothing writes no snapshot)."""
    if state is None:
        return (0, -1, -1, "")
    return (id(state), state.events_applied, state.last_seq, state.status)
