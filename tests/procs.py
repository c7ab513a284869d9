"""Real ``noetl-stream`` controller and worker processes for fault tests.

Each process is the installed ``noetl-stream`` script (next to ``sys.executable``) in its own session,
with its output in a log file. Only processes started here are ever signalled, by PID: ``kill()`` is
SIGKILL (a crash), ``stop()`` is SIGTERM with a grace period. JetStream settings the CLI reads from
the environment (``NOETL_COMMAND_ACK_WAIT_S``, ``NOETL_COMMAND_MAX_DELIVER``) come from the test's
`Topology`, so every process of a test provisions the same consumer configuration.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import TracebackType
from typing import Self

from nats.js import JetStreamContext

from noetl_stream.kv.provision import provision
from noetl_stream.protocol.subjects import Topology

NOETL_STREAM = Path(sys.executable).parent / "noetl-stream"


def topology_env(topology: Topology) -> dict[str, str]:
    """The ``NOETL_*`` variables that make a CLI process use `topology`'s JetStream settings."""
    return {
        "NOETL_PREFIX": topology.prefix,
        "NOETL_COMMAND_ACK_WAIT_S": repr(topology.command_ack_wait_s),
        "NOETL_COMMAND_MAX_DELIVER": str(topology.command_max_deliver),
        "NOETL_STORAGE": topology.storage,
        "NOETL_REPLICAS": str(topology.replicas),
        "NOETL_PARTITIONS": str(topology.partitions),
        "NOETL_LEASE_TTL_S": repr(topology.lease_ttl_s),
    }


class NoetlProcess:
    """One ``noetl-stream controller|worker`` child process (restartable with the same arguments)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self.popen: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} was never started"
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self) -> Self:
        assert not self.alive, f"{self.name} is already running"
        with open(self.log_path, "ab") as log:
            log.write(f"--- start #{self.starts + 1}: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )
        self.starts += 1
        return self

    def kill(self) -> None:
        """SIGKILL this process (by its PID) and reap it."""
        if self.alive:
            assert self.popen is not None
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited after `timeout`."""
        if not self.alive:
            return
        assert self.popen is not None
        os.kill(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def restart(self) -> Self:
        self.kill()
        return self.start()

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return f"== {self.name} ({self.log_path}) ==\n" + "\n".join(text.splitlines()[-lines:])


class Processes:
    """The controller and worker processes of one test; everything still running is stopped at exit."""

    def __init__(self, nats_url: str, topology: Topology, log_dir: Path) -> None:
        self.nats_url = nats_url
        self.topology = topology
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        self.all: list[NoetlProcess] = []
        self.env = {**os.environ, **topology_env(topology), "NOETL_NATS_URL": nats_url}

    def _spawn(self, name: str, args: list[str]) -> NoetlProcess:
        argv = [str(NOETL_STREAM), *args, "--nats", self.nats_url, "--prefix", self.topology.prefix]
        proc = NoetlProcess(name, argv, self.env, self.log_dir)
        self.all.append(proc)
        return proc.start()

    def controller(
        self, name: str = "controller", *, grace: float = 5.0, extra: tuple[str, ...] = ()
    ) -> NoetlProcess:
        """A controller whose id is `name` (a restart is the same controller, and takes its leases back);
        `extra`: more of its options (``--http``, ...)."""
        args = ["controller", "--grace", str(grace), "--log-level", "info", "--controller-id", name, *extra]
        return self._spawn(name, args)

    def worker(
        self,
        name: str,
        *,
        concurrency: int = 4,
        pool: str = "default",
        grace: float = 5.0,
        processes: int = 1,
        task_events: str | None = None,
        metrics: str | None = None,
    ) -> NoetlProcess:
        """A worker; with `processes` > 1 a supervisor of that many (named ``<name>-1``, ...); with
        `metrics` (``HOST:PORT``) serving its ``/metrics`` there."""
        args = ["worker", "--pool", pool, "--concurrency", str(concurrency), "--name", name]
        if task_events is not None:
            args += ["--task-events", task_events]
        if metrics is not None:
            args += ["--metrics", metrics]
        if processes > 1:
            args += ["--processes", str(processes)]
        return self._spawn(name, [*args, "--grace", str(grace), "--log-level", "info"])

    @property
    def workers(self) -> list[NoetlProcess]:
        return [p for p in self.all if p.argv[1] == "worker"]

    def logs(self, lines: int = 40) -> str:
        """The last lines of every process log, to attach to an assertion message."""
        return "\n".join(p.log_tail(lines) for p in self.all)

    def close(self) -> None:
        for proc in self.all:
            if proc.alive:
                assert proc.popen is not None
                os.kill(proc.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        for proc in self.all:
            if proc.popen is None:
                continue
            try:
                proc.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


async def run_cli(env: dict[str, str], *args: str, timeout: float = 60.0) -> tuple[int, str, str]:
    """Run ``noetl-stream ARGS`` to completion: (exit code, stdout, stderr). Killed (by PID) on timeout."""
    proc = await asyncio.create_subprocess_exec(
        str(NOETL_STREAM),
        *args,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate()
    except TimeoutError:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()
        raise TimeoutError(f"noetl-stream {' '.join(args)} did not finish within {timeout}s") from None
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


async def replay_verify(env: dict[str, str], ids: list[str]) -> None:
    """``noetl-stream replay ID --verify`` exits 0 for each of `ids` (the processes run at once)."""
    results = await asyncio.gather(*(run_cli(env, "replay", eid, "--verify", timeout=30) for eid in ids))
    for eid, (code, out, err) in zip(ids, results, strict=True):
        assert code == 0, f"replay --verify {eid}: exit {code}\n{out}{err}"
        assert "replay matches the live projection" in out


@contextlib.asynccontextmanager
async def provisioned(
    url: str, js: JetStreamContext, topology: Topology, logs: Path
) -> AsyncIterator[Processes]:
    """A test's controller and worker processes on `topology`, provisioned first (so no two processes
    race to create); their logs are printed at the end (pytest shows them when the test failed)."""
    await provision(js, topology, ("default",))
    with Processes(url, topology, logs) as p:
        yield p
        print(p.logs(60))
