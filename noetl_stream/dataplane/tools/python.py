"""``python``: inline ``code`` or a ``module: pkg.mod:function``, run off the event loop.

The rendered ``args`` are bound as local names and as ``args``. With ``code``, the task result is the
return value of ``main(**args)`` when the code defines ``main``, else the value left in ``result``. With
``module``, the function is called with the args it accepts (a coroutine function is awaited on the
event loop). An exception becomes an error outcome whose ``error.kind`` is the exception's type name
(``outcome.py.exception_type`` too). What the code prints is captured into ``outcome.meta.stdout`` /
``stderr`` (the last 64 KiB). ``spec.timeout`` (seconds) bounds the task.
"""

from __future__ import annotations

import asyncio
import copy
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
from noetl_stream.dataplane.tools.base import ToolContext

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
        if buf.tell() < CAPTURE_LIMIT * 2:
            buf.write(s)
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
        return _call(main, args)
    return namespace.get("result")


def _captured(fn: Callable[[], Any]) -> tuple[Any, str, str]:
    """Run ``fn`` in this thread with its prints captured."""
    out, err = _streams()
    out.local.buf, err.local.buf = io.StringIO(), io.StringIO()
    try:
        value = fn()
        return value, out.local.buf.getvalue(), err.local.buf.getvalue()
    except BaseException as exc:
        exc.__noetl_output__ = (out.local.buf.getvalue(), err.local.buf.getvalue())  # type: ignore[attr-defined]
        raise
    finally:
        out.local.buf = err.local.buf = None


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


async def run_python(config: dict[str, Any], ctx: ToolContext) -> Outcome:
    code, module = config.get("code"), config.get("module")
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
    timeout = ctx.spec.get("timeout")
    limit = float(timeout) if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) else None
    try:
        async with asyncio.timeout(limit):
            if isinstance(module, str):
                fn = _resolve(module)
                if inspect.iscoroutinefunction(fn):
                    value = await _call(fn, args)
                else:
                    value, stdout, stderr = await asyncio.to_thread(_captured, lambda: _call(fn, args))
            else:
                assert isinstance(code, str)
                try:
                    _compile(code, filename)
                except SyntaxError as exc:
                    return Outcome.fail(
                        "SyntaxError", f"line {exc.lineno}: {exc.msg}", py={"exception_type": "SyntaxError"}
                    )
                prev = copy.deepcopy(ctx.prev)
                value, stdout, stderr = await asyncio.to_thread(
                    _captured, lambda: _execute(code, filename, args, prev)
                )
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
        outcome = Outcome.fail(
            type(exc).__name__,
            f"{type(exc).__name__}: {exc}{where}",
            py={"exception_type": type(exc).__name__, "line": line},
        )
        outcome.meta = {"stdout": _tail(out_err[0]), "stderr": _tail(out_err[1])}
        return outcome
    outcome = Outcome.ok(json_safe(value), py={})
    if stdout or stderr:
        outcome.meta = {"stdout": _tail(stdout), "stderr": _tail(stderr)}
    return outcome
