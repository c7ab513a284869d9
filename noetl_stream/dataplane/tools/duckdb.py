"""``duckdb``: SQL with bound parameters, run off the event loop.

Tasks of one pipeline run share one in-memory database (so a ``command`` can
create a table a later ``query`` reads); give ``db_path`` for a database file.
"""

from __future__ import annotations

import asyncio
from typing import Any

import duckdb

from noetl_stream.dataplane.outcome import Outcome, json_safe
from noetl_stream.dataplane.tools.base import ToolContext

_RESOURCE = "duckdb.memory"


def _connection(config: dict[str, Any], ctx: ToolContext) -> Any:
    db_path = config.get("db_path")
    if db_path:
        return duckdb.connect(str(db_path))
    conn = ctx.resources.get(_RESOURCE)
    if conn is None:
        conn = duckdb.connect(":memory:")
        ctx.resources[_RESOURCE] = conn
    return conn.cursor()


def _run(sql: str, params: Any, config: dict[str, Any], ctx: ToolContext) -> Any:
    conn = _connection(config, ctx)
    try:
        cur = conn.execute(sql, params) if params is not None else conn.execute(sql)
        if cur.description is None:
            return {"status": "ok"}
        columns = [d[0] for d in cur.description]
        return [dict(zip(columns, row, strict=False)) for row in cur.fetchall()]
    finally:
        conn.close()


async def run_duckdb(config: dict[str, Any], ctx: ToolContext) -> Outcome:
    sql = config.get("query") or config.get("command")
    if not isinstance(sql, str) or not sql.strip():
        return Outcome.fail("config_error", "duckdb task needs 'query' or 'command' (SQL text)")
    params = config.get("params")
    if params is not None and not isinstance(params, (list, dict)):
        return Outcome.fail("config_error", "duckdb 'params' must be a list or a mapping")
    try:
        rows = await asyncio.to_thread(_run, sql, params, config, ctx)
    except duckdb.Error as exc:
        return Outcome.fail(
            "duckdb_error", str(exc).splitlines()[0], duckdb={"error_type": type(exc).__name__}
        )
    return Outcome.ok(json_safe(rows))


def close_resources(resources: dict[str, Any]) -> None:
    conn = resources.pop(_RESOURCE, None)
    if conn is not None:
        conn.close()
