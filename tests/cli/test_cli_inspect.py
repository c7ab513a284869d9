"""``controller --http`` as an operator runs it, and ``noetl-stream executions`` / ``ctx ID``."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from helpers import free_port

from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.protocol.subjects import Topology

ROOT = Path(__file__).resolve().parents[2]
NOETL_STREAM = Path(sys.executable).parent / "noetl-stream"
HELLO = (ROOT / "playbooks" / "hello.yaml").read_text()


@pytest.fixture
def env(nats_server: EmbeddedNats, topology: Topology) -> dict[str, str]:
    return {
        **os.environ,
        "NOETL_NATS_URL": nats_server.url,
        "NOETL_PREFIX": topology.prefix,
        "NOETL_API_TOKENS": "tok-a, tok-b",
    }


@pytest.fixture
def processes(env: dict[str, str], tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
    for proc in started:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def spawn(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [str(NOETL_STREAM), *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


async def cli(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        str(NOETL_STREAM),
        *args,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_http_needs_a_token_and_a_valid_address(env: dict[str, str]) -> None:
    bare = {k: v for k, v in env.items() if k != "NOETL_API_TOKENS"}
    code, _, err = await cli(bare, "controller", "--http", "127.0.0.1:0")
    assert code == 2 and "bearer token" in err
    code, _, err = await cli(env, "controller", "--http", "nowhere")
    assert code == 2 and "HOST:PORT" in err


async def test_controller_serves_the_api_and_the_cli_inspects(
    env: dict[str, str], processes: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    port = free_port()
    processes.append(spawn(env, tmp_path / "controller.log", "controller", "--http", f"127.0.0.1:{port}"))
    processes.append(spawn(env, tmp_path / "worker.log", "worker", "--concurrency", "4"))
    url = f"http://127.0.0.1:{port}"
    auth = {"Authorization": "Bearer tok-b"}
    async with aiohttp.ClientSession() as http:
        for _ in range(300):
            try:
                async with http.get(url + "/ready", headers=auth) as resp:
                    if resp.status == 200:
                        break
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.05)
        else:
            raise AssertionError((tmp_path / "controller.log").read_text())
        async with http.get(url + "/api/executions") as resp:
            assert resp.status == 401
        async with http.post(url + "/api/executions", headers=auth, json={"playbook": HELLO}) as resp:
            assert resp.status == 201, await resp.text()
            execution_id = (await resp.json())["execution_id"]
        for _ in range(300):
            async with http.get(f"{url}/api/executions/{execution_id}", headers=auth) as resp:
                status = await resp.json()
            if status["status"] not in ("pending", "running"):
                break
            await asyncio.sleep(0.05)
        assert status["status"] == "success", status

    code, out, err = await cli(env, "ctx", execution_id)
    assert code == 0, err
    assert json.loads(out) == {"total": 31}

    for _ in range(100):  # the terminal snapshot is written right after the last event
        code, out, err = await cli(env, "executions", "--json", "--status", "success")
        page = json.loads(out)
        if page["items"]:
            break
        await asyncio.sleep(0.05)
    assert [s["execution_id"] for s in page["items"]] == [execution_id]
    code, out, _ = await cli(env, "executions")
    assert code == 0 and [line.split()[:3] for line in out.splitlines()] == [
        ["EXECUTION", "STATUS", "PLAYBOOK"],
        [execution_id, "success", "examples/hello"],
    ]
    code, _, err = await cli(env, "executions", "--since", "not-a-time")
    assert code == 2 and "ISO-8601" in err
    code, _, err = await cli(env, "ctx", "no-such-run")
    assert code == 1 and "no execution no-such-run" in err
