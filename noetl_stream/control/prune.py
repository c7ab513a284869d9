"""Pruning the results object store: objects that nothing can read any more.

What the runtime writes to ``<prefix>_results`` is named after its execution:

- ``<id>/<step run>/result`` (and other names under ``<id>/``): a result above the inline limit, read by
  later steps and by inspection for as long as the execution's history exists;
- ``<id>/<loop run>/items``: a distributed loop's packed items, needed only while the loop runs (the
  controller deletes them when it finishes; a failed delete leaves them);
- ``snapshots/<id>/<uuid>``: a snapshot above the KV limit, needed while the KV pointer names it (a
  replaced one is deleted; a failed delete, or the pointer expiring with a finished execution's
  snapshot, leaves it).

`prune` deletes, among objects older than a grace period, those of executions that no longer exist
(no snapshot and no ``playbook.execution.requested``/``playbook.processed`` left in the events stream:
the history expired), the items of finished executions, and snapshot objects their execution's pointer
does not name. Anything else (names the runtime does not write, an unreadable snapshot) is kept.
"""

from __future__ import annotations

import datetime
from collections import defaultdict
from dataclasses import dataclass, field

import msgspec
from nats.js.api import ObjectInfo
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue

from noetl_stream import events as E
from noetl_stream.kv.results import ResultStore
from noetl_stream.subjects import SubjectError, Topology, check_token

__all__ = ["PruneReport", "prune"]

SNAPSHOTS = "snapshots/"


class _Head(msgspec.Struct):
    status: str = "running"


class _Pointer(msgspec.Struct):
    object: str = ""


class _PointerValue(msgspec.Struct, rename={"snapshot": "$snapshot"}):
    snapshot: _Pointer | None = None


@dataclass
class PruneReport:
    """What `prune` found and did (``pruned``: object names, deleted unless it was a dry run)."""

    scanned: int = 0
    kept: int = 0
    pruned: list[str] = field(default_factory=list)
    pruned_bytes: int = 0
    executions: int = 0
    """Executions some object was pruned of."""
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
    written more than `older_than_s` ago are considered."""
    report = PruneReport(dry_run=dry_run)
    try:
        store = await js.object_store(topology.results_store)
        infos = await store.list(ignore_deletes=True)
    except NotFoundError:  # no bucket, or an empty one
        return report
    cutoff = (now or datetime.datetime.now(datetime.UTC)) - datetime.timedelta(seconds=older_than_s)
    owned: dict[str, list[ObjectInfo]] = defaultdict(list)
    for info in infos:
        report.scanned += 1
        eid = _owner(info.name or "")
        written = _mtime(info.mtime)
        if eid is None or written is None or written > cutoff:
            report.kept += 1
            continue
        owned[eid].append(info)
    kv = await js.key_value(topology.executions_bucket)
    results = ResultStore(js, topology)
    for eid, objects in owned.items():
        try:
            doomed = await _doomed(js, kv, topology, eid, objects)
        except Exception as exc:  # one execution's lookup failing keeps its objects, not the others'
            report.errors.append(f"{eid}: {exc or type(exc).__name__}")
            report.kept += len(objects)
            continue
        report.kept += len(objects) - len(doomed)
        if doomed:
            report.executions += 1
        for info in doomed:
            name = info.name or ""
            if not dry_run:
                try:
                    await results.delete(name)
                except Exception as exc:
                    report.errors.append(f"{name}: {exc or type(exc).__name__}")
                    report.kept += 1
                    continue
            report.pruned.append(name)
            report.pruned_bytes += info.size or 0
    return report


async def _doomed(
    js: JetStreamContext, kv: KeyValue, topology: Topology, eid: str, objects: list[ObjectInfo]
) -> list[ObjectInfo]:
    """The objects of `eid` that nothing can read any more."""
    try:
        entry = await kv.get(eid)
        value = entry.value or b""
    except NotFoundError:
        value = b""
    if not value:
        if await _in_history(js, topology, eid):
            return []  # running without a snapshot yet, or a history that outlives its snapshot: keep
        return list(objects)
    pointer = None
    if value.startswith(b'{"$snapshot"'):
        pointer = msgspec.json.decode(value, type=_PointerValue).snapshot
    finished = pointer is None and msgspec.json.decode(value, type=_Head).status != "running"
    doomed = []
    for info in objects:
        name = info.name or ""
        if name.startswith(SNAPSHOTS):
            if pointer is None or pointer.object != name:
                doomed.append(info)
        elif finished and name.endswith("/items"):
            doomed.append(info)
    return doomed


async def _in_history(js: JetStreamContext, topology: Topology, eid: str) -> bool:
    for name in (E.EXECUTION_REQUESTED, E.PLAYBOOK_PROCESSED):
        try:
            await js.get_last_msg(topology.events_stream, topology.stored_event_filter(eid, name))
            return True
        except NotFoundError:
            continue
    return False


def _owner(name: str) -> str | None:
    """The execution an object of the runtime belongs to (None for names the runtime does not write)."""
    rest = name[len(SNAPSHOTS) :] if name.startswith(SNAPSHOTS) else name
    eid, sep, _ = rest.partition("/")
    if not sep:
        return None
    try:
        return check_token(eid, "execution id")
    except SubjectError:
        return None


def _mtime(value: str | None) -> datetime.datetime | None:
    """An object's modification time (RFC 3339, nanoseconds allowed), None when unreadable."""
    if not value:
        return None
    text = value.replace("Z", "+00:00")
    head, dot, tail = text.partition(".")
    if dot:  # Python reads at most microseconds: cut the fraction to 6 digits, keep the offset
        digits = "".join(c for c in tail if c.isdigit())
        offset = tail[len(digits) :]
        text = f"{head}.{digits[:6]}{offset}"
    try:
        parsed = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)
