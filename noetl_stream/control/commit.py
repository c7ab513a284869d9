"""The commit path: a batch's group commit folds each execution's events, publishes every effect with
one flush, then records the states and acks.

It is built from the parts of the controller it uses (`CommitParts`), not the controller: the reducer,
the execution cache, the result store, the pool, deadline and snapshot keepers, and the partitions'
fencing tokens. `folding` files the events and starts the batches this commits.

The folds run one execution after the other (loads and replays when not in memory); the effects of
every execution whose effects are ready (encoded, none needing the object store) are written with one
flush and their acks awaited together; an execution whose effects need the object store first (a large
result, a loop's assembled result, a large command) is flushed on its own after the others. The lease
(its fencing token) is checked after each fold, just before the write and after it: nothing of a
partition no longer held is published or acked. A fold that fails forgets the execution's in-memory
state and naks its events with a growing delay (`backoff.retry_delay`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
import structlog

from noetl_stream.control import backoff
from noetl_stream.control.core.reducer import Effects, Reducer
from noetl_stream.control.core.state import ExecutionState
from noetl_stream.control.loopresults import SAFE_MESSAGE_BYTES, complete, fit
from noetl_stream.control.planload import load_off_loop
from noetl_stream.errors import NoetlError
from noetl_stream.jetstream.fastpath import ack_soon, num_delivered
from noetl_stream.jetstream.outbox import Outbox
from noetl_stream.logs import bound
from noetl_stream.protocol import events as E
from noetl_stream.protocol.refs import is_ref
from noetl_stream.protocol.wire import Command, Event, encode

if TYPE_CHECKING:
    from nats.aio.msg import Msg
    from nats.js.client import JetStreamContext

    from noetl_stream.control.cache import ExecutionCache
    from noetl_stream.control.deadlines import Deadlines
    from noetl_stream.control.pools import PoolWatch
    from noetl_stream.control.snapshotting import SnapshotWriter
    from noetl_stream.kv.results import ResultStore
    from noetl_stream.protocol.subjects import Topology

log = structlog.get_logger(__name__)

__all__ = ["CommitParts", "GroupCommit", "Item", "Observer", "PartitionReleasedError", "Spans"]

Item = tuple["Msg", Event, int]
"""A filed event: its message, the event and its stream sequence."""

Observer = Callable[[Event | None, list[Event], ExecutionState | None], None]
"""Called with each folded input event and the events the reducer wrote for it (metrics); with None and
the effects a resume published."""

Spans = Callable[[list[Event], list[Effects], ExecutionState | None, bool, int], None]
"""Called once a fold's effects are stored, before its acks: the events folded, each one's effects, the
state after them, whether it had ended before, and when the effects were stored (epoch ns). The
controller's trace spans (`control.tracespans.CommitSpans`)."""


@dataclass(slots=True)
class CommitParts:
    """What the commit path uses of the controller, and nothing else of it."""

    js: JetStreamContext
    topology: Topology
    """The installation's (the controller sets it when it starts: the partition count is read then)."""
    controller_id: str
    reducer: Reducer
    cache: ExecutionCache
    """The executions in memory (`cache.states`), loaded, replayed and dropped."""
    results: ResultStore
    pools: PoolWatch
    deadlines: Deadlines
    snapshots: SnapshotWriter
    fence_of: Callable[[int], int | None]
    """The fencing token of a partition validly held here, else None."""
    observer: Observer | None = None
    spans: Spans | None = None
    """The controller's trace spans of each stored fold (they cost one global read with tracing off)."""


class _Folded:
    """One execution's fold of a batch: its state after, what to publish (each input's effects), and
    what it was before."""

    __slots__ = ("before", "effects", "ended_before", "inputs", "state", "was_terminal")

    def __init__(self, before: tuple[int, int, int, str], was_terminal: bool, ended_before: bool) -> None:
        self.before = before
        self.was_terminal = was_terminal
        self.ended_before = ended_before
        self.state: ExecutionState | None = None
        self.effects: list[Effects] = []
        self.inputs: list[Event] = []
        """The events folded (those not applied before), one per entry of `effects`."""


class PartitionReleasedError(NoetlError, LookupError):
    """The execution's partition is not (validly) held here any more: a stop or a lost lease while its
    events were in flight. Nothing is acked; the partition's next owner folds them."""


def _released(partition: int) -> PartitionReleasedError:
    return PartitionReleasedError(f"partition {partition}: its lease is not (validly) held here")


class GroupCommit:
    """A controller's way to fold, publish, record and ack a batch's executions (`run`)."""

    def __init__(self, parts: CommitParts) -> None:
        self.parts = parts

    async def run(self, batches: list[tuple[str, list[Item]]]) -> None:
        partition_of = self.parts.topology.partition_of
        folded: list[tuple[str, list[Item], _Folded, int, list[tuple[Event | Command, bytes]]]] = []
        alone: list[tuple[str, list[Item], _Folded, int]] = []
        for eid, batch in batches:
            partition = partition_of(eid)
            fence = self.parts.fence_of(partition)
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
            outbox = Outbox(self.parts.js, self.parts.topology)
            publish, released = [], []
            for entry in folded:
                eid, _, _, fence, ready = entry
                if self.parts.fence_of(partition_of(eid)) != fence:
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
                        if self.parts.fence_of(partition_of(eid)) != fence:
                            # not acked: the next owner re-derives the same (deduplicated) effects
                            raise _released(partition_of(eid))
                        await self._after(eid, batch, f, fence)
                    except Exception as exc:
                        await self._failed(eid, batch, exc)
        for eid, batch, f, fence in alone:
            with bound(execution_id=eid):
                try:
                    outbox = Outbox(self.parts.js, self.parts.topology)
                    await self._queue_effects(eid, f, fence, outbox)
                    if self.parts.fence_of(partition_of(eid)) != fence:
                        raise _released(partition_of(eid))
                    await outbox.flush()
                    if self.parts.fence_of(partition_of(eid)) != fence:
                        raise _released(partition_of(eid))
                    await self._after(eid, batch, f, fence)
                except Exception as exc:
                    await self._failed(eid, batch, exc)

    async def _failed(self, eid: str, batch: list[Item], exc: Exception) -> None:
        """The batch's effects may not be stored: forget the in-memory state (it is rebuilt from the
        snapshot and the stream) and let JetStream redeliver the batch."""
        self.parts.cache.drop(eid)
        delay = backoff.RETRY_DELAY_S
        if isinstance(exc, PartitionReleasedError):
            # The partition was released (a stop, a lost lease) while the batch was in flight: its next
            # owner folds it. Expected at every handover, not a failure.
            log.info("controller.batch_handed_back", execution_id=eid, events=len(batch))
        else:
            attempt = max(num_delivered(m) for m, _, _ in batch)
            delay = backoff.retry_delay(attempt)
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

    async def _fold(self, eid: str, batch: list[Item]) -> _Folded:
        """Load the execution (if it is not in memory) and fold the batch into it: what to publish."""
        first = batch[0][1]
        # A request delivered for the first time starts a new execution. A redelivered one may belong to an
        # execution whose later events a previous controller already handled: rebuild it from the stream.
        new = first.name == E.EXECUTION_REQUESTED and num_delivered(batch[0][0]) == 1
        state = self.parts.cache.states.get(eid)
        cached = state is not None
        if state is not None:  # (the usual case, without a coroutine)
            self.parts.cache.states.move_to_end(eid)
        else:
            state = await self.parts.cache.load(eid, new)
        if state is None and first.name == E.EXECUTION_REQUESTED and "rejected" not in first.payload:
            request = first.payload.get("request")  # compiled off the loop when long (intake did)
            if isinstance(request, dict) and isinstance(text := request.get("playbook"), str):
                file = request.get("file") or request.get("path") or "<playbook>"
                exts = request.get("extensions")
                extensions = [e for e in exts if isinstance(e, str)] if isinstance(exts, list) else ()
                await load_off_loop(self.parts.reducer.plans, text, str(file), extensions)
        if state is not None and not state.terminal and not self.parts.cache.ready(state):
            await self.parts.cache.ensure_plan(state)  # the plan cache may have evicted it
            await self.parts.cache.ensure_items(state)
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
            state, fx = self.parts.reducer.apply(state, event, seq)
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
            if self.parts.observer is not None:
                self.parts.observer(event, fx.events, state)
            f.effects.append(fx)
            f.inputs.append(event)
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
                ev.controller, ev.fence = self.parts.controller_id, fence
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
                self.parts.pools.scheduled(item.pool, eid, item.step)

    async def _queue_effects(self, eid: str, f: _Folded, fence: int, outbox: Outbox) -> None:
        """Queue the fold's effects in `outbox`, storing first what goes to the object store."""
        for fx in f.effects:
            for blob in fx.blobs:  # before anything that depends on it is published or snapshotted
                await self.parts.results.put_encoded(blob.key, blob.data)
            for ev in fx.events:
                ev.controller, ev.fence = self.parts.controller_id, fence
                spec = fx.loop_results.get(ev.event_id)
                if spec is not None:
                    async with self.parts.cache.replays:  # it reads the loop's events back (a consumer)
                        ev = await complete(self.parts.js, self.parts.topology, self.parts.results, ev, spec)
                data = encode(ev)
                if len(data) > SAFE_MESSAGE_BYTES:  # a large result goes by reference
                    ev, data = await fit(self.parts.results, ev, data)
                outbox.event(ev, data)
            for cmd in fx.commands:
                data = encode(cmd)
                if len(data) > SAFE_MESSAGE_BYTES:
                    cmd = await self._offload_command(cmd)
                    data = encode(cmd)
                outbox.command(cmd, data)
                self.parts.pools.scheduled(cmd.pool, eid, cmd.step)

    async def _after(self, eid: str, batch: list[Item], f: _Folded, fence: int) -> None:
        """The fold's effects are stored: record the state, index its deadline, write its snapshot when
        due, delete what it no longer needs, and ack the batch."""
        stored_ns = time.time_ns()
        state = f.state
        if state is not None and _version(state) != f.before:
            if not f.ended_before:
                self.parts.cache.changed[eid] = time.time()
            self.parts.cache.remember(state)
            self.parts.deadlines.arm_state(state)
            if state.deadline_at is not None:
                deadline = any(ev.name == E.EXECUTION_DEADLINE_EXCEEDED for _, ev, _ in batch)
                self.parts.deadlines.track(state, f.was_terminal, deadline)
            # Under the lease this fold published with. A final snapshot stored: keep a lean copy.
            if (
                self.parts.snapshots.due(state)
                and await self.parts.snapshots.write_due(state, fence)
                and self.parts.cache.states.get(eid) is state
            ):
                keys = state.items_keys
                self.parts.cache.retire(state)  # its results and loops are in the snapshot and the events
                await self.parts.cache.delete_items(eid, keys)
        dropped = [key for fx in f.effects for key in fx.dropped]
        if dropped:  # a finished loop's items: what needs them now is rebuilt from the events
            await self.parts.cache.delete_items(eid, dropped)
        if self.parts.spans is not None:
            self.parts.spans(f.inputs, f.effects, state, f.ended_before, stored_ns)
        for msg, _, _ in batch:
            ack_soon(msg)

    # -- reference-first --------------------------------------------------------------------------
    async def _offload_command(self, cmd: Command) -> Command:
        """Large step results a command would carry travel as references the worker resolves."""
        results = dict(cmd.results)
        for name, value in cmd.results.items():
            if not is_ref(value) and len(encode(value)) > 16 * 1024:
                results[name] = await self.parts.results.put(f"{cmd.execution_id}/results/{name}", value)
        return msgspec.structs.replace(cmd, results=results)


def _version(state: ExecutionState | None) -> tuple[int, int, int, str]:
    """What changes when a fold applies something (a fold that applied nothing writes no snapshot)."""
    if state is None:
        return (0, -1, -1, "")
    return (id(state), state.events_applied, state.last_seq, state.status)
