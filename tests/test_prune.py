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
from noetl_stream.control.prune import prune
from noetl_stream.control.state import ExecutionState
from noetl_stream.embedded import EmbeddedNats
from noetl_stream.kv.provision import provision
from noetl_stream.kv.results import ResultStore
from noetl_stream.kv.snapshots import SnapshotStore
from noetl_stream.subjects import Topology
from noetl_stream.wire import encode

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
    await results.put("snapshots/done/0123abcd", {"old": True})  # a replaced snapshot's object
    # young: history only (no snapshot yet)
    await stored_request(js, topology, "young")
    await results.put("young/young-s1/result", 3)
    # a large snapshot: its pointer names one object, the other is a leftover
    snapshots.inline_limit = 10
    await snapshots.put("large", ExecutionState(execution_id="large", status="running"))
    await results.put("snapshots/large/leftover", {"x": 1})
    # not a name the runtime writes
    await results.put("misc", 4)
    return snapshots


PRUNED = {
    "gone/gone-s1/result",
    "gone/gone-l1/items",
    "done/done-l1/items",
    "snapshots/done/0123abcd",
    "snapshots/large/leftover",
}


async def test_prune_deletes_what_nothing_can_read_and_keeps_the_rest(
    installed: JetStreamContext, topology: Topology
) -> None:
    js = installed
    snapshots = await populate(js, topology)
    before = await names(js, topology)
    (large_object,) = {n for n in before if n.startswith("snapshots/large/")} - {"snapshots/large/leftover"}

    fresh = await prune(js, topology)  # everything was written just now: within the grace period
    assert fresh.pruned == [] and fresh.kept == len(before) == fresh.scanned

    dry = await prune(js, topology, now=LATER, dry_run=True)
    assert set(dry.pruned) == PRUNED and dry.dry_run
    assert await names(js, topology) == before

    report = await prune(js, topology, now=LATER)
    assert set(report.pruned) == PRUNED
    assert report.executions == 3 and report.errors == []  # gone, done, large
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
