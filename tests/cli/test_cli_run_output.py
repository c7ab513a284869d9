"""``noetl-stream run`` prints the outcome as soon as the execution ends, then shuts its runtime down.

A child playbook whose task is abandoned after ``child_timeout_s`` leaves that task running on the
worker: shutting the runtime down waits for it (up to a grace), then cancels it (the worker's
``puller.stop_timeout`` warning on stderr). The outcome must not wait for that: the complete JSON is
on stdout before the warning is written to stderr. Both pipes are read as the process writes them,
so what stdout holds when the warning arrives is what was written before it (no clock involved).
The run still exits cleanly: exit 0, no traceback, its embedded nats-server (and the server's guard)
gone, the server's directory removed.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

from helpers import playbook
from test_cli_interrupt import _children, _ended
from test_cli_run import JSON_KEYS, ROOT, cli

from noetl_stream.runtime.local import ABANDONED_GRACE_S, GRACE_S, Runtime, _worker_grace

SAFETY_TIMEOUT_S = 120  # only against a hang: nothing below is timed

CHILD = playbook(
    """
    - step: start
      tool:
        kind: python
        args: {marker: "{{ workload.marker }}"}
        code: |
          import time
          open(marker, "w").close()
          while True:  # abandoned by the parent: runs until the worker's shutdown interrupts it
              time.sleep(0.02)
    """,
    workload={"marker": ""},
    name="child",
)

PARENT = playbook(
    """
    - step: start
      next:
        spec: {mode: inclusive}
        arcs: [{step: abandon}, {step: gate}]
    - step: abandon
      tool:
        kind: playbook
        path: child.yaml
        return_step: start
        args: {marker: "{{ workload.marker }}"}
        spec: {child_timeout_s: 0.2}
      next:
        arcs: [{step: handled, when: "{{ event.name == 'step.failed' }}", args: {kind: "{{ event.error.kind }}"}}]
    - step: handled
      tool: {kind: noop, result: "{{ args.kind }}"}
    - step: gate
      tool:
        kind: python
        args: {release: "{{ workload.release }}"}
        code: |
          import os, time
          while not os.path.exists(release):  # the test releases it once it has seen the child run
              time.sleep(0.02)
          result = "released"
    """,
    workload={"marker": "", "release": ""},
    name="parent",
)


def _read_available(fd: int) -> bytes:
    """Everything the pipe holds now, without waiting for more."""
    data = b""
    while select.select([fd], [], [], 0)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return data


def test_run_prints_the_outcome_before_shutting_down_an_abandoned_task(tmp_path: Path) -> None:
    (tmp_path / "child.yaml").write_text(CHILD)
    parent = tmp_path / "parent.yaml"
    parent.write_text(PARENT)
    marker, release = tmp_path / "child-running", tmp_path / "release"
    env = {k: v for k, v in os.environ.items() if k != "NOETL_NATS_URL"}
    (tmp_path / "tmp").mkdir()
    env["TMPDIR"] = str(tmp_path / "tmp")  # where the embedded server makes its directory
    proc = subprocess.Popen(
        [cli(), "run", "--json", str(parent), "--set", f"marker={marker}", "--set", f"release={release}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
        out = err = b""
        out_at_stop: bytes | None = None
        server: list[int] = []
        open_fds = {out_fd, err_fd}
        while open_fds:
            if not server and marker.exists():
                # The child's task runs and the execution cannot end before the release: the embedded
                # nats-server (and its guard) are up now.
                server = _children(proc.pid)
                release.touch()
            ready, _, _ = select.select(list(open_fds), [], [], 0.05)
            for fd in ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    open_fds.discard(fd)
                elif fd == out_fd:
                    out += chunk
                else:
                    before = err.count(b"\n")
                    err += chunk
                    new_lines = err.split(b"\n")[before:]
                    if out_at_stop is None and any(b"puller.stop_timeout" in ln for ln in new_lines):
                        out += _read_available(out_fd)  # written before the warning, if it was
                        out_at_stop = out
        code = proc.wait(timeout=SAFETY_TIMEOUT_S)
        stderr = err.decode(errors="replace")

        assert code == 0, stderr
        assert "Traceback" not in stderr, stderr
        assert out_at_stop is not None, f"the abandoned task was not cut short at shutdown:\n{stderr}"
        lines = out_at_stop.decode().splitlines()
        assert len(lines) == 1 and out_at_stop.endswith(b"\n"), (
            f"stdout when the shutdown cancelled the abandoned task: {out_at_stop!r}"
        )
        summary = json.loads(lines[0])
        assert set(summary) == JSON_KEYS
        assert summary["status"] == "success"
        assert summary["steps"]["abandon"]["status"] == "failed"
        assert summary["steps"]["handled"]["status"] == "done"
        assert summary["steps"]["gate"]["status"] == "done"
        assert out == out_at_stop  # nothing printed after it

        assert len(server) >= 2, server  # the embedded nats-server and its guard
        assert _ended(server, 30), "the embedded nats-server or its guard outlived the run"
        assert list((tmp_path / "tmp").iterdir()) == [], "the embedded server's directory was left"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_only_a_worker_left_with_abandoned_commands_shuts_down_without_the_full_grace(
    runtime: Runtime, tmp_path: Path, eventually: Callable[..., Awaitable[None]]
) -> None:
    """While a command of a running execution is in flight, the worker keeps the full grace (its work
    finishes or is handed back); once every command left belongs to an execution that ended (the child
    cancelled at its ``child_timeout_s``), nothing waits for them."""
    (tmp_path / "child.yaml").write_text(CHILD)
    parent = tmp_path / "parent.yaml"
    parent.write_text(PARENT)
    marker, release = tmp_path / "child-running", tmp_path / "release"
    (worker,) = runtime.workers
    run = asyncio.create_task(
        runtime.run_playbook(
            PARENT, str(parent), {"marker": str(marker), "release": str(release)}, timeout=60
        )
    )
    try:
        await eventually(marker.exists)
        # The child's task and the parent's gate run: both executions are running.
        assert _worker_grace(worker, GRACE_S) == GRACE_S
        release.touch()
        summary = await run
        assert summary.status == "success", summary.error
        assert summary.steps["abandon"].status == "failed"
        # The child's task still runs, its execution cancelled: the only command left is abandoned.
        await eventually(lambda: _worker_grace(worker, GRACE_S) == ABANDONED_GRACE_S)
        assert len(worker.running_executions()) == 1
    finally:
        release.touch()
        if not run.done():
            run.cancel()
