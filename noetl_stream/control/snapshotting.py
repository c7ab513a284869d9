"""When and how the controller writes an execution's snapshot (KV ``<prefix>_executions``).

A snapshot is a shortcut, the events are the truth: a missed write costs replay time, never
correctness. So the policy writes little. A short execution is written once, at the end. A longer one
at most once per `interval_s`, by the fold that finds the last write that old. One that changed and
then went quiet (a step running for minutes, no fold to write it) is found by `SnapshotWriter.quiet`,
and the controller writes it about `interval_s` after the change.

Every write is under the partition's fencing token (the lease revision), compare-and-set against the
revision last read or written: a controller that lost the partition cannot overwrite its new owner's
snapshot (`write` reports it, and the controller drops the execution).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

import structlog
from nats.js.client import JetStreamContext

from noetl_stream.control.core.state import ExecutionState
from noetl_stream.errors import StateConflictError
from noetl_stream.kv.provision import events_max_age_s
from noetl_stream.kv.snapshots import SnapshotStore
from noetl_stream.protocol.subjects import Topology

log = structlog.get_logger(__name__)

RETENTION_REFRESH_S = 300.0
"""How often a controller reads the events stream's ``max_age`` again (snapshot retention)."""

__all__ = ["RETENTION_REFRESH_S", "SnapshotWriter"]


class SnapshotWriter:
    def __init__(
        self,
        js: JetStreamContext,
        interval_s: float,
        retention_refresh_s: float,
        fences: Mapping[int, int],
        lease_valid: Callable[[int], bool],
        fenced_off: Callable[[str, int | None], None],
    ) -> None:
        """`fences`: the partitions we hold and their fencing tokens; `lease_valid(partition)`: by our
        clock nobody else can hold it yet. `fenced_off(execution_id, partition)`: a newer writer's
        snapshot is stored (the partition is the newer owner's; None: a later state of ours)."""
        self.js = js
        self.interval_s = interval_s
        self.retention_refresh_s = retention_refresh_s
        self._fences = fences
        self._lease_valid = lease_valid
        self._fenced_off = fenced_off
        self.store: SnapshotStore[ExecutionState] | None = None
        self.topology = Topology()
        self.events_max_age_s = 0.0
        """The events stream's ``max_age`` (read at start, then every `retention_refresh_s`): a finished
        execution's snapshot lives as long."""
        self.written_at: dict[str, float] = {}
        """Executions folded here, and when their snapshot was last written (or first folded)."""
        self.unsaved: dict[str, float] = {}
        """Running executions changed since their last snapshot, and since when (`quiet`)."""
        self.retired: set[str] = set()
        """Terminal executions whose final snapshot is stored and whose cached copy is lean (no results,
        runs or joins: `ExecutionCache.retire`): never written again, whatever a late event changes."""

    async def open(self, topology: Topology) -> None:
        self.topology = topology
        self.events_max_age_s = await events_max_age_s(self.js, topology)
        self.store = await SnapshotStore.open(self.js, topology, ExecutionState)

    def forget(self, execution_id: str) -> None:
        """Nothing of the execution stays here (its state left the controller's memory): a later write
        starts from the snapshot read when it is loaded again."""
        self.written_at.pop(execution_id, None)
        self.unsaved.pop(execution_id, None)
        self.retired.discard(execution_id)
        if self.store is not None:
            self.store.forget(execution_id)

    def retire(self, execution_id: str) -> None:
        """Its final snapshot is stored and its cached copy made lean: never write it again."""
        self.retired.add(execution_id)

    def due(self, state: ExecutionState) -> bool:
        """Whether a fold that changed `state` writes its snapshot now (`write_due`): a terminal state, or
        a running one last written `interval_s` ago. Otherwise it is left to `quiet`; short executions are
        written once, at the end."""
        if state.terminal:
            return True
        eid = state.execution_id
        last = self.written_at.get(eid)
        now = time.monotonic()
        if last is None:
            self.written_at[eid] = now
        elif now - last >= self.interval_s:
            return True
        self.unsaved.setdefault(eid, now)
        return False

    async def write_due(self, state: ExecutionState, fence: int) -> bool:
        """Write the snapshot a fold made `due`. True when a terminal state's final snapshot was written
        (its cached copy may be made lean)."""
        eid = state.execution_id
        now = time.monotonic()
        written = await self.write(state, fence)
        self.written_at[eid] = now
        if written or state.terminal:
            self.unsaved.pop(eid, None)
        else:
            self.unsaved.setdefault(eid, now)  # tried again when it is quiet
        if state.terminal:
            self.written_at.pop(eid, None)
        return written and state.terminal

    def quiet(self) -> list[str]:
        """The executions changed at least `interval_s` ago and not written since."""
        now = time.monotonic()
        return [eid for eid, since in self.unsaved.items() if now - since >= self.interval_s]

    def saved(self, execution_id: str) -> None:
        self.written_at[execution_id] = time.monotonic()
        self.unsaved.pop(execution_id, None)

    async def write(self, state: ExecutionState, fence: int | None = None) -> bool:
        """Write the state's snapshot under our fence; True when it is stored (or a retired execution's,
        which is stored already)."""
        if state.execution_id in self.retired:
            return True
        assert self.store is not None
        store = self.store
        partition = self.topology.partition_of(state.execution_id)
        fence = fence if fence is not None else self._fences.get(partition)
        if fence is None or not self._lease_valid(partition):
            return False  # not ours (any more): the partition's owner writes it
        state.fence = fence
        ttl = self.retention_s(state)
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
                self._fenced_off(state.execution_id, partition)
                return False
            if current is not None and current.fence == fence and current.last_seq > state.last_seq:
                log.warning(
                    "controller.snapshot_superseded",
                    execution_id=state.execution_id,
                    ours=state.last_seq,
                    theirs=current.last_seq,
                )
                self._fenced_off(state.execution_id, None)
                return False
            try:
                await store.put(state.execution_id, state, ttl)
                return True
            except Exception as exc:
                log.warning("controller.snapshot_failed", execution_id=state.execution_id, error=str(exc))
        except Exception as exc:  # the stream is the truth; a missed snapshot costs only replay time
            log.warning("controller.snapshot_failed", execution_id=state.execution_id, error=str(exc))
        return False

    async def refresh_retention(self) -> None:
        """Read the events stream's ``max_age`` again now and then: an operator's change to it (``nats
        stream edit``, a Helm upgrade) applies to the snapshots written from then on, without a restart."""
        while True:
            await asyncio.sleep(self.retention_refresh_s)
            try:
                age = await events_max_age_s(self.js, self.topology, missing=self.events_max_age_s)
            except Exception as exc:  # NATS down or slow: keep the value we have, try again later
                log.warning("controller.retention_read_failed", error=str(exc) or type(exc).__name__)
                continue
            if age != self.events_max_age_s:
                log.info("controller.retention_changed", before_s=self.events_max_age_s, after_s=age)
                self.events_max_age_s = age

    def retention_s(self, state: ExecutionState) -> float | None:
        """A finished execution's snapshot expires with its history: as long after it is written as the
        events stream keeps an event (its ``max_age``; none when events are kept forever). A running
        execution's never does."""
        age = self.events_max_age_s
        return max(1.0, float(int(age))) if state.terminal and age > 0 else None
