"""Stops an embedded nats-server whose owner is gone, even one killed with SIGKILL.

`EmbeddedNats` starts the server in its own session (a Ctrl-C in the terminal reaches only the
owner, which stops the server in order), so nothing ties the server's life to the owner's: an owner
killed with SIGKILL, or by the OOM killer, used to leave the server running. Each server gets one of
these guards, started right after it as ``python -I -S _server_guard.py <server pid> [--pidfd
<fd>] [--remove <dir>]``, with its standard input the read end of a pipe whose only write end the
owner holds. The guard blocks on that pipe. When it reads end-of-file (the owner closed the pipe,
or died and the kernel closed it) and the server still runs, it ends it: SIGTERM (JetStream writes
its store), SIGKILL after a grace period. Then, unless the owner wrote `KEEP` before closing the pipe
(it is alive and deals with the directory itself: it removes it, or starts the server in it again),
it removes ``<dir>``, given when the owner made a temporary directory: also when the server had
already ended on its own before the owner died. The server is signalled through a pidfd the owner opened right after starting
it and passed down (``--pidfd``), so a pid reused after the server exited is never signalled;
without pidfds (an old kernel, a seccomp filter) the guard checks the process's start time in /proc
before each signal.

Standard library only, and run with ``-I -S``: nothing of the owner's environment is imported.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import sys
import time

GRACE_S = 10.0
"""How long the server gets to stop after SIGTERM before SIGKILL."""


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time since boot): tells a process from a later one with
    its pid. None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # after the command name, which may hold spaces
    return fields[19] if len(fields) > 19 and fields[0] != "Z" else None


class _Target:
    def __init__(self, pid: int, fd: int | None = None) -> None:
        """`fd`: a pidfd the owner opened right after starting the server (while it could not yet
        have been reaped, so its pid could not have been reused), passed down; else one opened here."""
        self.pid = pid
        self.fd = fd
        self.started: str | None = None
        if fd is None:
            try:
                self.fd = os.pidfd_open(pid)
            except (AttributeError, OSError):
                self.started = _start_time(pid)

    def _ended(self, timeout_s: float) -> bool:
        """The pidfd is readable: its process has ended (poll, not select: any fd number)."""
        assert self.fd is not None
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        return bool(poller.poll(max(0, int(timeout_s * 1000))))

    def alive(self) -> bool:
        if self.fd is not None:
            return not self._ended(0)
        return self.started is not None and _start_time(self.pid) == self.started

    def signal(self, sig: int) -> None:
        try:
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, sig)
            elif self.alive():
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> bool:
        """True once the process has ended, False if it still runs after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while self.alive():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self.fd is not None:
                self._ended(left)
            else:
                time.sleep(min(0.05, left))
        return True


KEEP = b"k"
"""Written by a live owner just before it closes the pipe: the directory is its own business."""

USAGE = "usage: _server_guard.py <server pid> [--pidfd <fd>] [--remove <directory>]"


def _options(argv: list[str]) -> tuple[int, int | None, str | None] | None:
    """``(pid, pidfd, directory to remove)`` from the command line; None if it is not understood."""
    if len(argv) < 2 or not argv[1].isdigit():
        return None
    pid, fd, remove = int(argv[1]), None, None
    rest = argv[2:]
    while rest:
        if len(rest) < 2:
            return None
        flag, value, rest = rest[0], rest[1], rest[2:]
        if flag == "--pidfd" and value.isdigit():
            fd = int(value)
        elif flag == "--remove" and value:
            remove = value
        else:
            return None
    return pid, fd, remove


def main(argv: list[str]) -> int:
    options = _options(argv)
    if options is None:
        print(USAGE, file=sys.stderr)
        return 2
    pid, fd, remove = options
    target = _Target(pid, fd)
    if not target.alive() and remove is None:
        return 0  # nothing to stop, nothing to remove
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    kept = False
    while True:  # until end-of-file: only `KEEP` is ever written, but read whatever comes
        try:
            data = os.read(0, 4096)
        except InterruptedError:
            continue
        except OSError:
            break
        if not data:
            break
        kept = kept or KEEP in data
    if target.alive():
        target.signal(signal.SIGTERM)
        if not target.wait(GRACE_S):
            target.signal(signal.SIGKILL)
            if not target.wait(GRACE_S):
                return 1
    if remove is not None and not kept:
        shutil.rmtree(remove, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
