"""`noetl-stream prune`: result-store objects nothing can read any more, on a real nats-server."""

from __future__ import annotations

import asyncio
import datetime
import json

import pytest
from click.testing import CliRunner
from helpers import requested
from nats.js.client import JetStreamContext

from noetl_stream.cli import main
from noetl_stream.control.core.state import ExecutionState
from noetl_stream.control.prune import CONCURRENCY, SNAPSHOT_OBJECT_GRACE_S, _mtime, prune
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.provision import provision
from noetl_stream.kv.results import ResultStore
from noetl_stream.kv.snapshots import SnapshotStore
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import encode

LATER = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=2)
"""A `now` two hours ahead: every object written by the test is older than the default hour."""


@pytest.fixture
async def installed(js: JetStreamContext, topology: Topology) -> JetStreamContext:
    await provision(js, topology)
    return js


async def stored_request(js: JetStreamContext, topology: Topology, eid: str) -> None:
    """What intake stores when an execution starts: its history exists from then on."""
    ev = requested(eid, "{}")
    await js.publish(topology.event_subject(eid, ev.name), encode(ev))


async def names(js: JetStreamContext, topology: Topology) -> set[str]:
    store = await js.object_store(topology.results_store)
    try:
        return {i.name for i in await store.list(ignore_deletes=True) if i.name}
    except Exception:
        return set()


async def populate(js: JetStreamContext, topology: Topology) -> SnapshotStore[ExecutionState]:
    results = ResultStore(js, topology)
    snapshots = await SnapshotStore.open(js, topology, ExecutionState)
    # gone: no snapshot, no history left
    await results.put("gone/gone-s1/result", {"big": 1})
    await results.put("gone/gone-l1/items", [1, 2])
    # running: a snapshot that says so, its loop's items and a result
    await snapshots.put("run", ExecutionState(execution_id="run", status="running"))
    await results.put("run/run-l1/items", [1])
    await results.put("run/run-s1/result", 1)
    # done: a finished execution whose items a failed delete left behind
    await snapshots.put("done", ExecutionState(execution_id="done", status="success"))
    await results.put("done/done-s1/result", 2)
    await results.put("done/done-l1/items", [2])
    await results.put(f"snapshots/done/{'ab' * 16}", {"old": True})  # a replaced snapshot's object
    # young: history only (no snapshot yet)
    await stored_request(js, topology, "young")
    await results.put("young/young-s1/result", 3)
    # a large snapshot: its pointer names one object, the other is a leftover
    snapshots.inline_limit = 10
    await snapshots.put("large", ExecutionState(execution_id="large", status="running"))
    await results.put(f"snapshots/large/{'cd' * 16}", {"x": 1})  # a leftover of an earlier write
    # a parent (running) holds a reference to its child's result; the child's history is gone
    child = await results.put("child/child-s1/result", {"big": 5})
    await snapshots.put(
        "parent", ExecutionState(execution_id="parent", status="running", results={"call": child})
    )
    # an execution whose id is "snapshots" (client ids are free): its result is not a snapshot object
    await snapshots.put("snapshots", ExecutionState(execution_id="snapshots", status="running"))
    await results.put("snapshots/fetch-1/result", 6)
    # not a name the runtime writes
    await results.put("misc", 4)
    return snapshots


PRUNED = {
    "gone/gone-s1/result",
    "gone/gone-l1/items",
    "done/done-l1/items",
    f"snapshots/done/{'ab' * 16}",
    f"snapshots/large/{'cd' * 16}",
}


async def test_prune_deletes_what_nothing_can_read_and_keeps_the_rest(
    installed: JetStreamContext, topology: Topology
) -> None:
    js = installed
    snapshots = await populate(js, topology)
    before = await names(js, topology)
    (large_object,) = {n for n in before if n.startswith("snapshots/large/")} - PRUNED

    fresh = await prune(js, topology)  # everything was written just now: within the grace period
    assert fresh.pruned == [] and fresh.kept == len(before) == fresh.scanned

    dry = await prune(js, topology, now=LATER, dry_run=True)
    assert set(dry.pruned) == PRUNED and dry.dry_run
    assert await names(js, topology) == before

    report = await prune(js, topology, now=LATER)
    assert set(report.pruned) == PRUNED
    assert report.executions == 3 and report.errors == []  # gone, done, large
    assert report.referenced == 1  # the child's result, which the running parent holds
    assert report.pruned_bytes > 0
    left = await names(js, topology)
    assert left == before - PRUNED
    assert large_object in left
    large = await snapshots.get("large", record=False)  # its pointer still resolves
    assert large is not None and large.status == "running"
    assert await ResultStore(js, topology).get_encoded("done/done-s1/result") == b"2"

    again = await prune(js, topology, now=LATER)
    assert again.pruned == []


async def test_prune_on_an_empty_installation_does_nothing(
    installed: JetStreamContext, topology: Topology
) -> None:
    js = installed
    report = await prune(js, topology, now=LATER)
    assert (report.scanned, report.pruned, report.errors) == (0, [], [])


async def test_prune_cli(installed: JetStreamContext, topology: Topology, nats_server: EmbeddedNats) -> None:
    js = installed
    results = ResultStore(js, topology)
    await results.put("gone/gone-s1/result", {"big": 1})
    await results.put("misc", 1)
    env = {"NOETL_NATS_URL": nats_server.url, "NOETL_PREFIX": topology.prefix}

    out = await asyncio.to_thread(
        CliRunner().invoke, main, ["prune", "--dry-run", "--older-than", "0", "--json"], env=env
    )
    assert out.exit_code == 0, out.output
    body = json.loads(out.output)
    assert body["pruned"] == ["gone/gone-s1/result"] and body["dry_run"] is True

    out = await asyncio.to_thread(CliRunner().invoke, main, ["prune", "--older-than", "0"], env=env)
    assert out.exit_code == 0, out.output
    assert out.output.startswith("pruned 1 objects (")
    assert "gone/gone-s1/result" in out.output
    assert await names(js, topology) == {"misc"}

    bad = await asyncio.to_thread(CliRunner().invoke, main, ["prune", "--older-than", "-1"], env=env)
    assert bad.exit_code == 2


async def test_a_fresh_stray_snapshot_object_is_kept_whatever_the_grace_period(
    installed: JetStreamContext, topology: Topology
) -> None:
    """A snapshot's object is written just before the KV pointer that names it: never pruned young."""
    js = installed
    results = ResultStore(js, topology)
    await (await SnapshotStore.open(js, topology, ExecutionState)).put(
        "e1", ExecutionState(execution_id="e1", status="running")
    )
    await results.put(f"snapshots/e1/{'ef' * 16}", {"x": 1})
    assert (await prune(js, topology, older_than_s=0)).pruned == []
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=SNAPSHOT_OBJECT_GRACE_S + 60)
    assert (await prune(js, topology, older_than_s=0, now=later)).pruned == [f"snapshots/e1/{'ef' * 16}"]


async def test_a_delete_skips_an_object_written_again_since_it_was_listed(
    installed: JetStreamContext, topology: Topology
) -> None:
    js = installed
    results = ResultStore(js, topology)
    await results.put("gone/gone-s1/result", 1)
    store = await js.object_store(topology.results_store)
    listed = (await store.get_info("gone/gone-s1/result")).nuid
    await results.put("gone/gone-s1/result", 2)  # written again: another object under the same name
    assert not await results.delete("gone/gone-s1/result", nuid=listed)
    assert await results.get_encoded("gone/gone-s1/result") == b"2"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-22T16:00:00.123456789Z", datetime.datetime(2026, 11, 22, 16, 0, 0, 123456, datetime.UTC)),
        ("2026-11-22T09:00:00.5-07:00", datetime.datetime(2026, 11, 22, 16, 0, 0, 500000, datetime.UTC)),
        ("2026-11-22T16:00:00Z", datetime.datetime(2026, 11, 22, 16, 0, 0, tzinfo=datetime.UTC)),
        ("0001-01-01T00:00:00Z", None),  # the zero time: unknown, so kept
        ("yesterday", None),
        (None, None),
    ],
)
def test_object_times_are_read_with_their_offset(
    text: str | None, expected: datetime.datetime | None
) -> None:
    assert _mtime(text) == expected


async def test_many_executions_are_pruned_in_listing_order_and_a_bad_snapshot_keeps_only_its_own(
    installed: JetStreamContext, topology: Topology
) -> None:
    """More executions than are pruned at once: the report lists the deleted objects in the order they
    were listed, whatever order the deletes finished in; an unreadable snapshot keeps its execution's
    objects only."""
    js = installed
    results = ResultStore(js, topology)
    written = []
    for i in range(3 * CONCURRENCY):
        if i == CONCURRENCY + 1:
            kv = await js.key_value(topology.executions_bucket)
            await kv.put("bad", b'{"status": 5}')  # not a snapshot prune can read
            await results.put("bad/bad-l1/items", [1])
        for name in (f"g{i:02d}/g{i:02d}-s1/result", f"g{i:02d}/g{i:02d}-l1/items"):
            await results.put(name, i)
            written.append(name)

    dry = await prune(js, topology, now=LATER, dry_run=True)
    report = await prune(js, topology, now=LATER)
    assert dry.pruned == report.pruned == written
    assert report.executions == 3 * CONCURRENCY and report.kept == 1 and report.scanned == len(written) + 1
    (error,) = report.errors
    assert error.startswith("bad: ")
    assert await names(js, topology) == {"bad/bad-l1/items"}


async def test_every_snapshot_is_read_before_anything_is_deleted(
    installed: JetStreamContext, topology: Topology
) -> None:
    """A few hundred snapshots, each a running parent holding its gone child's result: every run sees
    them all. (nats-py's ``watchall`` may end its current values before the first one arrives, which
    now and then made the scan see no snapshot at all and prune every child's result.)"""
    js = installed
    results = ResultStore(js, topology)
    snapshots = await SnapshotStore.open(js, topology, ExecutionState)
    parents = 200

    async def parent(i: int) -> None:
        child = await results.put(f"c{i:03d}/c{i:03d}-s1/result", i)
        state = ExecutionState(execution_id=f"p{i:03d}", status="running", results={"call": child})
        await snapshots.put(f"p{i:03d}", state)

    await asyncio.gather(*(parent(i) for i in range(parents)))
    for _ in range(10):
        report = await prune(js, topology, now=LATER, dry_run=True)
        assert (report.pruned, report.referenced, report.errors) == ([], parents, [])
