"""``kind: script``: shell and Python scripts in a child process, in a clean environment, killed with
everything they started when their time is up. Real processes, a real runtime for the playbook test."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import playbook, run

from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.dataplane.tools.base import ToolContext
from noetl_stream.dataplane.tools.script import run_script
from noetl_stream.local import Runtime


def context(spec: dict[str, Any] | None = None) -> ToolContext:
    return ToolContext(execution_id="e1", step="s", task="t", spec=spec or {})


async def script(config: dict[str, Any], spec: dict[str, Any] | None = None) -> Outcome:
    return await run_script(config, context(spec))


async def test_a_shell_script_gets_its_args_and_env_and_its_json_stdout_is_decoded() -> None:
    out = await script(
        {
            "code": 'printf \'{"n": %s, "step": "%s", "args": %s}\' "$COUNT" "$NOETL_STEP" "$NOETL_ARGS"',
            "env": {"COUNT": 3},
            "args": {"who": "ada"},
        }
    )
    assert out.status == "ok", out.error
    assert out.result["exit_code"] == 0
    assert out.result["json"] == {"n": 3, "step": "s", "args": {"who": "ada"}}


async def test_a_python_script_runs_on_the_workers_interpreter() -> None:
    code = "import json, os\nprint(json.dumps({'sum': sum(json.loads(os.environ['NOETL_ARGS'])['xs'])}))"
    out = await script({"language": "python", "code": code, "args": {"xs": [1, 2, 3]}})
    assert out.status == "ok", out.error
    assert out.result["json"] == {"sum": 6}


async def test_the_workers_own_environment_does_not_reach_the_script(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOETL_KEYCHAIN_KEY", "worker-secret-key")
    monkeypatch.setenv("NOETL_NATS_PASSWORD", "worker-nats-password")
    out = await script({"code": "env"})
    assert out.status == "ok", out.error
    assert "worker-secret-key" not in out.result["stdout"]
    assert "worker-nats-password" not in out.result["stdout"]
    assert "NOETL_EXECUTION_ID=e1" in out.result["stdout"]


async def test_a_non_zero_exit_is_a_script_error_with_its_last_error_line_and_its_output() -> None:
    out = await script(
        {"language": "bash", "code": "echo partial\necho 'first' >&2\necho 'disk full' >&2\nexit 7"}
    )
    assert out.status == "error" and out.error is not None
    assert out.error["kind"] == "script_error" and not out.error["retryable"]
    assert out.error["message"] == "script exited with 7: disk full"
    assert out.result["exit_code"] == 7 and out.result["stdout"] == "partial\n"


async def test_a_script_file_on_the_worker_runs_by_path(tmp_path: Path) -> None:
    path = tmp_path / "hello.sh"
    path.write_text('echo "hello from $NOETL_TASK"\n')
    out = await script({"path": str(path)})
    assert out.status == "ok", out.error
    assert out.result["stdout"] == "hello from t\n" and out.result["json"] is None


async def test_a_timeout_kills_the_script_and_what_it_started(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    code = f"sleep 30 &\necho $! > {pidfile}\nwait"
    started = time.monotonic()
    out = await script({"code": code}, {"timeout": 0.5})
    assert out.status == "error" and out.error is not None
    assert out.error["kind"] == "timeout" and out.error["retryable"]
    assert time.monotonic() - started < 20  # not the 30 s of the sleep
    await _gone(int(pidfile.read_text()))


async def test_a_script_that_leaves_a_child_behind_ends_when_it_ends_and_the_child_is_stopped(
    tmp_path: Path,
) -> None:
    """The child inherits the script's pipes: reading them to their end waited for it (30 s here)."""
    pidfile = tmp_path / "child.pid"
    started = time.monotonic()
    out = await script({"code": f"sleep 30 &\necho $! > {pidfile}\necho done"})
    assert out.status == "ok", out.error
    assert out.result["stdout"] == "done\n"
    assert time.monotonic() - started < 20
    await _gone(int(pidfile.read_text()))


async def _gone(pid: int) -> None:
    for _ in range(100):  # SIGKILL is sent; the kernel reaps the orphan shortly
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the script's background child {pid} still runs")


async def test_a_chatty_script_keeps_the_tail_of_its_output() -> None:
    out = await script({"language": "python", "code": "for i in range(200_000):\n    print(i)"})
    assert out.status == "ok", out.error
    assert out.result["stdout"].endswith("199999\n") and len(out.result["stdout"]) <= 64 * 1024
    assert out.result["json"] is None


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, "needs 'code'"),
        ({"code": "true", "path": "/bin/true"}, "not both"),
        ({"code": "true", "language": "perl"}, "'language' 'perl' is not one of: bash, python, sh"),
        ({"path": "/nonexistent/run.sh"}, "no such file on the worker"),
        ({"code": "true", "env": ["A=1"]}, "'env' must be a mapping"),
        ({"code": "true", "env": {"A=B": "1"}}, "invalid variable name"),
        ({"code": "true", "args": [1]}, "'args' must render to a mapping"),
    ],
)
async def test_a_bad_config_is_a_config_error(config: dict[str, Any], message: str) -> None:
    out = await script(config)
    assert out.error is not None and out.error["kind"] == "config_error"
    assert message in out.error["message"]


async def test_a_playbook_step_runs_a_script_and_the_next_step_reads_its_json(runtime: Runtime) -> None:
    r = await run(
        runtime,
        playbook(
            """
            - step: start
              tool:
                kind: script
                args: {n: "{{ workload.n }}"}
                code: |
                  echo "{\\"double\\": $(( $(echo "$NOETL_ARGS" | tr -dc 0-9) * 2 ))}"
              next:
                arcs:
                  - step: report
            - step: report
              tool: {kind: noop, result: "{{ start.json.double }}"}
            """,
            workload={"n": 21},
        ),
    )
    assert r.status == "success", r.summary.error
    assert r.summary.result == 42
