"""``duckdb``: SQL with bound parameters, run off the event loop.

A task gives ``query`` or ``command`` (SQL text; not both). Tasks of one pipeline run share one
in-memory database (so a ``command`` can create a table a later ``query`` reads); give ``db_path`` for
a database file. A statement cut short (the task's ``timeout_s``, a cancelled step) is interrupted.

``attach`` adds database files under an alias before the statement runs: a list of
``{path, alias, read_only}`` (or bare paths, aliased by their file stem), e.g.
``attach: [{path: /data/ref.duckdb, alias: ref, read_only: true}]`` then
``SELECT * FROM ref.main.cities``. Attaching is idempotent (``ATTACH IF NOT EXISTS``).

Large results: a ``query`` result travels in the task's events, which have a size limit
(the worker turns an oversized result into a ``result_too_large`` error). Keep results
small: aggregate in SQL, or write the data to a file (``COPY (...) TO 'out.parquet'``) or
to a table in ``db_path`` and return its path or row count as the result.

A row is a mapping of column names: a result with two columns of one name (``SELECT 1 AS a, 2 AS a``,
a join's two ``id`` columns) fails with ``DuplicateColumnsError`` (a ``duckdb_error``) naming them,
rather than losing a value.

``TIMESTAMP WITH TIME ZONE`` values come back as ISO text with their offset (DuckDB hands them to
Python through ``pytz``, a dependency for that reason). ``JSON`` values are decoded (also in lists,
arrays, structs and map values), as the postgres tool decodes ``json``/``jsonb``; a ``DECIMAL`` is a
number the way postgres's ``numeric`` is (`json_safe`: an integer when whole and below 2^53, else a float).

A text of several ``;``-separated statements runs them in order, each committed as it ends, up to the
first that fails; the result is the last statement's (DuckDB's ``execute``), and ``params`` bind the
last statement only.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import msgspec

from noetl_stream.dataplane.outcome import INFINITE_DATETIMES, Outcome, json_safe, sql_infinity
from noetl_stream.dataplane.tools.base import DuplicateColumnsError, ToolContext, check_columns

_RESOURCE = "duckdb.memory"
_ALIAS_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _AttachError(ValueError):
    pass


def _attach_statements(raw: Any) -> list[str]:
    """``ATTACH`` statements for the ``attach`` config (paths are SQL literals, aliases identifiers)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _AttachError("'attach' must be a list of {path, alias, read_only}")
    out = []
    for i, item in enumerate(raw):
        spec = {"path": item} if isinstance(item, str) else item
        if not isinstance(spec, dict) or not isinstance(spec.get("path"), str) or not spec["path"]:
            raise _AttachError(f"attach[{i}] needs 'path' (a database file)")
        path = str(spec["path"])
        alias = spec.get("alias") or Path(path).stem
        if not isinstance(alias, str) or not _ALIAS_RE.fullmatch(alias):
            raise _AttachError(f"attach[{i}]: alias {alias!r} must be an identifier (letters, digits, '_')")
        literal = "'" + path.replace("'", "''") + "'"
        options = " (READ_ONLY)" if spec.get("read_only") else ""
        out.append(f'ATTACH IF NOT EXISTS {literal} AS "{alias}"{options}')
    return out


def _connection(config: dict[str, Any], ctx: ToolContext) -> Any:
    db_path = config.get("db_path")
    if db_path:
        return duckdb.connect(str(db_path))
    conn = ctx.resources.get(_RESOURCE)
    if conn is None:
        conn = duckdb.connect(":memory:")
        ctx.resources[_RESOURCE] = conn
    return conn.cursor()


def _json_value(text: Any) -> Any:
    """A value of a ``JSON`` column decoded (DuckDB gives its text); text that does not decode (a number
    out of range like ``1e400``) stays text."""
    if not isinstance(text, str):
        return text
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError:
        return text


def _json_decoder(kind: Any) -> Callable[[Any], Any] | None:
    """How to decode the ``JSON`` values in a value of the DuckDB type `kind`: a ``JSON`` column, or one
    holding ``JSON`` in a list, an array, a struct or a map's values; None when it holds none."""
    if str(kind) == "JSON":
        return _json_value
    nested = getattr(kind, "id", None)
    if nested in ("list", "array"):
        item = _json_decoder(dict(kind.children)["child"])
        if item is not None:
            return lambda v: v if v is None else [item(x) for x in v]
    elif nested == "struct":
        fields = {name: f for name, sub in kind.children if (f := _json_decoder(sub)) is not None}
        if fields:
            return lambda v: (
                v
                if not isinstance(v, dict)
                else {k: fields[k](x) if k in fields else x for k, x in v.items()}
            )
    elif nested == "map":
        value = _json_decoder(dict(kind.children)["value"])
        if value is not None:
            return lambda v: v if not isinstance(v, dict) else {k: value(x) for k, x in v.items()}
    return None


def _run(conn: Any, sql: str, params: Any, attach: list[str]) -> Any:
    try:
        for statement in attach:
            conn.execute(statement)
        cur = conn.execute(sql, params) if params is not None else conn.execute(sql)
        if cur.description is None:
            return {"status": "ok"}
        columns = [d[0] for d in cur.description]
        check_columns(columns)
        # JSON values decoded, as the postgres tool decodes json/jsonb (DuckDB gives their text).
        decoders = [_json_decoder(d[1]) or _as_is for d in cur.description]
        return [
            {
                c: sql_infinity(decode(v), INFINITE_DATETIMES)
                for c, decode, v in zip(columns, decoders, row, strict=False)
            }
            for row in cur.fetchall()
        ]
    finally:
        conn.close()


def _as_is(value: Any) -> Any:
    return value


async def run_duckdb(config: dict[str, Any], ctx: ToolContext) -> Outcome:
    if config.get("query") is not None and config.get("command") is not None:
        return Outcome.fail("config_error", "duckdb task: give 'query' or 'command', not both")
    sql = config.get("query") if config.get("query") is not None else config.get("command")
    if not isinstance(sql, str) or not sql.strip():
        return Outcome.fail("config_error", "duckdb task needs 'query' or 'command' (SQL text)")
    if config.get("db_path") is not None and not isinstance(config["db_path"], str):
        return Outcome.fail("config_error", "duckdb 'db_path' must be a database file path (a string)")
    params = config.get("params")
    if params is not None and not isinstance(params, (list, dict)):
        return Outcome.fail("config_error", "duckdb 'params' must be a list or a mapping")
    try:
        attach = _attach_statements(config.get("attach"))
    except _AttachError as exc:
        return Outcome.fail("config_error", str(exc))
    try:
        conn = await asyncio.to_thread(_connection, config, ctx)
        try:
            rows = await asyncio.to_thread(_run, conn, sql, params, attach)
        except asyncio.CancelledError:  # a timeout: stop the statement, else it runs on in its thread
            with contextlib.suppress(duckdb.Error):  # already finished and closed: nothing to stop
                conn.interrupt()
            raise
    except (duckdb.Error, DuplicateColumnsError) as exc:
        return Outcome.fail(
            "duckdb_error", str(exc).splitlines()[0], duckdb={"error_type": type(exc).__name__}
        )
    return Outcome.ok(json_safe(rows))


def close_resources(resources: dict[str, Any]) -> None:
    conn = resources.pop(_RESOURCE, None)
    if conn is not None:
        try:
            conn.interrupt()  # a statement cut short by a timeout may still be finishing
            conn.close()
        except duckdb.Error:
            pass  # still busy: the database is freed with its last cursor
