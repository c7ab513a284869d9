"""An installation missing on the server, as an operator meets it: `prune` (a nightly CronJob) fails
like every other command instead of reporting nothing to do, and a controller whose snapshot bucket is
gone says which bucket and how to get it back."""

from __future__ import annotations

import asyncio
import datetime
import os
import uuid

import pytest
import structlog
from helpers import playbook, requested
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError
from procs import run_cli

from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import follow
from noetl_stream.control.core.state import ExecutionState
from noetl_stream.control.prune import _in_history, prune
from noetl_stream.errors import StoreMissingError
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.provision import provision
from noetl_stream.kv.results import ResultStore
from noetl_stream.kv.snapshots import SnapshotStore
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import encode
from noetl_stream.runtime.local import Runtime

LATER = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=2)


def cli_env(nats_server: EmbeddedNats, prefix: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("NOETL_")}
    return {**base, "NOETL_NATS_URL": nats_server.url, "NOETL_PREFIX": prefix}


def one_error_line(code: int, err: str, expected_code: int = 2) -> str:
    assert code == expected_code, (code, err)
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("options", [[], ["--dry-run", "--json"]])
async def test_prune_of_an_installation_that_is_not_there_fails_like_every_command(
    nats_server: EmbeddedNats, options: list[str]
) -> None:
    """``prune --prefix typo`` said "pruned 0 objects ... kept 0 of 0" and exited 0 every night."""
    typo = "u" + uuid.uuid4().hex[:10]  # nothing provisioned under it
    code, out, err = await run_cli(cli_env(nats_server, typo), "prune", *options)
    line = one_error_line(code, err)
    assert "does not exist" in line and "noetl-stream provision" in line and "--prefix" in line
    assert out == ""
    # the same line as another command's on that prefix
    code, _, status_err = await run_cli(cli_env(nats_server, typo), "executions")
    assert one_error_line(code, status_err) == line


@pytest.mark.parametrize(
    ("gone", "says"),
    [("events", "a stream of the installation does not exist"), ("executions", "a KV bucket")],
)
async def test_prune_with_a_stream_or_bucket_gone_deletes_nothing_and_fails(
    nats_server: EmbeddedNats, js: JetStreamContext, topology: Topology, gone: str, says: str
) -> None:
    """Without the events stream every execution without a snapshot looked expired, and its results
    were deleted; without the snapshots nothing can be known unread."""
    await provision(js, topology)
    results = ResultStore(js, topology)
    await results.put("running/running-s1/result", {"big": 1})  # running, no snapshot yet
    await js.publish(
        topology.event_subject("running", "playbook.execution.requested"),
        encode(requested("running", "{}")),
    )
    await js.delete_stream(topology.events_stream if gone == "events" else f"KV_{topology.executions_bucket}")

    code, _, err = await run_cli(cli_env(nats_server, topology.prefix), "prune", "--older-than", "0")
    line = one_error_line(code, err)
    assert says in line and "noetl-stream provision" in line
    store = await js.object_store(topology.results_store)
    assert (await store.get("running/running-s1/result")).data == b'{"big":1}'
    with pytest.raises(NotFoundError):  # the library says it too, before reading anything
        await prune(js, topology, now=LATER)


async def test_a_history_lookup_on_a_deleted_events_stream_is_an_error_not_an_expired_history(
    js: JetStreamContext, topology: Topology
) -> None:
    """The events stream deleted while `prune` runs: an execution's lookup fails (its objects are
    kept), rather than finding no history (and deleting them)."""
    await provision(js, topology)
    assert not await _in_history(js, topology, "nobody")  # a stream without that history: no history
    await js.delete_stream(topology.events_stream)
    with pytest.raises(NotFoundError):
        await _in_history(js, topology, "nobody")


HELLO = playbook("- step: start\n  tool: {kind: noop, result: 1}")


async def test_a_snapshot_write_without_its_bucket_names_the_bucket_and_the_fix(
    runtime: Runtime, js: JetStreamContext, topology: Topology
) -> None:
    """The snapshot bucket's stream deleted: the controller said ``nats: no response from stream``."""
    await js.delete_stream(f"KV_{topology.executions_bucket}")
    with structlog.testing.capture_logs() as logs:
        eid = await submit(runtime.nc, topology, request_for(HELLO, "hello.yaml"))
        summary = await follow(runtime.nc, topology, eid, timeout=30)
        async with asyncio.timeout(10):
            while not (failed := [e for e in logs if e["event"] == "controller.snapshot_failed"]):
                await asyncio.sleep(0.05)
    assert summary.status == "success"  # a snapshot is a shortcut: the execution runs without one
    assert failed[0]["execution_id"] == eid
    assert failed[0]["error"] == (
        f"the executions bucket '{topology.executions_bucket}' is not on the server (deleted?): "
        "`noetl-stream provision` creates it again"
    )


async def test_a_large_snapshot_without_the_results_bucket_names_that_bucket(
    js: JetStreamContext, topology: Topology
) -> None:
    """A state above the KV limit goes to the results bucket: its absence is named the same way."""
    await provision(js, topology)
    store = await SnapshotStore.open(js, topology, ExecutionState)
    store.inline_limit = 10
    await js.delete_object_store(topology.results_store)
    with pytest.raises(StoreMissingError) as raised:
        await store.put("e1", ExecutionState(execution_id="e1", status="running"))
    assert str(raised.value) == (
        f"the results bucket '{topology.results_store}' is not on the server (deleted?): "
        "`noetl-stream provision` creates it again"
    )
