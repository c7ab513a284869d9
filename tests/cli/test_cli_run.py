"""``noetl-stream run`` as a user runs it: a subprocess, with an embedded server or a given one.

Exit codes: 0 success, 1 execution failed, 2 invalid input. ``--json`` prints one JSON object.
Every playbook shipped in ``playbooks/`` must run and succeed this way.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from helpers import playbook
from nats.js.errors import NotFoundError

from noetl_stream.jetstream.connection import connect
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.history import read_events
from noetl_stream.kv.provision import stream_names
from noetl_stream.protocol.subjects import Topology

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS = sorted([*ROOT.glob("playbooks/*.yaml"), *ROOT.glob("playbooks/*.yml")])
JSON_KEYS = {"execution_id", "status", "ctx", "steps", "result", "error", "events", "duration_s"}


def cli() -> str:
    local = Path(sys.executable).parent / "noetl-stream"
    found = str(local) if local.exists() else shutil.which("noetl-stream")
    assert found, "the noetl-stream console script is not installed"
    return found


def noetl(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "NOETL_NATS_URL"}
    return subprocess.run(
        [cli(), *args], capture_output=True, text=True, timeout=timeout, env={**base, **(env or {})}, cwd=ROOT
    )


def parse(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stdout + proc.stderr
    out = json.loads(lines[0])
    assert isinstance(out, dict)
    return out


HELLO = playbook(
    """
    - step: start
      tool:
        kind: python
        args: {who: "{{ workload.who }}", n: "{{ workload.n }}"}
        code: |
          result = {"greeting": f"hello {who}", "n": n}
        spec:
          policy:
            rules:
              - else:
                  then: {do: continue, set_ctx: {greeted: "{{ who }}"}}
      next:
        arcs:
          - step: end
    - step: end
      tool: {kind: noop, result: "{{ start }}"}
    """,
    workload={"who": "world", "n": 1},
    name="hello",
)

FAILING = playbook(
    """
    - step: start
      tool: {kind: noop}
      next: {arcs: [{step: explode}]}
    - step: explode
      tool:
        kind: python
        code: |
          raise LookupError("nothing here")
    """,
    name="failing",
)

INVALID = playbook(
    """
    - step: start
      tool: {kind: noop}
      retries: 3
    """,
    name="invalid",
)


@pytest.fixture
def hello(tmp_path: Path) -> Path:
    path = tmp_path / "hello.yaml"
    path.write_text(HELLO)
    return path


def assert_json_shape(out: dict[str, Any]) -> None:
    assert set(out) == JSON_KEYS
    assert isinstance(out["execution_id"], str) and out["execution_id"]
    assert isinstance(out["ctx"], dict)
    assert isinstance(out["events"], int) and out["events"] > 0
    assert isinstance(out["duration_s"], (int, float)) and out["duration_s"] >= 0
    for step in out["steps"].values():
        assert set(step) == {"status", "runs"}


def test_run_with_an_embedded_server_prints_one_json_object(hello: Path) -> None:
    proc = noetl("run", str(hello), "--json")

    assert proc.returncode == 0, proc.stderr
    out = parse(proc)
    assert_json_shape(out)
    assert out["status"] == "success"
    assert out["result"] == {"greeting": "hello world", "n": 1}
    assert out["ctx"] == {"greeted": "world"}
    assert out["steps"] == {"start": {"status": "done", "runs": 1}, "end": {"status": "done", "runs": 1}}
    assert out["error"] is None


def test_run_with_an_embedded_server_prints_a_large_result_not_its_reference(tmp_path: Path) -> None:
    """Above the inline limit a result travels by reference to the embedded server's object store, which
    is gone once `run` exits: it prints the value."""
    book = tmp_path / "big.yaml"
    book.write_text(
        playbook(
            """
            - step: start
              tool: {kind: python, code: "result = {'blob': 'x' * 300000}"}
            """,
            name="big",
        )
    )
    proc = noetl("run", str(book), "--json")

    assert proc.returncode == 0, proc.stderr
    assert parse(proc)["result"] == {"blob": "x" * 300000}


@pytest.fixture
async def default_topology_cleanup(nats_server: EmbeddedNats) -> AsyncIterator[Topology]:
    """`noetl-stream run --nats` uses the default prefix: remove its streams from the shared server."""
    topo = Topology()
    yield topo
    nc = await connect(nats_server.url, name="pytest-cleanup", connect_wait_s=10)
    js = nc.jetstream(timeout=10)
    for name in stream_names(topo):
        try:
            await js.delete_stream(name)
        except NotFoundError:
            pass
    await nc.close()


@pytest.mark.parametrize("how", ["option", "env"])
async def test_run_against_a_given_nats_server(
    hello: Path, nats_server: EmbeddedNats, default_topology_cleanup: Topology, how: str
) -> None:
    if how == "option":
        args, env = ["--nats", nats_server.url], None
    else:
        args, env = [], {"NOETL_NATS_URL": nats_server.url}

    proc = await asyncio.to_thread(noetl, "run", str(hello), "--json", "--set", "who=nats", *args, env=env)

    assert proc.returncode == 0, proc.stderr
    out = parse(proc)
    assert out["status"] == "success"
    assert out["result"]["greeting"] == "hello nats"
    # the execution's history is on the given server
    nc = await connect(nats_server.url, name="pytest", connect_wait_s=10)
    try:
        names = [
            e.name
            async for _, e in read_events(nc.jetstream(), default_topology_cleanup, out["execution_id"])
        ]
    finally:
        await nc.close()
    assert names[0] == "playbook.execution.requested"
    assert names[-1] == "playbook.processed"
    assert len(names) == out["events"]


def test_payload_and_set_override_the_workload(hello: Path, tmp_path: Path) -> None:
    inline = noetl("run", str(hello), "--json", "--payload", '{"who": "json", "n": 2}', "--set", "n=[3, 4]")
    payload_file = tmp_path / "payload.json"
    payload_file.write_text(json.dumps({"who": "file"}))
    from_file = noetl("run", str(hello), "--json", "--payload", f"@{payload_file}", "--set", "who=set")

    assert inline.returncode == 0, inline.stderr
    assert parse(inline)["result"] == {"greeting": "hello json", "n": [3, 4]}
    assert from_file.returncode == 0, from_file.stderr
    assert parse(from_file)["result"] == {"greeting": "hello set", "n": 1}


def test_run_with_several_workers(hello: Path) -> None:
    proc = noetl("run", str(hello), "--json", "--workers", "2")

    assert proc.returncode == 0, proc.stderr
    assert parse(proc)["status"] == "success"


def test_run_without_json_shows_progress_and_the_result(hello: Path) -> None:
    proc = noetl("run", str(hello))

    assert proc.returncode == 0, proc.stderr
    assert "start" in proc.stderr and "end" in proc.stderr
    assert "success" in proc.stderr
    assert "hello world" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_failed_execution_exits_1(tmp_path: Path) -> None:
    path = tmp_path / "failing.yaml"
    path.write_text(FAILING)

    proc = noetl("run", str(path), "--json")
    human = noetl("run", str(path))

    assert proc.returncode == 1, proc.stderr
    out = parse(proc)
    assert_json_shape(out)
    assert out["status"] == "failed"
    assert out["error"]["kind"] == "python_error"
    assert out["error"]["step"] == "explode"
    assert "nothing here" in out["error"]["message"]
    assert out["steps"]["explode"]["status"] == "failed"
    assert human.returncode == 1
    assert "nothing here" in human.stderr
    assert "Traceback" not in human.stderr


def test_a_failure_with_only_a_plain_arc_after_it_exits_1(tmp_path: Path) -> None:
    """An arc without ``when`` is taken on success only: the raising step's failure is unhandled."""
    path = tmp_path / "plain.yaml"
    path.write_text(
        playbook(
            """
            - step: start
              tool:
                kind: python
                code: |
                  raise LookupError("nothing here")
              next: {arcs: [{step: end}]}
            - step: end
              tool: {kind: noop, result: ended}
            """,
            name="plain",
        )
    )

    proc = noetl("run", str(path), "--json")

    assert proc.returncode == 1, proc.stderr
    out = parse(proc)
    assert (out["status"], out["error"]["step"]) == ("failed", "start")
    assert "end" not in out["steps"]


def test_invalid_playbook_exits_2_with_located_diagnostics(tmp_path: Path) -> None:
    path = tmp_path / "invalid.yaml"
    path.write_text(INVALID)

    proc = noetl("run", str(path), "--json")

    assert proc.returncode == 2
    assert f"{path}:7:5:" in proc.stderr
    assert "unknown key 'retries'" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["missing.yaml"], "missing.yaml", id="missing-file"),
        pytest.param(["{hello}", "--payload", "{not json"], "--payload", id="payload-not-json"),
        pytest.param(["{hello}", "--payload", "[1, 2]"], "JSON object", id="payload-not-an-object"),
        pytest.param(["{hello}", "--set", "novalue"], "KEY=VALUE", id="set-without-equals"),
    ],
)
def test_invalid_input_exits_2(hello: Path, args: list[str], message: str) -> None:
    proc = noetl("run", *[a.replace("{hello}", str(hello)) for a in args])

    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


# --- the shipped playbooks -------------------------------------------------------------------------


@pytest.mark.parametrize("path", PLAYBOOKS, ids=[p.name for p in PLAYBOOKS])
def test_shipped_playbook_runs_and_succeeds(path: Path) -> None:
    proc = noetl("run", str(path.relative_to(ROOT)), "--json", timeout=90)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = parse(proc)
    assert out["status"] == "success", out
    assert out["error"] is None
