"""000/004 ``sink``: a tool call that stores data, as an ordinary task of a storage kind (003 §10).

``sink: {tool: {kind: postgres, auth: pg, table: t}, args: {a: ..., b: ...}}`` inserts one row with
the rendered ``args`` as columns: ``INSERT INTO t ("a", "b") VALUES ($1, $2)`` with bound params.
A sink that gives its own ``command``/``query`` keeps it; its ``args`` are inlined where the SQL
template reads them (``{{ args.a }}`` or ``{{ a }}``).
"""

from __future__ import annotations

import re
from typing import Any

from noetl_stream.dsl.diagnostics import Path
from noetl_stream.dsl.legacy.context import Translation, UntranslatableError
from noetl_stream.dsl.rewrite import Rewrite, as_expression, rewrite_value

TABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")
SQL_KINDS = ("postgres", "duckdb")
DEFAULT_DB = "noetl_db"
"""The credential a legacy ``postgres`` task without ``auth`` is given: legacy NoETL ran such tasks
on its own system database."""


def sink_task(t: Translation, raw: Any, path: Path, who: str, name: str) -> dict[str, Any]:
    """The task a legacy ``sink`` block stands for (templates not yet rewritten)."""
    if not isinstance(raw, dict):
        raise t.error(path, f"{who}: 'sink' must be a mapping with 'tool' (and 'args')")
    tool = raw.get("tool")
    rest = {k: v for k, v in raw.items() if k not in ("tool", "args")}
    if tool is None:
        tool, rest = rest, {}
    if not isinstance(tool, dict) or "kind" not in tool:
        raise t.error(path, f"{who}: 'sink' needs 'tool: {{kind: ...}}'")
    if rest:
        raise t.error(
            (*path, next(iter(rest))),
            f"{who}: sink key '{next(iter(rest))}' has no canonical translation (a sink is a task: "
            "'tool' and 'args')",
        )
    args = raw.get("args") or {}
    if not isinstance(args, dict):
        raise t.error((*path, "args"), f"{who}: sink 'args' must be a mapping")
    task: dict[str, Any] = {"name": name, **{k: v for k, v in tool.items() if k != "table"}}
    kind = tool.get("kind")
    table = tool.get("table")
    if table is not None:
        if kind not in SQL_KINDS:
            raise t.error(
                (*path, "tool", "table"),
                f"{who}: sink 'table' is translated for {', '.join(SQL_KINDS)} only, not kind '{kind}'",
            )
        if not isinstance(table, str) or not TABLE.match(table):
            raise t.error((*path, "tool", "table"), f"{who}: sink table {table!r} must be a plain table name")
        if "command" in tool or "query" in tool:
            raise t.error((*path, "tool", "table"), f"{who}: sink has both 'table' and SQL; keep one")
        if not args:
            raise t.error(path, f"{who}: a sink into table '{table}' needs 'args' (the columns)")
        cols = ", ".join('"' + str(c).replace('"', '""') + '"' for c in args)
        marks = ", ".join(f"${i + 1}" for i in range(len(args)))
        task["command"] = f"INSERT INTO {table} ({cols}) VALUES ({marks})"
        task["params"] = list(args.values())
        t.warn(
            (*path, "tool", "table"),
            f"{who}: legacy sink into table '{table}' translated to a '{kind}' task '{name}' "
            f"running INSERT with the args as bound parameters",
        )
    elif kind in SQL_KINDS and ("command" in tool or "query" in tool):
        inline: dict[str, str] = {}
        for key, value in args.items():
            expr = as_expression(value)
            if expr is None:
                raise t.error((*path, "args", key), f"{who}: sink arg '{key}' cannot be inlined in the SQL")
            inline[str(key)] = expr
        rw = Rewrite(names=inline, attrs={("args", k): v for k, v in inline.items()})
        for key in ("command", "query"):
            if key in task:
                task[key] = rewrite_value(task[key], rw)
        t.warn(path, f"{who}: legacy sink translated to a '{kind}' task '{name}' (args inlined in its SQL)")
    else:
        if args:
            task["args"] = args
        t.warn(path, f"{who}: legacy sink translated to a '{kind}' task '{name}'")
    default_auth(t, task, path, who)
    return t.mark(task, path)


def default_auth(t: Translation, task: dict[str, Any], path: Path, who: str) -> None:
    """A legacy ``postgres`` task without ``auth``/``dsn`` ran on NoETL's own database: name it. (A task
    with ``credential:``, NoETL's spelling of ``auth:``, names its own.)"""
    if task.get("kind") == "postgres" and not {"auth", "credential", "dsn"} & task.keys():
        task["auth"] = DEFAULT_DB
        t.keychain.setdefault(DEFAULT_DB, "postgres_credential")
        t.warn(
            path,
            f"{who}: a legacy postgres task without 'auth' ran on NoETL's own database; translated "
            f"to 'auth: {DEFAULT_DB}' (declared in the root keychain: store that database's "
            f"credential under this name)",
        )


__all__ = ["DEFAULT_DB", "UntranslatableError", "default_auth", "sink_task"]
