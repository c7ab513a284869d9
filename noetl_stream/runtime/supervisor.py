"""``noetl-stream worker --processes N``: N worker processes on one machine, kept running.

A worker process runs its tools in threads of one Python interpreter, so a pool of CPU-bound tasks
scales on one machine by processes rather than by ``--concurrency``. The `Supervisor` starts one
child per command line (``python -m noetl_stream worker ...``); every child pulls from the same
durable consumer ``pool-<pool>``, exactly like worker replicas on several machines, so nothing
else changes when processes are added.

- SIGTERM or SIGINT to the supervisor is forwarded to every child as SIGTERM: each stops pulling
  and finishes its commands within ``--grace``. A child still running ``grace + kill_after_s``
  later gets SIGKILL (its commands are redelivered). The supervisor exits when all children have.
- A child that dies on its own (crash, OOM kill, lost connection) is started again after a
  backoff that doubles with each quick death (``backoff_base_s`` up to ``backoff_max_s``) and
  resets once a child has run for ``stable_s``. A child that exits with code 2 (invalid
  configuration) is not restarted: a restart cannot fix it, so everything stops with code 2.
- On Linux children get SIGTERM if the supervisor itself dies (``PR_SET_PDEATHSIG``), so a
  SIGKILLed supervisor does not leave orphan workers behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence

import structlog

from noetl_stream.api.server import listen_text

__all__ = ["Supervisor", "supervise_workers", "worker_commands"]

log = structlog.get_logger(__name__)

EXIT_INVALID = 2  # the CLI's exit code for invalid input: restarting does not help
_PR_SET_PDEATHSIG = 1


class Supervisor:
    """Runs one child process per command, restarts the ones that die, stops all on a signal."""

    def __init__(
        self,
        commands: Sequence[Sequence[str]],
        *,
        env: Mapping[str, str] | None = None,
        grace_s: float = 30.0,
        kill_after_s: float = 10.0,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        stable_s: float = 30.0,
    ) -> None:
        if not commands:
            raise ValueError("nothing to supervise")
        self.commands = [list(c) for c in commands]
        self.env = dict(env) if env is not None else None
        self.grace_s, self.kill_after_s = grace_s, kill_after_s
        self.backoff_base_s, self.backoff_max_s, self.stable_s = backoff_base_s, backoff_max_s, stable_s
        self.pids: dict[int, int] = {}
        """PID of the running child of each slot (1-based)."""
        self.restarts = 0
        self._stop = asyncio.Event()
        self._code = 0

    def shutdown(self) -> None:
        """Stop every child (SIGTERM, SIGKILL after the grace period) and do not restart them. Idempotent."""
        if not self._stop.is_set():
            log.info("supervisor.stopping", children=len(self.pids), grace_s=self.grace_s)
            self._stop.set()

    async def run(self) -> int:
        """Run until shut down (by `shutdown()`, SIGTERM or SIGINT) and every child has exited.

        Returns 0, or 2 when a child reported invalid configuration.
        """
        loop = asyncio.get_running_loop()
        handled = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.shutdown)
                handled.append(sig)
        try:
            async with asyncio.TaskGroup() as tg:
                for slot, argv in enumerate(self.commands, 1):
                    tg.create_task(self._keep(slot, argv), name=f"supervisor-slot-{slot}")
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)
        log.info("supervisor.stopped", code=self._code)
        return self._code

    async def _keep(self, slot: int, argv: list[str]) -> None:
        """Keep one child of `slot` running until shutdown."""
        loop = asyncio.get_running_loop()
        quick_deaths = 0
        while not self._stop.is_set():
            started = loop.time()
            # Own process group: a Ctrl-C in the terminal reaches the supervisor only, which forwards
            # it once (a child stopping on its own SIGINT first would look like a crash).
            proc = await asyncio.create_subprocess_exec(
                *argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent(os.getpid()),
            )
            self.pids[slot] = proc.pid
            log.info("supervisor.child_started", slot=slot, pid=proc.pid)
            try:
                code = await self._wait(proc)
            finally:
                self.pids.pop(slot, None)
            if self._stop.is_set():
                log.info("supervisor.child_stopped", slot=slot, pid=proc.pid, code=code)
                return
            if code == EXIT_INVALID:
                log.error("supervisor.child_invalid", slot=slot, pid=proc.pid, code=code)
                self._code = EXIT_INVALID
                self.shutdown()
                return
            quick_deaths = 0 if loop.time() - started >= self.stable_s else quick_deaths + 1
            delay = min(self.backoff_max_s, self.backoff_base_s * 2 ** max(0, quick_deaths - 1))
            log.warning("supervisor.child_died", slot=slot, pid=proc.pid, code=code, restart_in_s=delay)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stop.wait()
            self.restarts += 1

    async def _wait(self, proc: asyncio.subprocess.Process) -> int:
        """The child's exit code; on shutdown SIGTERM it first, and SIGKILL it after the grace period."""
        exited = asyncio.ensure_future(proc.wait())
        stopping = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({exited, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not exited.done():
                _signal(proc, signal.SIGTERM)
                await asyncio.wait({exited}, timeout=self.grace_s + self.kill_after_s)
                if not exited.done():
                    log.warning(
                        "supervisor.child_killed", pid=proc.pid, after_s=self.grace_s + self.kill_after_s
                    )
                    _signal(proc, signal.SIGKILL)
            return await exited
        finally:
            stopping.cancel()
            if not exited.done():  # cancelled from outside: never leave the child behind
                _signal(proc, signal.SIGKILL)
                await exited


def _signal(proc: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)


def _die_with_parent(parent: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to SIGTERM the child when the supervisor dies (None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None

    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the supervisor died before prctl took effect
            os._exit(1)

    return preexec


def worker_commands(
    processes: int,
    worker_args: Sequence[str],
    name: str | None = None,
    metrics: tuple[str, int] | None = None,
) -> list[list[str]]:
    """``python -m noetl_stream worker ARGS`` per process; with `name`, the children are ``name-1``..``name-N``;
    with `metrics` (host, port), child i serves its ``/metrics`` on port + i - 1."""
    base = [sys.executable, "-m", "noetl_stream", "worker", *worker_args]
    commands = []
    for i in range(1, processes + 1):
        argv = base + (["--name", f"{name}-{i}"] if name else [])
        if metrics is not None:
            argv += ["--metrics", listen_text(metrics[0], metrics[1] + i - 1)]
        commands.append(argv)
    return commands


def supervise_workers(
    processes: int,
    worker_args: Sequence[str],
    nats_url: str,
    prefix: str,
    grace_s: float,
    name: str | None,
    metrics: tuple[str, int] | None = None,
) -> int:
    """Run `processes` workers under a `Supervisor` until SIGTERM/SIGINT; the exit code.

    The NATS URL (which may carry a password) travels in the environment, not on command lines.
    """
    env = {**os.environ, "NOETL_NATS_URL": nats_url, "NOETL_PREFIX": prefix}
    commands = worker_commands(processes, worker_args, name, metrics)
    supervisor = Supervisor(commands, env=env, grace_s=grace_s)
    return asyncio.run(supervisor.run())
