"""``python``: inline ``code`` or a ``module: pkg.mod:function``, run off the event loop.

The rendered ``args`` (a task's ``input:`` is its ``args``) are the inputs. ``code`` runs with them as
globals, the whole mapping as ``args`` and ``input_data``, the modules ``json``, ``os``, ``datetime``,
``uuid`` and ``sys``, and its ``libs`` imports (`pycode.py`). Its result: the value of a top-level
``return``, else the return value of ``main`` called with the inputs it takes (all of them for
``**kw``), else the value left in ``result``. With ``module``, the function is called with the inputs
it accepts (a coroutine function is awaited on the event loop; an ``async def main`` of ``code`` runs on
an event loop of its own thread).

An exception (a failed ``assert`` too, ``SystemExit`` and ``KeyboardInterrupt`` included: task code
never stops the worker) is an error of kind ``python_error``; ``outcome.py.exception_type`` is its type
name, ``outcome.py.line`` its line in ``code``, and ``error.traceback`` Python's traceback of the task's
own frames (the pipeline masks keychain values in it as in the rest of the outcome). What the code
prints is captured into ``outcome.meta.stdout`` / ``stderr`` (the last 64 KiB). ``spec.timeout``
(seconds, a number or numeric text; anything else is a ``config_error``) bounds the task: code still
running then (or when the task is cancelled) is interrupted at its next Python instruction (a call
blocked in C, e.g. a long ``time.sleep``, is interrupted when it returns); that is a ``timeout`` error.
"""

from __future__ import annotations

import asyncio
import copy
import ctypes
import importlib
import inspect
import io
import re
import sys
import threading
import traceback
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, TextIO

from noetl_stream.dataplane.outcome import Outcome, json_safe
from noetl_stream.dataplane.tools import pycode
from noetl_stream.dataplane.tools.base import ToolContext, script_file, timeout_seconds
from noetl_stream.dataplane.tools.pycode import (
    Program,
    compile_code,
    format_traceback,
    input_names,
    namespace,
    run_program,
)
from noetl_stream.dsl.pylibs import LibImport, lib_imports
from noetl_stream.errors import NoetlError

CAPTURE_LIMIT = 64 * 1024
PYTHON_ERROR = "python_error"
"""The error kind of task code that raised (its type is ``outcome.py.exception_type``)."""


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


def _call(fn: Callable[..., Any], args: dict[str, Any]) -> Any:
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fn(**args)
    return fn(**{k: v for k, v in args.items() if k in params})


def _call_main(args: dict[str, Any]) -> Callable[[Callable[..., Any]], Any]:
    def call(main: Callable[..., Any]) -> Any:
        value = _call(main, args)
        # `async def main`: run it here, on an event loop of this thread's own (not the worker's)
        return asyncio.run(value) if inspect.iscoroutine(value) else value

    return call


def _execute(
    program: Program, args: dict[str, Any], prev: Any, libs: list[LibImport], context: Any = None
) -> Any:
    ns = namespace(args, prev, libs)
    if context is not None:
        ns.setdefault("context", context)
    return run_program(program, ns, _call_main(args))


_NAMES_CONTEXT = re.compile(r"(?<![\w.])context\b")
"""The name ``context`` in code (not ``contextlib``, ``x.context``): a cheap look before a deep copy."""


def _context(code: str, args: dict[str, Any], ctx: ToolContext) -> Mapping[str, Any] | None:
    """NoETL's ``context``: the template scope the task rendered in, read-only (a copy: changing what it
    holds changes nothing else). Built only for code that names it and has no input of that name."""
    if "context" in args or ctx.scope is None or _NAMES_CONTEXT.search(code) is None:
        return None
    return MappingProxyType(copy.deepcopy(dict(ctx.scope)))


class _TaskExitError(NoetlError):
    """Task code raised a ``BaseException`` that is not an ``Exception`` (``SystemExit``,
    ``KeyboardInterrupt``, ``CancelledError``): reported like any error, never let through to the
    worker's event loop (where ``SystemExit`` stops the process and ``CancelledError`` reads as a
    cancelled command). It carries a ``TimeoutError`` too, which leaving a pool thread would become a
    new one, without its traceback, that reads as the task's own timeout."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(*exc.args)
        self.type_name = type(exc).__name__
        self.text = _text(exc)

    def __str__(self) -> str:
        return self.text


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
        carried = not isinstance(exc, Exception) or type(exc) is TimeoutError
        raised = _TaskExitError(exc) if carried else exc
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


def _runner_frame(frame: traceback.FrameSummary) -> bool:
    return frame.filename in _RUNNER_FILES or frame.filename.startswith("<frozen ")


_RUNNER_FILES = frozenset({__file__, pycode.__file__})


def _after_runner(frames: list[traceback.FrameSummary]) -> list[traceback.FrameSummary]:
    """The frames after the last one of this runner or of the import system (a ``module`` function's,
    and what it called)."""
    last = max((i for i, f in enumerate(frames) if _runner_frame(f)), default=-1)
    return frames[last + 1 :]


def _failed(
    exc: BaseException, name: str, filename: str, code: str | None, out_err: tuple[str, str]
) -> Outcome:
    """The error outcome of task code that raised `exc` (of type `name`)."""
    frames = list(traceback.extract_tb(exc.__traceback__))
    if code is not None:
        line = next((f.lineno for f in reversed(frames) if f.filename == filename), None)
        if isinstance(exc, SyntaxError) and exc.filename == filename:
            line = exc.lineno
        tb = format_traceback(exc, name, [f for f in frames if f.filename == filename], code)
    else:
        line = None
        tb = format_traceback(exc, name, _after_runner(frames), None)
    where = f" (line {line})" if line else ""
    text = exc.msg if isinstance(exc, SyntaxError) else _text(exc)
    outcome = Outcome.fail(PYTHON_ERROR, f"{name}: {text}{where}", py={"exception_type": name, "line": line})
    assert outcome.error is not None
    outcome.error["traceback"] = tb
    if out_err[0] or out_err[1]:
        outcome.meta = {"stdout": _tail(out_err[0]), "stderr": _tail(out_err[1])}
    return outcome


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # task code's own __str__ may raise
        return f"<{type(exc).__name__} whose str() failed>"


def _inputs(config: dict[str, Any]) -> dict[str, Any] | Outcome:
    args = config.get("args")
    if args is None:
        return {}
    if not isinstance(args, dict):
        return Outcome.fail(
            "config_error",
            f"python task 'args' (or 'input') must render to a mapping, got {type(args).__name__}",
        )
    return copy.deepcopy(args)


async def run_python(config: dict[str, Any], ctx: ToolContext) -> Outcome:
    code, module = config.get("code"), config.get("module")
    if config.get("script") is not None and code is None:  # NoETL's file script: its text is the code
        try:
            code = script_file(config, ctx)
        except ValueError as exc:
            return Outcome.fail("config_error", f"python task: {exc}")
    if code is not None and module is not None:
        return Outcome.fail("config_error", "python task: give 'code' or 'module', not both")
    if not isinstance(code, str) and not isinstance(module, str):
        return Outcome.fail(
            "config_error", "python task needs 'code' (a string) or 'module' (pkg.mod:function)"
        )
    args = _inputs(config)
    if isinstance(args, Outcome):
        return args
    try:
        libs = lib_imports(config.get("libs"))
        limit = timeout_seconds(ctx.spec.get("timeout"))
    except ValueError as exc:
        return Outcome.fail("config_error", f"python task: {exc}")
    if libs and isinstance(module, str):
        return Outcome.fail("config_error", "python task: 'libs' imports names into 'code', not a 'module'")
    filename = f"<{ctx.step}.{ctx.task}>"
    stdout = stderr = ""
    bound: asyncio.Timeout | None = None
    try:
        async with asyncio.timeout(limit) as bound:
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
                program = compile_code(code, filename, input_names(args, libs))
                prev = copy.deepcopy(ctx.prev)
                context = _context(code, args, ctx)
                value, stdout, stderr = await _threaded(lambda: _execute(program, args, prev, libs, context))
    except Exception as exc:
        if isinstance(exc, TimeoutError) and bound is not None and bound.expired():
            return Outcome.fail(
                "timeout",
                f"python task '{ctx.task}' ran longer than {limit}s",
                retryable=True,
                py={"exception_type": "TimeoutError"},
            )
        # (a TimeoutError the code raised itself, a socket's, is the code's error like any other)
        name = exc.type_name if isinstance(exc, _TaskExitError) else type(exc).__name__
        source = code if isinstance(code, str) else None
        return _failed(exc, name, filename, source, getattr(exc, "__noetl_output__", ("", "")))
    outcome = Outcome.ok(json_safe(value), py={})
    if stdout or stderr:
        outcome.meta = {"stdout": _tail(stdout), "stderr": _tail(stderr)}
    return outcome
