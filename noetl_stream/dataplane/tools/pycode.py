"""A ``python`` task's ``code``: the names it runs with, how it is compiled, the traceback of its error.

Names, from first to last (a later one hides an earlier one): the pre-imported modules `PREIMPORTED`;
the inputs (``args``/``input`` keys, each a global) with the whole mapping as ``args`` and
``input_data``, and ``_prev``; the ``libs`` imports.

Code with a top-level ``return`` (as NoETL's Rust engine runs it) is compiled as the body of a function
whose keyword parameters are those inputs, so assigning to an input name works as it does at the top
level of a module, and its return value is the result. Its other top-level names are that function's
locals: functions it defines see them as closures. Falling off its end gives the local ``result``
(None if there is none). Line numbers stay those of the code as written.
"""

from __future__ import annotations

import ast
import functools
import importlib
import keyword
import traceback
from collections.abc import Callable
from types import CodeType
from typing import Any, NamedTuple

from noetl_stream.dsl.pylibs import LibImport

PREIMPORTED = ("datetime", "json", "os", "sys", "uuid")
"""Modules bound under their own names in every task's code."""
RUNNER = "__noetl_task__"
"""The function code with a top-level ``return`` is compiled into (shown as ``<module>``)."""
_LOCALS = "__noetl_locals__"
TOP_LEVEL_RETURN = "'return' outside function"
FRAMES_KEPT = 30
TRACEBACK_LIMIT = 16 * 1024
LINE_LIMIT = 240


class Program(NamedTuple):
    code: CodeType
    params: tuple[str, ...] | None
    """The parameters of `RUNNER` (code with a top-level ``return``); None: code run as a module."""


def input_names(args: dict[str, Any], libs: list[LibImport]) -> tuple[str, ...]:
    """The input names code with a top-level ``return`` gets as parameters (those a lib does not hide)."""
    hidden = {lib.alias for lib in libs}
    names = [
        "args",
        "input_data",
        "_prev",
        *(k for k in args if k.isidentifier() and not keyword.iskeyword(k)),
    ]
    return tuple(sorted(set(names) - hidden))


@functools.lru_cache(maxsize=1024)
def compile_code(code: str, filename: str, params: tuple[str, ...]) -> Program:
    """Compile `code`; one with a top-level ``return`` is wrapped (`RUNNER`). Raises ``SyntaxError``."""
    try:
        return Program(compile(code, filename, "exec"), None)
    except SyntaxError as exc:
        if exc.msg != TOP_LEVEL_RETURN:
            raise
    tree = ast.parse(code, filename)
    future = 0  # `from __future__ import ...` must stay first in the module, outside the function
    while future < len(tree.body) and _is_future(tree.body[future]):
        future += 1
    header = f"def {RUNNER}(*, {', '.join(params)}): pass" if params else f"def {RUNNER}(): pass"
    runner = ast.parse(header).body[0]
    assert isinstance(runner, ast.FunctionDef)
    fallthrough = ast.parse(f"return {_LOCALS}().get('result')").body[0]
    last = (tree.body[-1].end_lineno or 1) if tree.body else 1
    for node in ast.walk(fallthrough):
        if hasattr(node, "lineno"):
            node.lineno = node.end_lineno = last  # type: ignore[attr-defined]
    runner.body = [*tree.body[future:], fallthrough]
    module = ast.Module(body=[*tree.body[:future], runner], type_ignores=[])
    return Program(compile(ast.fix_missing_locations(module), filename, "exec"), params)


def _is_future(node: ast.stmt) -> bool:
    return isinstance(node, ast.ImportFrom) and node.module == "__future__"


def _import(lib: LibImport) -> Any:
    """What `lib` binds; an error names the module (and the name) it could not import."""
    what = f"{lib.name!r} from '{lib.module}'" if lib.name is not None else f"'{lib.module}'"
    try:
        module = importlib.import_module(lib.module)
        if lib.name is None:
            return module
        try:
            return getattr(module, lib.name)
        except AttributeError:  # `from pkg import submodule`
            try:
                return importlib.import_module(f"{lib.module}.{lib.name}")
            except ModuleNotFoundError:
                message = f"'{lib.module}' has no attribute or submodule {lib.name!r}"
                raise ImportError(message, name=lib.module) from None
    except ImportError as exc:
        raise type(exc)(f"libs '{lib.alias}': cannot import {what}: {exc}", name=exc.name) from None
    except Exception as exc:  # the module's own code failed while it was imported
        raise ImportError(
            f"libs '{lib.alias}': importing {what} failed: {type(exc).__name__}: {exc}"
        ) from None


def namespace(args: dict[str, Any], prev: Any, libs: list[LibImport]) -> dict[str, Any]:
    """The globals task code runs with (the module docstring's order)."""
    ns: dict[str, Any] = {"__name__": "__noetl_task__", _LOCALS: locals}
    ns.update((name, importlib.import_module(name)) for name in PREIMPORTED)
    ns.update(args=args, input_data=args, _prev=prev)
    ns.update(args)
    for lib in libs:
        ns[lib.alias] = _import(lib)
    return ns


def run_program(program: Program, ns: dict[str, Any], call: Callable[[Callable[..., Any]], Any]) -> Any:
    """Run compiled code in `ns`; its result: `RUNNER`'s return value, else ``main`` called with `call`,
    else ``result``."""
    exec(program.code, ns)
    if program.params is not None:
        return ns[RUNNER](**{name: ns[name] for name in program.params})
    main = ns.get("main")
    if callable(main):
        return call(main)
    return ns.get("result")


def format_traceback(
    exc: BaseException, type_name: str, frames: list[traceback.FrameSummary], source: str | None
) -> str:
    """Python's traceback text for `exc` (of type `type_name`) with only `frames` (the task's own), the
    last `FRAMES_KEPT` of them, without its ``Traceback (most recent call last):`` header (a user reads
    it in the error, not as a crash of the worker); lines of `source` (the task's code) shown for its
    frames."""
    lines = source.splitlines() if source is not None else []
    out: list[str] = []
    if frames:
        if len(frames) > FRAMES_KEPT:
            out.append(f"  ... {len(frames) - FRAMES_KEPT} frames left out ...")
            frames = frames[-FRAMES_KEPT:]
        for f in frames:
            name = "<module>" if f.name == RUNNER else f.name
            out.append(f'  File "{f.filename}", line {f.lineno}, in {name}')
            text = f.line
            if source is not None and f.lineno is not None and 0 < f.lineno <= len(lines):
                text = lines[f.lineno - 1]
            if text and text.strip():
                out.append("    " + text.strip()[:LINE_LIMIT])
    if isinstance(exc, SyntaxError):
        out.extend(line.rstrip("\n") for line in traceback.format_exception_only(exc))
    else:
        try:
            text = str(exc)
        except Exception:
            text = f"<{type_name} whose str() failed>"
        out.append(f"{type_name}: {text}" if text else type_name)
    joined = "\n".join(out)
    return joined if len(joined) <= TRACEBACK_LIMIT else "...\n" + joined[-TRACEBACK_LIMIT:]
