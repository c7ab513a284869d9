"""End to end on a real nats-server: how executions get in, and workers sharing one pool.

Bad requests on the durable request subject or the ``execute`` micro endpoint must be answered with
``playbook.request.rejected`` and ``playbook.processed`` carrying the diagnostics; nothing crashes,
nothing is left half-started, and the next good request still runs.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import JOURNAL_CODE, indent, journal, max_concurrency, playbook
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import follow
from noetl_stream.dataplane.worker import Worker
from noetl_stream.jetstream.connection import connect
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.history import read_events
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event, decode_event
from noetl_stream.runtime.local import Runtime, local_runtime

Eventually = Callable[..., Awaitable[None]]

GOOD = playbook(
    """
    - step: start
      tool: {kind: noop, result: "{{ workload.x }}"}
    """,
    workload={"x": "hello"},
)

BAD_YAML = "apiVersion: noetl.io/v2\nkind: Playbook\nworkflow: [1, 2\n"

BAD_STEP = playbook(
    """
    - step: start
      tool: {kind: noop}
      retries: 3
    """
)


class Tap:
    """Every event published under the topology's prefix, in arrival order (subscribed up front)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    async def on_msg(self, msg: Msg) -> None:
        self.events.append(decode_event(msg.data))

    def named(self, name: str) -> list[Event]:
        return [e for e in self.events if e.name == name]


@pytest.fixture
async def tap(nc: NATS, topology: Topology) -> AsyncIterator[Tap]:
    t = Tap()
    sub = await nc.subscribe(f"{topology.prefix}.events.>", cb=t.on_msg)
    yield t
    await sub.unsubscribe()


async def history(rt: Runtime, execution_id: str) -> list[Event]:
    return [e async for _, e in read_events(rt.nc.jetstream(), rt.topology, execution_id)]


async def assert_good_request_still_runs(rt: Runtime) -> None:
    summary = await rt.run_playbook(GOOD, "good.yaml", {"x": "after"}, timeout=20)
    assert summary.status == "success"
    assert summary.result == "after"


async def pending_commands(rt: Runtime) -> int:
    info = await rt.nc.jetstream().stream_info(rt.topology.commands_stream)
    return int(info.state.messages)


# --- the durable request subject -------------------------------------------------------------------

BAD_REQUESTS = [
    pytest.param(b"{not json", "not valid JSON", id="not-json"),
    pytest.param(b"", "not valid JSON", id="empty"),
    pytest.param(b"[1, 2]", "wrong shape at $: expected an object, got an array", id="not-an-object"),
    pytest.param(
        json.dumps({"playbook": 5}).encode(), "wrong shape at $.playbook", id="playbook-not-a-string"
    ),
    pytest.param(
        json.dumps({"playbook": GOOD, "payload": [1, 2]}).encode(),
        "wrong shape at $.payload",
        id="payload-not-a-mapping",
    ),
    pytest.param(json.dumps({"payload": {"x": 1}}).encode(), "give 'playbook'", id="missing-playbook"),
    pytest.param(
        json.dumps({"path": "demo/unknown"}).encode(),
        "unknown playbook path 'demo/unknown'",
        id="unknown-path",
    ),
    pytest.param(
        json.dumps({"playbook": GOOD, "bogus": 1}).encode(),
        "wrong shape at $: unknown field 'bogus'",
        id="unknown-key",
    ),
    pytest.param(
        json.dumps({"playbook": GOOD, "execution_id": "a.b"}).encode(), "execution id", id="bad-execution-id"
    ),
    pytest.param(json.dumps({"playbook": GOOD, "pool": "p>"}).encode(), "pool", id="bad-pool"),
]


@pytest.mark.parametrize(("raw", "message"), BAD_REQUESTS)
async def test_malformed_request_on_the_subject_is_rejected(
    runtime: Runtime, tap: Tap, eventually: Eventually, raw: bytes, message: str
) -> None:
    await runtime.nc.jetstream().publish(runtime.topology.request_subject, raw)

    await eventually(lambda: len(tap.named("playbook.processed")) == 1)
    (rejected,) = tap.named("playbook.request.rejected")
    (processed,) = tap.named("playbook.processed")
    assert rejected.execution_id == processed.execution_id
    assert rejected.status == processed.status == "error"
    error = rejected.payload["error"]
    assert message in error["message"], error
    assert processed.payload["status"] == "rejected"
    assert processed.payload["error"] == error
    names = [e.name for e in await history(runtime, rejected.execution_id)]
    assert "workflow.started" not in names and "step.scheduled" not in names
    assert await pending_commands(runtime) == 0

    await assert_good_request_still_runs(runtime)


@pytest.mark.parametrize(
    ("text", "diagnostic"),
    [
        pytest.param(BAD_YAML, "bad.yaml:4:1: YAML syntax error", id="yaml-syntax"),
        pytest.param(BAD_STEP, "unknown key 'retries'", id="unknown-step-key"),
        pytest.param(playbook("- step: first\n  tool: {kind: noop}\n"), "start", id="no-start-step"),
    ],
)
async def test_invalid_playbook_is_rejected_with_its_diagnostics(
    runtime: Runtime, tap: Tap, eventually: Eventually, text: str, diagnostic: str
) -> None:
    execution_id = await submit(runtime.nc, runtime.topology, request_for(text, "bad.yaml"))
    summary = await follow(runtime.nc, runtime.topology, execution_id, timeout=20)

    assert summary.status == "rejected"
    # The tap listens on another connection than `follow`: its copy may come a moment later.
    await eventually(lambda: len(tap.named("playbook.request.rejected")) == 1)
    (rejected,) = tap.named("playbook.request.rejected")
    assert rejected.execution_id == execution_id
    error = rejected.payload["error"]
    assert any(diagnostic in d for d in error["diagnostics"]), error
    assert diagnostic in error["message"]
    assert summary.error == error
    names = [e.name for e in await history(runtime, execution_id)]
    assert names == ["playbook.execution.requested", "playbook.request.rejected", "playbook.processed"]
    assert await pending_commands(runtime) == 0

    await assert_good_request_still_runs(runtime)


async def test_bad_request_with_an_execution_id_is_rejected_under_that_id(runtime: Runtime) -> None:
    """Whoever sent the request (and follows its id) learns that it was rejected."""
    raw = json.dumps({"execution_id": "my-run-1", "playbook": GOOD, "payload": "not a mapping"}).encode()
    await runtime.nc.jetstream().publish(runtime.topology.request_subject, raw)

    summary = await follow(runtime.nc, runtime.topology, "my-run-1", timeout=5)

    assert summary.status == "rejected"
    assert summary.error is not None and "$.payload" in summary.error["message"]


async def test_many_bad_requests_then_good_ones(runtime: Runtime, tap: Tap, eventually: Eventually) -> None:
    js = runtime.nc.jetstream()
    for raw, _ in [p.values for p in BAD_REQUESTS]:
        await js.publish(runtime.topology.request_subject, raw)
    ids = [
        await submit(runtime.nc, runtime.topology, request_for(GOOD, "good.yaml", {"x": i})) for i in range(3)
    ]

    summaries = [await follow(runtime.nc, runtime.topology, i, timeout=20) for i in ids]

    assert [(s.status, s.result) for s in summaries] == [("success", 0), ("success", 1), ("success", 2)]
    await eventually(lambda: len(tap.named("playbook.request.rejected")) == len(BAD_REQUESTS))


async def test_request_payload_overrides_playbook_workload(runtime: Runtime) -> None:
    summary = await runtime.run_playbook(GOOD, "good.yaml", {"x": {"nested": [1]}}, timeout=20)

    assert summary.result == {"nested": [1]}


async def test_same_execution_id_submitted_twice_runs_once(runtime: Runtime) -> None:
    request = request_for(GOOD, "good.yaml", {"x": "once"}, execution_id="twice-submitted")
    await submit(runtime.nc, runtime.topology, request)
    await submit(runtime.nc, runtime.topology, request)

    events: list[Event] = []
    summary = await follow(runtime.nc, runtime.topology, "twice-submitted", events.append, timeout=20)

    assert summary.status == "success"
    assert [e.name for e in events].count("workflow.started") == 1
    assert summary.steps["start"].runs == 1


# --- the micro endpoint ----------------------------------------------------------------------------


async def execute(rt: Runtime, body: bytes) -> Msg:
    return await rt.nc.request(rt.topology.api_subject("execute"), body, timeout=10)


async def test_execute_endpoint_answers_with_the_execution_id(runtime: Runtime) -> None:
    reply = await execute(runtime, json.dumps({"playbook": GOOD, "payload": {"x": "micro"}}).encode())

    assert not (reply.headers or {}).get("Nats-Service-Error-Code")
    execution_id = json.loads(reply.data)["execution_id"]
    summary = await follow(runtime.nc, runtime.topology, execution_id, timeout=20)
    assert (summary.status, summary.result) == ("success", "micro")


async def test_execute_endpoint_uses_the_given_execution_id(runtime: Runtime) -> None:
    reply = await execute(runtime, json.dumps({"playbook": GOOD, "execution_id": "chosen-id"}).encode())

    assert json.loads(reply.data)["execution_id"] == "chosen-id"
    summary = await follow(runtime.nc, runtime.topology, "chosen-id", timeout=20)
    assert summary.status == "success"


@pytest.mark.parametrize(("raw", "message"), BAD_REQUESTS)
async def test_execute_endpoint_answers_a_malformed_request_with_an_error(
    runtime: Runtime, raw: bytes, message: str
) -> None:
    reply = await execute(runtime, raw)

    headers = reply.headers or {}
    assert headers.get("Nats-Service-Error-Code") == "400"
    assert message in headers.get("Nats-Service-Error", "")
    body = json.loads(reply.data)
    assert message in body["detail"]
    summary = await follow(runtime.nc, runtime.topology, body["execution_id"], timeout=10)
    assert summary.status == "rejected"

    await assert_good_request_still_runs(runtime)


@pytest.mark.parametrize("text", [BAD_YAML, BAD_STEP], ids=["yaml-syntax", "unknown-step-key"])
async def test_execute_endpoint_answers_an_invalid_playbook_with_an_error(
    runtime: Runtime, text: str
) -> None:
    reply = await execute(runtime, json.dumps({"playbook": text, "file": "bad.yaml"}).encode())

    headers = reply.headers or {}
    assert headers.get("Nats-Service-Error-Code") == "400", (headers, reply.data)
    body = json.loads(reply.data)
    assert "bad.yaml:" in body["detail"]
    summary = await follow(runtime.nc, runtime.topology, body["execution_id"], timeout=10)
    assert summary.status == "rejected"


# --- two worker processes sharing one pool ---------------------------------------------------------


async def test_two_workers_on_separate_connections_share_one_pool(
    nats_server: EmbeddedNats, topology: Topology, tmp_path: Path
) -> None:
    text = playbook(
        f"""
        - step: start
          loop:
            in: "{{{{ workload['items'] }}}}"
            iterator: item
            spec: {{mode: parallel, max_in_flight: 6, policy: {{exec: distributed}}}}
          tool:
            kind: python
            args: {{path: "{{{{ workload.journal }}}}", i: "{{{{ iter.index }}}}", hold: 0.2}}
            code: |
{indent(JOURNAL_CODE, 14)}
          next:
            arcs:
              - step: after
        - step: after
          tool: {{kind: noop, result: "{{{{ start }}}}"}}
        """
    )
    connections = [await connect(nats_server.url, name=f"worker-{i}", connect_wait_s=10) for i in (1, 2)]
    try:
        async with local_runtime(nats_server.url, topology=topology, workers=0) as rt:
            workers = [
                Worker(nc, topology, name=f"w{i}", concurrency=1) for i, nc in enumerate(connections, 1)
            ]
            for w in workers:
                await w.start()
            try:
                events: list[Event] = []
                payload: dict[str, Any] = {"items": list(range(6)), "journal": str(tmp_path / "j.txt")}
                summary = await rt.run_playbook(text, "shared.yaml", payload, events.append, timeout=30)
            finally:
                for w in workers:
                    await w.shutdown(grace_s=5)
    finally:
        for nc in connections:
            await nc.close()

    assert summary.status == "success", summary.error
    assert summary.result == [0, 10, 20, 30, 40, 50]
    by_worker: dict[str, set[int]] = {}
    for e in events:
        if e.name == "loop.iteration.done":
            assert e.worker is not None
            by_worker.setdefault(e.worker, set()).add(e.payload["index"])
    assert set(by_worker) == {"w1", "w2"}, by_worker
    assert set().union(*by_worker.values()) == set(range(6))
    assert sum(len(v) for v in by_worker.values()) == 6  # each iteration ran once
    # each worker runs one command at a time, so two at once is the most the pool can do
    assert max_concurrency(journal(tmp_path / "j.txt")) == 2
    (after,) = [e for e in events if e.name == "step.done" and e.step == "after"]
    assert after.worker in {"w1", "w2"}


async def test_concurrent_executions_do_not_interfere(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: noop
            result: "{{ workload.n }}"
            spec: {policy: {rules: [{else: {then: {do: continue, set_ctx: {mine: "{{ workload.n }}"}}}}]}}
          next: {arcs: [{step: double}]}
        - step: double
          loop:
            in: "{{ [start, start] }}"
            iterator: v
            spec: {mode: parallel, policy: {exec: distributed}}
          tool: {kind: noop, result: "{{ iter.v * 2 + ctx.mine }}"}
        """
    )

    summaries = await asyncio.gather(
        *(runtime.run_playbook(text, f"c{n}.yaml", {"n": n}, timeout=30) for n in range(8))
    )

    assert len({s.execution_id for s in summaries}) == 8
    for n, s in enumerate(summaries):
        assert (s.status, s.result, s.ctx) == ("success", [3 * n, 3 * n], {"mine": n})


async def test_two_noetl_stream_worker_processes_share_one_pool(
    nats_server: EmbeddedNats, topology: Topology, tmp_path: Path, eventually: Eventually
) -> None:
    text = playbook(
        f"""
        - step: start
          loop:
            in: "{{{{ workload['items'] }}}}"
            iterator: item
            spec: {{mode: parallel, max_in_flight: 6, policy: {{exec: distributed}}}}
          tool:
            kind: python
            args: {{path: "{{{{ workload.journal }}}}", i: "{{{{ iter.index }}}}", hold: 0.2}}
            code: |
{indent(JOURNAL_CODE, 14)}
        """
    )
    exe = Path(sys.executable).parent / "noetl-stream"
    log = open(tmp_path / "workers.log", "wb")  # noqa: SIM115 - closed below, after the processes end
    async with local_runtime(nats_server.url, topology=topology, workers=0) as rt:
        options = [
            "--nats",
            nats_server.url,
            "--prefix",
            topology.prefix,
            "--concurrency",
            "1",
            "--grace",
            "5",
        ]
        procs = [
            subprocess.Popen(
                [str(exe), "worker", *options, "--name", name, "--log-level", "warning"],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
            for name in ("proc-1", "proc-2")
        ]
        try:
            js = rt.nc.jetstream()
            consumer = topology.pool_consumer("default")

            async def both_pulling() -> bool:
                assert all(p.poll() is None for p in procs), (tmp_path / "workers.log").read_text()
                info = await js.consumer_info(topology.commands_stream, consumer)
                return (info.num_waiting or 0) >= 2

            await eventually(both_pulling, timeout=30)
            events: list[Event] = []
            payload = {"items": list(range(6)), "journal": str(tmp_path / "j.txt")}
            summary = await rt.run_playbook(text, "procs.yaml", payload, events.append, timeout=30)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            log.close()

    assert summary.status == "success", summary.error
    assert summary.result == [0, 10, 20, 30, 40, 50]
    workers = {e.worker for e in events if e.name == "loop.iteration.done"}
    assert workers == {"proc-1", "proc-2"}
    assert all(p.returncode == 0 for p in procs), [p.returncode for p in procs]


async def test_the_compile_warnings_are_recorded_with_the_evaluated_request(runtime: Runtime) -> None:
    """The intake compiles a request's playbook first and caches the plan; the fold that writes
    `playbook.request.evaluated` found it cached and recorded no warnings."""
    from helpers import run

    text = playbook(
        """
        - step: start
          tool:
            - fetch: {kind: noop, result: 1}
        """
    )
    r = await run(runtime, text)
    assert r.status == "success", r.summary.error
    (evaluated,) = r.named("playbook.request.evaluated")
    (warning,) = evaluated.payload["warnings"]
    assert "task 'fetch' uses the label-as-key shape" in warning
