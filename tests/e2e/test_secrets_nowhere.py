"""A secret never appears in events, logs, error messages or `submit --wait --json` output.

Real processes: a controller and a worker (debug logging) whose environment holds the secret; the
playbook reads it through `{{ keychain.token.value }}`, prints it, puts it in its result and in an
error message. Then the whole event stream, the process logs and the CLI output are grepped.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import msgspec
from procs import NOETL_STREAM, Processes

from noetl_stream.jetstream.connection import connect
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.history import read_events
from noetl_stream.kv.provision import provision
from noetl_stream.protocol.subjects import Topology

SECRET = "tok-7f3a9c1e5b2d8f46"

PLAYBOOK = """apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: leak, path: tests/leak}
keychain:
  - name: token
    kind: bearer
    env: NOETL_TEST_LEAK_TOKEN
workflow:
  - step: start
    tool:
      - name: use
        kind: python
        args: {t: "{{ keychain.token.value }}"}
        code: |
          print("the token is", t)
          result = {"echo": t, "len": len(t)}
    next:
      arcs: [{step: boom, when: "{{ event.name == 'step.done' }}"}]
  - step: boom
    tool:
      kind: python
      args: {t: "{{ keychain.token.value }}"}
      code: |
        raise RuntimeError("bad token " + t)
"""


async def test_a_secret_is_in_no_event_log_or_output(
    nats_server: EmbeddedNats, topology: Topology, tmp_path: Path
) -> None:
    pb = tmp_path / "leak.yaml"
    pb.write_text(PLAYBOOK)
    nc = await connect(nats_server.url, name="pytest-leak-setup", connect_wait_s=10)
    try:
        await provision(nc.jetstream(), topology)  # before the processes start: `submit` needs the streams
    finally:
        await nc.close()
    os.environ["NOETL_TEST_LEAK_TOKEN"] = SECRET
    try:
        with Processes(nats_server.url, topology, tmp_path / "logs") as procs:
            procs.env["NOETL_TEST_LEAK_TOKEN"] = SECRET
            procs.controller()
            procs._spawn("worker", ["worker", "--name", "w", "--log-level", "debug"])
            out = subprocess.run(
                [
                    str(NOETL_STREAM),
                    "submit",
                    str(pb),
                    "--wait",
                    "--json",
                    "--nats",
                    nats_server.url,
                    "--prefix",
                    topology.prefix,
                ],
                capture_output=True,
                timeout=60,
                env=procs.env,
                check=False,
            )
            logs = "".join(p.log_path.read_text() for p in procs.all)
    finally:
        del os.environ["NOETL_TEST_LEAK_TOKEN"]
    assert out.returncode == 1, out.stderr.decode()
    assert out.stdout, out.stderr.decode()
    summary = msgspec.json.decode(out.stdout)
    assert summary["status"] == "failed" and summary["error"]["kind"] == "python_error"
    assert "***" in summary["error"]["message"]
    nc = await connect(nats_server.url, name="pytest-leak", connect_wait_s=10)
    try:
        events = [ev async for _, ev in read_events(nc.jetstream(), topology, summary["execution_id"])]
    finally:
        await nc.close()
    assert len(events) > 10
    stream = b"".join(msgspec.json.encode(ev) for ev in events)
    assert b"the token is ***" in stream  # the print was captured, redacted
    for where, text in (
        ("events", stream),
        ("logs", logs.encode()),
        ("stdout", out.stdout),
        ("stderr", out.stderr),
    ):
        assert SECRET.encode() not in text, f"the secret leaked into {where}"
