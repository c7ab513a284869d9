"""``noetl-stream worker --metrics HOST:PORT``: a real worker process against a real nats-server serves
``/metrics`` in Prometheus text format: task runs by kind and status (counted and timed), commands in
flight, its pool consumer's lag, and the process's own metrics; with ``--processes 2`` each process
on a port of its own. The controller's ``/metrics`` has the process metrics too."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from helpers import free_port, free_ports, playbook
from nats.js import JetStreamContext
from procs import Processes, provisioned
from prometheus_client.parser import text_string_to_metric_families

from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import follow
from noetl_stream.jetstream.connection import connect
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.protocol.subjects import Topology

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

BOOK = playbook(
    """
    - step: start
      tool: {kind: python, code: "result = 1"}
      next: {arcs: [{step: boom}]}
    - step: boom
      tool: {kind: python, code: "raise ValueError('no')"}
      next:
        arcs: [{step: recover, when: "{{ event.name == 'step.failed' }}"}]
    - step: recover
      tool: {kind: noop, result: recovered}
    """,
    name="metered",
)
"""Task runs: python ok, python error, noop ok (the failure is handled: the execution succeeds)."""


def parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample's value; a sample the scrape does not have fails the test."""
    key = (name, frozenset(labels.items()))
    assert key in samples, f"no sample {name}{labels} in the scrape"
    return samples[key]


def count(samples: Samples, name: str, **labels: str) -> float:
    """A labelled counter's value: 0 when its series was never incremented (an unused label set is not
    exported), but the metric itself must be in the scrape."""
    assert any(n == name for n, _ in samples), f"no metric {name} in the scrape"
    return samples.get((name, frozenset(labels.items())), 0.0)


async def scrape(http: aiohttp.ClientSession, port: int, logs: str = "") -> Samples:
    """The worker's /metrics, once it serves (it starts listening before it takes any work)."""
    for _ in range(400):
        try:
            async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                return parse(await resp.text())
        except aiohttp.ClientConnectionError:
            await asyncio.sleep(0.05)
    raise AssertionError(f"nothing serves /metrics on port {port}\n{logs}")


@pytest.fixture
async def procs(
    nats_server: EmbeddedNats, js: JetStreamContext, topology: Topology, tmp_path: Path
) -> AsyncIterator[Processes]:
    async with provisioned(nats_server.url, js, topology, tmp_path / "logs") as p:
        yield p


async def test_a_worker_counts_its_task_runs_by_kind_and_status(
    nats_server: EmbeddedNats, topology: Topology, procs: Processes
) -> None:
    port = free_port()
    procs.controller()
    procs.worker("w1", metrics=f"127.0.0.1:{port}")
    async with aiohttp.ClientSession() as http:
        before = await scrape(http, port, procs.logs())
        assert not [name for name, _ in before if name.startswith("noetl_worker_task")]  # none ran yet
        assert value(before, "noetl_worker_info", worker="w1", pool="default") == 1
        assert value(before, "noetl_worker_concurrency") == 4

        nc = await connect(nats_server.url, name="pytest-metrics", connect_wait_s=10)
        try:
            eid = await submit(nc, topology, request_for(BOOK, "metered.yaml"))
            summary = await follow(nc, topology, eid, timeout=60)
        finally:
            await nc.close()
        assert summary.status == "success", (summary.error, procs.logs())

        after = await scrape(http, port, procs.logs())
    counts = {
        (kind, status): count(after, "noetl_worker_tasks_total", kind=kind, status=status)
        for kind, status in (("python", "ok"), ("python", "error"), ("noop", "ok"), ("noop", "error"))
    }
    assert counts == {("python", "ok"): 1, ("python", "error"): 1, ("noop", "ok"): 1, ("noop", "error"): 0}
    for (kind, status), n in counts.items():  # the histogram saw each of them
        assert count(after, "noetl_worker_task_duration_seconds_count", kind=kind, status=status) == n
    assert value(after, "noetl_worker_task_duration_seconds_sum", kind="python", status="ok") > 0
    assert value(after, "noetl_worker_commands_in_flight") == 0
    assert ("noetl_worker_consumer_pending", frozenset({("pool", "default")})) in after
    # the last command's ack may reach the server just after its step's end was seen: read again until
    # the consumer shows none un-acknowledged
    async with aiohttp.ClientSession() as http:
        for _ in range(50):
            if value(after, "noetl_worker_consumer_ack_pending", pool="default") == 0:
                break
            await asyncio.sleep(0.2)
            after = await scrape(http, port, procs.logs())
    assert value(after, "noetl_worker_consumer_ack_pending", pool="default") == 0
    assert value(after, "process_cpu_seconds_total") > 0  # the process's own
    assert value(after, "process_resident_memory_bytes") > 0
    assert any(name == "python_info" for name, _ in after)


async def test_each_process_of_a_supervised_worker_serves_its_own_port(procs: Processes) -> None:
    port = free_ports(2)
    procs.worker("sv", processes=2, metrics=f"127.0.0.1:{port}")
    async with aiohttp.ClientSession() as http:
        first, second = await scrape(http, port, procs.logs()), await scrape(http, port + 1, procs.logs())
    assert value(first, "noetl_worker_info", worker="sv-1", pool="default") == 1
    assert value(second, "noetl_worker_info", worker="sv-2", pool="default") == 1


async def test_the_controller_exports_its_process_metrics_too(
    nats_server: EmbeddedNats, topology: Topology, procs: Processes
) -> None:
    port = free_port()
    controller = procs.controller("api", extra=("--http", f"127.0.0.1:{port}", "--api-token", "tok"))
    async with aiohttp.ClientSession() as http:
        text = ""
        for _ in range(400):
            with contextlib.suppress(aiohttp.ClientConnectionError):
                async with http.get(
                    f"http://127.0.0.1:{port}/metrics", headers={"Authorization": "Bearer tok"}
                ) as resp:
                    if resp.status == 200:
                        text = await resp.text()
                        break
            await asyncio.sleep(0.05)
    assert text, controller.log_tail()
    samples = parse(text)
    assert value(samples, "process_cpu_seconds_total") > 0
    assert any(name == "python_info" for name, _ in samples)
    assert ("noetl_executions_running", frozenset()) in samples


def test_a_bad_metrics_address_is_a_usage_error(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from noetl_stream.cli import main

    for given, said in (("nowhere", "expected HOST:PORT"), ("127.0.0.1:65535", "up to 65535")):
        args = ["worker", "--metrics", given, "--processes", "2", "--nats", "nats://127.0.0.1:1"]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2 and said in result.output, result.output
