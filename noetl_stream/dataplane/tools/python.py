"""``python``: inline ``code`` run off the event loop.

The rendered ``args`` are bound as local names and as ``args``. The task result is
the return value of ``main(**args)`` when the code defines ``main``, else the value
left in ``result``. An exception becomes an error outcome whose ``error.kind`` is
the exception's type name (``outcome.py.exception_type`` too).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import traceback
from types import CodeType
from typing import Any

from noetl_stream.dataplane.outcome import Outcome, json_safe
from noetl_stream.dataplane.tools.base import ToolContext


@functools.lru_cache(maxsize=1024)
def _compile(code: str, filename: str) -> CodeType:
    return compile(code, filename, "exec")


def _call_main(main: Any, args: dict[str, Any]) -> Any:
    params = inspect.signature(main).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return main(**args)
    return main(**{k: v for k, v in args.items() if k in params})


def _execute(code: str, filename: str, args: dict[str, Any], prev: Any) -> Any:
    compiled = _compile(code, filename)
    namespace: dict[str, Any] = {"__name__": "__noetl_task__", "args": args, "_prev": prev, **args}
    exec(compiled, namespace)
    main = namespace.get("main")
    if callable(main):
        return _call_main(main, args)
    return namespace.get("result")


async def run_python(config: dict[str, Any], ctx: ToolContext) -> Outcome:
    code = config.get("code")
    if not isinstance(code, str):
        return Outcome.fail("config_error", "python task needs 'code' (a string)")
    args = config.get("args") or {}
    if not isinstance(args, dict):
        return Outcome.fail(
            "config_error", f"python task 'args' must render to a mapping, got {type(args).__name__}"
        )
    args = copy.deepcopy(args)
    filename = f"<{ctx.step}.{ctx.task}>"
    try:
        _compile(code, filename)
    except SyntaxError as exc:
        return Outcome.fail(
            "SyntaxError", f"line {exc.lineno}: {exc.msg}", py={"exception_type": "SyntaxError"}
        )
    try:
        value = await asyncio.to_thread(_execute, code, filename, args, copy.deepcopy(ctx.prev))
    except Exception as exc:
        tb = traceback.extract_tb(exc.__traceback__)
        line = next((f.lineno for f in reversed(tb) if f.filename == filename), None)
        where = f" (line {line})" if line else ""
        return Outcome.fail(
            type(exc).__name__,
            f"{type(exc).__name__}: {exc}{where}",
            py={"exception_type": type(exc).__name__, "line": line},
        )
    return Outcome.ok(json_safe(value), py={})
