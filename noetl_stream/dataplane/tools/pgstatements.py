"""The statements a ``postgres`` task runs, prepared through the connection's statement cache.

A task's statement is prepared first so that its columns are known even when no row comes back
(postgres.py). ``Connection.prepare`` prepares afresh every time: each task cost three round trips where
a direct ``pool.execute`` costs one (the parse, the execution, and the close of the previous task's
statement). `run_prepared` takes the statement from the connection's own statement cache instead — the
one ``execute`` and ``fetch`` use, kept across a pool's acquisitions, bounded by ``statement_cache_size``
— through asyncpg's ``Connection._prepare(use_cache=True)``; a loop of inserts parses its statement once
per pooled connection. (A version of asyncpg without it: ``prepare``, as before.)

As asyncpg does for ``execute`` and ``fetch``: a statement whose plan the server refuses (its result
type changed since it was prepared: ``ALTER TABLE``, ``search_path``) is prepared again and run once
more, unless a transaction is open (the error aborted it: the error stands); one whose rows no longer
decode (a type altered) ran already: the error stands. Either way the connection's cached statements
and types are dropped (``reload_schema_state``) and the next task prepares it afresh. A value the cached
plan's parameter types refuse (a column's type changed since) is checked against the statement prepared
afresh: when its parameter types differ, the task runs with those (one statement outside a transaction
only: nothing of it ran).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg

__all__ = ["run_prepared"]

T = TypeVar("T")


async def run_prepared(
    conn: Any, sql: str, timeout: float | None, run: Callable[[Any], Awaitable[T]], *, once: bool = True
) -> T:
    """`run` with `sql` prepared on `conn` (a connection, or a pool's proxy of one), from its cache.
    `once`: what `run` does fails whole or not at all (one statement, not ``many`` rows), so a failure it
    raised may be retried."""
    statement = await _prepared(conn, sql, timeout)
    try:
        return await run(statement)
    except asyncpg.exceptions.OutdatedSchemaCacheError:
        await conn.reload_schema_state()  # (found decoding its rows: it ran, so it is not run again)
        raise
    except asyncpg.exceptions.InvalidCachedStatementError:
        await conn.reload_schema_state()  # (refused before it ran)
        if conn.is_in_transaction():
            raise
        return await run(await _prepared(conn, sql, timeout))
    except asyncpg.exceptions.DataError:
        # A value its parameters' types refuse: the types of a plan prepared before a column's type
        # changed (ALTER COLUMN ... TYPE) are stale, and the refusal is the client's, before the server
        # sees the statement. Prepared afresh, the types differ: run with those. Otherwise the error
        # stands (the value is wrong), at the cost of one more parse.
        if not once or conn.is_in_transaction() or not await _types_changed(conn, sql, statement, timeout):
            raise
        await conn.reload_schema_state()
        return await run(await _prepared(conn, sql, timeout))


async def _types_changed(conn: Any, sql: str, statement: Any, timeout: float | None) -> bool:
    """Whether `sql` prepared now takes other parameter types than `statement` (the cache's) did."""
    fresh = await conn.prepare(sql, timeout=timeout)
    return [t.oid for t in fresh.get_parameters()] != [t.oid for t in statement.get_parameters()]


async def _prepared(conn: Any, sql: str, timeout: float | None) -> Any:
    cached = getattr(conn, "_prepare", None)
    if cached is None:
        return await conn.prepare(sql, timeout=timeout)
    return await cached(sql, timeout=timeout, use_cache=True)
