"""``python``: inline ``code`` or a ``module: pkg.mod:function``, run off the event loop.

The rendered ``args`` are bound as local names and as ``args``. With ``code``, the task result is the
return value of ``main(**args)`` when the code defines ``main``, else the value left in ``result``. With
``module``, the function is called with the args it accepts (a coroutine function is awaited on the
event loop; an ``async def main`` of ``code`` runs on an event loop of its own thread). An exception
becomes an error outcome whose ``error.kind`` is the exception's type name (``outcome.py.exception_type``
too), ``SystemExit`` and ``KeyboardInterrupt`` included: task code never stops the worker. What the
code prints is captured into ``outcome.meta.stdout`` / ``stderr`` (the last 64 KiB). ``spec.timeout``
(seconds, a number or numeric text; anything else is a ``config_error``) bounds the task: code still
running then (or when the task is cancelled) is interrupted at its next Python instruction (a call
blocked in C, e.g. a long ``time.sleep``, is interrupted when it returns).
"""

from __future__ import annotations

import asyncio
import copy
import ctypes
import functools
import importlib
import inspect
import io
import sys
import threading
import traceback
from collections.abc import Callable
from types import CodeType
from typing import Any, TextIO

from noetl_stream.dataplane.outcome import Outcome, json_safe
from noetl_stream.dataplane.tools.base import ToolContext, timeout_seconds

CAPTURE_LIMIT = 64 * 1024


class _ThreadStream(io.TextIOBase):
    """``sys.stdout``/``stderr`` stand-in: a thread running a task writes into its own buffer."""

    def __init__(self, real: TextIO) -> None:
        self.real = real
        self.local = threading.local()

    def write(self, s: str) -> int:
        buf = getattr(self.local, "buf", None)
        if buf is None:
            return self.real.write(s)
        buf.write(s)
        if buf.tell() > CAPTURE_LIMIT * 2:  # keep the tail: the last lines are the ones that matter
            tail = buf.getvalue()[-CAPTURE_LIMIT:]
            buf.seek(0)
            buf.truncate()
            buf.write(tail)
        return len(s)

    def flush(self) -> None:
        if getattr(self.local, "buf", None) is None:
            self.real.flush()


_installed: tuple[_ThreadStream, _ThreadStream] | None = None
_install_lock = threading.Lock()


def _streams() -> tuple[_ThreadStream, _ThreadStream]:
    global _installed
    with _install_lock:
        # (Re)install when someone else replaced sys.stdout/stderr since (test runners, embedding apps).
        if _installed is None or sys.stdout is not _installed[0] or sys.stderr is not _installed[1]:
            out = sys.stdout if isinstance(sys.stdout, _ThreadStream) else _ThreadStream(sys.stdout)
            err = sys.stderr if isinstance(sys.stderr, _ThreadStream) else _ThreadStream(sys.stderr)
            sys.stdout, sys.stderr = out, err
            _installed = (out, err)
        return _installed


def _tail(text: str) -> str:
    return text[-CAPTURE_LIMIT:]


@functools.lru_cache(maxsize=1024)
def _compile(code: str, filename: str) -> CodeType:
    return compile(code, filename, "exec")


def _call(fn: Callable[..., Any], args: dict[str, Any]) -> Any:
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fn(**args)
    return fn(**{k: v for k, v in args.items() if k in params})


def _execute(code: str, filename: str, args: dict[str, Any], prev: Any) -> Any:
    compiled = _compile(code, filename)
    namespace: dict[str, Any] = {"__name__": "__noetl_task__", "args": args, "_prev": prev, **args}
    exec(compiled, namespace)
    main = namespace.get("main")
    if callable(main):
        value = _call(main, args)
        # `async def main`: run it here, on an event loop of this thread's own (not the worker's)
        return asyncio.run(value) if inspect.iscoroutine(value) else value
    return namespace.get("result")


class _TaskExitError(Exception):
    """Task code raised a ``BaseException`` that is not an ``Exception`` (``SystemExit``,
    ``KeyboardInterrupt``, ``CancelledError``): reported like any error, never let through to the
    worker's event loop (where ``SystemExit`` stops the process and ``CancelledError`` reads as a
    cancelled command)."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(*exc.args)
        self.type_name = type(exc).__name__


class _TaskInterruptedError(BaseException):
    """Raised inside a python task's thread when its timeout fired (not an ``Exception``, so that task
    code catching ``Exception`` does not swallow it)."""


def _captured(fn: Callable[[], Any]) -> tuple[Any, str, str]:
    """Run ``fn`` in this thread with its prints captured."""
    out, err = _streams()
    out.local.buf, err.local.buf = io.StringIO(), io.StringIO()
    try:
        value = fn()
        return value, out.local.buf.getvalue(), err.local.buf.getvalue()
    except BaseException as exc:
        raised = exc if isinstance(exc, Exception) else _TaskExitError(exc)
        raised.__noetl_output__ = (out.local.buf.getvalue(), err.local.buf.getvalue())  # type: ignore[attr-defined]
        if raised is exc:
            raise
        raise raised.with_traceback(exc.__traceback__) from None
    finally:
        out.local.buf = err.local.buf = None


def _set_async_exc(ident: int, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in thread ``ident`` at its next Python instruction (None: clear a pending one)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(ident), ctypes.py_object(exc) if exc is not None else None
    )


class _Job:
    """One task's run in a pool thread, which `interrupt` stops when the task is cut short."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ident: int | None = None
        self._interrupted = False

    def run(self, fn: Callable[[], Any]) -> tuple[Any, str, str]:
        with self._lock:
            if self._interrupted:  # cut short before its thread took it: never start it
                raise _TaskInterruptedError
            self._ident = threading.get_ident()
        try:
            return _captured(fn)
        finally:
            with self._lock:
                if self._interrupted and self._ident is not None:
                    _set_async_exc(self._ident, None)  # not yet raised: the pool thread must not get it
                self._ident = None

    def interrupt(self) -> None:
        with self._lock:
            if self._interrupted:
                return
            self._interrupted = True
            if self._ident is not None:
                _set_async_exc(self._ident, _TaskInterruptedError)


def _resolve(module: str) -> Callable[..., Any]:
    mod_name, sep, attr = module.partition(":")
    if not sep or not mod_name or not attr:
        raise ValueError(f"module must look like 'package.module:function', got {module!r}")
    target: Any = importlib.import_module(mod_name)
    for part in attr.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"{module} is not callable")
    return target  # type: ignore[no-any-return]


async def _threaded(fn: Callable[[], Any]) -> tuple[Any, str, str]:
    """``fn`` in a pool thread with its prints captured; interrupted if this task is cancelled (a
    timeout), so that runaway code does not keep a pool thread (and a CPU) after its task ended."""
    job = _Job()
    try:
        return await asyncio.to_thread(job.run, fn)
    except asyncio.CancelledError:
        job.interrupt()
        raise


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # task code's own __str__ may raise
        return f"<{type(exc).__name__} whose str() failed>"


async def run_python(config: dict[str, Any], ctx: ToolContext) -> Outcome:
    code, module = config.get("code"), config.get("module")
    if code is not None and module is not None:
        return Outcome.fail("config_error", "python task: give 'code' or 'module', not both")
    if not isinstance(code, str) and not isinstance(module, str):
        return Outcome.fail(
            "config_error", "python task needs 'code' (a string) or 'module' (pkg.mod:function)"
        )
    args = config.get("args") or {}
    if not isinstance(args, dict):
        return Outcome.fail(
            "config_error", f"python task 'args' must render to a mapping, got {type(args).__name__}"
        )
    args = copy.deepcopy(args)
    filename = f"<{ctx.step}.{ctx.task}>"
    stdout = stderr = ""
    try:
        limit = timeout_seconds(ctx.spec.get("timeout"))
    except ValueError as exc:
        return Outcome.fail("config_error", str(exc))
    try:
        async with asyncio.timeout(limit):
            if isinstance(module, str):
                fn = _resolve(module)
                if inspect.iscoroutinefunction(fn):
                    try:
                        value = await _call(fn, args)
                    except (SystemExit, KeyboardInterrupt) as exc:
                        raise _TaskExitError(exc) from None
                else:
                    value, stdout, stderr = await _threaded(lambda: _call(fn, args))
            else:
                assert isinstance(code, str)
                try:
                    _compile(code, filename)
                except SyntaxError as exc:
                    return Outcome.fail(
                        "SyntaxError", f"line {exc.lineno}: {exc.msg}", py={"exception_type": "SyntaxError"}
                    )
                prev = copy.deepcopy(ctx.prev)
                value, stdout, stderr = await _threaded(lambda: _execute(code, filename, args, prev))
    except TimeoutError:
        return Outcome.fail(
            "timeout",
            f"python task '{ctx.task}' ran longer than {limit}s",
            retryable=True,
            py={"exception_type": "TimeoutError"},
        )
    except Exception as exc:
        out_err = getattr(exc, "__noetl_output__", ("", ""))
        tb = traceback.extract_tb(exc.__traceback__)
        line = next((f.lineno for f in reversed(tb) if f.filename == filename), None)
        where = f" (line {line})" if line else ""
        name = exc.type_name if isinstance(exc, _TaskExitError) else type(exc).__name__
        outcome = Outcome.fail(
            name, f"{name}: {_text(exc)}{where}", py={"exception_type": name, "line": line}
        )
        outcome.meta = {"stdout": _tail(out_err[0]), "stderr": _tail(out_err[1])}
        return outcome
    outcome = Outcome.ok(json_safe(value), py={})
    if stdout or stderr:
        outcome.meta = {"stdout": _tail(stdout), "stderr": _tail(stderr)}
    return outcome
