"""Real ``noetl-stream`` controller and worker processes for the bench, and their memory.

`Deployment` is one installation (its own prefix) on a running server: ``noetl-stream provision``, then
controllers (``noetl-stream controller --controller-id X``) and workers (``noetl-stream worker``, with
``--processes N`` a supervisor of N worker processes), each the installed script in its own session with
its output in a log file, exactly as they run in production. The bench process itself is only a client:
it submits executions and waits for their ``playbook.processed``.

`rss()` reads ``VmRSS`` (now) and ``VmHWM`` (peak since start) from ``/proc/<pid>/status``, `cpu_s()` the
CPU time from ``/proc/<pid>/stat``; for a supervisor both sum its worker children. Only processes started here are ever signalled, by PID; `close()`
stops them (SIGTERM, SIGKILL after a grace period) and deletes the installation's streams and buckets,
and the processes' logs unless one of them died (then the error names the directory).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

import msgspec
from nats.aio.client import Client as NATS
from nats.js.errors import NoKeysError

from noetl_stream.jetstream.connection import connect
from noetl_stream.protocol.subjects import Topology

__all__ = ["Deployment", "Memory", "Proc", "cpu_s", "rss"]

NOETL_STREAM = Path(sys.executable).parent / "noetl-stream"


@dataclass(frozen=True)
class Memory:
    """Resident memory of a process (or a supervisor's children), in MiB."""

    rss_mb: float
    hwm_mb: float


def _status_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def children(pid: int) -> list[int]:
    """Live child processes of `pid` (from /proc/<child>/stat)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[1]) == pid:
            out.append(int(entry.name))
    return out


def rss(pid: int, *, of_children: bool = False) -> Memory:
    """VmRSS and VmHWM of `pid`, or summed over its children (a worker supervisor's processes)."""
    pids = children(pid) if of_children else [pid]
    return Memory(
        rss_mb=sum(_status_kb(p, "VmRSS") for p in pids) / 1024,
        hwm_mb=sum(_status_kb(p, "VmHWM") for p in pids) / 1024,
    )


def cpu_s(pid: int, *, system_only: bool = False) -> float:
    """User + system (or only system: the kernel's share, socket I/O) CPU seconds of a live process
    (``/proc/<pid>/stat``); 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[12]) if system_only else int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


class Proc:
    """One ``noetl-stream controller|worker`` child process."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path, supervisor: bool):
        self.name, self.argv, self.supervisor = name, argv, supervisor
        with open(log_path, "ab") as log:
            self.popen = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def memory(self) -> Memory:
        """This process's memory; for a supervisor, the sum over its worker processes."""
        return rss(self.pid, of_children=self.supervisor)

    def worker_pids(self) -> list[int]:
        return children(self.pid) if self.supervisor else [self.pid]

    def cpu_s(self) -> float:
        """CPU seconds used so far (for a supervisor: by its worker processes)."""
        return sum(cpu_s(p) for p in self.worker_pids())

    def stop(self, timeout: float = 10.0) -> None:
        if not self.alive:
            return
        os.kill(self.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.pid, signal.SIGKILL)
            self.popen.wait()

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return f"== {self.name} ==\n" + "\n".join(text.splitlines()[-lines:])


class Deployment:
    """One installation (a fresh prefix) with its controller and worker processes, and a client connection."""

    def __init__(
        self, url: str, *, partitions: int = 1, lease_ttl_s: float = 4.0, log_dir: Path | None = None
    ):
        self.url = url
        self.topology = Topology(
            prefix=f"b{uuid.uuid4().hex[:8]}", partitions=partitions, lease_ttl_s=lease_ttl_s
        )
        self._owns_log_dir = log_dir is None
        self.log_dir = log_dir or Path(tempfile.mkdtemp(prefix="noetl-bench-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.failed = False
        """A process exited on its own: its log directory is kept (and named in the error)."""
        self.env = {
            **os.environ,
            "NOETL_NATS_URL": url,
            "NOETL_PREFIX": self.topology.prefix,
            "NOETL_PARTITIONS": str(partitions),
            "NOETL_LEASE_TTL_S": repr(lease_ttl_s),
        }
        self.procs: list[Proc] = []
        self.nc: NATS | None = None

    async def start(self) -> Self:
        code = await asyncio.to_thread(
            subprocess.run,
            [str(NOETL_STREAM), "provision", "--partitions", str(self.topology.partitions)],
            env=self.env,
            capture_output=True,
            timeout=60,
        )
        if code.returncode != 0:
            raise RuntimeError(f"noetl-stream provision failed: {code.stderr.decode(errors='replace')}")
        self.nc = await connect(self.url, name="bench-client", connect_wait_s=10.0)
        return self

    def _spawn(self, name: str, args: list[str], supervisor: bool = False) -> Proc:
        argv = [str(NOETL_STREAM), *args, "--log-level", "warning"]
        proc = Proc(name, argv, self.env, self.log_dir / f"{self.topology.prefix}-{name}.log", supervisor)
        self.procs.append(proc)
        return proc

    def controller(self, controller_id: str = "ctl-1") -> Proc:
        return self._spawn(controller_id, ["controller", "--controller-id", controller_id, "--grace", "5"])

    def worker(self, name: str = "wrk", *, processes: int = 1, concurrency: int = 128) -> Proc:
        args = ["worker", "--name", name, "--concurrency", str(concurrency), "--grace", "5"]
        if processes > 1:
            args += ["--processes", str(processes)]
        return self._spawn(name, args, supervisor=processes > 1)

    @property
    def controllers(self) -> list[Proc]:
        return [p for p in self.procs if p.argv[1] == "controller"]

    @property
    def workers(self) -> list[Proc]:
        return [p for p in self.procs if p.argv[1] == "worker"]

    def check_alive(self) -> None:
        dead = [p for p in self.procs if not p.alive]
        if dead:
            self.failed = True
            tails = "\n".join(p.log_tail() for p in dead)
            raise RuntimeError(f"process exited (logs kept in {self.log_dir}):\n{tails}")

    async def lease_owners(self) -> dict[int, str]:
        """``partition.<n>`` -> owning controller id, from the leases bucket."""
        assert self.nc is not None
        kv = await self.nc.jetstream().key_value(self.topology.leases_bucket)
        try:
            keys = await kv.keys()
        except NoKeysError:
            return {}
        owners = {}
        for key in keys:
            kind, _, n = key.partition(".")
            if kind == "partition":
                with contextlib.suppress(Exception):
                    entry = await kv.get(key)
                    if entry.value:
                        owners[int(n)] = msgspec.json.decode(entry.value)["owner"]
        return owners

    async def wait_leases(self, timeout: float = 60.0, stable_s: float = 2.0) -> dict[int, str]:
        """Wait until every partition is held, every controller holds its fair share, and that has not
        changed for `stable_s` (leases move only at lease ticks, every ttl/4)."""
        ids = {p.name for p in self.controllers}
        share = math.ceil(self.topology.partitions / max(1, len(ids)))
        deadline = time.monotonic() + timeout
        last: dict[int, str] | None = None
        since = time.monotonic()
        while True:
            self.check_alive()
            owners = await self.lease_owners()
            counts = {c: sum(1 for o in owners.values() if o == c) for c in ids}
            settled = (
                len(owners) == self.topology.partitions
                and set(owners.values()) == ids
                and all(n <= share for n in counts.values())
            )
            if owners != last:
                last, since = owners, time.monotonic()
            elif settled and time.monotonic() - since >= stable_s:
                return owners
            if time.monotonic() > deadline:
                raise TimeoutError(f"leases did not settle: {owners} (controllers {sorted(ids)})")
            await asyncio.sleep(0.2)

    async def close(self) -> None:
        for proc in self.procs:
            if proc.alive:
                os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15.0
        for proc in self.procs:
            try:
                await asyncio.to_thread(proc.popen.wait, max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.popen.wait()
        if self.nc is not None:
            await self._delete_everything()
            await self.nc.close()
            self.nc = None
        if self._owns_log_dir and not self.failed:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    async def _delete_everything(self) -> None:
        """Streams, KV buckets and the object store of this prefix (the 100k runs write hundreds of MB)."""
        assert self.nc is not None
        js = self.nc.jetstream()
        t = self.topology
        names = [t.events_stream, t.commands_stream, t.requests_stream]
        names += [f"KV_{b}" for b in t.kv_buckets] + [f"OBJ_{t.results_store}"]
        with contextlib.suppress(Exception):
            for info in await js.streams_info():
                if info.config.name.startswith(t.prefix.upper() + "_"):
                    names.append(info.config.name)
        for name in dict.fromkeys(names):
            with contextlib.suppress(Exception):
                await js.delete_stream(name)

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
