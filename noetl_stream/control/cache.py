"""The controller's executions in memory.

An execution is loaded from its snapshot plus the input events stored after it (replayed through the
reducer, publishing what a controller that died before storing it did not), kept while it runs, kept
lean once its final snapshot is stored (status queries read it), and forgotten past `size` finished
ones or when its partition goes. The stream is the truth: whatever is forgotten is rebuilt from it.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Mapping

import structlog
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from noetl_stream.control.children import ChildWatch
from noetl_stream.control.core.items import ItemsMissingError
from noetl_stream.control.core.reducer import Reducer
from noetl_stream.control.core.state import ExecutionState
from noetl_stream.control.planload import load_off_loop
from noetl_stream.control.resume import resume
from noetl_stream.control.snapshotting import SnapshotWriter
from noetl_stream.kv.results import ResultStore
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event, decode_event

log = structlog.get_logger(__name__)

__all__ = ["ExecutionCache"]


class ExecutionCache:
    def __init__(
        self,
        js: JetStreamContext,
        reducer: Reducer,
        results: ResultStore,
        snapshots: SnapshotWriter,
        controller_id: str,
        fences: Mapping[int, int],
        size: int,
    ) -> None:
        """`fences`: the partitions the controller holds and their fencing tokens (the events a replay
        publishes carry them)."""
        self.js = js
        self.topology = Topology()
        self.reducer = reducer
        self.results = results
        self._snapshots = snapshots
        self.controller_id = controller_id
        self._fences = fences
        self.size = size
        self.states: OrderedDict[str, ExecutionState] = OrderedDict()
        self.changed: dict[str, float] = {}
        """When each cached execution last changed (epoch seconds): the API's `updated_at`."""
        self.on_resumed: Callable[[list[Event], ExecutionState | None], None] | None = None
        """Called with the effects a resume published (the controller's observer: metrics)."""
        self.children: ChildWatch | None = None
        """Told of every state of a child execution recorded here (`ChildWatch.note`)."""
        self.replays = asyncio.Semaphore(16)
        """Replays read history with ephemeral consumers: bound them (JetStream caps consumers per stream)."""

    async def load(self, execution_id: str, new: bool = False) -> ExecutionState | None:
        state = self.states.get(execution_id)
        if state is not None:
            self.states.move_to_end(execution_id)
            return state
        if new:
            return None  # a request starts a new execution (a redelivered one re-derives the same effects)
        assert self._snapshots.store is not None
        try:
            state = await self._snapshots.store.get(execution_id)
        except ValueError as exc:  # not a snapshot (written by something else), a checksum that differs
            # Only a shortcut: the events are the truth. (Retrying would meet it again, every second.)
            log.warning(
                "controller.rebuild_from_events", execution_id=execution_id, reason=f"snapshot: {exc}"
            )
            state = None
        if state is not None and state.terminal:  # nothing folds into it any more
            keys = state.items_keys
            self.remember(state)
            self.retire(state)
            await self.delete_items(execution_id, keys)  # in case its writer stopped before deleting them
            return state
        if state is not None:
            await self.ensure_plan(state)
            try:
                await self.ensure_items(state)
            except ItemsMissingError as exc:  # e.g. a snapshot of an earlier layout: rebuild from events
                log.warning("controller.rebuild_from_events", execution_id=execution_id, reason=str(exc))
                state = None
        after = state.last_seq if state is not None else 0
        # Always fold everything stored after the snapshot, up to the end of the stream (not just up to
        # this message, which may be a redelivery older than events a dead controller handled and acked
        # after its last snapshot: skipping those lost them): each is applied once, and the messages of
        # them still to come are then skipped as already applied.
        async with self.replays:
            state = await self._replay(execution_id, state, after, None)
        if state is not None:
            self.remember(state)
        return state

    def ready(self, state: ExecutionState) -> bool:
        """Whether `ensure_plan` and `ensure_items` have nothing to load for `state` (the usual case)."""
        if state.content_hash and self.reducer.plans.get(state.content_hash) is None:
            return False
        for run in state.runs.values():
            lr = run.loop
            if lr is not None and not lr.finished:
                return False  # (`ensure_items` decides)
        return True

    async def ensure_plan(self, state: ExecutionState) -> None:
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
        plan, diagnostics = await load_off_loop(
            self.reducer.plans, text, state.file, request.get("extensions") or ()
        )
        if plan is None or plan.content_hash != state.content_hash:
            raise RuntimeError(
                f"execution {state.execution_id}: cannot rebuild its playbook ({len(diagnostics)} "
                "diagnostics or a different content hash)"
            )

    async def ensure_items(self, state: ExecutionState) -> None:
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
        if out.events and self.on_resumed is not None:
            self.on_resumed(out.events, out.state)
        if out.replayed:
            log.info(
                "controller.resumed",
                execution_id=execution_id,
                replayed=out.replayed,
                republished=len(out.events) + len(out.commands),
            )
        return out.state

    def remember(self, state: ExecutionState) -> None:
        """Keep `state` (a fold of it is stored, or it was loaded)."""
        self.states[state.execution_id] = state
        self.states.move_to_end(state.execution_id)
        if state.parent_execution_id is not None and self.children is not None:
            self.children.note(state)
        while len(self.states) > self.size:
            old_id, old = next(iter(self.states.items()))
            if not old.terminal:
                break
            self.drop(old_id)

    def drop(self, execution_id: str) -> None:
        """Forget an execution's in-memory state (it is rebuilt from its snapshot and events)."""
        self.states.pop(execution_id, None)
        self.changed.pop(execution_id, None)
        self._snapshots.forget(execution_id)  # its revision too: read again when it is loaded again
        self.reducer.items.forget(execution_id)

    def retire(self, state: ExecutionState) -> None:
        """A terminal execution whose final snapshot is written: keep only what status queries read."""
        state.results = {}
        state.runs = {}
        state.joins = {}
        state.deferred = []
        self._snapshots.retire(state.execution_id)
        self.reducer.items.forget(state.execution_id)

    async def delete_items(self, execution_id: str, keys: list[str]) -> None:
        """Delete the packed items of distributed loops (best effort): a loop's once it has finished
        (every item dispatched) and the fold that says so is stored, and those of loops still running
        when the execution ended, once its terminal snapshot is stored.

        A controller resuming from an earlier snapshot whose loop still dispatches would read them
        (`ensure_items`); if they are gone, it rebuilds the execution from its events instead
        (`load`), which renders and packs the items again."""
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
