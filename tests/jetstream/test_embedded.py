"""The embedded nats-server starts, stops, restarts on the same port and keeps file-stored data."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import select
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from noetl_stream.jetstream.connection import connect
from noetl_stream.jetstream.embedded import EmbeddedNats, EmbeddedNatsError, find_nats_server
from noetl_stream.kv.provision import provision
from noetl_stream.protocol.subjects import Topology


def test_finds_the_wheel_binary() -> None:
    assert os.access(find_nats_server(), os.X_OK)


async def _publish_and_count(server: EmbeddedNats, topology: Topology, publish: int) -> int:
    nc = await connect(server.url, connect_wait_s=10)
    try:
        js = nc.jetstream(timeout=10)
        await provision(js, topology)
        for i in range(publish):
            await js.publish(topology.event_subject(f"e{i}", "step.done"), b"{}")
        return (await js.stream_info(topology.events_stream)).state.messages
    finally:
        await nc.close()


async def test_restart_keeps_port_and_file_data() -> None:
    topology = Topology(prefix="emb")
    async with EmbeddedNats() as server:
        url, first_pid = server.url, server.pid
        assert await _publish_and_count(server, topology, 3) == 3
        await asyncio.to_thread(server.restart)
        assert server.url == url and server.pid != first_pid
        assert await _publish_and_count(server, topology, 0) == 3


async def test_kill_then_start_recovers_file_data() -> None:
    topology = Topology(prefix="emb")
    async with EmbeddedNats() as server:
        assert await _publish_and_count(server, topology, 2) == 2
        server.kill()
        assert not server.running
        await asyncio.to_thread(server.start)
        assert await _publish_and_count(server, topology, 1) == 3


def test_stop_ends_the_process_and_close_removes_the_temp_dir() -> None:
    server = EmbeddedNats()
    server.start()
    pid = server.pid
    assert pid is not None and server.running
    server.stop()
    assert not server.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    directory = server.dir
    server.close()
    assert not directory.exists()


def test_a_forgotten_server_is_killed_and_its_temp_dir_removed() -> None:
    server = EmbeddedNats()
    server.start()
    pid, directory = server.pid, server.dir
    assert pid is not None
    del server
    gc.collect()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not directory.exists()


def test_closed_server_cannot_start_again() -> None:
    server = EmbeddedNats()
    server.close()
    with pytest.raises(EmbeddedNatsError, match="closed"):
        server.start()


def test_given_directory_is_kept(tmp_path: Path) -> None:
    with EmbeddedNats(tmp_path / "nats") as server:
        log = server.log_path.read_text()
        assert log.count("Server is ready") == 1 and "[WRN]" not in log and "[ERR]" not in log
    assert (tmp_path / "nats" / "store").is_dir()


def test_sync_interval_and_monitoring() -> None:
    with EmbeddedNats(monitor_port=0, sync_interval="always") as server:
        assert server.monitor_url is not None
        with urllib.request.urlopen(server.monitor_url + "/varz") as resp:
            varz = json.load(resp)
    assert varz["jetstream"]["config"]["sync_always"] is True


def test_extra_config_file_is_included(tmp_path: Path) -> None:
    extra = tmp_path / "extra.conf"
    extra.write_text("server_name: noetl-test-server\n")
    with EmbeddedNats(config_file=extra) as server:
        assert "noetl-test-server" in server.log_path.read_text()


def test_startup_failure_reports_the_log(tmp_path: Path) -> None:
    bad = tmp_path / "bad.conf"
    bad.write_text("this is { not valid\n")
    server = EmbeddedNats(config_file=bad)
    try:
        with pytest.raises(EmbeddedNatsError, match="exited"):
            server.start()
    finally:
        server.close()
    assert not server.running


# --- the guard: a server does not outlive an owner killed with SIGKILL ------------------------------

_OWNER = """
import sys, time
from noetl_stream.jetstream.embedded import EmbeddedNats
server = EmbeddedNats(sys.argv[1] if len(sys.argv) > 1 else None)
server.start()
print(server.pid, server._res.guard.pid, server.dir, flush=True)
time.sleep(120)
"""


def _gone(pidfd: int, timeout: float) -> bool:
    readable, _, _ = select.select([pidfd], [], [], timeout)
    return bool(readable)


@pytest.mark.parametrize("given_dir", [False, True], ids=["temp-dir", "given-dir"])
def test_a_server_whose_owner_is_killed_is_stopped_in_order(tmp_path: Path, given_dir: bool) -> None:
    """An owner killed with SIGKILL cannot stop its server; its guard sees the pipe close and stops
    it with SIGTERM (JetStream shuts down in order), then removes the directory only if it was a
    temporary one the owner would have removed."""
    args = [str(tmp_path / "nats")] if given_dir else []
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert owner.stdout is not None
        server_pid, guard_pid, directory = owner.stdout.readline().split()
        server_fd, guard_fd = os.pidfd_open(int(server_pid)), os.pidfd_open(int(guard_pid))
        assert not _gone(server_fd, 0.3), "the server must run while its owner does"
    finally:
        owner.kill()
        owner.wait()
    try:
        assert _gone(server_fd, 15), "the server outlived its owner"
        assert _gone(guard_fd, 5), "the guard outlived the server"
    finally:
        os.close(server_fd)
        os.close(guard_fd)
    if given_dir:
        log = (Path(directory) / "nats-server.log").read_text()
        assert "Initiating JetStream Shutdown" in log and "Server Exiting" in log
        assert (Path(directory) / "store").is_dir()
    else:
        assert not Path(directory).exists()


def test_stop_kill_and_close_leave_no_guard_behind() -> None:
    server = EmbeddedNats()
    server.start()
    guards = []
    for end in (server.kill, server.stop):
        guard = server._res.guard
        assert guard is not None and guard.poll() is None
        guards.append(guard)
        end()
        assert server._res.guard is None and guard.returncode == 0
        server.start()
    last = server._res.guard
    assert last is not None
    guards.append(last)
    server.close()
    assert all(g.returncode == 0 for g in guards)
    assert len({g.pid for g in guards}) == 3


def test_a_server_that_ended_on_its_own_gets_a_new_guard_on_start() -> None:
    with EmbeddedNats() as server:
        assert server.pid is not None and server._res.guard is not None
        old = server._res.guard
        os.kill(server.pid, signal.SIGKILL)  # our own child, by PID
        deadline = time.monotonic() + 10
        while server.running:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        server.start()
        assert old.returncode == 0 and server._res.guard is not old and server._res.guard.poll() is None


def test_without_pidfds_the_guard_checks_the_start_time_before_signalling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An old kernel or a seccomp filter refuses pidfd_open: the guard identifies the server by pid
    and start time, and a later process with that pid (another start time) is never signalled."""
    from noetl_stream.jetstream import _server_guard

    def refused(pid: int, flags: int = 0) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", refused)
    child = subprocess.Popen(["sleep", "30"])
    try:
        target = _server_guard._Target(child.pid)
        assert target.fd is None and target.started is not None and target.alive()
        impostor = _server_guard._Target(child.pid)
        impostor.started = str(int(target.started) + 1)  # the pid reused by a later process
        assert not impostor.alive()
        impostor.signal(signal.SIGTERM)
        assert child.poll() is None and not target.wait(0.1)
        target.signal(signal.SIGTERM)
        assert child.wait(5) == -signal.SIGTERM
        assert not target.alive() and target.wait(0)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()


def test_the_guard_exits_at_once_for_a_server_already_gone() -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    from noetl_stream.jetstream import _server_guard

    guard = subprocess.run(
        [sys.executable, "-I", "-S", _server_guard.__file__, str(child.pid)],
        stdin=subprocess.PIPE,
        timeout=10,
    )
    assert guard.returncode == 0


_FORKING_OWNER = """
import os, sys, time
from noetl_stream.jetstream.embedded import EmbeddedNats
server = EmbeddedNats()
server.start()
later = EmbeddedNats()  # made before the fork, not started
quick = os.fork()
if quick == 0:
    sys.exit(0)  # a forked child that exits through Python: its finalizers must not stop our server
os.waitpid(quick, 0)
assert later.dir.is_dir(), "a child's exit removed the directory of a server not started yet"
later.close()
sleeper = os.fork()
if sleeper == 0:
    time.sleep(60)  # a forked child that outlives its parent, with a copy of every descriptor
    os._exit(0)
print(server.pid, sleeper, server.running, server.dir.exists(), flush=True)
time.sleep(120)
"""


def test_forked_children_neither_stop_the_server_nor_keep_it_alive() -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", _FORKING_OWNER], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    sleeper_pid = None
    try:
        assert owner.stdout is not None
        server_pid, sleeper, running, dir_exists = owner.stdout.readline().split()
        sleeper_pid = int(sleeper)
        assert running == "True" and dir_exists == "True", "a child's exit stopped the parent's server"
        server_fd = os.pidfd_open(int(server_pid))
    finally:
        owner.kill()
        owner.wait()
    try:
        assert _gone(server_fd, 15), "a forked child's copy of the guard pipe kept the server alive"
    finally:
        os.close(server_fd)
        if sleeper_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(sleeper_pid, signal.SIGKILL)  # the owner's child, which this test started


def test_without_a_python_to_run_the_guard_the_server_still_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """An embedded interpreter has no `sys.executable`: the server runs unguarded, as before."""
    binary = find_nats_server()  # found next to the interpreter
    monkeypatch.setattr(sys, "executable", "")
    with EmbeddedNats(binary=binary) as server:
        assert server.running and server._res.guard is None


def _cmdline(pid: int) -> list[bytes]:
    """A process's arguments. Empty for a moment after it was started: `Popen` returns once the child's
    exec has replaced its memory (vfork), and the kernel writes the new arguments after that (seen on a
    loaded machine; a guard that ended has none either, and still fails)."""
    deadline = time.monotonic() + 10
    while True:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if argv != [b""] or time.monotonic() > deadline:
            return argv
        time.sleep(0.01)


def test_the_guard_holds_a_pidfd_opened_before_the_server_could_be_reaped() -> None:
    with EmbeddedNats() as server:
        guard = server._res.guard
        assert guard is not None
        argv = _cmdline(guard.pid)
        assert b"--pidfd" in argv and b"--remove" in argv


_FORK_AND_EXIT = """
import os, sys
from noetl_stream.jetstream.embedded import EmbeddedNats
with EmbeddedNats() as server:
    child = os.fork()
    if child == 0:
        sys.exit(0)  # the child's copies of the server's and the guard's Popen are collected here
    _, status = os.waitpid(child, 0)
    print(os.waitstatus_to_exitcode(status), server.running, flush=True)
"""


def test_a_forked_child_does_not_warn_about_the_parents_processes() -> None:
    """The child's copies of the parent's `Popen` objects are not its children: collecting them neither
    waits for them nor warns that they are "still running"."""
    done = subprocess.run(
        [sys.executable, "-W", "always::ResourceWarning", "-c", _FORK_AND_EXIT],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "True"]
    assert "still running" not in done.stderr, done.stderr


_OWNER_OF_A_CRASHED_SERVER = """
import os, signal, sys, time
from noetl_stream.jetstream.embedded import EmbeddedNats
server = EmbeddedNats()
server.start()
os.kill(server.pid, signal.SIGKILL)  # the server crashes; its owner does not notice before it dies too
server._res.proc.wait()
print(server._res.guard.pid, server.dir, flush=True)
time.sleep(120)
"""


def test_the_temp_dir_of_a_server_that_crashed_goes_when_its_owner_is_killed() -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER_OF_A_CRASHED_SERVER],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert owner.stdout is not None
        guard_pid, directory = owner.stdout.readline().split()
        guard_fd = os.pidfd_open(int(guard_pid))
        assert Path(directory).is_dir()
        assert not _gone(guard_fd, 0.3), "the guard waits for the owner, not for the server"
    finally:
        owner.kill()
        owner.wait()
    try:
        assert _gone(guard_fd, 10), "the guard outlived the owner"
    finally:
        os.close(guard_fd)
    assert not Path(directory).exists()
