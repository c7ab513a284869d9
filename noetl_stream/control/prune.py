"""Pruning the results object store: objects that nothing can read any more.

What the runtime writes to ``<prefix>_results`` is named after the execution that wrote it:

- ``<id>/<step run>/result``, ``<id>/results/<name>`` and other names under ``<id>/``: results above the
  inline limit, read by later steps and by inspection for as long as a history or a snapshot refers to
  them — possibly another execution's (a parent holds its child's result reference, a ``retry`` the
  results it reuses);
- ``<id>/<loop run>/items``: a distributed loop's packed items, needed only while the loop runs (the
  controller deletes them when it finishes; a failed delete leaves them);
- ``snapshots/<id>/<32 hex>``: a snapshot above the KV limit, needed while the KV pointer names it (a
  replaced one is deleted; a failed delete, or the pointer expiring with a finished execution's
  snapshot, leaves it).

`prune` lists the objects (keeping, of those old enough, only name, nuid and size), then reads every
snapshot in the executions bucket and collects the result references they hold; nothing is deleted
unless both reads reached their end. It then deletes, among objects older than a grace period that no
snapshot refers to: the objects of executions that no longer exist (no snapshot and no
``playbook.execution.requested`` or ``playbook.processed`` left in the events stream: the history
expired), the items of finished executions, and snapshot objects their execution's pointer does not
name (these only after `SNAPSHOT_OBJECT_GRACE_S` whatever the grace period: a snapshot's object is
written just before its pointer). Anything else (names the runtime does not write, an unreadable
snapshot) is kept.

Executions are looked up and their objects deleted `CONCURRENCY` at a time (the report keeps the
listing's order). Each delete is final: a run cut short (a deadline, a lost connection) loses none of
what it did, and the next run starts from what is left. Cost: linear in the objects and snapshots,
three requests per object it deletes (`ResultStore.delete`), one or two per execution without a
snapshot (docs/operations.md, "Retention").
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import re
from collections import defaultdict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError
from nats.js.object_store import OBJ_ALL_META_PRE_TEMPLATE, OBJ_STREAM_TEMPLATE

from noetl_stream.control.core.state import ExecutionState
from noetl_stream.kv.partindex import is_snapshot_key
from noetl_stream.kv.results import ResultStore
from noetl_stream.kv.scan import entries, last_messages
from noetl_stream.kv.snapshots import SnapshotStore, pointed_object
from noetl_stream.protocol import events as E
from noetl_stream.protocol.refs import REF
from noetl_stream.protocol.subjects import SubjectError, Topology, check_token

__all__ = ["SNAPSHOT_OBJECT_GRACE_S", "PruneReport", "prune"]

SNAPSHOTS = "snapshots/"
SNAPSHOT_OBJECT_GRACE_S = 900.0
"""The least age of a snapshot object `prune` deletes, whatever its grace period: the writer stores the
object first and then points the KV value to it."""
_SNAPSHOT_OBJECT = re.compile(r"snapshots/([^/]+)/[0-9a-f]{32}")
_MTIME = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)?")


class _Head(msgspec.Struct):
    status: str = "running"


_decode_head = msgspec.json.Decoder(_Head).decode

_STREAM_NOT_FOUND = 10059
"""JSStreamNotFoundErr, as opposed to a message that is not in the stream."""

_LIST_BATCH = 256
"""Object metas fetched at once."""
_SCAN_BATCH = 64
"""Snapshots fetched at once (each up to 512 KiB)."""

CONCURRENCY = 8
"""Executions whose objects are looked up and deleted at once (each execution's one after the other)."""


class _Object(NamedTuple):
    """What `prune` keeps of a listed object it may delete."""

    name: str
    nuid: str
    size: int


class _Snapshot(NamedTuple):
    """What `_doomed` needs of an execution's snapshot (its KV value)."""

    pointer: str | None
    """The object a large snapshot's pointer names."""
    finished: bool


class _Meta(msgspec.Struct):
    """An object's meta message, as far as `prune` reads it."""

    name: str | None = None
    nuid: str | None = None
    size: int | None = None
    mtime: str | None = None
    deleted: bool | None = None


_decode_meta = msgspec.json.Decoder(_Meta).decode


def _summary(value: bytes) -> _Snapshot:
    pointer = pointed_object(value)
    return _Snapshot(pointer, pointer is None and _decode_head(value).status != "running")


@dataclass
class PruneReport:
    """What `prune` found and did (``pruned``: object names, deleted unless it was a dry run)."""

    scanned: int = 0
    kept: int = 0
    pruned: list[str] = field(default_factory=list)
    pruned_bytes: int = 0
    executions: int = 0
    """Executions some object was pruned of."""
    referenced: int = 0
    """Objects kept because a snapshot refers to them."""
    errors: list[str] = field(default_factory=list)
    dry_run: bool = False


async def prune(
    js: JetStreamContext,
    topology: Topology,
    *,
    older_than_s: float = 3600.0,
    dry_run: bool = False,
    now: datetime.datetime | None = None,
) -> PruneReport:
    """Delete the results store's objects nothing can read any more (see the module); only objects last
    written more than `older_than_s` ago are considered.

    An installation that is not on the server (a wrong prefix, never provisioned, a bucket or stream
    deleted) raises what nats-py raises for it (``BucketNotFoundError``, ``NotFoundError``), which the
    CLI reports like every other command's (exit 2, "run `noetl-stream provision`"): before anything
    is read, since without the snapshots or the histories nothing can be known unread."""
    report = PruneReport(dry_run=dry_run)
    await js.object_store(topology.results_store)
    await js.key_value(topology.executions_bucket)
    await js.stream_info(topology.events_stream)
    now = now or datetime.datetime.now(datetime.UTC)
    cutoff = now - datetime.timedelta(seconds=older_than_s)
    snapshot_cutoff = now - datetime.timedelta(seconds=max(older_than_s, SNAPSHOT_OBJECT_GRACE_S))
    owned: dict[str, list[_Object]] = defaultdict(list)
    stream = OBJ_STREAM_TEMPLATE.format(bucket=topology.results_store)
    metas = OBJ_ALL_META_PRE_TEMPLATE.format(bucket=topology.results_store)
    async with contextlib.aclosing(last_messages(js, stream, metas, _LIST_BATCH)) as listing:
        async for msg in listing:  # one object at a time: only the candidates are kept, and small
            try:
                info = _decode_meta(msg.data)
            except (msgspec.DecodeError, msgspec.ValidationError):
                info = _Meta()  # unreadable: kept
            if info.deleted:
                continue
            report.scanned += 1
            name = info.name or ""
            owner = _owner(name)
            written = _mtime(info.mtime)
            limit = snapshot_cutoff if _SNAPSHOT_OBJECT.fullmatch(name) else cutoff
            if owner is None or written is None or written > limit:
                report.kept += 1
                continue
            owned[owner].append(_Object(name, info.nuid or "", info.size or 0))
    if not owned:
        return report
    try:
        referenced, snapshots = await _scan(js, topology, set(owned))
    except Exception as exc:  # without the references nothing can be known unread: delete nothing
        report.errors.append(f"reading the snapshots' references: {exc or type(exc).__name__}")
        report.kept += sum(len(objects) for objects in owned.values())
        return report
    results = ResultStore(js, topology)
    # `CONCURRENCY` executions at once, their reports added in the listing's order
    running: deque[asyncio.Task[PruneReport]] = deque()
    try:
        for eid, objects in owned.items():
            if len(running) >= CONCURRENCY:
                _add(report, await running.popleft())
            unreferenced = [o for o in objects if o.name not in referenced]
            part = PruneReport(referenced=len(objects) - len(unreferenced))
            part.kept = part.referenced
            work = _prune_execution(
                js, topology, results, eid, snapshots.get(eid), unreferenced, part, dry_run
            )
            running.append(asyncio.create_task(work))
        while running:
            _add(report, await running.popleft())
    finally:
        for task in running:
            task.cancel()
    return report


def _add(report: PruneReport, part: PruneReport) -> None:
    report.kept += part.kept
    report.referenced += part.referenced
    report.executions += part.executions
    report.pruned.extend(part.pruned)
    report.pruned_bytes += part.pruned_bytes
    report.errors.extend(part.errors)


async def _prune_execution(
    js: JetStreamContext,
    topology: Topology,
    results: ResultStore,
    eid: str,
    snapshot: _Snapshot | Exception | None,
    unreferenced: list[_Object],
    report: PruneReport,
    dry_run: bool,
) -> PruneReport:
    """Delete what nothing can read among `unreferenced` (objects of `eid` no snapshot refers to), in
    `report` (a part of the run's)."""
    try:
        doomed = await _doomed(js, topology, eid, snapshot, unreferenced)
    except Exception as exc:  # one execution's lookup failing keeps its objects, not the others'
        report.errors.append(f"{eid}: {exc or type(exc).__name__}")
        report.kept += len(unreferenced)
        return report
    report.kept += len(unreferenced) - len(doomed)
    if doomed:
        report.executions += 1
    for info in doomed:
        if not dry_run:
            try:
                if not await results.delete(info.name, nuid=info.nuid):
                    report.kept += 1  # written again since it was listed (or gone already)
                    continue
            except Exception as exc:
                report.errors.append(f"{info.name}: {exc or type(exc).__name__}")
                report.kept += 1
                continue
        report.pruned.append(info.name)
        report.pruned_bytes += info.size
    return report


async def _scan(
    js: JetStreamContext, topology: Topology, owners: set[str]
) -> tuple[set[str], dict[str, _Snapshot | Exception]]:
    """One pass over the executions bucket: the result-store keys its snapshots refer to (a large
    snapshot is read from its object), and what `_doomed` needs of the snapshots of `owners` (or why it
    could not be read)."""
    keys: set[str] = set()
    snapshots: dict[str, _Snapshot | Exception] = {}
    store = await SnapshotStore.open(js, topology, ExecutionState)
    bucket = await js.key_value(topology.executions_bucket)
    async with contextlib.aclosing(entries(bucket, batch=_SCAN_BATCH)) as values:
        async for key, value, _, _ in values:
            if not value or not is_snapshot_key(key):
                continue
            if key in owners:
                try:
                    snapshots[key] = _summary(value)
                except Exception as exc:  # that execution's objects are kept (`_doomed`), not the others'
                    snapshots[key] = exc
            if pointed_object(value) is not None:
                state = await store.get(key, record=False)
                keys.update(_ref_keys(msgspec.to_builtins(state), topology.results_store))
            elif REF.encode() in value:
                keys.update(_ref_keys(msgspec.json.decode(value), topology.results_store))
    return keys, snapshots


def _ref_keys(value: Any, bucket: str) -> Iterator[str]:
    """The keys of every result reference in `value` (``{"$ref": {"bucket": ..., "key": ...}}``)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            ref = v.get(REF)
            if isinstance(ref, dict) and isinstance(ref.get("key"), str):
                if ref.get("bucket", bucket) == bucket:
                    yield ref["key"]
                continue
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


async def _doomed(
    js: JetStreamContext,
    topology: Topology,
    eid: str,
    snapshot: _Snapshot | Exception | None,
    objects: list[_Object],
) -> list[_Object]:
    """Among `objects` of `eid` (none of them referenced by a snapshot; `snapshot`: its snapshot, if
    any), those nothing can read."""
    if not objects:
        return []
    if isinstance(snapshot, Exception):
        raise snapshot
    if snapshot is None:
        if await _in_history(js, topology, eid):
            return []  # running without a snapshot yet, or a history that outlives its snapshot: keep
        return list(objects)
    doomed = []
    for info in objects:
        if _SNAPSHOT_OBJECT.fullmatch(info.name):
            if snapshot.pointer != info.name:
                doomed.append(info)
        elif snapshot.finished and info.name.endswith("/items"):
            doomed.append(info)
    return doomed


async def _in_history(js: JetStreamContext, topology: Topology, eid: str) -> bool:
    for name in (E.EXECUTION_REQUESTED, E.PLAYBOOK_PROCESSED):
        try:
            await js.get_last_msg(topology.events_stream, topology.stored_event_filter(eid, name))
            return True
        except NotFoundError as exc:
            if exc.err_code == _STREAM_NOT_FOUND:  # the events stream is gone: no history is known gone
                raise
            continue
    return False


def _owner(name: str) -> str | None:
    """The execution an object of the runtime belongs to (None for names the runtime does not write).
    ``snapshots/<id>/<32 hex>`` is a snapshot object of ``<id>``; any other ``snapshots/...`` belongs to
    an execution whose id is ``snapshots``."""
    match = _SNAPSHOT_OBJECT.fullmatch(name)
    eid = match.group(1) if match else name.partition("/")[0]
    if "/" not in name:
        return None
    try:
        return check_token(eid, "execution id")
    except SubjectError:
        return None


def _mtime(value: str | None) -> datetime.datetime | None:
    """An object's modification time (RFC 3339, nanoseconds allowed), None when unreadable or not set
    (a year before 2000: the zero time some clients write)."""
    match = _MTIME.fullmatch(value or "")
    if match is None:
        return None
    whole, fraction, offset = match.groups()
    text = whole + (f".{fraction[:6]}" if fraction else "") + ("+00:00" if offset in (None, "Z") else offset)
    try:
        parsed = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.year >= 2000 else None
