"""``kind: script``: shell and Python scripts in a child process, in a clean environment, killed with
everything they started when their time is up. Real processes, a real runtime for the playbook test."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import playbook, run

from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.dataplane.tools.base import ToolContext
from noetl_stream.dataplane.tools.script import OUTPUT_LIMIT, run_script
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import Runtime, local_runtime


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


ESCAPE = """
setsid sh -c 'echo $$ > {d}/a.tmp; mv {d}/a.tmp {d}/a; exec sleep 300' &
( setsid sh -c 'echo $$ > {d}/b.tmp; mv {d}/b.tmp {d}/b; exec sleep 300' & ) &
until [ -e {d}/a ] && [ -e {d}/b ]; do sleep 0.01; done
touch {d}/ready
"""
"""Two processes that leave the script's process group (``setsid``, and ``setsid`` in a double fork);
each writes its pid to a file, and the script goes on once both have."""

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sweep reads /proc")


def _stat(pid: int) -> tuple[str, int] | None:
    """State and parent pid of a process, None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[0], int(fields[1])


def _alive(pid: int) -> bool:
    """Running, or a zombie still ours to reap (a zombie orphan is dead: init reaps it, or never here)."""
    stat = _stat(pid)
    return stat is not None and (stat[0] != "Z" or stat[1] == os.getpid())


async def _all_gone(pids: list[int]) -> None:
    for _ in range(200):  # SIGKILL is sent; the kernel tears the processes down shortly
        if not any(_alive(pid) for pid in pids):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"escaped processes still run: {[pid for pid in pids if _alive(pid)]}")


@contextlib.contextmanager
def _escaped(d: Path) -> Iterator[list[int]]:
    """The pids the `ESCAPE` script wrote, filled once it has run; whatever still runs of them at the
    end is killed here (by pid, if still a sleep), so a failing test leaks nothing."""
    pids: list[int] = []
    try:
        yield pids
    finally:
        for name in ("a", "b"):
            with contextlib.suppress(OSError, ValueError):
                pid = int((d / name).read_text())
                if _alive(pid) and b"sleep" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)


def _pids(d: Path) -> list[int]:
    assert (d / "ready").exists(), "the script did not get to start its escaped processes"
    return [int((d / name).read_text()) for name in ("a", "b")]


@linux_only
async def test_processes_that_left_the_process_group_are_killed_when_the_script_ends(
    tmp_path: Path,
) -> None:
    with _escaped(tmp_path):
        out = await script({"code": ESCAPE.format(d=tmp_path) + "echo done"})
        assert out.status == "ok", out.error
        assert out.result["stdout"] == "done\n"
        await _all_gone(_pids(tmp_path))


@linux_only
async def test_without_pidfds_processes_that_left_the_process_group_are_still_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel without ``pidfd_open`` (before 5.3) or a sandbox that filters it out: the sweep kills by
    pid, after checking the marker again."""

    real = os.pidfd_open

    def no_pidfd(pid: int, flags: int = 0) -> int:
        # Only in the sweep's thread: asyncio itself (3.12+) waits for the script through a pidfd.
        if threading.current_thread() is threading.main_thread():
            return real(pid, flags)
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    with _escaped(tmp_path):
        out = await script({"code": ESCAPE.format(d=tmp_path) + "echo done"})
        assert out.status == "ok", out.error
        await _all_gone(_pids(tmp_path))


@linux_only
async def test_processes_that_left_the_process_group_are_killed_at_the_timeout(tmp_path: Path) -> None:
    with _escaped(tmp_path):
        # ESCAPE is done in well under 0.5 s (_pids checks that it got to its end before the timeout)
        out = await script({"code": ESCAPE.format(d=tmp_path) + "sleep 300"}, {"timeout": 1.5})
        assert out.status == "error" and out.error is not None
        assert out.error["kind"] == "timeout"
        await _all_gone(_pids(tmp_path))


@linux_only
async def test_processes_that_left_the_process_group_are_killed_when_the_task_is_cancelled(
    tmp_path: Path,
) -> None:
    with _escaped(tmp_path):
        task = asyncio.create_task(script({"code": ESCAPE.format(d=tmp_path) + "sleep 300"}))
        for _ in range(400):
            if (tmp_path / "ready").exists():
                break
            await asyncio.sleep(0.025)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _all_gone(_pids(tmp_path))


@linux_only
async def test_a_process_without_the_runs_marker_survives_a_script_run(tmp_path: Path) -> None:
    """The worker's own processes, and one with another run's marker, are not the script's to kill."""
    plain = subprocess.Popen(["sleep", "300"])
    other = subprocess.Popen(["sleep", "300"], env={**os.environ, "NOETL_SCRIPT_RUN": "0" * 32})
    try:
        with _escaped(tmp_path):
            out = await script({"code": ESCAPE.format(d=tmp_path)})
            assert out.status == "ok", out.error
            await _all_gone(_pids(tmp_path))  # the sweep ran
        assert plain.poll() is None and other.poll() is None
    finally:
        for proc in (plain, other):
            proc.kill()
            proc.wait()


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


# --- the ``script`` tool's ``json`` is the whole stdout decoded, also past the 64 KiB kept as
# ``stdout`` text.


async def test_json_is_the_whole_stdout_decoded_past_the_kept_tail() -> None:
    code = "import json\nprint(json.dumps({'rows': ['x' * 100 for _ in range(2000)], 'end': True}))\n"
    ctx = ToolContext(execution_id="e1", step="s", task="t", spec={})
    out = await run_script({"language": "python", "code": code}, ctx)
    assert out.status == "ok", out.error
    assert len(out.result["stdout"].encode()) == OUTPUT_LIMIT  # the text is cut to its tail
    assert out.result["json"] == {"rows": ["x" * 100] * 2000, "end": True}


# --- ``kind: script``'s ``env``: a null value leaves the variable unset, never the text ``null``.


SHOW = 'echo "X=${X-unset} HOME=${HOME-unset} KEPT=${KEPT-unset} N=${N-unset}"'


async def test_a_null_env_value_leaves_the_variable_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/worker")  # inherited (KEPT_ENV) unless `env` unsets it
    out = await script({"code": SHOW, "env": {"X": None, "HOME": None, "KEPT": "yes", "N": 0}})
    assert out.status == "ok", out.error
    assert out.result["stdout"] == "X=unset HOME=unset KEPT=yes N=0\n"


async def test_a_null_env_value_in_python_is_not_in_os_environ() -> None:
    code = "import json, os\nprint(json.dumps({'has': 'X' in os.environ, 'path': 'PATH' in os.environ}))"
    out = await script({"language": "python", "code": code, "env": {"X": None, "PATH": None}})
    assert out.status == "ok", out.error
    assert out.result["json"] == {"has": False, "path": False}


async def test_a_template_rendering_to_null_unsets_the_variable(
    nats_server: EmbeddedNats, topology: Topology
) -> None:
    text = playbook(
        f"""
        - step: start
          tool:
            kind: script
            code: '{SHOW}'
            env: {{X: "{{{{ workload.nothing }}}}", KEPT: "{{{{ workload.region }}}}"}}
        """,
        workload={"nothing": None, "region": "eu"},
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "success", r.summary.error
    assert r.result["stdout"].startswith("X=unset ") and "KEPT=eu" in r.result["stdout"]
