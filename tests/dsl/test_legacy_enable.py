"""Where the legacy extension is enabled: per run (``submit --legacy``, ``run --legacy``, the request's
``extensions``), per controller (``controller --legacy`` / ``NOETL_LEGACY=1``), per catalog entry, and
inherited by child playbooks. The execution records it, so a controller without the setting resumes it
and a replay or a retry compiles it the same way; without it a legacy playbook is rejected, saying how to
enable it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from httpserver import HttpServer
from legacy_support import example_002

from noetl_stream.client.submit import request_for, retry_request, submit
from noetl_stream.client.tracking import follow
from noetl_stream.control.intake import RequestError, parse_request
from noetl_stream.control.replay import replay
from noetl_stream.dataplane.worker import Worker
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.catalog import Catalog, CatalogError
from noetl_stream.kv.history import read_events
from noetl_stream.kv.provision import provision
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event, ExecutionRequest, content_hash
from noetl_stream.runtime.local import local_runtime

NOETL_STREAM = Path(sys.executable).parent / "noetl-stream"
HINT = "(enable legacy extensions to translate it)"

# 000 forms: root name/path, a structural next as a string and as a list, step vars read as vars.x.
ANSWER = """\
apiVersion: noetl.io/v2
kind: Playbook
name: answer
path: tests/answer
workflow:
  - step: start
    next: work
  - step: work
    tool:
      kind: python
      code: |
        result = 42
    vars:
      answer: "{{ result }}"
    next: [end]
  - step: end
    tool: {kind: noop, result: "{{ vars.answer }}"}
"""


@pytest.fixture
async def http() -> AsyncIterator[HttpServer]:
    server = await HttpServer().start()
    server.pages.update({"a": [1, 2, 3, 4, 5], "b": ["x", "y", "z"]})
    yield server
    await server.stop()


async def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:
    """Run ``noetl-stream`` (as a subprocess, while this test's event loop keeps serving)."""
    proc = await asyncio.create_subprocess_exec(
        str(NOETL_STREAM),
        *args,
        env=env or dict(os.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    lines = out.decode().strip().splitlines()
    return proc.returncode, json.loads(lines[-1]) if lines else {}, err.decode()


async def recorded(js: Any, topology: Topology, execution_id: str, name: str) -> Event:
    (event,) = [ev async for _, ev in read_events(js, topology, execution_id, names=(name,))]
    return event


async def test_submit_legacy_runs_the_002_example_and_the_execution_records_it(
    nats_server: EmbeddedNats, topology: Topology, http: HttpServer, tmp_path: Path
) -> None:
    file = tmp_path / "legacy_002.yaml"
    file.write_text(example_002())
    payload = json.dumps({"base_url": http.url, "sources": [{"path": "/pages/a"}, {"path": "/pages/b"}]})
    target = ("--nats", nats_server.url, "--prefix", topology.prefix, "--payload", payload, str(file))
    async with local_runtime(nats_server.url, topology=topology) as rt:  # a controller without the setting
        code, out, err = await cli("submit", "--legacy", "--wait", "--json", *target)
        refused, rejection, _ = await cli("submit", "--wait", "--json", *target)
        js = rt.nc.jetstream()
        eid = out["execution_id"]
        requested = await recorded(js, topology, eid, E.EXECUTION_REQUESTED)
        evaluated = await recorded(js, topology, eid, E.REQUEST_EVALUATED)
        state = await replay(js, topology, eid)  # a reducer with no setting of its own
    assert code == 0, (out, err)
    assert out["status"] == "success"
    assert out["ctx"] == {"summary": {"last_pages": [3, 2]}}
    assert requested.payload["request"]["extensions"] == ["legacy"]
    assert evaluated.payload["content_hash"] == content_hash(file.read_text()) + "+legacy"
    assert evaluated.payload["extensions"] == ["legacy"]
    assert state is not None and state.status == "success"
    assert state.ctx == {"summary": {"last_pages": [3, 2]}}
    assert state.content_hash == evaluated.payload["content_hash"]
    assert refused == 2 and rejection["status"] == "rejected"
    assert rejection["error"]["kind"] == "invalid_playbook"
    assert "written in legacy DSL forms" in rejection["error"]["message"]


async def test_a_legacy_execution_resumes_on_a_controller_without_the_setting(
    nats_server: EmbeddedNats, topology: Topology
) -> None:
    async with local_runtime(nats_server.url, topology=topology, workers=0, extensions=("legacy",)) as first:
        eid = await submit(first.nc, topology, request_for(ANSWER, "answer.yaml"))
        js = first.nc.jetstream()
        for _ in range(200):  # the step with a tool is scheduled: its command waits for a worker
            if [ev async for _, ev in read_events(js, topology, eid, names=(E.STEP_SCHEDULED,))]:
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("step 'work' was never scheduled")
    async with local_runtime(nats_server.url, topology=topology, workers=1) as second:
        summary = await follow(second.nc, topology, eid, timeout=30)
        requested = await recorded(second.nc.jetstream(), topology, eid, E.EXECUTION_REQUESTED)
    assert (summary.status, summary.result, summary.ctx) == ("success", 42, {"answer": 42}), summary.error
    assert requested.payload["request"]["extensions"] == ["legacy"]


async def test_a_controller_with_the_setting_compiles_requests_and_registrations_with_it(
    nats_server: EmbeddedNats, topology: Topology
) -> None:
    versioned = ANSWER.replace("path: tests/answer", "path: tests/answer\nversion: '1'")
    async with local_runtime(nats_server.url, topology=topology, extensions=("legacy",)) as rt:
        ran = await rt.run_playbook(ANSWER, "answer.yaml", timeout=30)
        # what the REST API and the micro endpoint register with (the controller's catalog)
        entry, created = await rt.controller.intake.catalog.register(versioned, "answer.yaml")
        with pytest.raises(CatalogError) as refused:  # a catalog without the setting
            await Catalog(rt.nc.jetstream(), topology).register(versioned.replace("'1'", "'2'"))
    assert created and entry.version == "1"
    assert any(HINT in line for line in refused.value.diagnostics)
    assert (ran.status, ran.result, ran.ctx) == ("success", 42, {"answer": 42}), ran.error
    async with local_runtime(nats_server.url, topology=topology) as plain:
        rejected = await plain.run_playbook(ANSWER, "answer.yaml", timeout=30)
        by_request = await plain.run_playbook(ANSWER, "answer.yaml", timeout=30, extensions=("legacy",))
        # a catalog entry registered with the extension runs with it on any controller
        eid = await submit(plain.nc, topology, ExecutionRequest(path="tests/answer"))
        by_path = await follow(plain.nc, topology, eid, timeout=30)
    assert rejected.status == "rejected" and rejected.error is not None
    assert rejected.error["message"] == (
        "invalid playbook: answer.yaml:1:1: missing 'metadata' (with 'name' and 'path') (at <root>) "
        "(and 5 more); it is written in legacy DSL forms: run it with the legacy extension "
        "(submit/run --legacy, a controller with --legacy, or executor.spec.extensions: [legacy]) "
        "or rewrite it with `noetl-stream migrate`"
    )
    assert f"answer.yaml:3:1: root 'name' is not part of noetl.io/v2 (v10); use metadata.name {HINT}" in (
        " ".join(rejected.error["diagnostics"])
    )
    assert (by_request.status, by_request.result) == ("success", 42), by_request.error
    assert (by_path.status, by_path.result) == ("success", 42), by_path.error


async def test_noetl_legacy_turns_the_setting_on_for_a_controller_process(
    nats_server: EmbeddedNats, topology: Topology, tmp_path: Path
) -> None:
    from noetl_stream.jetstream.connection import connect

    nc = await connect(nats_server.url, name="pytest-legacy", connect_wait_s=10)
    await provision(nc.jetstream(), topology, ("default",))
    env = {
        **os.environ,
        "NOETL_NATS_URL": nats_server.url,
        "NOETL_PREFIX": topology.prefix,
        "NOETL_LEGACY": "1",
    }
    with open(tmp_path / "controller.log", "ab") as log:
        controller = subprocess.Popen(
            [str(NOETL_STREAM), "controller", "--log-level", "warning"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    worker = Worker(nc, topology, pool="default", concurrency=4, name="pytest")
    await worker.start()
    try:
        eid = await submit(nc, topology, request_for(ANSWER, "answer.yaml"))
        summary = await follow(nc, topology, eid, timeout=30)
    finally:
        await worker.shutdown(grace_s=5)
        os.kill(controller.pid, signal.SIGTERM)
        try:
            controller.wait(15)
        except subprocess.TimeoutExpired:
            os.kill(controller.pid, signal.SIGKILL)
            controller.wait()
        await nc.close()
    assert (summary.status, summary.result) == ("success", 42), (
        summary.error,
        (tmp_path / "controller.log").read_text()[-2000:],
    )


CHILD = """\
apiVersion: noetl.io/v2
kind: Playbook
name: child
path: tests/child
workflow:
  - step: start
    tool: {kind: noop, result: "{{ workload.base + 1 }}"}
"""

PARENT = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: parent, path: tests/parent}
workflow:
  - step: start
    tool: {kind: playbook, path: child.yaml, return_step: start, args: {base: 41}}
"""


async def test_a_child_playbook_is_compiled_like_its_parent(
    nats_server: EmbeddedNats, topology: Topology, tmp_path: Path
) -> None:
    (tmp_path / "child.yaml").write_text(CHILD)
    parent = tmp_path / "parent.yaml"
    parent.write_text(PARENT)
    async with local_runtime(nats_server.url, topology=topology) as rt:
        legacy = await rt.run_playbook(PARENT, str(parent), timeout=30, extensions=("legacy",))
        plain = await rt.run_playbook(PARENT, str(parent), timeout=30)
    assert (legacy.status, legacy.result["data"]) == ("success", 42), legacy.error
    assert plain.status == "failed" and plain.error is not None
    assert plain.error["kind"] == "child_failed" and "rejected" in plain.error["message"]


async def test_a_retry_runs_with_the_extension_the_execution_ran_with(
    nats_server: EmbeddedNats, topology: Topology
) -> None:
    failing = ANSWER.replace("result = 42", "raise ValueError('down')")
    async with local_runtime(nats_server.url, topology=topology) as rt:
        first = await rt.run_playbook(failing, "answer.yaml", timeout=30, extensions=("legacy",))
        request = await retry_request(rt.nc, topology, first.execution_id)
    assert first.status == "failed" and first.error is not None and first.error["kind"] == "python_error"
    assert request.extensions == ["legacy"]
    assert request.resume is not None and [t.step for t in request.resume.tokens] == ["work"]


async def test_the_execute_endpoint_takes_the_extension_in_the_request(
    nats_server: EmbeddedNats, topology: Topology
) -> None:
    async with local_runtime(nats_server.url, topology=topology) as rt:
        subject = topology.api_subject("execute")
        body = {"playbook": ANSWER, "file": "answer.yaml", "extensions": ["legacy"]}
        reply = json.loads((await rt.nc.request(subject, json.dumps(body).encode(), timeout=10)).data)
        summary = await follow(rt.nc, topology, reply["execution_id"], timeout=30)
        refused = await rt.nc.request(subject, json.dumps({**body, "extensions": []}).encode(), timeout=10)
    assert (summary.status, summary.result) == ("success", 42), summary.error
    assert (refused.headers or {}).get("Nats-Service-Error-Code") == "400"
    assert "written in legacy DSL forms" in json.loads(refused.data)["detail"]


def test_a_request_with_an_unknown_extension_is_a_bad_request() -> None:
    ok = parse_request(b'{"playbook": "x", "extensions": ["legacy"]}')
    assert ok.extensions == ["legacy"]
    with pytest.raises(RequestError, match="unknown extension 'legasy' \\(known: legacy, custom_kinds\\)"):
        parse_request(b'{"playbook": "x", "extensions": ["legasy"]}')
