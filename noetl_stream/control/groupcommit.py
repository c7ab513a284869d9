"""A batch's group commit: fold each execution's events, publish every effect with one flush, then
record the states and ack.

The folds run one execution after the other (loads and replays when not in memory); the effects of
every execution whose effects are ready (encoded, none needing the object store) are written with one
flush and their acks awaited together; an execution whose effects need the object store first (a large
result, a loop's assembled result, a large command) is flushed on its own after the others. The lease
(its fencing token) is checked after each fold, just before the write and after it: nothing of a
partition no longer held is published or acked. A fold that fails forgets the execution's in-memory
state and naks its events with a growing delay (`retry_delay`).
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

import msgspec
import structlog

from noetl_stream.control.loopresults import SAFE_MESSAGE_BYTES, complete, fit
from noetl_stream.control.reducer import Effects
from noetl_stream.control.state import ExecutionState
from noetl_stream.errors import NoetlError
from noetl_stream.jetstream.fastpath import ack_soon, num_delivered
from noetl_stream.jetstream.outbox import Outbox
from noetl_stream.kv.results import is_ref
from noetl_stream.logs import bound
from noetl_stream.protocol import events as E
from noetl_stream.protocol.wire import Command, Event, encode

if TYPE_CHECKING:
    from nats.aio.msg import Msg

    from noetl_stream.control.controller import Controller

log = structlog.get_logger(__name__)

__all__ = ["GroupCommit", "Item", "PartitionReleasedError"]

Item = tuple["Msg", Event, int]
"""A filed event: its message, the event and its stream sequence."""


class _Folded:
    """One execution's fold of a batch: its state after, what to publish, and what it was before."""

    __slots__ = ("before", "effects", "ended_before", "state", "was_terminal")

    def __init__(self, before: tuple[int, int, int, str], was_terminal: bool, ended_before: bool) -> None:
        self.before = before
        self.was_terminal = was_terminal
        self.ended_before = ended_before
        self.state: ExecutionState | None = None
        self.effects: list[Effects] = []


class PartitionReleasedError(NoetlError, LookupError):
    """The execution's partition is not (validly) held here any more: a stop or a lost lease while its
    events were in flight. Nothing is acked; the partition's next owner folds them."""


def _released(partition: int) -> PartitionReleasedError:
    return PartitionReleasedError(f"partition {partition}: its lease is not (validly) held here")


class GroupCommit:
    """A controller's way to fold, publish, record and ack a batch's executions (`run`)."""

    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl

    async def run(self, batches: list[tuple[str, list[Item]]]) -> None:
        partition_of = self.ctl.topology.partition_of
        folded: list[tuple[str, list[Item], _Folded, int, list[tuple[Event | Command, bytes]]]] = []
        alone: list[tuple[str, list[Item], _Folded, int]] = []
        for eid, batch in batches:
            partition = partition_of(eid)
            fence = self.ctl.fence_of(partition)
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
            outbox = Outbox(self.ctl.js, self.ctl.topology)
            publish, released = [], []
            for entry in folded:
                eid, _, _, fence, ready = entry
                if self.ctl.fence_of(partition_of(eid)) != fence:
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
                        if self.ctl.fence_of(partition_of(eid)) != fence:
                            # not acked: the next owner re-derives the same (deduplicated) effects
                            raise _released(partition_of(eid))
                        await self._after(eid, batch, f, fence)
                    except Exception as exc:
                        await self._failed(eid, batch, exc)
        for eid, batch, f, fence in alone:
            with bound(execution_id=eid):
                try:
                    outbox = Outbox(self.ctl.js, self.ctl.topology)
                    await self._queue_effects(eid, f, fence, outbox)
                    if self.ctl.fence_of(partition_of(eid)) != fence:
                        raise _released(partition_of(eid))
                    await outbox.flush()
                    if self.ctl.fence_of(partition_of(eid)) != fence:
                        raise _released(partition_of(eid))
                    await self._after(eid, batch, f, fence)
                except Exception as exc:
                    await self._failed(eid, batch, exc)

    async def _failed(self, eid: str, batch: list[Item], exc: Exception) -> None:
        """The batch's effects may not be stored: forget the in-memory state (it is rebuilt from the
        snapshot and the stream) and let JetStream redeliver the batch."""
        self.ctl.cache.drop(eid)
        delay = RETRY_DELAY_S
        if isinstance(exc, PartitionReleasedError):
            # The partition was released (a stop, a lost lease) while the batch was in flight: its next
            # owner folds it. Expected at every handover, not a failure.
            log.info("controller.batch_handed_back", execution_id=eid, events=len(batch))
        else:
            attempt = max(num_delivered(m) for m, _, _ in batch)
            delay = retry_delay(attempt)
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
        state = self.ctl.states.get(eid)
        cached = state is not None
        if state is not None:  # (the usual case, without a coroutine)
            self.ctl.states.move_to_end(eid)
        else:
            state = await self.ctl.cache.load(eid, new)
        if state is None and first.name == E.EXECUTION_REQUESTED and "rejected" not in first.payload:
            request = first.payload.get("request")  # compiled off the loop when long (intake did)
            if isinstance(request, dict) and isinstance(text := request.get("playbook"), str):
                file = request.get("file") or request.get("path") or "<playbook>"
                exts = request.get("extensions")
                extensions = [e for e in exts if isinstance(e, str)] if isinstance(exts, list) else ()
                await self.ctl.reducer.plans.load_off_loop(text, str(file), extensions)
        if state is not None and not state.terminal and not self.ctl.cache.ready(state):
            await self.ctl.cache.ensure_plan(state)  # the plan cache may have evicted it
            await self.ctl.cache.ensure_items(state)
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
            state, fx = self.ctl.reducer.apply(state, event, seq)
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
            if self.ctl.observer is not None:
                self.ctl.observer(event, fx.events, state)
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
                ev.controller, ev.fence = self.ctl.controller_id, fence
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
                self.ctl.pools.scheduled(item.pool, eid, item.step)

    async def _queue_effects(self, eid: str, f: _Folded, fence: int, outbox: Outbox) -> None:
        """Queue the fold's effects in `outbox`, storing first what goes to the object store."""
        for fx in f.effects:
            for blob in fx.blobs:  # before anything that depends on it is published or snapshotted
                await self.ctl.results.put_encoded(blob.key, blob.data)
            for ev in fx.events:
                ev.controller, ev.fence = self.ctl.controller_id, fence
                spec = fx.loop_results.get(ev.event_id)
                if spec is not None:
                    async with self.ctl.cache.replays:  # it reads the loop's events back (a consumer)
                        ev = await complete(self.ctl.js, self.ctl.topology, self.ctl.results, ev, spec)
                data = encode(ev)
                if len(data) > SAFE_MESSAGE_BYTES:  # a large result goes by reference
                    ev, data = await fit(self.ctl.results, ev, data)
                outbox.event(ev, data)
            for cmd in fx.commands:
                data = encode(cmd)
                if len(data) > SAFE_MESSAGE_BYTES:
                    cmd = await self._offload_command(cmd)
                    data = encode(cmd)
                outbox.command(cmd, data)
                self.ctl.pools.scheduled(cmd.pool, eid, cmd.step)

    async def _after(self, eid: str, batch: list[Item], f: _Folded, fence: int) -> None:
        """The fold's effects are stored: record the state, index its deadline, write its snapshot when
        due, delete what it no longer needs, and ack the batch."""
        state = f.state
        if state is not None and _version(state) != f.before:
            if not f.ended_before:
                self.ctl.cache.changed[eid] = time.time()
            self.ctl.cache.remember(state)
            self.ctl.deadlines.arm_state(state)
            if state.deadline_at is not None:
                deadline = any(ev.name == E.EXECUTION_DEADLINE_EXCEEDED for _, ev, _ in batch)
                self.ctl.deadlines.track(state, f.was_terminal, deadline)
            # Under the lease this fold published with. A final snapshot stored: keep a lean copy.
            if (
                self.ctl.snapshots.due(state)
                and await self.ctl.snapshots.write_due(state, fence)
                and self.ctl.states.get(eid) is state
            ):
                keys = state.items_keys
                self.ctl.cache.retire(state)  # its results and loops are in the snapshot and the events
                await self.ctl.cache.delete_items(eid, keys)
        dropped = [key for fx in f.effects for key in fx.dropped]
        if dropped:  # a finished loop's items: what needs them now is rebuilt from the events
            await self.ctl.cache.delete_items(eid, dropped)
        for msg, _, _ in batch:
            ack_soon(msg)

    # -- reference-first --------------------------------------------------------------------------
    async def _offload_command(self, cmd: Command) -> Command:
        """Large step results a command would carry travel as references the worker resolves."""
        results = dict(cmd.results)
        for name, value in cmd.results.items():
            if not is_ref(value) and len(encode(value)) > 16 * 1024:
                results[name] = await self.ctl.results.put(f"{cmd.execution_id}/results/{name}", value)
        return msgspec.structs.replace(cmd, results=results)


RETRY_DELAY_S = 1.0
MAX_RETRY_DELAY_S = 30.0


def retry_delay(attempt: int) -> float:
    """How long the controller waits before it tries again what failed `attempt` times in a row (a batch's
    fold, a child's index write): 1 s after the first attempt, doubling to at most 30 s. A cause that
    lasts (a bucket deleted, a bug) costs one attempt and one log line every 30 s, not every second; a
    brief one (NATS failing over) is retried soon."""
    return min(MAX_RETRY_DELAY_S, RETRY_DELAY_S * 2.0 ** max(0, attempt - 1))


def _version(state: ExecutionState | None) -> tuple[int, int, int, str]:
    """What changes when a fold applies something (a fold that applied nothing writes no snapshot)."""
    if state is None:
        return (0, -1, -1, "")
    return (id(state), state.events_applied, state.last_seq, state.status)
