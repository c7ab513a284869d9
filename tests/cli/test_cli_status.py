"""``noetl-stream status ID`` on a terminal (a tree of the steps), in a pipe or with ``--json`` (one line
of JSON, as scripts read it), and for an unknown id (exit 1); the column names above ``executions`` and
``events``; durations as a person reads them."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import playbook
from procs import NOETL_STREAM

from noetl_stream.cli import main
from noetl_stream.client.timeline import Timeline, duration_text
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.runtime.local import Runtime

ROOT = Path(__file__).resolve().parents[2]

FLAKY_THEN_FAILING = playbook(
    """
    - step: start
      tool: {kind: noop}
      next: {arcs: [{step: each}]}
    - step: each
      loop: {in: "{{ [1, 2, 3] }}", iterator: n}
      tool: {kind: python, args: {n: "{{ iter.n }}"}, code: "result = n * n"}
      next: {arcs: [{step: flaky}]}
    - step: flaky
      tool:
        kind: python
        code: |
          raise TimeoutError("upstream slow")
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                then: {do: retry, attempts: 3, delay: 0.01}
    """,
    name="statusbook",
)
"""A loop of three, then a step whose task fails three times (two policy retries): the execution fails."""

DURATION = re.compile(r"^(-|\d+ms|\d+\.\d\ds|\d+m\d\ds|\d+h\d\dm)$")


def cli(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


def env_of(nats_server: EmbeddedNats, runtime: Runtime) -> dict[str, str]:
    return {"NOETL_NATS_URL": nats_server.url, "NOETL_PREFIX": runtime.topology.prefix}


@pytest.fixture
async def failed(runtime: Runtime) -> str:
    summary = await runtime.run_playbook(FLAKY_THEN_FAILING, "statusbook.yaml", timeout=60)
    assert summary.status == "failed", summary
    return summary.execution_id


def test_durations_read_as_a_person_says_them() -> None:
    assert duration_text(0.0123) == "12ms"
    assert duration_text(1.2345) == "1.23s"
    assert duration_text(59.994) == "59.99s"
    assert duration_text(123.4) == "2m03s"
    assert duration_text(3725) == "1h02m"
    assert duration_text(-1) == "0ms"


async def test_the_tree_names_each_step_with_its_status_duration_attempts_and_error(
    nats_server: EmbeddedNats, runtime: Runtime, failed: str
) -> None:
    code, out, err = await asyncio.to_thread(cli, env_of(nats_server, runtime), "status", failed, "--tree")

    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"execution {failed}  failed"
    blank = lines.index("")
    fields = dict(line.split(None, 1) for line in lines[1:blank])
    assert fields["playbook"] == "tests/statusbook (statusbook)"
    assert fields["error"] == "flaky: python_error: TimeoutError: upstream slow (line 1)"
    assert DURATION.match(fields["duration"]), fields
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["STEP"])
    assert lines[header].split() == ["STEP", "STATUS", "DURATION", "ATTEMPTS"]
    rows = {}
    for line in lines[header + 1 :]:
        cells = line.split()
        if line.startswith(("  ├─", "  └─")):  # a step (what is below it is indented further)
            rows[cells[2]] = cells[1], cells[3], cells[4], int(cells[5])
    assert rows.keys() == {"start", "each", "flaky"}
    assert rows["start"][:2] == ("✔", "ok") and rows["start"][3] == 1
    assert rows["each"][:2] == ("✔", "ok") and rows["each"][3] == 1
    assert rows["flaky"][:2] == ("✘", "failed")
    assert rows["flaky"][3] == 3, "its run and the two task runs the policy retried"
    assert all(DURATION.match(row[2]) for row in rows.values()), rows
    assert "     └─ error: python_error: TimeoutError: upstream slow (line 1)" in lines  # last step
    loop = lines[header + 3]  # under `each`, the second step
    assert loop.startswith("  │  └─ loop: 3/3 done, 0 failed ("), out


async def test_on_a_terminal_status_prints_the_tree_and_in_a_pipe_the_json_of_before(
    nats_server: EmbeddedNats, runtime: Runtime, failed: str
) -> None:
    env = {**os.environ, **env_of(nats_server, runtime)}

    def on_a_terminal(*args: str) -> tuple[int, str]:
        leader, follower = pty.openpty()
        try:
            proc = subprocess.Popen(
                [str(NOETL_STREAM), *args],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=follower,
                stderr=subprocess.PIPE,
                cwd=ROOT,
            )
            os.close(follower)
            follower = -1
            out = b""
            while True:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # EIO: the process closed its end
                    break
                if not chunk:
                    break
                out += chunk
            assert proc.wait(60) == 0, proc.stderr.read() if proc.stderr else ""
            return proc.returncode, out.decode().replace("\r\n", "\n")
        finally:
            os.close(leader)
            if follower >= 0:
                os.close(follower)

    code, tty_out = await asyncio.to_thread(on_a_terminal, "status", failed)
    assert code == 0
    assert tty_out.splitlines()[0] == f"execution {failed}  failed"
    assert "└─ ✘ flaky" in tty_out

    code, tty_json = await asyncio.to_thread(on_a_terminal, "status", failed, "--json")
    assert code == 0 and json.loads(tty_json)["status"] == "failed"

    code, piped, err = await asyncio.to_thread(cli, env_of(nats_server, runtime), "status", failed)
    assert code == 0, err
    assert len(piped.splitlines()) == 1
    summary = json.loads(piped)
    assert set(summary) == {"execution_id", "status", "ctx", "steps", "result", "error", "events"}
    assert summary["steps"]["flaky"] == {"status": "failed", "runs": 1}
    assert summary["error"]["step"] == "flaky"
    code, as_json, _ = await asyncio.to_thread(cli, env_of(nats_server, runtime), "status", failed, "--json")
    assert code == 0 and json.loads(as_json) == summary


async def test_status_of_an_unknown_execution_exits_1_and_says_so(
    nats_server: EmbeddedNats, runtime: Runtime
) -> None:
    env = env_of(nats_server, runtime)
    for flags in ([], ["--tree"], ["--json"]):
        code, out, err = await asyncio.to_thread(cli, env, "status", "no-such-run", *flags)
        assert (code, out) == (1, ""), (flags, code, out, err)
        assert (
            err == f"error: no execution no-such-run (no events under prefix '{runtime.topology.prefix}')\n"
        )
    code, _, err = await asyncio.to_thread(cli, env, "status", "x", "--json", "--tree")
    assert code == 2 and "--json and --tree" in err


async def test_executions_and_events_print_column_names_above_their_rows(
    nats_server: EmbeddedNats, runtime: Runtime, failed: str
) -> None:
    env = env_of(nats_server, runtime)
    for _ in range(200):  # the terminal snapshot is written right after the last event
        code, out, err = await asyncio.to_thread(cli, env, "executions", "--status", "failed")
        if failed in out:
            break
        await asyncio.sleep(0.05)
    assert code == 0, err
    header, row = out.splitlines()
    assert header.split() == ["EXECUTION", "STATUS", "PLAYBOOK", "UPDATED"]
    assert row.split()[:3] == [failed, "failed", "tests/statusbook"]
    assert header.index("STATUS") == row.index("failed")  # the columns line up
    assert header.index("PLAYBOOK") == row.index("tests/statusbook")
    code, bare, _ = await asyncio.to_thread(cli, env, "executions", "--status", "failed", "--no-headers")
    assert bare.splitlines() == [row]

    code, out, err = await asyncio.to_thread(cli, env, "events", failed)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == Timeline.HEADER
    assert lines[0].split() == ["TIME", "EVENT", "STEP", "RUN", "STATUS", "DURATION", "DETAIL"]
    assert lines[1].split()[:2] == ["+0.000s", "playbook.execution.requested"]
    assert lines[0].index("EVENT") == lines[1].index("playbook.execution.requested")
    code, bare, _ = await asyncio.to_thread(cli, env, "events", failed, "--no-headers")
    assert bare.splitlines() == lines[1:]
    code, raw, _ = await asyncio.to_thread(cli, env, "events", failed, "--json")
    assert all(json.loads(line)["execution_id"] == failed for line in raw.splitlines())
