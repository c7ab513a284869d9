"""The controller: a thin NATS loop around the pure reducer.

For each input event (stream order, one execution at a time): load the execution's
state (memory, else snapshot + replay of the events after it), reduce, publish the
effects with deterministic ids, wait for their acks, snapshot, then ack the input.

This module holds the partitions (leases, one puller each, their start and stop) and what runs
beside them (intake, deadlines, pools, children, quiet snapshots). The events are filed and folded
by batches in `folding`; a batch is folded, published, recorded and acked in `commit`, both built from
the parts of the controller they use (`commit.CommitParts`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterable
from typing import Any

import msgspec
import structlog
from nats.aio.client import Client as NATS

from noetl_stream.control.cache import ExecutionCache
from noetl_stream.control.children import ChildWatch
from noetl_stream.control.commit import CommitParts, Observer
from noetl_stream.control.core.plans import PlanCache
from noetl_stream.control.core.reducer import Reducer
from noetl_stream.control.core.state import ExecutionState
from noetl_stream.control.deadlines import Deadlines
from noetl_stream.control.folding import Folding
from noetl_stream.control.intake import Intake
from noetl_stream.control.leases import Leases, default_controller_id
from noetl_stream.control.loopresults import SAFE_MESSAGE_BYTES
from noetl_stream.control.poison import PoisonHandler
from noetl_stream.control.pools import PoolWatch
from noetl_stream.control.snapshotting import RETENTION_REFRESH_S, SnapshotWriter
from noetl_stream.control.tracespans import CommitSpans
from noetl_stream.jetstream.puller import ContinuousPuller
from noetl_stream.kv.children import ChildIndex
from noetl_stream.kv.deadlines import DeadlineIndex
from noetl_stream.kv.provision import provisioned_topology
from noetl_stream.kv.results import ResultStore
from noetl_stream.logs import bound
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event, now_iso
from noetl_stream.settings import Settings

log = structlog.get_logger(__name__)

__all__ = ["REBALANCE_GRACE_S", "SAFE_MESSAGE_BYTES", "Controller"]

REBALANCE_GRACE_S = 30.0
"""How long a partition handed to another controller waits for its folds in flight (its lease is renewed
meanwhile); a shutdown waits its own grace (``--grace``) for everything."""


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
        settings: Settings | None = None,
    ) -> None:
        """`settings`: the process's limits (`Settings.from_env` at the edge); None: the defaults."""
        settings = Settings() if settings is None else settings
        self.nc = nc
        self.js = nc.jetstream()
        self.topology = topology
        self.reducer = Reducer(PlanCache(default_pool), clock=now_iso)  # what it mints: stamped now
        self.concurrency = concurrency
        self.snapshot_interval_s = snapshot_interval_s
        self.controller_id = controller_id or default_controller_id(settings.controller_id)
        self._pullers: dict[int, ContinuousPuller] = {}
        self._fences: dict[int, int] = {}
        """Partitions this controller holds, and the fencing token (lease revision) of each."""
        self._partition_locks: dict[int, asyncio.Lock] = {}
        self._stopping: dict[int, asyncio.Event] = {}
        """Partitions being stopped gracefully, each with what a lost lease sets to cut the stop short."""
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
            nc,
            topology,
            self.states,
            self.cache.changed,
            extensions=extensions,
            plans=self.reducer.plans,
            max_child_depth=settings.max_child_depth,
        )
        self.cache.on_resumed = self._observe_resumed
        self.poison = PoisonHandler(nc, topology)
        self.deadlines = Deadlines(
            self.js,
            topology,
            self.controller_id,
            fence_of=self.fence_of,
            is_terminal=self._is_terminal,
            spawn=self._spawn,
        )
        self.pools = PoolWatch(self.js, self._spawn)
        self.children = ChildWatch(
            nc,
            topology,
            self.controller_id,
            fence_of=self.fence_of,
            held=self._fences.__contains__,
            is_terminal=self._is_terminal,
        )
        self.cache.children = self.children
        self.commit_parts = CommitParts(
            js=self.js,
            topology=topology,
            controller_id=self.controller_id,
            reducer=self.reducer,
            cache=self.cache,
            results=self.results,
            pools=self.pools,
            deadlines=self.deadlines,
            snapshots=self.snapshots,
            fence_of=self.fence_of,
            spans=CommitSpans(self.controller_id),  # nothing but a global read with tracing off
        )
        self.folding = Folding(self.commit_parts)
        self._background: set[asyncio.Task[None]] = set()
        self._stopped = asyncio.Event()
        self._shutdown_at: float | None = None
        """Loop time by which a shutdown's partition stops end (its grace from when it began)."""

    async def __aenter__(self) -> Controller:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def start(self) -> None:
        if self.leases is not None:
            return
        self.folding.loop = asyncio.get_running_loop()
        # The partition count and lease TTL are the installation's (read from the server), not ours.
        self.topology = await provisioned_topology(self.js, self.topology)
        await self.snapshots.open(self.topology)
        self.cache.topology = self.topology
        assert self.snapshots.store is not None
        self.deadlines.open(DeadlineIndex(self.snapshots.store.kv), self.topology)
        self.children.open(ChildIndex(self.snapshots.store.kv), self.topology)
        self.pools.topology = self.topology
        self.commit_parts.topology = self.topology
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

    @property
    def observer(self) -> Observer | None:
        """Called with each folded input event and the events the reducer wrote for it (metrics); with
        None and the effects a resume published (`ExecutionCache.on_resumed`)."""
        return self.commit_parts.observer

    @observer.setter
    def observer(self, observer: Observer | None) -> None:
        self.commit_parts.observer = observer

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
                intake=self.folding.file,  # an execution's events are filed in stream order as they arrive
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
        snapshots are written); otherwise the lease is lost and we stop before it can expire. A lease
        lost during a graceful stop cuts it short: what still folds is cancelled at once.
        """
        if not graceful and (lost := self._stopping.get(partition)) is not None:
            lost.set()  # a graceful stop in progress: its lease is gone now
        async with self._partition_lock(partition):
            # No new fold starts from here (they find no fence and hand their events back); the
            # folds already running finish (graceful, within the shutdown grace) or are cut short
            # well before the lease can expire on the server.
            fence = self._fences.pop(partition, None)
            puller = self._pullers.pop(partition, None)
            # (no renewal runs meanwhile when lost: the stop ends well before the key expires)
            loop = asyncio.get_running_loop()
            now = loop.time()
            if not graceful:
                wait, deadline = self.topology.lease_ttl_s * 0.1, now + self.topology.lease_ttl_s * 0.2
            else:  # a shutdown: what is left of its grace; rebalancing: REBALANCE_GRACE_S
                deadline = self._shutdown_at if self._shutdown_at is not None else now + REBALANCE_GRACE_S
                wait = max(0.0, deadline - now)
            lost = self._stopping[partition] = asyncio.Event()
            try:
                if puller is not None:
                    await puller.stop(timeout=wait)
                self.deadlines.release(partition)
                self.children.release(partition)  # (a fold still running adds none: the fence is gone)
                # Batches fold executions of every partition held: wait for those folding this one's
                # (they find no fence now and hand the events back, or finish what they published),
                # then cancel what still runs (its executions are forgotten and their events handed
                # back, whatever their partition: rebuilt from the snapshot and the stream). No fold of
                # this partition runs once this returns.
                await self.folding.end_batches_of(partition, deadline, lost)
            finally:
                self._stopping.pop(partition, None)
            self.folding.unclaim_partition(partition)
            graceful = graceful and not lost.is_set()
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
        # One grace for all of it: the intake's requests in hand, then every partition's folds (each
        # partition's stop gets what is left); then the snapshots, which are not cut short.
        loop = asyncio.get_running_loop()
        self._shutdown_at = shutdown_at = loop.time() + grace_s
        self.deadlines.cancel_all()
        for task in list(self._background):
            task.cancel()
        await self.intake.stop(timeout=grace_s)
        await self.poison.stop(timeout=max(0.0, shutdown_at - loop.time()))
        if self.leases is not None:
            await self.leases.stop()  # each partition: stop pulling, write snapshots, free the lease
        await self.children.stop()
        await self.deadlines.stop()
        await self._flush_snapshots()
        self._stopped.set()

    def fence_of(self, partition: int) -> int | None:
        """The fencing token of a partition validly held here (`_holds`), else None."""
        return self._fences.get(partition) if self._holds(partition) else None

    def _is_terminal(self, execution_id: str) -> bool:
        state = self.states.get(execution_id)
        return state is not None and state.terminal

    async def _save_quiet(self) -> None:
        """Write the snapshots of executions that changed and then went quiet (`SnapshotWriter.quiet`).
        One being folded is left to its fold; one being written takes no fold meanwhile
        (`Folding.write_quietly`)."""
        while True:
            await asyncio.sleep(self.snapshots.interval_s / 2)
            for eid in self.snapshots.quiet():
                state = self.states.get(eid)
                if state is None or state.terminal:  # dropped, or its fold writes it
                    self.snapshots.unsaved.pop(eid, None)
                    continue
                with bound(execution_id=eid):
                    await self.folding.write_quietly(eid, functools.partial(self._write_quiet, eid, state))

    async def _write_quiet(self, eid: str, state: ExecutionState) -> None:
        if await self.snapshots.write(state):  # (logs its own failures: tried again)
            self.snapshots.saved(eid)

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
