"""What ``noetl-stream run`` (and ``submit --wait``) print when the execution does not succeed, as a user
runs them (subprocesses): a failure names its step and error once and prints no result; Ctrl-C is exit
130 and one line, without what the runtime's shutdown logs; ``--timeout`` gives up with a message and
exit 124 (``run`` cancels its execution, ``submit --wait`` leaves it running); payload keys the
playbook's workload does not declare are warned about, and the run goes on."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import playbook
from test_cli_run import ROOT, cli, noetl

from noetl_stream.client.tracking import follow
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.runtime.local import Runtime

DURATION = r"(\d+ms|\d+\.\d\ds|\d+m\d\ds|\d+h\d\dm)"

FAILING = playbook(
    """
    - step: start
      tool: {kind: noop, result: {stale: "the result of the step before"}}
      next: {arcs: [{step: explode}]}
    - step: explode
      tool:
        kind: python
        code: |
          raise LookupError("nothing here")
    """,
    name="failing",
)

BLOCKED = playbook(
    """
    - step: start
      tool:
        kind: python
        code: |
          import time
          time.sleep(600)  # blocked in C: its thread outlives the shutdown's grace
          result = 1
    """,
    name="blocked",
)

GATED = playbook(
    """
    - step: start
      tool:
        kind: python
        args: {release: "{{ workload.release }}"}
        code: |
          import os, time
          while not os.path.exists(release):
              time.sleep(0.02)
          result = "released"
    """,
    workload={"release": ""},
    name="gated",
)

FLAKY_GATED = playbook(
    """
    - step: start
      tool:
        kind: python
        args: {broken: "{{ workload.broken }}", release: "{{ workload.release }}"}
        code: |
          import os, time
          if os.path.exists(broken):
              raise RuntimeError("broken")
          while not os.path.exists(release):
              time.sleep(0.02)
          result = "released"
    """,
    workload={"broken": "", "release": ""},
    name="flaky_gated",
)

HELLO = playbook(
    """
    - step: start
      tool: {kind: python, args: {who: "{{ workload.who }}"}, code: "result = f'hello {who}'"}
    """,
    workload={"who": "world"},
    name="hello",
)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def _log_lines(stderr: str) -> list[str]:
    """The structured log lines (JSON objects) among stderr's lines."""
    return [line for line in stderr.splitlines() if line.startswith("{")]


def test_a_failed_run_names_the_failed_step_and_its_error_once(tmp_path: Path) -> None:
    path = _write(tmp_path, "failing", FAILING)

    human = noetl("run", str(path))

    assert human.returncode == 1, human.stderr
    assert human.stdout == "", "a failed run has no result to print"
    assert human.stderr.count("nothing here") == 1, human.stderr
    assert _log_lines(human.stderr) == [], human.stderr
    lines = human.stderr.splitlines()
    assert "  ✘ explode failed: python_error: LookupError: nothing here (line 1)" in lines
    assert re.fullmatch(rf"✘ execution [0-9a-f]{{32}} failed in {DURATION}: step explode", lines[-1]), lines
    assert "stale" not in human.stderr and "Traceback" not in human.stderr

    as_json = noetl("run", str(path), "--json")

    assert as_json.returncode == 1, as_json.stderr
    out = json.loads(as_json.stdout)
    assert out["status"] == "failed" and out["result"] is None
    assert out["error"]["step"] == "explode" and "nothing here" in out["error"]["message"]
    assert as_json.stderr == "", "the outcome on stdout says it all"


def _run_blocked(tmp_path: Path) -> subprocess.Popen[str]:
    """``noetl-stream run`` of a playbook whose task blocks (it cannot end before a signal)."""
    path = _write(tmp_path, "blocked", BLOCKED)
    env = {k: v for k, v in os.environ.items() if k != "NOETL_NATS_URL"}
    return subprocess.Popen(
        [cli(), "run", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        # Ctrl-C's default action: a child of a non-interactive shell may have inherited SIGINT ignored.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def test_ctrl_c_is_exit_130_and_one_line(tmp_path: Path) -> None:
    proc = _run_blocked(tmp_path)
    try:
        assert proc.stderr is not None
        before = []
        for line in proc.stderr:  # the task runs (and blocks) once its step started
            before.append(line)
            if "start started" in line:
                break
        else:
            raise AssertionError("".join(before))
        proc.send_signal(signal.SIGINT)
        out, after = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, after
    assert out == ""
    (said,) = after.splitlines()  # no worker.grace_expired, no puller.stop_timeout, no traceback
    assert re.fullmatch(
        r"interrupted: execution [0-9a-f]{32} stopped unfinished \(with the embedded NATS server\)", said
    ), after


def test_run_timeout_cancels_the_execution_and_exits_124(tmp_path: Path) -> None:
    path = _write(tmp_path, "blocked", BLOCKED)

    human = noetl("run", str(path), "--timeout", "1")

    assert human.returncode == 124, human.stderr
    assert human.stdout == ""
    assert _log_lines(human.stderr) == [], human.stderr
    last = human.stderr.splitlines()[-1]
    assert re.fullmatch(
        r"error: execution [0-9a-f]{32} did not end within --timeout 1s: cancelled \(stopped: start\)", last
    ), human.stderr

    as_json = noetl("run", str(path), "--timeout", "0.5", "--json")

    assert as_json.returncode == 124, as_json.stderr
    out = json.loads(as_json.stdout)
    assert (out["status"], out["result"]) == ("cancelled", None)
    assert out["steps"]["start"]["status"] == "cancelled"
    assert as_json.stderr.splitlines() == [
        f"error: execution {out['execution_id']} did not end within --timeout 0.5s: cancelled (stopped: start)"
    ]
    assert noetl("run", str(path), "--timeout", "0").returncode == 2  # not a time to wait


async def test_submit_wait_timeout_exits_124_and_leaves_the_execution_running(
    nats_server: EmbeddedNats, runtime: Runtime, tmp_path: Path
) -> None:
    path = _write(tmp_path, "gated", GATED)
    release = tmp_path / "release"
    args = ["--nats", nats_server.url, "--prefix", runtime.topology.prefix]

    proc = await asyncio.to_thread(
        noetl, "submit", str(path), "--set", f"release={release}", "--wait", "--timeout", "1", *args
    )

    assert proc.returncode == 124, proc.stderr
    assert proc.stdout == ""
    last = proc.stderr.splitlines()[-1]
    match = re.fullmatch(
        r"error: execution ([0-9a-f]{32}) did not end within --timeout 1s; it goes on .*", last
    )
    assert match, proc.stderr
    assert f"noetl-stream cancel {match[1]}" in last
    release.touch()  # it went on: it ends once let go
    summary = await follow(runtime.nc, runtime.topology, match[1], timeout=30)
    assert (summary.status, summary.result) == ("success", "released")

    usage = await asyncio.to_thread(noetl, "submit", str(path), "--timeout", "1", *args)
    assert usage.returncode == 2 and "--wait" in usage.stderr


async def test_retry_wait_timeout_exits_124_and_leaves_the_new_execution_running(
    nats_server: EmbeddedNats, runtime: Runtime, tmp_path: Path
) -> None:
    path = _write(tmp_path, "flaky_gated", FLAKY_GATED)
    broken, release = tmp_path / "broken", tmp_path / "release"
    broken.touch()
    args = ["--nats", nats_server.url, "--prefix", runtime.topology.prefix]
    sets = ["--set", f"broken={broken}", "--set", f"release={release}"]
    first = await asyncio.to_thread(noetl, "submit", str(path), *sets, "--wait", "--json", *args)
    assert first.returncode == 1, first.stderr
    failed_id = json.loads(first.stdout)["execution_id"]
    broken.unlink()  # the retry's run of the step waits for its release

    proc = await asyncio.to_thread(noetl, "retry", failed_id, "--wait", "--timeout", "1", *args)

    assert proc.returncode == 124, proc.stderr
    last = proc.stderr.splitlines()[-1]
    match = re.fullmatch(
        r"error: execution ([0-9a-f]{32}) did not end within --timeout 1s; it goes on .*", last
    )
    assert match and match[1] != failed_id, proc.stderr
    release.touch()
    summary = await follow(runtime.nc, runtime.topology, match[1], timeout=30)
    assert (summary.status, summary.result) == ("success", "released")
    usage = await asyncio.to_thread(noetl, "retry", failed_id, "--timeout", "1", *args)
    assert usage.returncode == 2 and "--wait" in usage.stderr


def test_payload_keys_the_workload_does_not_declare_are_warned_about(tmp_path: Path) -> None:
    path = _write(tmp_path, "hello", HELLO)

    proc = noetl("run", str(path), "--json", "--payload", '{"who": "you", "whom": 1}', "--set", "extra=2")

    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["result"] == "hello you"  # it ran, with what was given
    assert proc.stderr.splitlines() == [
        f"warning: {path}: the payload has keys its workload does not declare: 'whom', 'extra' "
        "(declared: who); passed on as given"
    ]
    quiet = noetl("run", str(path), "--json", "--set", "who=all")
    assert quiet.returncode == 0 and quiet.stderr == ""


async def test_submit_warns_about_undeclared_payload_keys_too(
    nats_server: EmbeddedNats, runtime: Runtime, tmp_path: Path
) -> None:
    path = _write(tmp_path, "hello", HELLO)
    args = ["--nats", nats_server.url, "--prefix", runtime.topology.prefix]

    proc = await asyncio.to_thread(noetl, "submit", str(path), "--set", "hwo=x", "--wait", "--json", *args)

    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["result"] == "hello world"
    assert (
        f"warning: {path}: the payload has a key its workload does not declare: 'hwo' (declared: who); "
        "passed on as given"
    ) in proc.stderr.splitlines()


# The console script's entry, as the installed script runs it, after a line that says it was reached (the
# interpreter's own start, before it, is no code of ours: a Ctrl-C there is Python's).
CONSOLE = (
    "import sys; from noetl_stream.console import entry; print('reached', flush=True); "
    "sys.argv = ['noetl-stream', 'run', sys.argv[1]]; entry()"
)


@pytest.mark.parametrize("after_s", [0.0, 0.05, 0.15])
def test_ctrl_c_while_the_command_line_starts_is_exit_130_and_one_line(
    tmp_path: Path, after_s: float
) -> None:
    """A Ctrl-C in the first fraction of a second, while the command line imports what it runs, is the
    same one line and exit 130 (not a traceback of the module being imported)."""
    path = _write(tmp_path, "blocked", BLOCKED)  # (it cannot end before the signal)
    env = {k: v for k, v in os.environ.items() if k != "NOETL_NATS_URL"}
    proc = subprocess.Popen(
        [sys.executable, "-c", CONSOLE, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "reached\n"
        time.sleep(after_s)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert err.splitlines()[-1].startswith("interrupted"), err
