"""Execution deadlines: a timer per running execution with a deadline, and the index that re-arms them.

When the timer of an execution fires, the controller that holds its partition records
``execution.deadline.exceeded`` (deterministic id: firing twice is deduplicated); the reducer fails
the execution when it folds it. Timers live in one process, so the executions that have a deadline and
are not finished are also kept in an index by partition (`kv/deadlines.py`): a controller that takes a
partition over lists that partition's keys and arms their timers, without reading any snapshot.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import structlog
from nats.js.client import JetStreamContext

from noetl_stream.control.backoff import retry_delay
from noetl_stream.control.core.effects import server_event
from noetl_stream.control.core.state import ExecutionState
from noetl_stream.control.indexwriter import IndexWriter
from noetl_stream.jetstream.outbox import Outbox
from noetl_stream.kv.deadlines import DeadlineIndex
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology

log = structlog.get_logger(__name__)

REARM_RETRY_S = 0.5
"""How soon the timers of a held partition whose re-arming could not be done are tried again."""


class Deadlines:
    def __init__(
        self,
        js: JetStreamContext,
        topology: Topology,
        controller_id: str,
        *,
        fence_of: Callable[[int], int | None],
        is_terminal: Callable[[str], bool],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        """``fence_of(partition)``: the fencing token while this controller validly holds the partition,
        else None. ``is_terminal(eid)``: the execution is known (in memory) to be over."""
        self.js = js
        self.topology = topology
        self.controller_id = controller_id
        self._fence_of = fence_of
        self._is_terminal = is_terminal
        self._spawn = spawn
        self.timers: dict[str, asyncio.TimerHandle] = {}
        self.index: DeadlineIndex | None = None
        self._indexed: set[str] = set()
        """Executions this controller has put in the index (and not removed since)."""
        self._writer: IndexWriter[float] | None = None
        """Writes the index: by execution, its deadline (add) or None (remove)."""
        self._pending: set[int] = set()
        self._held: set[int] = set()
        """Partitions acquired and not released since (their re-arming is retried until it is done)."""

    def open(self, index: DeadlineIndex, topology: Topology) -> None:
        """Start indexing (``topology``: the installation's, as the controller read it at start)."""
        self.index = index
        self.topology = topology
        self._writer = IndexWriter(index, topology, self._still, "controller.deadline_index_failed")

    async def stop(self, timeout: float = 2.0) -> None:
        """Let the index writes in flight finish (briefly)."""
        if self._writer is not None:
            await self._writer.stop(timeout)

    # -- timers ------------------------------------------------------------------------------------
    def arm_state(self, state: ExecutionState) -> None:
        eid = state.execution_id
        if state.terminal or state.deadline_at is None:
            timer = self.timers.pop(eid, None)
            if timer is not None:
                timer.cancel()
            return
        self.arm(eid, state.deadline_at)

    def arm(self, eid: str, deadline_at: float) -> None:
        if eid in self.timers:
            return
        delay = max(0.0, deadline_at - time.time())
        loop = asyncio.get_running_loop()
        self.timers[eid] = loop.call_later(delay, self._fire_soon, eid, deadline_at)

    def release(self, partition: int) -> None:
        """The partition is not ours any more: its timers go (armed from the index too, not only for
        the states in memory), its next owner re-arms them."""
        for eid in [e for e in self.timers if self.topology.partition_of(e) == partition]:
            self.timers.pop(eid).cancel()
        for eid in [e for e in self._indexed if self.topology.partition_of(e) == partition]:
            self._indexed.discard(eid)
        self._held.discard(partition)

    def cancel_all(self) -> None:
        for timer in self.timers.values():
            timer.cancel()
        self.timers.clear()
        self._held.clear()

    def _fire_soon(self, eid: str, deadline_at: float, failures: int = 0) -> None:
        self._spawn(self.fire(eid, deadline_at, failures))

    async def fire(self, eid: str, deadline_at: float, failures: int = 0) -> None:
        """Record ``execution.deadline.exceeded`` (deterministic id: firing twice is deduplicated).
        ``failures``: how many times in a row its publish failed before."""
        self.timers.pop(eid, None)
        if self._is_terminal(eid):
            return
        fence = self._fence_of(self.topology.partition_of(eid))
        if fence is None:
            return  # the partition's owner has its own timer
        ev = server_event(
            eid,
            E.EXECUTION_DEADLINE_EXCEEDED,
            "workflow",
            eid,
            "error",
            "execution",
            {"deadline_at": deadline_at},
        )
        ev.controller, ev.fence = self.controller_id, fence
        outbox = Outbox(self.js, self.topology)
        outbox.event(ev)
        try:
            await outbox.flush()
        except Exception as exc:  # (after the outbox's own retries): again in a while, while it is ours
            log.warning(
                "controller.deadline_publish_failed", execution_id=eid, error=str(exc) or type(exc).__name__
            )
            if eid not in self.timers:  # (a release cancels it, an end of the execution too)
                delay = retry_delay(failures + 1)
                loop = asyncio.get_running_loop()
                self.timers[eid] = loop.call_later(delay, self._fire_soon, eid, deadline_at, failures + 1)

    # -- index -------------------------------------------------------------------------------------
    def track(self, state: ExecutionState, was_terminal: bool, deadline_folded: bool) -> None:
        """After a fold: index an execution with a deadline while it runs, remove it when it ends (also
        when a deadline event reached an execution that had ended: a key left by a crash). The write goes
        out off the fold's path (`IndexWriter`: a failed one is tried again while `_still` holds)."""
        if state.deadline_at is None or self._writer is None:
            return
        eid = state.execution_id
        if not state.terminal:
            if eid not in self._indexed:
                self._indexed.add(eid)
                self._writer.write(eid, state.deadline_at)
        elif not was_terminal or eid in self._indexed or deadline_folded:
            self._indexed.discard(eid)
            self._writer.write(eid, None)

    def _still(self, eid: str, deadline_at: float | None) -> bool:
        """A failed index write still says what is true here: its partition is held, and the execution
        is indexed (an add) or not (a removal). Until it is written, a missing key costs a timer after a
        takeover (an execution in one long task sends no event that would write it again); a stale one,
        nothing (its next owner's timer finds it ended)."""
        held = self.topology.partition_of(eid) in self._held
        return held and (eid in self._indexed) == (deadline_at is not None)

    def acquired(self, partition: int) -> None:
        """A partition was taken: re-arm its timers (one task for the partitions of the same tick)."""
        self._held.add(partition)
        self._pending.add(partition)
        if len(self._pending) == 1:
            self._spawn(self.rearm())

    def _retry(self, partition: int) -> None:
        if partition in self._held:
            asyncio.get_running_loop().call_later(REARM_RETRY_S, self._retry_now, partition)

    def _retry_now(self, partition: int) -> None:
        if partition in self._held:
            self.acquired(partition)

    async def rearm(self) -> None:
        """Timers for the acquired partitions' executions in the index (those with a deadline that have
        not ended: the listing does not grow with the other executions of the bucket)."""
        await asyncio.sleep(0)  # let the other acquisitions of this tick join
        partitions, self._pending = self._pending, set()
        if self.index is None:
            return
        for partition in sorted(partitions):
            if self._fence_of(partition) is None:
                # Held, but its lease not (yet) valid by our clock: a start that acquired many partitions
                # in one slow tick renews the first ones late. Try again in a moment, while it is held.
                self._retry(partition)
                continue
            try:
                indexed = await self.index.of_partition(partition)
            except Exception as exc:
                log.warning(
                    "controller.rearm_failed", partition=partition, error=str(exc) or type(exc).__name__
                )
                self._retry(partition)
                continue
            for eid, deadline_at in indexed:
                ours = self._fence_of(partition) is not None  # (still: the listing awaited)
                if ours and self.topology.partition_of(eid) == partition and not self._is_terminal(eid):
                    self.arm(eid, deadline_at)
