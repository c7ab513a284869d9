"""Logs: structlog JSON when not a TTY, the console format on one; lines about a step carry its ids."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from helpers import playbook
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from procs import Processes

from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import follow
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.provision import provision
from noetl_stream.logs import bound, configure
from noetl_stream.protocol.subjects import Topology

FAILING = playbook(
    """
    - step: start
      next: {arcs: [{step: boom}]}
    - step: boom
      tool:
        - name: divide
          kind: python
          code: "result = 1 / 0"
    """,
    name="logged",
)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def restore_structlog() -> Iterator[None]:
    yield
    structlog.reset_defaults()


async def test_a_worker_logs_a_failed_step_as_json_with_the_ids_of_the_step(
    nats_server: EmbeddedNats, nc: NATS, js: JetStreamContext, topology: Topology, tmp_path: Path
) -> None:
    await provision(js, topology, ("default",))
    with Processes(nats_server.url, topology, tmp_path / "logs") as procs:
        procs.controller()
        worker = procs.worker("w-logs")
        execution_id = await submit(nc, topology, request_for(FAILING, "logged.yaml"))
        summary = await follow(nc, topology, execution_id, timeout=60)
        assert summary.status == "failed", procs.logs()

    lines = [line for line in worker.log_path.read_text().splitlines() if not line.startswith("--- start")]
    records = [json.loads(line) for line in lines]  # not a TTY: every line is a JSON object
    (failed,) = [r for r in records if r["event"] == "step.failed"]
    assert failed["level"] == "warning"
    assert failed["execution_id"] == execution_id
    assert (failed["step"], failed["step_run_id"], failed["worker"]) == ("boom", "boom-1", "w-logs")
    assert failed["error_kind"] == "python_error"
    assert "division by zero" in failed["error"]
    started = [r for r in records if r["event"] == "worker.started"]
    assert started and "execution_id" not in started[0]  # bound only while a command is handled


def test_console_format_on_a_tty_with_the_bound_values(restore_structlog: None) -> None:
    out = Terminal()
    configure("info", stream=out)
    log = structlog.get_logger("t")
    with bound(execution_id="e1", step="fetch", step_run_id=None):
        log.warning("step.failed", error_kind="http_error")
    log.info("after")

    first, second = out.getvalue().splitlines()
    assert not first.startswith("{")
    assert "step.failed" in first and "execution_id=e1" in first and "step=fetch" in first
    assert "error_kind=http_error" in first and "step_run_id" not in first
    assert "after" in second and "execution_id" not in second


def test_json_when_not_a_tty(restore_structlog: None) -> None:
    out = io.StringIO()
    configure("info", stream=out)
    with bound(execution_id="e2", worker="w1"):
        structlog.get_logger("t").info("worker.command", pool="default")

    record = json.loads(out.getvalue())
    assert record["event"] == "worker.command"
    assert (record["execution_id"], record["worker"], record["pool"]) == ("e2", "w1", "default")


_TRACEBACK_WITH_A_SECRET = """
import structlog
from noetl_stream.logs import configure_unless_configured
{setup}
configure_unless_configured()
def fetch():
    password = "hunter2-in-a-local"
    raise RuntimeError("refused")
try:
    fetch()
except RuntimeError:
    structlog.get_logger().exception("fetch_failed")
"""


def test_an_unconfigured_process_gets_the_runtimes_logging_without_local_variables() -> None:
    """structlog's own default prints to stdout and, with ``rich`` installed (it is, in the test
    environment), every frame's local variables: a credential held in one would be logged."""
    out = subprocess.run(
        [sys.executable, "-c", _TRACEBACK_WITH_A_SECRET.format(setup="")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == ""
    assert "fetch_failed" in out.stderr and "RuntimeError: refused" in out.stderr
    assert "hunter2-in-a-local" not in out.stderr


def test_an_applications_own_logging_is_left_as_it_is() -> None:
    setup = "structlog.configure(processors=[structlog.processors.JSONRenderer()])"
    out = subprocess.run(
        [sys.executable, "-c", _TRACEBACK_WITH_A_SECRET.format(setup=setup)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert '"event": "fetch_failed"' in out.stdout and out.stderr == ""  # its JSON on stdout, as it chose
