"""A client that leaves an execution's live event stream (``GET .../events?follow=1``: a browser tab
closed, ``curl`` stopped with Ctrl-C) is no failure of the server: a real ``controller --http`` logs it at
debug level, never as ``api.internal_error`` (an error with a traceback), and goes on serving.

The client reads one event and drops the connection (closed, or reset with SO_LINGER 0); the execution
is then let go on (its python task waits for a file), so the server has more events to write to a
client that has gone. The controller's log (JSON lines, ``--log-level debug``) is what is checked."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from helpers import free_port, playbook
from procs import NOETL_STREAM

from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.protocol.subjects import Topology

TOKEN = "tok-stream"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

GATED = playbook(
    """
    - step: start
      tool:
        kind: python
        args: {release: "{{ workload.release }}"}
        code: |
          import os, time
          while not os.path.exists(release):  # the test lets it go once its client has left
              time.sleep(0.02)
          result = "released"
      next: {arcs: [{step: after}]}
    - step: after
      tool: {kind: noop, result: done}
    """,
    workload={"release": ""},
    name="gated",
)


@pytest.fixture
def env(nats_server: EmbeddedNats, topology: Topology) -> dict[str, str]:
    return {
        **os.environ,
        "NOETL_NATS_URL": nats_server.url,
        "NOETL_PREFIX": topology.prefix,
        "NOETL_API_TOKENS": TOKEN,
    }


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _spawn(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [str(NOETL_STREAM), *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _records(log: Path) -> list[dict[str, Any]]:
    """The JSON log lines of `log` (a line that is not JSON is kept as its text)."""
    out: list[dict[str, Any]] = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            record = {"text": line}
        out.append(record if isinstance(record, dict) else {"text": line})
    return out


async def _ready(http: aiohttp.ClientSession, url: str, log: Path) -> None:
    for _ in range(400):
        try:
            async with http.get(url + "/ready", headers=AUTH) as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientConnectionError:
            pass
        await asyncio.sleep(0.05)
    raise AssertionError(log.read_text())


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_a_client_leaving_the_event_stream_is_no_internal_error(
    env: dict[str, str], started: list[subprocess.Popen[bytes]], tmp_path: Path, how: str
) -> None:
    port = free_port()
    controller_log = tmp_path / "controller.log"
    started.append(
        _spawn(env, controller_log, "controller", "--http", f"127.0.0.1:{port}", "--log-level", "debug")
    )
    started.append(_spawn(env, tmp_path / "worker.log", "worker", "--concurrency", "2"))
    url = f"http://127.0.0.1:{port}"
    release = tmp_path / "release"
    request = {"playbook": GATED, "payload": {"release": str(release)}}
    async with aiohttp.ClientSession() as http:
        await _ready(http, url, controller_log)
        async with http.post(url + "/api/executions", headers=AUTH, json=request) as resp:
            assert resp.status == 201, await resp.text()
            execution_id = (await resp.json())["execution_id"]
        events = f"{url}/api/executions/{execution_id}/events?follow=1"

        # A client of its own, so that nothing it leaves is reused: read one event, then go away.
        async with aiohttp.ClientSession() as leaving:
            resp = await leaving.get(events, headers=AUTH)
            assert resp.status == 200 and resp.content_type == "text/event-stream"
            first = await resp.content.readuntil(b"\n\n")
            assert b"event: playbook.execution.requested" in first
            if how == "reset":  # an RST, not a FIN: SO_LINGER on, with a zero timeout
                transport = resp.connection.transport if resp.connection is not None else None
                assert transport is not None
                sock = transport.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            resp.close()  # the connection is closed, not handed back to the pool

        release.write_text("")  # the execution goes on: the server has events to write to nobody

        async def left() -> bool:
            return any(r.get("event") == "api.stream.client_left" for r in _records(controller_log))

        for _ in range(600):
            if await left():
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(controller_log.read_text())

        records = _records(controller_log)
        errors = [r for r in records if r.get("level") in ("error", "critical")]
        assert errors == [], errors
        assert not [r for r in records if r.get("event") == "api.internal_error"]
        gone = [r for r in records if r.get("event") == "api.stream.client_left"]
        assert [r["level"] for r in gone] == ["debug"], gone
        assert gone[0]["execution_id"] == execution_id and "exception" not in gone[0]

        # The server goes on serving: the same stream, read to its end by a client that stays.
        async with http.get(url + "/health") as resp:
            assert resp.status == 200
        async with http.get(events, headers=AUTH) as resp:
            assert resp.status == 200
            body = await resp.read()
        assert body.rstrip().splitlines()[-1].startswith(b"data: ")
        assert b"event: playbook.processed" in body
    assert started[0].poll() is None, controller_log.read_text()
