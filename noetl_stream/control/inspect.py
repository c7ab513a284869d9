"""Read-only views of executions for the operator API: status, ctx, events pages, the list.

The controller's live projection answers first (it is the newest), then the KV snapshot, then the
events stream itself (an execution requested but not folded yet is ``pending``; one rejected at
intake has only its ``playbook.processed``). Nothing here writes.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime
import json
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any, Literal, cast

import msgspec
import structlog
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue

from noetl_stream.control.core.state import ExecutionState
from noetl_stream.errors import NoetlError
from noetl_stream.kv import scan
from noetl_stream.kv.history import read_events
from noetl_stream.kv.partindex import is_snapshot_key
from noetl_stream.kv.snapshots import SnapshotStore
from noetl_stream.protocol import events as E
from noetl_stream.protocol.operations import (
    MAX_PAGE,
    CtxReply,
    EventRecord,
    EventsPage,
    ExecutionList,
    ExecutionSummary,
    ListExecutions,
)
from noetl_stream.protocol.subjects import Topology, check_token
from noetl_stream.protocol.wire import decode_event, seconds_between

__all__ = ["Inspector", "QueryError", "summarize"]


log = structlog.get_logger(__name__)


class QueryError(NoetlError, ValueError):
    """A malformed query (bad id, filter or page)."""


class _HeadRun(msgspec.Struct):
    step: str
    status: str = "scheduled"


class _Head(msgspec.Struct):
    """The fields of a snapshot a summary needs (decoding skips the rest: results, loops, ...)."""

    execution_id: str
    status: str = "running"
    content_hash: str = ""
    name: str = ""
    path: str = ""
    file: str = ""
    step_status: dict[str, str] = {}
    runs: dict[str, _HeadRun] = {}
    error: dict[str, Any] | None = None
    parent_execution_id: str | None = None
    last_seq: int = 0
    events_applied: int = 0
    paused: bool = False
    started_at: str | None = None
    finished_at: str | None = None
    retry_of: str | None = None


def summarize(
    state: ExecutionState | _Head,
    source: Literal["live", "snapshot", "stream"] = "snapshot",
    updated_at: str | None = None,
) -> ExecutionSummary:
    return ExecutionSummary(
        execution_id=state.execution_id,
        status=state.status,
        source=source,
        name=state.name,
        path=state.path,
        file=state.file,
        content_hash=state.content_hash,
        paused=state.paused,
        steps=_steps(state),
        error=state.error,
        parent_execution_id=state.parent_execution_id,
        last_seq=state.last_seq,
        events_applied=state.events_applied,
        updated_at=updated_at,
        started_at=state.started_at,
        finished_at=state.finished_at,
        duration_s=seconds_between(state.started_at, state.finished_at),
        retry_of=state.retry_of,
    )


def _steps(state: ExecutionState | _Head) -> dict[str, str]:
    """How each step ended, and the runs in progress (``scheduled``: its command waits for a worker or
    runs; ``looping``: a distributed loop; ``routing``), which a later status replaces. A run still in
    progress when the execution ended (cancelled, failed, past its deadline) was stopped: ``cancelled``,
    as the execution graph says."""
    steps = dict(state.step_status)
    ended = state.status != "running"
    for run in state.runs.values():
        steps[run.step] = "cancelled" if ended else run.status
    return steps


def _iso(when: datetime.datetime | None) -> str | None:
    if when is None:
        return None
    return when.astimezone(datetime.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _parse_time(value: str | None, what: str) -> datetime.datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise QueryError(f"'{what}' is not an ISO-8601 time: {value!r}") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


STATUSES = ("pending", "running", "paused", "success", "failed", "cancelled", "rejected")
"""What the list filters on: an execution's status, or ``paused`` (a running one that is paused)."""


def check_page(offset: int, limit: int) -> None:
    if offset < 0:
        raise QueryError("'offset' must be >= 0")
    if not 1 <= limit <= MAX_PAGE:
        raise QueryError(f"'limit' must be between 1 and {MAX_PAGE}")


class Inspector:
    def __init__(
        self,
        js: JetStreamContext,
        topology: Topology,
        live: Mapping[str, ExecutionState] | None = None,
        changed: Mapping[str, float] | None = None,
    ) -> None:
        """`live`: the controller's states, by execution id; `changed`: when each last changed (epoch
        seconds), the `updated_at` of a live summary."""
        self.js = js
        self.topology = topology
        self.live: Mapping[str, ExecutionState] = live if live is not None else {}
        self.changed: Mapping[str, float] = changed if changed is not None else {}
        self._kv: KeyValue | None = None
        self._heads: SnapshotStore[_Head] | None = None
        self._states: SnapshotStore[ExecutionState] | None = None

    async def _decoded(self, execution_id: str, value: bytes, full: bool = False) -> Any:
        """The snapshot's head (or, `full`, the whole state) from a KV value, inline or a pointer to a
        large snapshot's object; None for a value that is not a snapshot (logged: written by something
        else; the stream still answers)."""
        if full:
            if self._states is None:
                self._states = await SnapshotStore.open(self.js, self.topology, ExecutionState)
            store: SnapshotStore[Any] = self._states
        else:
            if self._heads is None:
                self._heads = await SnapshotStore.open(self.js, self.topology, _Head)
            store = self._heads
        try:
            return await store.decode(execution_id, value)
        except (ValueError, NotFoundError) as exc:  # msgspec's errors included; a missing object
            log.warning("inspect.bad_snapshot", execution_id=execution_id, error=str(exc))
            return None

    def _changed_at(self, execution_id: str) -> str | None:
        at = self.changed.get(execution_id)
        return None if at is None else _iso(datetime.datetime.fromtimestamp(at, datetime.UTC))

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            self._kv = await self.js.key_value(self.topology.executions_bucket)
        return self._kv

    @staticmethod
    def check_id(execution_id: str) -> str:
        try:
            return check_token(execution_id, "execution id")
        except ValueError as exc:
            raise QueryError(str(exc)) from None

    async def _snapshot(self, execution_id: str) -> tuple[bytes, str | None] | None:
        kv = await self._bucket()
        try:
            entry = await kv.get(execution_id)
        except NotFoundError:
            return None
        if not entry.value:
            return None
        created: Any = entry.created
        return entry.value, _iso(created) if isinstance(created, datetime.datetime) else None

    async def _last(self, execution_id: str, name: str) -> dict[str, Any] | None:
        try:
            msg = await self.js.get_last_msg(
                self.topology.events_stream, self.topology.stored_event_filter(execution_id, name)
            )
        except NotFoundError:
            return None
        if not msg.data:
            return None
        try:
            return msgspec.to_builtins(decode_event(msg.data))  # type: ignore[no-any-return]
        except msgspec.DecodeError:  # not written by a runtime (the controller refused it too)
            log.warning("inspect.bad_event", execution_id=execution_id, event_name=name)
            return None

    async def exists(self, execution_id: str) -> bool:
        if self.check_id(execution_id) in self.live:
            return True
        for name in (E.EXECUTION_REQUESTED, E.PLAYBOOK_PROCESSED, E.REQUEST_REJECTED):
            if await self._last(execution_id, name) is not None:
                return True
        return False

    async def status(self, execution_id: str) -> ExecutionSummary | None:
        state = self.live.get(self.check_id(execution_id))
        if state is not None:
            at = self._changed_at(execution_id)
            if at is None:  # cached from its snapshot, not changed since: the snapshot's time
                snap = await self._snapshot(execution_id)
                at = snap[1] if snap is not None else None
            return summarize(state, "live", at)
        snap = await self._snapshot(execution_id)
        head = await self._decoded(execution_id, snap[0]) if snap is not None else None
        if head is not None:
            assert snap is not None
            return summarize(head, "snapshot", snap[1])
        processed = await self._last(execution_id, E.PLAYBOOK_PROCESSED)
        if processed is not None:
            payload = processed.get("payload") or {}
            return ExecutionSummary(
                execution_id=execution_id,
                status=str(payload.get("status") or "failed"),
                source="stream",
                error=payload.get("error"),
                updated_at=processed.get("timestamp"),
            )
        rejected = await self._last(execution_id, E.REQUEST_REJECTED)
        if rejected is not None:  # final: its playbook.processed is missing only until a retry writes it
            return ExecutionSummary(
                execution_id=execution_id,
                status="rejected",
                source="stream",
                error=(rejected.get("payload") or {}).get("error"),
                updated_at=rejected.get("timestamp"),
            )
        requested = await self._last(execution_id, E.EXECUTION_REQUESTED)
        if requested is not None:
            return ExecutionSummary(
                execution_id=execution_id,
                status="pending",
                source="stream",
                file=str(requested.get("entity_id") or ""),
                updated_at=requested.get("timestamp"),
            )
        return None

    async def ctx(self, execution_id: str) -> CtxReply | None:
        state = self.live.get(self.check_id(execution_id))
        if state is None:
            snap = await self._snapshot(execution_id)
            if snap is not None:
                state = await self._decoded(execution_id, snap[0], full=True)
        if state is not None:
            return CtxReply(execution_id=execution_id, ctx=dict(state.ctx), revision=state.ctx_revision)
        if await self.exists(execution_id):
            return CtxReply(execution_id=execution_id, ctx={}, revision=0)
        return None

    async def events(self, execution_id: str, after: int = 0, limit: int = 100) -> EventsPage | None:
        """One page of an execution's events in stream order (None: no such execution). The events one
        message holds (`carried.expand`) share its sequence and stay on one page: a page ends at a message
        boundary, so it may hold a few more than ``limit``."""
        self.check_id(execution_id)
        check_page(after, limit)
        records: list[EventRecord] = []
        more = False
        reader = cast(
            AsyncGenerator[tuple[int, Any], None],
            read_events(self.js, self.topology, execution_id, after_seq=after, batch=min(limit + 1, 500)),
        )
        async with contextlib.aclosing(reader) as stream:
            async for seq, event in stream:
                if len(records) >= limit and seq != records[-1].seq:  # (a message's events on one page)
                    more = True
                    break
                records.append(EventRecord(seq=seq, event=event))
        if not records and after == 0 and not await self.exists(execution_id):
            return None
        return EventsPage(
            execution_id=execution_id, events=records, next_after=records[-1].seq if more else None
        )

    async def executions(self, query: ListExecutions) -> ExecutionList:
        """Snapshots (overlaid with the live projections), newest update (or start) first, filtered and
        paged by offset or by cursor."""
        check_page(query.offset, query.limit)
        if query.status is not None and query.status not in STATUSES:
            raise QueryError(f"'status' must be one of {', '.join(STATUSES)}, not {query.status!r}")
        if query.order not in ORDERS:
            raise QueryError(f"'order' must be one of {', '.join(ORDERS)}, not {query.order!r}")
        since = _parse_time(query.since, "since")
        until = _parse_time(query.until, "until")
        after = _parse_cursor(query.cursor) if query.cursor is not None else None
        rows: dict[str, tuple[str, ExecutionSummary]] = {}
        kv = await self._bucket()
        async for entry in scan.entries(kv):  # to the end (nats-py's watchall may end before the first)
            if not entry.value or not is_snapshot_key(entry.key):
                continue
            when = _iso(entry.created)
            head = await self._decoded(entry.key, entry.value)
            if head is not None:
                rows[head.execution_id] = (when or "", summarize(head, "snapshot", when))
        for state in list(self.live.values()):
            eid = state.execution_id
            # When it last changed; cached from its snapshot and not changed since: the snapshot's time.
            changed = self._changed_at(eid) or (rows[eid][0] if eid in rows else None) or None
            rows[eid] = (changed or "", summarize(state, "live", changed))
        items = [s for _, s in rows.values()]
        retries: dict[str, list[ExecutionSummary]] = {}
        for s in items:
            if s.retry_of is not None:
                retries.setdefault(s.retry_of, []).append(s)
        for s in items:
            if s.execution_id in retries:
                newest = sorted(retries[s.execution_id], key=_sort_key("started"), reverse=True)
                s.retried_by = [r.execution_id for r in newest]
        if query.status == "paused":
            items = [s for s in items if s.paused]
        elif query.status is not None:
            items = [s for s in items if s.status == query.status]
        if query.playbook is not None:
            items = [s for s in items if query.playbook in (s.path, s.name)]
        if query.q:
            needle = query.q.lower()
            items = [s for s in items if needle in s.execution_id.lower()]
        if query.retry_of is not None:
            items = [s for s in items if s.retry_of == query.retry_of]
        if since is not None or until is not None:
            kept = []
            for s in items:
                at = _parse_time(s.updated_at, "updated_at") if s.updated_at else None
                if at is None or (since is not None and at < since) or (until is not None and at > until):
                    continue
                kept.append(s)
            items = kept
        key = _sort_key(query.order)
        items.sort(key=key, reverse=True)
        if after is not None:
            start = next((i for i, s in enumerate(items) if key(s) < after), len(items))
        else:
            start = query.offset
        page = items[start : start + query.limit]
        more = start + query.limit < len(items)
        return ExecutionList(
            items=page,
            total=len(items),
            offset=start,
            limit=query.limit,
            next_cursor=_cursor(key(page[-1])) if page and more else None,
        )


ORDERS = ("updated", "started")
"""How the list is sorted (newest first): by the last update, or by the start."""

_SortKey = tuple[str, str]


def _sort_key(order: str) -> Callable[[ExecutionSummary], _SortKey]:
    """The list's order, newest first when sorted in reverse; the id breaks ties, so every row has a place
    of its own and a cursor names one. Times are UTC ISO strings of one format: they sort as text."""
    if order == "started":
        return lambda s: (s.started_at or "", s.execution_id)
    return lambda s: (s.updated_at or "", s.execution_id)


def _cursor(key: _SortKey) -> str:
    """An opaque cursor for the row with this sort key: the page after it starts at the next row."""
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode().rstrip("=")


def _parse_cursor(cursor: str) -> _SortKey:
    try:
        raw = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, binascii.Error):
        raw = None
    if not (isinstance(raw, list) and len(raw) == 2 and all(isinstance(v, str) for v in raw)):
        raise QueryError("'cursor' is not one this API gave (pass a page's next_cursor as it is)")
    return raw[0], raw[1]
