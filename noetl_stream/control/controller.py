"""The controller: a thin NATS loop around the pure reducer.

For each input event (stream order, one execution at a time): load the execution's
state (memory, else snapshot + replay of the events after it), reduce, publish the
effects with deterministic ids, wait for their acks, snapshot, then ack the input.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import msgspec
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from noetl_stream import events as E
from noetl_stream.control.deadlines import Deadlines
from noetl_stream.control.intake import Intake
from noetl_stream.control.items import ItemsMissingError
from noetl_stream.control.leases import Leases, default_controller_id
from noetl_stream.control.loopresults import SAFE_MESSAGE_BYTES, complete, fit
from noetl_stream.control.poison import PoisonHandler
from noetl_stream.control.reducer import (
    ITERATION_RESULTS,
    PlanCache,
    Reducer,
    folds,
)
from noetl_stream.control.resume import resume
from noetl_stream.control.state import ExecutionState
from noetl_stream.errors import StateConflictError
from noetl_stream.kv.deadlines import DeadlineIndex
from noetl_stream.kv.provision import events_max_age_s, provisioned_topology
from noetl_stream.kv.results import ResultStore, is_ref
from noetl_stream.kv.snapshots import SnapshotStore
from noetl_stream.logs import bound
from noetl_stream.natsconn import ContinuousPuller, ack_soon, num_delivered, stream_seq
from noetl_stream.outbox import Outbox
from noetl_stream.subjects import Topology
from noetl_stream.wire import Command, Event, decode_event, encode

log = structlog.get_logger(__name__)

RETENTION_REFRESH_S = 300.0
"""How often a controller reads the events stream's ``max_age`` again (snapshot retention)."""

__all__ = ["SAFE_MESSAGE_BYTES", "Controller"]


class PartitionReleased(LookupError):
    """The execution's partition is not (validly) held here any more: a stop or a lost lease while its
    events were in flight. Nothing is acked; the partition's next owner folds them."""


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
        self.cache_size = cache_size
        self.states: OrderedDict[str, ExecutionState] = OrderedDict()
        self._queues: dict[str, list[tuple[Msg, Event, int]]] = {}
        self._snapshot_at: dict[str, float] = {}
        self._snapshots: SnapshotStore[ExecutionState] | None = None
        self._events_max_age_s = 0.0
        """The events stream's ``max_age`` (read at start, then every `retention_refresh_s`): a finished
        execution's snapshot lives as long."""
        self.retention_refresh_s = retention_refresh_s
        self._retired: set[str] = set()
        """Terminal executions whose final snapshot is written: their cached state is kept lean (no
        results, no runs) for the status queries, never folded into or written again."""
        self.controller_id = controller_id or default_controller_id()
        self._pullers: dict[int, ContinuousPuller] = {}
        self._fences: dict[int, int] = {}
        """Partitions this controller holds, and the fencing token (lease revision) of each."""
        self._partition_locks: dict[int, asyncio.Lock] = {}
        self._stopping: dict[int, ContinuousPuller] = {}
        """Partitions whose puller is being stopped (a lost lease aborts it)."""
        self.leases: Leases | None = None
        self.intake = Intake(nc, topology, self.states, extensions=extensions, plans=self.reducer.plans)
        self.observer: Callable[[Event, list[Event], ExecutionState | None], None] | None = None
        """Called with each folded input event and the events the reducer wrote for it (metrics)."""
        self.poison = PoisonHandler(nc, topology)
        self.results = ResultStore(self.js, topology)
        self.deadlines = Deadlines(
            self.js,
            topology,
            self.controller_id,
            fence_of=self._fence_of,
            is_terminal=self._is_terminal,
            spawn=self._spawn,
        )
        self._replays = asyncio.Semaphore(16)
        """Replays read history with ephemeral consumers: bound them (JetStream caps consumers per stream)."""
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
        # The partition count and lease TTL are the installation's (read from the server), not ours.
        self.topology = await provisioned_topology(self.js, self.topology)
        self._events_max_age_s = await events_max_age_s(self.js, self.topology)
        self._snapshots = await SnapshotStore.open(self.js, self.topology, ExecutionState)
        self.deadlines.open(DeadlineIndex(self._snapshots.kv), self.topology)
        await self.intake.start()
        await self.poison.start()
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
            raise
        self._spawn(self._refresh_retention())
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

    def _check_holds(self, eid: str) -> None:
        if not self._holds(self.topology.partition_of(eid)):
            raise PartitionReleased(f"execution {eid}: its partition's lease is not (validly) held here")

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
                self._handle,
                max_concurrency=self.concurrency,
                ordered=True,  # an execution's events must be filed in stream order (see _fold)
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
            for eid in [e for e in self.states if self.topology.partition_of(e) == partition]:
                state = self.states.get(eid)
                try:
                    if state is not None and graceful and fence is not None and eid in self._snapshot_at:
                        await self._write_snapshot(state, fence)
                except Exception as exc:  # whatever happens, nothing of the partition stays in memory
                    log.warning("controller.snapshot_failed", execution_id=eid, error=str(exc))
                finally:
                    self._drop(eid)
                    self._snapshot_at.pop(eid, None)
                    if self._snapshots is not None:
                        self._snapshots.forget(eid)

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
        await self._flush_snapshots()
        self._stopped.set()

    # -- one input event --------------------------------------------------------------------------
    async def _handle(self, msg: Msg) -> None:
        """Fold the event, and any that queue up for the same execution meanwhile, in stream order."""
        try:
            event = decode_event(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.error("controller.bad_event", subject=msg.subject, error=str(exc))
            await msg.term()
            return
        eid = event.execution_id
        if (
            event.name in ITERATION_RESULTS
            and (state := self.states.get(eid)) is not None
            and not folds(state, event)
        ):
            # A local loop's iteration (most of a local loop's traffic here): nothing to fold or publish.
            # The state is current for it: the fold that made a loop distributed ran before its commands.
            ack_soon(msg)
            return
        item = (msg, event, stream_seq(msg))
        queue = self._queues.get(eid)
        if queue is not None:
            queue.append(item)  # the handler draining this execution will fold it
            return
        queue = self._queues[eid] = [item]
        with bound(execution_id=eid):  # on every log line of the fold
            await self._drain(eid, queue)

    async def _drain(self, eid: str, queue: list[tuple[Msg, Event, int]]) -> None:
        """Fold whatever has queued up for one execution, publish all effects with one flush, then ack.

        Under load this is a group commit: N events of one execution cost one round trip.
        """
        try:
            while queue:
                batch = list(queue)
                queue.clear()
                try:
                    await self._fold(eid, batch)
                except Exception as exc:
                    # Effects may not be stored: forget the in-memory state (it is rebuilt from the
                    # snapshot and the stream) and let JetStream redeliver the batch.
                    self._drop(eid)
                    if isinstance(exc, PartitionReleased):
                        # The partition was released (a stop, a lost lease) while the batch was in
                        # flight: its next owner folds it. Expected at every handover, not a failure.
                        log.info("controller.batch_handed_back", execution_id=eid, events=len(batch))
                    else:
                        log.warning(
                            "controller.batch_failed", execution_id=eid, error=str(exc) or type(exc).__name__
                        )
                    for msg, _, _ in batch:
                        with contextlib.suppress(Exception):
                            await msg.nak(delay=1.0)
        finally:
            self._queues.pop(eid, None)

    async def _fold(self, eid: str, batch: list[tuple[Msg, Event, int]]) -> None:
        self._check_holds(eid)  # released while these were in flight: the partition's next owner takes them
        fence = self._fences[self.topology.partition_of(eid)]
        first = batch[0][1]
        # A request delivered for the first time starts a new execution. A redelivered one may belong to an
        # execution whose later events a previous controller already handled: rebuild it from the stream.
        new = first.name == E.EXECUTION_REQUESTED and num_delivered(batch[0][0]) == 1
        cached = eid in self.states
        state = await self._load(eid, new)
        if state is None and first.name == E.EXECUTION_REQUESTED and "rejected" not in first.payload:
            request = first.payload.get("request") or {}  # compiled off the loop when long (intake did)
            text, file = request.get("playbook"), request.get("file") or request.get("path") or "<playbook>"
            if isinstance(text, str):
                await self.reducer.plans.load_off_loop(text, file, request.get("extensions") or ())
        if state is not None and not state.terminal:
            await self._ensure_plan(state)  # the plan cache may have evicted it
            await self._ensure_items(state)
        # A state loaded from its snapshot may have folded later events already (resume): as changed.
        before = _version(state if cached else None)
        was_terminal = cached and state is not None and state.terminal
        outbox = Outbox(self.js, self.topology)
        dropped: list[str] = []
        for _, event, seq in batch:
            if state is not None and seq and seq <= state.last_seq:
                continue  # already applied (a redelivery after a crash)
            # Raises only what says "load it first" (the batch is not acked and comes back); a reducer bug
            # fails the execution instead (`Reducer.apply`).
            state, fx = self.reducer.apply(state, event, seq)
            if fx.error is not None:
                log.error(
                    "controller.reducer_error", execution_id=eid, event_name=event.name, exc_info=fx.error
                )
            if self.observer is not None:
                self.observer(event, fx.events, state)
            for blob in fx.blobs:  # before anything that depends on it is published or snapshotted
                await self.results.put_encoded(blob.key, blob.data)
            dropped += fx.dropped
            for ev in fx.events:
                ev.controller, ev.fence = self.controller_id, fence
                spec = fx.loop_results.get(ev.event_id)
                if spec is not None:
                    async with self._replays:  # it reads the loop's events back (a consumer)
                        ev = await complete(self.js, self.topology, self.results, ev, spec)
                ev, data = await fit(self.results, ev)
                outbox.event(ev, data)
            for cmd in fx.commands:
                data = encode(cmd)
                if len(data) > SAFE_MESSAGE_BYTES:
                    cmd = await self._offload_command(cmd)
                    data = encode(cmd)
                outbox.command(cmd, data)
        self._check_holds(eid)  # the loads and replays above can take long
        await outbox.flush()
        self._check_holds(eid)  # not acked: the next owner re-derives the same (deduplicated) effects
        if state is not None and _version(state) != before:
            self._remember(state)
            self.deadlines.arm_state(state)
            deadline = any(ev.name == E.EXECUTION_DEADLINE_EXCEEDED for _, ev, _ in batch)
            await self.deadlines.track(state, was_terminal, deadline)
            await self._maybe_snapshot(state, fence)  # under the lease this fold published with
        if dropped:  # a finished loop's items: what needs them now is rebuilt from the events
            await self._delete_items(eid, dropped)
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

    # -- state ------------------------------------------------------------------------------------
    async def _load(self, execution_id: str, new: bool = False) -> ExecutionState | None:
        state = self.states.get(execution_id)
        if state is not None:
            self.states.move_to_end(execution_id)
            return state
        if new:
            return None  # a request starts a new execution (a redelivered one re-derives the same effects)
        assert self._snapshots is not None
        state = await self._snapshots.get(execution_id)
        if state is not None and state.terminal:  # nothing folds into it any more
            keys = state.items_keys
            self._remember(state)
            self._retire(state)
            await self._delete_items(execution_id, keys)  # in case its writer stopped before deleting them
            return state
        if state is not None:
            await self._ensure_plan(state)
            try:
                await self._ensure_items(state)
            except ItemsMissingError as exc:  # e.g. a snapshot of an earlier layout: rebuild from events
                log.warning("controller.rebuild_from_events", execution_id=execution_id, reason=str(exc))
                state = None
        after = state.last_seq if state is not None else 0
        # Always fold everything stored after the snapshot, up to the end of the stream (not just up to
        # this message, which may be a redelivery older than events a dead controller handled and acked
        # after its last snapshot: skipping those lost them): each is applied once, and the messages of
        # them still to come are then skipped as already applied.
        async with self._replays:
            state = await self._replay(execution_id, state, after, None)
        if state is not None:
            self._remember(state)
        return state

    async def _ensure_plan(self, state: ExecutionState) -> None:
        """A state resumed from a snapshot needs its compiled playbook: compile the exact text its request
        recorded (read with a direct get, no consumer)."""
        if not state.content_hash or self.reducer.plans.get(state.content_hash) is not None:
            return
        subject = self.topology.stored_event_filter(state.execution_id, E.EXECUTION_REQUESTED)
        raw = await self.js.get_last_msg(self.topology.events_stream, subject)
        event = decode_event(raw.data or b"")
        request = event.payload.get("request") or {}
        text = request.get("playbook")
        if not isinstance(text, str):
            raise RuntimeError(f"execution {state.execution_id}: its request has no playbook text")
        plan, diagnostics = await self.reducer.plans.load_off_loop(
            text, state.file, request.get("extensions") or ()
        )
        if plan is None or plan.content_hash != state.content_hash:
            raise RuntimeError(
                f"execution {state.execution_id}: cannot rebuild its playbook ({len(diagnostics)} "
                "diagnostics or a different content hash)"
            )

    async def _ensure_items(self, state: ExecutionState) -> None:
        """A resumed distributed loop's packed items are in the object store: load them for the reducer
        (only for loops that still have items to dispatch)."""
        for run in state.runs.values():
            lr = run.loop
            if lr is None or lr.finished:
                continue
            if not lr.compatible:
                raise ItemsMissingError(f"loop {run.run_id}: a snapshot of an earlier layout")
            if (
                lr.items_key is None
                or lr.stopping
                or lr.next_index >= lr.total
                or self.reducer.items.get(state.execution_id, run.run_id) is not None
            ):
                continue
            try:
                data = await self.results.get_encoded(lr.items_key, lr.items_checksum)
            except (NotFoundError, ValueError, TimeoutError) as exc:  # deleted (even while read), corrupt
                raise ItemsMissingError(
                    f"loop {run.run_id}: items {lr.items_key}: {exc or type(exc).__name__}"
                ) from None
            self.reducer.items.put(state.execution_id, run.run_id, data)

    async def _replay(
        self, execution_id: str, state: ExecutionState | None, after: int, before: int | None
    ) -> ExecutionState | None:
        """Fold the input events stored after the snapshot; publish the effects of that fold that are
        not stored yet (events a controller died holding were never handled: see `resume`)."""
        fence = self._fences.get(self.topology.partition_of(execution_id))

        def stamp(ev: Event) -> None:
            ev.controller, ev.fence = self.controller_id, fence

        out = await resume(
            self.js,
            self.topology,
            self.reducer,
            execution_id,
            state,
            after=after,
            before=before,
            stamp=stamp,
            results=self.results,
        )
        if out.replayed:
            log.info(
                "controller.resumed",
                execution_id=execution_id,
                replayed=out.replayed,
                republished=len(out.events) + len(out.commands),
            )
        return out.state

    def _remember(self, state: ExecutionState) -> None:
        self.states[state.execution_id] = state
        self.states.move_to_end(state.execution_id)
        while len(self.states) > self.cache_size:
            old_id, old = next(iter(self.states.items()))
            if not old.terminal:
                break
            self._drop(old_id)

    def _drop(self, execution_id: str) -> None:
        """Forget an execution's in-memory state (it is rebuilt from its snapshot and events)."""
        self.states.pop(execution_id, None)
        self._retired.discard(execution_id)
        self.reducer.items.forget(execution_id)

    def _retire(self, state: ExecutionState) -> None:
        """A terminal execution whose final snapshot is written: keep only what status queries read."""
        state.results = {}
        state.runs = {}
        state.joins = {}
        state.deferred = []
        self._retired.add(state.execution_id)
        self.reducer.items.forget(state.execution_id)

    async def _delete_items(self, execution_id: str, keys: list[str]) -> None:
        """Delete the packed items of distributed loops (best effort): a loop's once it has finished
        (every item dispatched) and the fold that says so is stored, and those of loops still running
        when the execution ended, once its terminal snapshot is stored.

        A controller resuming from an earlier snapshot whose loop still dispatches would read them
        (`_ensure_items`); if they are gone, it rebuilds the execution from its events instead
        (`_load`), which renders and packs the items again."""
        for key in keys:
            try:
                await self.results.delete(key)
            except Exception as exc:  # a leftover object costs space, never correctness
                log.warning(
                    "controller.items_delete_failed",
                    execution_id=execution_id,
                    key=key,
                    error=str(exc) or type(exc).__name__,
                )

    async def _maybe_snapshot(self, state: ExecutionState, fence: int) -> None:
        now = time.monotonic()
        last = self._snapshot_at.get(state.execution_id)
        if last is None and not state.terminal:
            self._snapshot_at[state.execution_id] = now  # short executions snapshot once, at the end
            return
        if state.terminal or last is None or now - last >= self.snapshot_interval_s:
            written = await self._write_snapshot(state, fence)
            self._snapshot_at[state.execution_id] = now
            if state.terminal:
                self._snapshot_at.pop(state.execution_id, None)
                if written and self.states.get(state.execution_id) is state:
                    keys = state.items_keys
                    self._retire(state)  # its results and loops are in the snapshot and the events
                    await self._delete_items(state.execution_id, keys)

    async def _write_snapshot(self, state: ExecutionState, fence: int | None = None) -> bool:
        """Write the state's snapshot under our fence; True when it is stored."""
        assert self._snapshots is not None
        store = self._snapshots
        if state.execution_id in self._retired:
            return True  # lean copy of a terminal state whose snapshot is stored: never written again
        partition = self.topology.partition_of(state.execution_id)
        fence = fence if fence is not None else self._fences.get(partition)
        if fence is None or (self.leases is not None and not self.leases.valid(partition)):
            return False  # not ours (any more): the partition's owner writes it
        state.fence = fence
        ttl = self._retention_s(state)
        try:
            await store.put(state.execution_id, state, ttl)
            return True
        except StateConflictError:
            # Someone wrote it since we last read or wrote it: a newer owner of the partition (we are
            # fenced off), or an older one that kept running after it lost the lease (ours wins).
            try:
                current = await store.get(state.execution_id)
            except Exception as exc:
                log.warning("controller.snapshot_failed", execution_id=state.execution_id, error=str(exc))
                return False
            if current is not None and current.fence > fence:
                log.warning(
                    "controller.fenced",
                    execution_id=state.execution_id,
                    partition=partition,
                    ours=fence,
                    theirs=current.fence,
                )
                self._drop(state.execution_id)
                if self.leases is not None:
                    self._spawn(self.leases.lost(partition))
                return False
            if current is not None and current.fence == fence and current.last_seq > state.last_seq:
                log.warning(
                    "controller.snapshot_superseded",
                    execution_id=state.execution_id,
                    ours=state.last_seq,
                    theirs=current.last_seq,
                )
                self._drop(state.execution_id)
                return False
            try:
                await store.put(state.execution_id, state, ttl)
                return True
            except Exception as exc:
                log.warning("controller.snapshot_failed", execution_id=state.execution_id, error=str(exc))
        except Exception as exc:  # the stream is the truth; a missed snapshot costs only replay time
            log.warning("controller.snapshot_failed", execution_id=state.execution_id, error=str(exc))
        return False

    async def _refresh_retention(self) -> None:
        """Read the events stream's ``max_age`` again now and then: an operator's change to it (``nats
        stream edit``, a Helm upgrade) applies to the snapshots written from then on, without a restart."""
        while True:
            await asyncio.sleep(self.retention_refresh_s)
            try:
                age = await events_max_age_s(self.js, self.topology, missing=self._events_max_age_s)
            except Exception as exc:  # NATS down or slow: keep the value we have, try again later
                log.warning("controller.retention_read_failed", error=str(exc) or type(exc).__name__)
                continue
            if age != self._events_max_age_s:
                log.info("controller.retention_changed", before_s=self._events_max_age_s, after_s=age)
                self._events_max_age_s = age

    def _retention_s(self, state: ExecutionState) -> float | None:
        """A finished execution's snapshot expires with its history: as long after it is written as the
        events stream keeps an event (its ``max_age``; none when events are kept forever). A running
        execution's never does."""
        age = self._events_max_age_s
        return max(1.0, float(int(age))) if state.terminal and age > 0 else None

    async def _flush_snapshots(self) -> None:
        for eid in list(self._snapshot_at):
            state = self.states.get(eid)
            if state is not None:
                await self._write_snapshot(state)

    def status(self, execution_id: str) -> dict[str, Any] | None:
        state = self.states.get(execution_id)
        return None if state is None else msgspec.to_builtins(state)


def _version(state: ExecutionState | None) -> tuple[int, int, int, str]:
    """What changes when a fold applies something (a fold that applied nothing writes no snapshot)."""
    if state is None:
        return (0, -1, -1, "")
    return (id(state), state.events_applied, state.last_seq, state.status)
