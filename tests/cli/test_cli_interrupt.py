"""A ``noetl-stream run`` whose python task is blocked in C (``time.sleep``: its thread cannot be
interrupted) ends when it is told to, not when the task's code returns: on Ctrl-C (exit 130) and when
the task times out (exit 1). Before, the interpreter joined the task's thread at exit: a Ctrl-C'd run
took as long as the sleep. Its embedded nats-server and the server's guard end with it, and the
server's temporary directory is removed (an exit that skipped the finalizers left it)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
from pathlib import Path

from helpers import playbook
from test_cli_run import ROOT, cli

SLEEP_S = 600  # far longer than any wait below: a run that waited for it would hit the test's timeout

SLEEPER = playbook(
    f"""
    - step: start
      tool:
        - name: nap
          kind: python
          spec: {{timeout: TIMEOUT}}
          code: |
            import time
            time.sleep({SLEEP_S})
            result = 1
    """
)


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rfind(")") + 2 :].split()[1]) == pid:
                found.append(int(entry))
    return found


def _start(tmp_path: Path, timeout_s: int) -> subprocess.Popen[str]:
    path = tmp_path / "sleeper.yaml"
    path.write_text(SLEEPER.replace("TIMEOUT", str(timeout_s)))
    env = {k: v for k, v in os.environ.items() if k != "NOETL_NATS_URL"}
    (tmp_path / "tmp").mkdir()
    env["TMPDIR"] = str(tmp_path / "tmp")  # where the embedded server makes its directory
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


def _ended(pids: list[int], timeout: float) -> bool:
    handles = []
    for pid in pids:
        try:
            handles.append(os.pidfd_open(pid))
        except ProcessLookupError:
            continue
    try:
        return all(select.select([h], [], [], timeout)[0] for h in handles)
    finally:
        for h in handles:
            os.close(h)


def test_ctrl_c_ends_a_run_whose_python_task_is_blocked(tmp_path: Path) -> None:
    proc = _start(tmp_path, SLEEP_S * 2)
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:  # the progress lines: the task is running once its step started
            seen.append(line)
            if "start started" in line:
                break
        else:
            raise AssertionError("".join(seen))
        children = _children(proc.pid)  # the embedded nats-server and its guard
        assert len(children) >= 2, children
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
        assert _ended(children, 30), "the embedded nats-server or its guard outlived the run"
        assert list((tmp_path / "tmp").iterdir()) == [], "the embedded server's directory was left"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_run_whose_python_task_timed_out_exits_without_waiting_for_its_thread(tmp_path: Path) -> None:
    proc = _start(tmp_path, 1)
    try:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 1, out + err
        assert "timeout" in (out + err).lower()
        assert list((tmp_path / "tmp").iterdir()) == [], "the embedded server's directory was left"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
