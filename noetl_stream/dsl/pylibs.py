"""A ``python`` task's ``libs:``: the imports its ``code`` runs with, checked here and read by the worker.

``libs`` maps a name bound in the code to what it imports::

    libs:
      pd: pandas                               # import pandas as pd
      json: json                               # import json
      dt: {from: datetime, import: datetime}   # from datetime import datetime as dt

The compiler reports every malformed entry at its place (`check_libs`); the worker reads the rendered
mapping with `lib_imports`, which raises ``ValueError`` for the first problem (a template may have
rendered to anything).
"""

from __future__ import annotations

import keyword
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from noetl_stream.dsl.diagnostics import Path

if TYPE_CHECKING:
    from noetl_stream.dsl.compiler import Compiler

SHAPE = "{pd: pandas} or {dt: {from: datetime, import: datetime}}"


class LibImport(NamedTuple):
    alias: str
    """The name the code sees."""
    module: str
    name: str | None = None
    """``from <module> import <name> as <alias>``; None: ``import <module> as <alias>``."""


def _name(text: Any) -> bool:
    return isinstance(text, str) and text.isidentifier() and not keyword.iskeyword(text)


def _module(text: Any) -> bool:
    return isinstance(text, str) and all(_name(part) for part in text.split("."))


def _never(value: Any) -> bool:
    return False


def lib_problems(libs: Any, skip: Callable[[Any], bool] = _never) -> list[tuple[tuple[str, ...], str, bool]]:
    """``(path below 'libs', message, at_key)`` of every malformed entry; values `skip` accepts (the
    compiler's templates) are not checked."""
    if skip(libs):
        return []
    if not isinstance(libs, dict):
        return [((), f"'libs' must be a mapping of names to modules: {SHAPE}", False)]
    problems: list[tuple[tuple[str, ...], str, bool]] = []
    for alias, target in libs.items():
        where = (str(alias),)
        if not _name(alias):
            problems.append(
                (where, f"libs name {alias!r} must be a Python identifier (the code reads it)", True)
            )
        if skip(target):
            continue
        if isinstance(target, dict):
            for key in target:
                if key not in ("from", "import"):
                    problems.append(
                        (
                            (*where, str(key)),
                            f"libs '{alias}': unknown key '{key}' (use 'from' and 'import')",
                            True,
                        )
                    )
            for key, valid, what in (("from", _module, "a module name"), ("import", _name, "a name")):
                if key not in target:
                    problems.append((where, f"libs '{alias}': missing '{key}' ({SHAPE})", True))
                elif not skip(target[key]) and not valid(target[key]):
                    problems.append(
                        ((*where, key), f"libs '{alias}': '{key}' must be {what}, got {target[key]!r}", False)
                    )
        elif not _module(target):
            problems.append(
                (where, f"libs '{alias}' must be a module name or {{from, import}}, got {target!r}", False)
            )
    return problems


def lib_imports(libs: Any) -> list[LibImport]:
    """The imports of a rendered ``libs`` (None: none); ``ValueError`` for a malformed one."""
    if libs is None:
        return []
    problems = lib_problems(libs)
    if problems:
        raise ValueError(problems[0][1])
    return [
        LibImport(alias, t["from"], t["import"]) if isinstance(t, dict) else LibImport(alias, t)
        for alias, t in libs.items()
    ]


def check_libs(c: Compiler, raw: dict[str, Any], path: Path, who: str) -> bool:
    """Report a python task's malformed ``libs`` (and ``libs`` beside ``module``); true when it is fine."""
    if "libs" not in raw:
        return True
    ok = True
    if "module" in raw:
        c.error(
            (*path, "libs"),
            f"{who}: 'libs' imports names into 'code'; a 'module' function imports what it needs itself",
            at_key=True,
        )
        ok = False
    for rel, message, at_key in lib_problems(raw["libs"], c.is_template):
        c.error((*path, "libs", *rel), f"{who}: {message}", at_key=at_key)
        ok = False
    return ok
