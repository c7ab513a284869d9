"""``script``: a shell or Python script in a child process of the worker.

Config: ``code`` (the script's text) or ``path`` (a script file on the worker), ``language`` (``sh``,
the default, ``bash`` or ``python``: the worker's own interpreter), ``env`` (a mapping of environment
variables; values rendered to strings, and a null value leaves the variable unset, also one the script
would inherit, such as ``HOME``) and ``args`` (a mapping, given to the script as JSON in ``NOETL_ARGS``).
The script starts in a clean environment: ``PATH``, ``HOME``, ``LANG``, ``LC_ALL``, ``TMPDIR`` and
``TZ`` from the worker, ``NOETL_EXECUTION_ID``, ``NOETL_STEP``, ``NOETL_TASK``, then ``env``: nothing
else of the worker's (its NATS credentials, its keychain key) reaches the script. Templates never
build the command line: the script's text goes to the interpreter as a file.

The result: ``{exit_code, stdout, stderr, json}``: the last 64 KiB of each stream (UTF-8, undecodable
bytes replaced), and ``json`` the whole stdout decoded as JSON when it is JSON (else None; also None
when stdout is longer than ``JSON_LIMIT``, 64 MiB, which is not read into memory). A non-zero
exit code is ``script_error`` (not retryable; the result is still there). ``spec.timeout`` (seconds)
bounds the run: the script and every process it started are killed (SIGKILL to its process group) and
the task fails with ``timeout`` (retryable). A cancelled step kills them too.

When the script ends (by itself, at its timeout, or cancelled), what it started in the background is
killed too: its process group, and every process that left the group (``setsid``, a double fork, a
daemon). Those are found by a marker in their environment: ``NOETL_SCRIPT_RUN``, a random value for
each run, inherited by every descendant. The worker reads ``/proc/<pid>/environ`` of the processes it
may signal and SIGKILLs those whose environment holds that exact entry. It is Linux-only (without
``/proc`` that sweep is skipped), and a descendant that clears its environment still escapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import uuid
from collections.abc import Mapping
from typing import Any

import msgspec
import structlog

from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.dataplane.tools.base import ToolContext, timeout_seconds
from noetl_stream.errors import NoetlError

LANGUAGES = {"sh": ["/bin/sh"], "bash": ["bash"], "python": [sys.executable, "-I"]}
"""Interpreters by ``language``; each runs the script file given as its last argument."""

KEPT_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ")
"""What the script inherits of the worker's environment."""

OUTPUT_LIMIT = 64 * 1024
"""Bytes of stdout and stderr kept (the last ones)."""

JSON_LIMIT = 64 * 1024 * 1024
"""Bytes of stdout at most decoded as ``json`` (the whole stdout is read for it; like http's
``spec.max_body_bytes`` default)."""

RUN_MARKER = "NOETL_SCRIPT_RUN"
"""The variable that marks every process of one run: its value is new for each run."""

SWEEP_ROUNDS = 5
"""At most this many scans of ``/proc`` per run: another one only while the last killed new processes
(one may fork between the scan that finds it and its kill)."""

PROC = "/proc"

log = structlog.get_logger(__name__)


class _ConfigError(NoetlError, ValueError):
    pass


def _environment(config: Mapping[str, Any], ctx: ToolContext) -> dict[str, str]:
    env = {name: os.environ[name] for name in KEPT_ENV if name in os.environ}
    env.update(NOETL_EXECUTION_ID=ctx.execution_id, NOETL_STEP=ctx.step, NOETL_TASK=ctx.task)
    args = config.get("args") or {}
    if not isinstance(args, Mapping):
        raise _ConfigError(f"script 'args' must render to a mapping, got {type(args).__name__}")
    env["NOETL_ARGS"] = msgspec.json.encode(args).decode()
    given = config.get("env") or {}
    if not isinstance(given, Mapping):
        raise _ConfigError(f"script 'env' must be a mapping of names to values, got {type(given).__name__}")
    for name, value in given.items():
        if not isinstance(name, str) or not name or "=" in name or "\0" in name:
            raise _ConfigError(f"script 'env': invalid variable name {name!r}")
        if value is None:  # not set: removed from what the script would inherit (`HOME: null`)
            env.pop(name, None)
            continue
        text = value if isinstance(value, str) else msgspec.json.encode(value).decode()
        if "\0" in text:
            raise _ConfigError(f"script 'env': the value of {name} holds a NUL byte")
        env[name] = text
    return env


def _command(config: Mapping[str, Any]) -> tuple[list[str], str | None, str | None]:
    """The interpreter's command, and either the script's text (to write to a file) or its path."""
    code, path = config.get("code"), config.get("path")
    if (code is None) == (path is None):
        raise _ConfigError("script task needs 'code' (the script's text) or 'path' (a file), not both")
    if code is not None and not isinstance(code, str):
        raise _ConfigError("script 'code' must be a string")
    if path is not None and (not isinstance(path, str) or not path):
        raise _ConfigError("script 'path' must be a file path")
    language = config.get("language") or "sh"
    interpreter = LANGUAGES.get(language) if isinstance(language, str) else None
    if interpreter is None:
        raise _ConfigError(f"script 'language' {language!r} is not one of: {', '.join(sorted(LANGUAGES))}")
    if path is not None and not os.path.isfile(path):
        raise _ConfigError(f"script 'path' {path!r}: no such file on the worker")
    return interpreter, code, path


def _tail(data: bytes) -> str:
    return data[-OUTPUT_LIMIT:].decode("utf-8", errors="replace")


def _tail_of(path: str) -> bytes:
    """The last `OUTPUT_LIMIT` bytes of an output file."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - OUTPUT_LIMIT))
        return f.read()


def _json_of(path: str) -> Any:
    """The whole output file decoded as JSON; None when it is empty, not JSON or above `JSON_LIMIT`."""
    if not 0 < os.path.getsize(path) <= JSON_LIMIT:
        return None
    with open(path, "rb") as f:
        data = f.read()
    try:
        return msgspec.json.decode(data) if data.strip() else None
    except msgspec.DecodeError:
        return None


def _kill(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the script's process group: the script and whatever it started (also once the script has
    ended: what it left running in the background is ours to stop)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _is_marked(pid: int, entry: bytes, uid: int) -> bool:
    """Whether process `pid` (of user `uid`, unless the worker is root) has `entry` in its environment.
    A process that is gone, a zombie (its environment reads empty), a kernel thread or another user's
    process is not."""
    try:
        if uid != 0 and os.stat(f"{PROC}/{pid}").st_uid != uid:
            return False
        with open(f"{PROC}/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:
        return False
    return entry in environ and entry in environ.split(b"\0")


def _kill_marked_pid(pid: int, entry: bytes, uid: int) -> bool:
    """SIGKILL `pid` if it still holds `entry`; through a pidfd, so that a pid reused by another process
    between the scan and the kill is not signalled."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # gone already
        return False
    except (AttributeError, OSError) as exc:  # no pidfd here (an old kernel, a sandbox's seccomp filter)
        log.debug("script.no_pidfd", error=str(exc) or type(exc).__name__)
        return _kill_checked(pid, entry, uid)
    try:
        if not _is_marked(pid, entry, uid):  # no longer the process the scan found
            return False
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _kill_checked(pid: int, entry: bytes, uid: int) -> bool:
    """SIGKILL `pid` by number if it still holds `entry` (without a pidfd, a pid reused between the check
    and the kill could be hit: the window is the few microseconds between the two)."""
    if not _is_marked(pid, entry, uid):
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _kill_marked(marker: str) -> list[int]:
    """SIGKILL every process whose environment holds ``NOETL_SCRIPT_RUN=<marker>``: what the script left
    running, also outside its process group. The pids killed. Never raises."""
    if not os.path.isdir(f"{PROC}/self"):
        log.debug("script.sweep_skipped", reason=f"no {PROC} on this system")
        return []
    entry = f"{RUN_MARKER}={marker}".encode()
    me, uid = os.getpid(), os.geteuid()
    killed: list[int] = []
    try:
        for _ in range(SWEEP_ROUNDS):
            found = [
                pid
                for pid in (int(name) for name in os.listdir(PROC) if name.isdigit())
                if pid != me and pid not in killed and _is_marked(pid, entry, uid)
            ]
            new = [pid for pid in found if _kill_marked_pid(pid, entry, uid)]
            if not new:
                break
            killed.extend(new)
    except Exception as exc:  # a sweep never fails the task nor the worker
        log.warning("script.sweep_failed", marker=marker, error=str(exc) or type(exc).__name__)
    if killed:
        log.info("script.escaped_killed", marker=marker, pids=killed)
    return killed


async def _sweep(marker: str) -> None:
    """`_kill_marked` off the event loop; it finishes even if the task is cancelled meanwhile."""
    try:
        await asyncio.shield(asyncio.to_thread(_kill_marked, marker))
    except RuntimeError:  # the loop's executor is shut down (the worker is stopping): sweep here
        _kill_marked(marker)


async def run_script(config: dict[str, Any], ctx: ToolContext) -> Outcome:
    try:
        interpreter, code, path = _command(config)
        env = _environment(config, ctx)
        limit = timeout_seconds(ctx.spec.get("timeout"))
    except ValueError as exc:  # _ConfigError included
        return Outcome.fail("config_error", str(exc))
    marker = uuid.uuid4().hex
    env[RUN_MARKER] = marker  # after `env`: a task cannot unset or share it
    with tempfile.TemporaryDirectory(prefix="noetl-script-") as workdir:
        script = path
        if code is not None:
            script = os.path.join(workdir, "script")
            with open(script, "w", encoding="utf-8") as f:
                f.write(code)
        assert script is not None
        out_path, err_path = os.path.join(workdir, "stdout"), os.path.join(workdir, "stderr")
        # Output goes to files, not pipes: a child the script leaves behind may hold them open, and a
        # pipe is only at its end when every holder is gone.
        with open(out_path, "wb") as out_f, open(err_path, "wb") as err_f:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *interpreter,
                    script,
                    cwd=workdir,
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out_f,
                    stderr=err_f,
                    start_new_session=True,  # its own process group: a timeout kills everything it started
                )
            except OSError as exc:
                return Outcome.fail("script_error", f"cannot start {interpreter[0]}: {exc.strerror or exc}")
        try:
            async with asyncio.timeout(limit):
                code_ = await proc.wait()
        except TimeoutError:
            _kill(proc)
            await proc.wait()
            await _sweep(marker)
            return Outcome.fail(
                "timeout", f"script task '{ctx.task}' ran longer than {limit}s", retryable=True
            )
        except BaseException:  # cancelled (the step's timeout, a cancelled execution): leave nothing behind
            _kill(proc)
            await _sweep(marker)
            raise
        _kill(proc)  # the script ended; what it started in the background is ours to stop
        await _sweep(marker)
        out, err = _tail_of(out_path), _tail_of(err_path)
        parsed = _json_of(out_path)
    stdout, stderr = _tail(out), _tail(err)
    result = {"exit_code": code_, "stdout": stdout, "stderr": stderr, "json": parsed}
    if code_ == 0:
        return Outcome.ok(result)
    last = next((line for line in reversed(stderr.splitlines()) if line.strip()), "")
    outcome = Outcome.fail(
        "script_error",
        f"script exited with {code_}" + (f": {last[:500]}" if last else ""),
        script={"exit_code": code_},
    )
    outcome.result = result
    return outcome
