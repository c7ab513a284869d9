"""Which pool a step runs on: its own ``spec.pool``, else the request's ``pool``, else the playbook's
``executor.spec.pool``, else the controller's default (real server, a worker per pool)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
import structlog
from helpers import indent, requested
from procs import NOETL_STREAM

from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import follow
from noetl_stream.control.core.plans import PlanCache
from noetl_stream.control.core.reducer import Reducer
from noetl_stream.control.replay import verify
from noetl_stream.dataplane.worker import Worker
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.history import read_events
from noetl_stream.kv.provision import provision
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import Runtime, local_runtime


def pools_playbook(executor_pool: str | None = None) -> str:
    executor = f"executor: {{spec: {{pool: {executor_pool}}}}}\n" if executor_pool else ""
    return (
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: pools, path: tests/pools}\n"
        + executor
        + "workflow:\n"
        + indent(
            """
            - step: start
              tool: {kind: noop, result: 1}
              next:
                arcs: [{step: pinned}]
            - step: pinned
              spec: {pool: default}
              tool: {kind: noop, result: 2}
            """,
            2,
        )
    )


@contextlib.asynccontextmanager
async def two_pools(url: str, topology: Topology) -> AsyncIterator[Runtime]:
    """The local runtime's worker on ``default``, and one more on ``gpu``."""
    async with local_runtime(url, topology=topology, pools=("default", "gpu")) as rt:
        gpu = Worker(rt.nc, topology, pool="gpu", name="gpu-worker")
        await gpu.start()
        try:
            yield rt
        finally:
            await gpu.shutdown(grace_s=1.0)


async def workers_by_step(rt: Runtime, text: str, pool: str | None) -> dict[str, str]:
    request = msgspec.structs.replace(request_for(text, "pools.yaml"), pool=pool)
    eid = await submit(rt.nc, rt.topology, request)
    summary = await follow(rt.nc, rt.topology, eid, timeout=30)
    assert summary.status == "success", summary.error
    async with asyncio.timeout(10):  # the final snapshot is written after playbook.processed
        while (found := await verify(rt.nc.jetstream(), rt.topology, eid))[1] is None or not found[
            1
        ].terminal:
            await asyncio.sleep(0.02)
    differences, live = found
    assert differences == [] and live is not None and live.pool == pool  # replay agrees, pool included
    return {
        ev.step or "": ev.worker or ""
        async for _, ev in read_events(rt.nc.jetstream(), rt.topology, eid, names={E.STEP_STARTED})
    }


@pytest.mark.parametrize(
    ("executor_pool", "request_pool", "start_on"),
    [
        (None, None, "local-0"),
        (None, "gpu", "gpu-worker"),
        ("gpu", None, "gpu-worker"),
        ("gpu", "default", "local-0"),  # the request's pool wins over the playbook's
    ],
)
async def test_a_step_runs_on_its_own_pool_else_the_requests_else_the_playbooks(
    nats_server: EmbeddedNats,
    topology: Topology,
    executor_pool: str | None,
    request_pool: str | None,
    start_on: str,
) -> None:
    async with two_pools(nats_server.url, topology) as rt:
        ran = await workers_by_step(rt, pools_playbook(executor_pool), request_pool)
    assert ran == {"start": start_on, "pinned": "local-0"}


ELSEWHERE = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: elsewhere, path: tests/elsewhere}
workflow:
  - step: start
    spec: {pool: batch}
    tool: {kind: noop, result: done}
"""


async def test_a_step_on_a_pool_nothing_runs_is_logged_and_runs_once_a_worker_comes(
    nats_server: EmbeddedNats, topology: Topology
) -> None:
    """No consumer for the pool: the controller says so (the step would otherwise sit in ``scheduled``
    with nothing to tell why). Provisioned, but no worker: it says that. A worker then runs it: the
    command waited in the stream, nothing was lost."""
    async with local_runtime(nats_server.url, topology=topology) as rt:
        watch = rt.controller.pools
        watch.confirm_after_s = 0.1
        with structlog.testing.capture_logs() as logs:
            eid = await submit(rt.nc, rt.topology, request_for(ELSEWHERE, "elsewhere.yaml"))
            async with asyncio.timeout(10):
                while not any(e["event"] == "controller.pool_not_provisioned" for e in logs):
                    await asyncio.sleep(0.02)
        (said,) = [e for e in logs if e["event"] == "controller.pool_not_provisioned"]
        assert said["pool"] == "batch" and said["step"] == "start" and said["execution_id"] == eid
        assert "noetl-stream worker --pool batch" in said["hint"]

        await provision(rt.nc.jetstream(), rt.topology, ("batch",))
        assert await watch.check("batch", eid, "start") == "no_workers"
        assert await watch.check("default", eid, "start") is None  # the local worker pulls from it

        # A pool whose every worker is busy (a command taken, none waiting for more) is not reported.
        js = rt.nc.jetstream()
        busy = await js.pull_subscribe_bind(
            rt.topology.pool_consumer("batch"), stream=rt.topology.commands_stream
        )
        (taken,) = await busy.fetch(1, timeout=5)
        assert await watch.check("batch", eid, "start") is None
        await taken.nak()
        await busy.unsubscribe()

        worker = Worker(rt.nc, rt.topology, pool="batch", name="batch-worker")
        await worker.start()
        try:
            summary = await follow(rt.nc, rt.topology, eid, timeout=30)
            assert await watch.check("batch", eid, "start") is None
        finally:
            await worker.shutdown(grace_s=1.0)
    assert summary.status == "success" and summary.result == "done"


async def test_submit_pool_runs_the_execution_on_that_pool(
    nats_server: EmbeddedNats, topology: Topology, tmp_path: Path
) -> None:
    file = tmp_path / "pools.yaml"
    file.write_text(pools_playbook())
    async with two_pools(nats_server.url, topology) as rt:
        proc = await asyncio.create_subprocess_exec(
            str(NOETL_STREAM),
            *("submit", "--pool", "gpu", "--wait", "--json", str(file)),
            *("--nats", nats_server.url, "--prefix", topology.prefix),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        eid = json.loads(out.decode().splitlines()[-1])["execution_id"]
        ran = {
            ev.step: ev.worker
            async for _, ev in read_events(rt.nc.jetstream(), topology, eid, names={E.STEP_STARTED})
        }
    assert ran == {"start": "gpu-worker", "pinned": "local-0"}


def test_a_request_recorded_before_pools_were_honoured_replays_as_it_ran() -> None:
    """The pool is the one the intake recorded with ``playbook.execution.requested``, not the request's
    own field: a request stored by an intake that ignored it (or any writer of the event) replays, and
    resumes, on the pools it ran on."""
    old = requested("e1", pools_playbook())
    old.payload["request"]["pool"] = "gpu"
    state, fx = Reducer(PlanCache()).apply(None, old, 1)
    assert state is not None and state.pool is None and [c.pool for c in fx.commands] == ["default"]

    recorded = requested("e2", pools_playbook())
    recorded.payload["request"]["pool"] = recorded.payload["pool"] = "gpu"
    state, fx = Reducer(PlanCache()).apply(None, recorded, 1)
    assert state is not None and state.pool == "gpu" and [c.pool for c in fx.commands] == ["gpu"]
