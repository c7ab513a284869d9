"""``duckdb``: SQL with bound parameters, run off the event loop.

SQL: ``query`` or ``command`` (a text), or ``commands``/``cmds`` (a list of texts, or one); one of the
four. A text may hold several ``;``-separated statements, split by DuckDB's own parser (strings,
quoted identifiers, dollar quotes and comments stay whole) and run in order, each committed as it
ends (``BEGIN; ...; COMMIT;`` for all or nothing), up to the first that fails. ``params`` (a list for
``?``/``$1``, a mapping for ``$name``) bind a task of one statement only: with more, a ``config_error``.

The result is NoETL's (`sqlresult`): the last statement's ``{rows, row_count, columns}`` when it
returns rows, else ``{row_count, affected_rows, message}`` (``message`` our own text: ``INSERT 3``,
``CREATE``, ``DROP``, ...), plus ``command_<i>`` with each statement's own result.

Database: ``database`` (or ``db_path``, its older name) is a file path; ``database: ":memory:"`` an
in-memory database that the tasks of one pipeline run share. Without it, the execution's own file
(`duckdbfiles`): tables survive from step to step of one execution, never into another. A file is
opened for a task and closed at its end (in the task's thread, so that its checkpoint never blocks the
event loop), which lets another process open it between tasks; a task of another process that finds
it open fails with a retryable ``duckdb_error`` (its lock). A statement cut short (the task's
``timeout_s``, a cancelled step) is interrupted.

``attach`` adds database files under an alias before the statements run: a list of
``{path, alias, read_only}`` (or bare paths, aliased by their file stem), e.g.
``attach: [{path: /data/ref.duckdb, alias: ref, read_only: true}]`` then
``SELECT * FROM ref.main.cities``. Attaching is idempotent (``ATTACH IF NOT EXISTS``).

A row is a mapping of column names: a result with two columns of one name (``SELECT 1 AS a, 2 AS a``,
a join's two ``id`` columns) fails with ``DuplicateColumnsError`` (a ``duckdb_error``) naming them,
rather than losing a value.

``TIMESTAMP WITH TIME ZONE`` values come back as ISO text with their offset (DuckDB hands them to
Python through ``pytz``, a dependency for that reason). ``JSON`` values are decoded (also in lists,
arrays, structs and map values), as the postgres tool decodes ``json``/``jsonb``; a ``DECIMAL`` is a
number the way postgres's ``numeric`` is (`json_safe`: an integer when whole and below 2^53, else a float).
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
from noetl_stream.dataplane.tools import duckdbfiles
from noetl_stream.dataplane.tools.base import DuplicateColumnsError, ToolContext, check_columns
from noetl_stream.dataplane.tools.sqlresult import command_result, rows_result, task_result
from noetl_stream.errors import NoetlError

MEMORY = ":memory:"
_RESOURCE = "duckdb.memory"
SQL_KEYS = ("query", "command", "commands", "cmds")
_COUNTED = {"INSERT": "INSERT", "UPDATE": "UPDATE", "DELETE": "DELETE", "COPY": "COPY", "MERGE_INTO": "MERGE"}
"""Statement types whose result is one ``Count`` (the rows changed) unless they have ``RETURNING``;
``CREATE`` gives one too (the rows of a ``CREATE TABLE ... AS``)."""
_ALIAS_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _ConfigError(NoetlError, ValueError):
    pass


class _AttachError(_ConfigError):
    pass


class _StatementError(NoetlError):
    """A statement of the task failed: `index` is its number (``command_<i>``)."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(str(error))
        self.index = index
        self.error = error


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


def _texts(config: dict[str, Any]) -> list[str]:
    """The task's SQL texts (each may hold several statements)."""
    given = [k for k in SQL_KEYS if config.get(k) is not None]
    if not given:
        raise _ConfigError("duckdb task needs 'query', 'command', 'commands' or 'cmds' (SQL text)")
    if len(given) > 1:
        raise _ConfigError(f"duckdb task: give {' or '.join(repr(k) for k in given)}, not both")
    key = given[0]
    value = config[key]
    listed = key in ("commands", "cmds")
    texts = value if listed and isinstance(value, list) else [value]
    if not texts or not all(isinstance(t, str) and t.strip() for t in texts):
        shape = "SQL text or a non-empty list of SQL texts" if listed else "SQL text"
        raise _ConfigError(f"duckdb '{key}' must be {shape}")
    return texts


def _database(config: dict[str, Any]) -> str | None:
    """The database file the task gives (``database``, or ``db_path``), None for the execution's."""
    given = [k for k in ("database", "db_path") if config.get(k) is not None]
    if len(given) > 1:
        raise _ConfigError("duckdb task: give 'database' or 'db_path' (its older name), not both")
    if not given:
        return None
    value = config[given[0]]
    if not isinstance(value, str) or not value:
        raise _ConfigError(f"duckdb '{given[0]}' must be a database file path (a string)")
    return value


def _connection(database: str | None, ctx: ToolContext, keep_for: float) -> Any:
    """A connection for one task: a cursor of the pipeline's in-memory database, or the file's own."""
    if database == MEMORY:
        conn = ctx.resources.get(_RESOURCE)
        if conn is None:
            conn = duckdb.connect(MEMORY)
            ctx.resources[_RESOURCE] = conn
        return conn.cursor()
    if database is not None:
        return duckdb.connect(database)
    path = duckdbfiles.execution_file(ctx.execution_id)
    duckdbfiles.prepare(path, keep_for)
    return duckdb.connect(str(path))


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


def _run(conn: Any, texts: list[str], params: Any, attach: list[str]) -> list[dict[str, Any]]:
    """Run the statements of `texts` on `conn` (closed at the end) and give their results."""
    try:
        for statement in attach:
            conn.execute(statement)
        statements = [st for text in texts for st in conn.extract_statements(text)]
        if not statements:
            raise _ConfigError("duckdb task holds no SQL statement (only comments or ';')")
        if params is not None and len(statements) > 1:
            raise _ConfigError(
                f"duckdb task holds {len(statements)} statements and 'params' bind one: give the "
                "statements their values in tasks of their own"
            )
        results = []
        for i, st in enumerate(statements):
            try:
                cur = conn.execute(st, params) if params is not None else conn.execute(st)
                results.append(json_safe(_result(cur, st)))
            except (duckdb.Error, DuplicateColumnsError) as exc:
                raise _StatementError(i, exc) from exc
        return results
    finally:
        conn.close()


def _result(cur: Any, statement: Any) -> dict[str, Any]:
    """One statement's result (`sqlresult`)."""
    kind = statement.type.name
    description = cur.description
    shape = [(d[0], str(d[1])) for d in description or ()]
    if kind in (*_COUNTED, "CREATE") and shape == [("Count", "BIGINT")] and not _returning(statement.query):
        row = cur.fetchone()
        count = int(row[0]) if row else 0
        if kind == "CREATE":
            return command_result(count, f"CREATE {count}" if row else "CREATE")
        return command_result(count, f"{_COUNTED[kind]} {count}")
    if description is None or (shape == [("Success", "BOOLEAN")] and kind != "SELECT"):
        return command_result(0, kind)  # BEGIN, SET, DROP, ATTACH, CHECKPOINT: nothing changed or returned
    columns = [d[0] for d in description]
    check_columns(columns)
    # JSON values decoded, as the postgres tool decodes json/jsonb (DuckDB gives their text).
    decoders = [_json_decoder(d[1]) or _as_is for d in description]
    rows = [
        {
            c: sql_infinity(decode(v), INFINITE_DATETIMES)
            for c, decode, v in zip(columns, decoders, row, strict=False)
        }
        for row in cur.fetchall()
    ]
    return rows_result(columns, rows)


def _returning(sql: str) -> bool:
    """Whether the statement has a ``RETURNING`` clause (a keyword, not a word in a string)."""
    tokens = duckdb.tokenize(sql)
    ends = [offset for offset, _ in tokens[1:]] + [len(sql)]
    return any(
        kind == duckdb.token_type.keyword and sql[offset:end].strip().upper() == "RETURNING"
        for (offset, kind), end in zip(tokens, ends, strict=True)
    )


def _as_is(value: Any) -> Any:
    return value


async def run_duckdb(config: dict[str, Any], ctx: ToolContext) -> Outcome:
    params = config.get("params")
    try:
        texts = _texts(config)
        database = _database(config)
        if params is not None and not isinstance(params, (list, dict)):
            raise _ConfigError("duckdb 'params' must be a list or a mapping")
        attach = _attach_statements(config.get("attach"))
        keep_for = duckdbfiles.max_age() if database is None else 0.0
    except ValueError as exc:  # _ConfigError, or a NOETL_DUCKDB_MAX_AGE_S that is no number
        return Outcome.fail("config_error", str(exc))
    try:
        conn = await asyncio.to_thread(_connection, database, ctx, keep_for)
        try:
            results = await asyncio.to_thread(_run, conn, texts, params, attach)
        except asyncio.CancelledError:  # a timeout: stop the statement, else it runs on in its thread
            with contextlib.suppress(duckdb.Error):  # already finished and closed: nothing to stop
                conn.interrupt()
            raise
    except _ConfigError as exc:
        return Outcome.fail("config_error", str(exc))
    except _StatementError as exc:
        return _error(exc.error, exc.index)
    except (duckdb.Error, DuplicateColumnsError) as exc:
        return _error(exc, None)
    return Outcome.ok(task_result(results), duckdb={"statements": len(results)})


def _error(exc: BaseException, statement: int | None) -> Outcome:
    """``duckdb_error`` (the first line of DuckDB's message); retryable when another process holds the
    database file (it may have closed it when the task runs again)."""
    helpers: dict[str, Any] = {"error_type": type(exc).__name__}
    if statement is not None:
        helpers["statement"] = statement
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    locked = isinstance(exc, duckdb.IOException) and "Could not set lock" in message
    return Outcome.fail("duckdb_error", message, retryable=locked, duckdb=helpers)


def close_resources(resources: dict[str, Any]) -> None:
    conn = resources.pop(_RESOURCE, None)
    if conn is not None:
        try:
            conn.interrupt()  # a statement cut short by a timeout may still be finishing
            conn.close()
        except duckdb.Error:
            pass  # still busy: the database is freed with its last cursor
