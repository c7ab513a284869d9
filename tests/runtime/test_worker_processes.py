"""``noetl-stream worker --processes N``: one supervisor, N worker processes on one durable consumer.

Real processes throughout (tests/procs.py): the supervisor is the ``noetl-stream`` script, its children
are ``python -m noetl_stream worker``. Children are found through ``/proc`` (their parent PID is the
supervisor's); the only processes signalled are the ones this test started, or their children, by PID.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from eventlog import read_named, wait_processed
from helpers import playbook
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from procs import NoetlProcess, Processes

from noetl_stream.client.submit import request_for, submit
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.provision import provision
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.supervisor import Supervisor

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# Appends the PID of the worker process running it, then holds its slot briefly.
SHORT = playbook(
    r"""
    - step: start
      tool:
        - name: short
          kind: python
          args: {path: "{{ workload.path }}"}
          code: |
            import os, time
            def main(path):
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, f"{os.getpid()}\n".encode())
                finally:
                    os.close(fd)
                time.sleep(0.2)
                return os.getpid()
    """,
    name="short",
)


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state, ppid, ...), None if there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def children(parent: int) -> set[int]:
    """Live processes whose parent is `parent`."""
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and fields[0] != "Z" and int(fields[1]) == parent:
                out.add(int(entry.name))
    return out


def pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


async def until(
    check: Callable[[], object], timeout: float, what: str, procs: Processes | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        ok = check()
        if not isinstance(ok, bool):
            ok = await ok  # type: ignore[misc]
        if ok:
            return
        if time.monotonic() > deadline:
            logs = f"\n{procs.logs(80)}" if procs is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{logs}")
        await asyncio.sleep(0.05)


@pytest.fixture
async def procs(
    nats_server: EmbeddedNats, js: JetStreamContext, topology: Topology, tmp_path: Path
) -> AsyncIterator[Processes]:
    await provision(js, topology, ("default",))
    with Processes(nats_server.url, topology, tmp_path / "logs") as p:
        yield p
        print(p.logs(80))  # shown when the test failed


async def _pulling(js: JetStreamContext, topology: Topology, n: int) -> bool:
    """`n` workers have a pull request waiting on the pool's consumer."""
    info = await js.consumer_info(topology.commands_stream, topology.pool_consumer("default"))
    return (info.num_waiting or 0) >= n


def _starts(supervisor: NoetlProcess) -> int:
    """Worker processes that started under `supervisor` so far (their logs go to its log)."""
    return supervisor.log_path.read_text().count('"worker.started"')


async def _run_batch(nc: NATS, js: JetStreamContext, topology: Topology, runs: Path, n: int) -> list[str]:
    ids = [
        await submit(nc, topology, request_for(SHORT, "short.yaml", {"path": str(runs)})) for _ in range(n)
    ]
    await wait_processed(js, topology, ids, timeout=60)
    return ids


async def test_processes_share_the_pool_a_dead_child_is_replaced_and_sigterm_stops_them_all(
    procs: Processes, topology: Topology, js: JetStreamContext, nc: NATS, tmp_path: Path
) -> None:
    runs = tmp_path / "runs.txt"
    procs.controller()
    supervisor = procs.worker("sw", concurrency=2, processes=3, grace=5, task_events="informative")
    await until(lambda: len(children(supervisor.pid)) == 3, 30, "three worker processes", procs)
    await until(lambda: _starts(supervisor) == 3, 30, "three workers started", procs)
    # The supervisor passes its settings on: every child runs with --task-events informative.
    assert supervisor.log_path.read_text().count('"task_events": "informative"') == 3
    await until(lambda: _pulling(js, topology, 3), 30, "three workers pulling", procs)
    first = children(supervisor.pid)

    # Many short tasks, one durable consumer: every process takes a share.
    ids = await _run_batch(nc, js, topology, runs, 30)
    assert set(pids(runs)) == first, f"tasks ran in {set(pids(runs))}, workers are {first}"
    done = [ev for _, ev in await read_named(js, topology, E.STEP_DONE) if ev.execution_id in ids]
    assert len(done) == 30
    assert {ev.worker for ev in done} == {"sw-1", "sw-2", "sw-3"}
    # One python task, no output: with informative task events, its step events are all it writes.
    tasks = [ev for _, ev in await read_named(js, topology, E.TASK_STARTED) if ev.execution_id in ids]
    assert tasks == []
    starts = [ev for _, ev in await read_named(js, topology, E.STEP_STARTED) if ev.execution_id in ids]
    assert len(starts) == 30  # (read where they are: a short step's inside its step.done)

    # A child that dies is started again, and the pool keeps working with three processes.
    victim = sorted(first)[0]
    os.kill(victim, signal.SIGKILL)
    await until(lambda: not alive(victim), 10, "the killed worker to be reaped", procs)
    await until(
        lambda: len(children(supervisor.pid)) == 3, 30, "the supervisor to replace the dead worker", procs
    )
    second = children(supervisor.pid)
    (replacement,) = second - first
    assert victim not in second
    # A stale pull request of the dead worker may still count as waiting: wait for the new one's start.
    await until(lambda: _starts(supervisor) == 4, 30, "the replacement to start", procs)
    await until(lambda: _pulling(js, topology, 3), 30, "the replacement to pull", procs)
    runs.unlink()
    await _run_batch(nc, js, topology, runs, 30)
    assert replacement in pids(runs)
    assert set(pids(runs)) <= second

    # SIGTERM to the supervisor: every child shuts down gracefully (exit 0), nothing is left behind.
    code = await sigterm(supervisor, timeout=30)
    assert code == 0, procs.logs()
    assert not any(alive(pid) for pid in first | second), "a worker process outlived its supervisor"
    log = supervisor.log_path.read_text()
    assert log.count('"worker.stopping"') >= 3, log[-3000:]
    stopped = [line for line in log.splitlines() if "supervisor.child_stopped" in line]
    assert len(stopped) == 3 and all('"code": 0' in line for line in stopped), stopped
    (died,) = [line for line in log.splitlines() if "supervisor.child_died" in line]
    assert f'"pid": {victim}' in died and '"code": -9' in died, died
    info = await js.consumer_info(topology.commands_stream, topology.pool_consumer("default"))
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def sigterm(proc: NoetlProcess, timeout: float) -> int:
    """SIGTERM (by PID) and the exit code."""
    assert proc.popen is not None and proc.alive
    os.kill(proc.pid, signal.SIGTERM)
    return await asyncio.to_thread(proc.popen.wait, timeout)


# --- the supervisor alone, with stand-in children -------------------------------------------------

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


async def test_a_child_with_invalid_configuration_stops_everything_with_exit_2() -> None:
    invalid = [sys.executable, "-c", "import sys; sys.exit(2)"]
    supervisor = Supervisor([SLEEPER, invalid], grace_s=5, backoff_base_s=0.05)
    started = time.monotonic()
    code = await asyncio.wait_for(supervisor.run(), 20)
    assert code == 2
    assert supervisor.restarts == 0 and supervisor.pids == {}
    assert time.monotonic() - started < 10, "the sleeper was not stopped by SIGTERM"


async def test_a_crashing_child_is_restarted_with_backoff_until_shutdown() -> None:
    crash = [sys.executable, "-c", "import sys; sys.exit(1)"]
    supervisor = Supervisor([crash], grace_s=1, backoff_base_s=0.05, backoff_max_s=0.2)
    task = asyncio.create_task(supervisor.run())
    await until(lambda: supervisor.restarts >= 4, 20, "four restarts")
    supervisor.shutdown()
    assert await asyncio.wait_for(task, 10) == 0


def test_children_do_not_outlive_a_killed_supervisor(tmp_path: Path) -> None:
    pid_file, child, parent_py = tmp_path / "pids", tmp_path / "child.py", tmp_path / "supervisor.py"
    child.write_text(
        "import os, sys, time\n"
        "with open(sys.argv[1], 'a') as f:\n"
        "    f.write(f'{os.getpid()}\\n')\n"
        "time.sleep(60)\n"
    )
    parent_py.write_text(
        "import asyncio, sys\n"
        "from noetl_stream.runtime.supervisor import Supervisor\n"
        "cmd = [sys.executable, sys.argv[1], sys.argv[2]]\n"
        "asyncio.run(Supervisor([cmd, cmd]).run())\n"
    )
    parent = subprocess.Popen(
        [sys.executable, str(parent_py), str(child), str(pid_file)], start_new_session=True
    )
    try:
        deadline = time.monotonic() + 20
        while len(pids(pid_file)) < 2:
            assert time.monotonic() < deadline, "the children did not start"
            assert parent.poll() is None, "the supervisor exited"
            time.sleep(0.05)
    finally:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids(pid_file)):
        assert time.monotonic() < deadline, "children of a SIGKILLed supervisor are still running"
        time.sleep(0.05)
