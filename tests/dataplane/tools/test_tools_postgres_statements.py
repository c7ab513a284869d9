"""A connection keeps the statements ``postgres`` tasks prepared on it in its statement cache (pgstatements.py): a loop of
the same statement parses it once per connection, and a statement whose plan a schema change made stale
is prepared again, as asyncpg does for its own cache."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from helpers import credentials
from pgserver import PgServer

from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.dataplane.tools.base import ToolContext, WorkerServices
from noetl_stream.dataplane.tools.postgres import run_postgres

ONE_CONNECTION = {"pool_size": 1}
"""Every task on the same pooled connection (what a statement kept on it is seen by)."""


@pytest.fixture
async def services(pg: PgServer) -> AsyncIterator[WorkerServices]:
    svc = WorkerServices(credentials=credentials({"pg": {"kind": "postgres_credential", **pg.credential()}}))
    yield svc
    await svc.close()


@pytest.fixture
async def table(services: WorkerServices) -> str:
    name = "t_" + uuid.uuid4().hex[:12]
    out = await pg(services, command=f"CREATE TABLE {name} (id int PRIMARY KEY, name text)")
    assert out.status == "ok", out.error
    return name


async def pg(services: WorkerServices, transaction: Any = None, **config: Any) -> Outcome:
    config.setdefault("auth", "pg")
    if transaction is not None:
        config["transaction"] = transaction
    ctx = ToolContext(execution_id="e1", step="s", task="t", spec=ONE_CONNECTION, services=services)
    return await run_postgres(config, ctx)


async def _prepared_here(services: WorkerServices) -> list[str]:
    out = await pg(services, query="SELECT statement FROM pg_prepared_statements ORDER BY prepare_time")
    assert out.status == "ok", out.error
    return [row["statement"] for row in out.result["rows"]]


async def test_a_statement_run_by_many_tasks_is_prepared_once_on_their_connection(
    services: WorkerServices, table: str
) -> None:
    insert = f"INSERT INTO {table} (id, name) VALUES ($1, $2)"
    for i in range(25):
        out = await pg(services, command=insert, params=[i, f"n{i}"])
        assert out.status == "ok", out.error
        assert out.result["row_count"] == 1
    prepared = await _prepared_here(services)
    assert prepared.count(insert) == 1
    count = await pg(services, query=f"SELECT count(*) AS n FROM {table}")
    assert count.result["rows"] == [{"n": 25}]


async def test_a_statement_a_schema_change_made_stale_is_prepared_again(
    services: WorkerServices, table: str
) -> None:
    select = f"SELECT * FROM {table} ORDER BY id"
    await pg(services, command=f"INSERT INTO {table} (id, name) VALUES (1, 'a')")
    before = await pg(services, query=select)
    assert before.result["rows"] == [{"id": 1, "name": "a"}]
    altered = await pg(services, command=f"ALTER TABLE {table} ADD COLUMN extra int DEFAULT 7")
    assert altered.status == "ok", altered.error
    after = await pg(services, query=select)  # its kept plan returns two columns: the server refuses it
    assert after.status == "ok", after.error
    assert after.result["rows"] == [{"id": 1, "name": "a", "extra": 7}]


async def test_inside_a_transaction_a_stale_statement_fails_the_task_and_the_next_prepares_it_again(
    services: WorkerServices, table: str
) -> None:
    select = f"SELECT * FROM {table} ORDER BY id"
    assert (await pg(services, query=select)).status == "ok"
    await pg(services, command=f"ALTER TABLE {table} ADD COLUMN extra int DEFAULT 7")
    failed = await pg(services, query=select, transaction=True)
    assert failed.status == "error"
    assert failed.error is not None and failed.error["kind"] == "pg_error"
    again = await pg(services, query=select, transaction=True)
    assert again.status == "ok", again.error
    assert again.result["columns"] == ["id", "name", "extra"]


async def test_a_column_whose_type_changed_takes_the_values_of_its_new_type(
    services: WorkerServices, table: str
) -> None:
    """The statement kept by the connection has the parameter types of when it was prepared (int): a
    text value is refused on the client, before the server sees it. Prepared afresh, its types differ:
    the task runs with those, as it did when every task prepared its statement."""
    insert = f"INSERT INTO {table} (id, name) VALUES ($1, $2)"
    assert (await pg(services, command=insert, params=[1, "a"])).status == "ok"
    altered = await pg(services, command=f"ALTER TABLE {table} ALTER COLUMN name TYPE int USING 0")
    assert altered.status == "ok", altered.error
    out = await pg(services, command=insert, params=[2, 7])
    assert out.status == "ok", out.error
    wrong = await pg(services, command=insert, params=[3, "not a number"])  # (a value that is wrong)
    assert wrong.status == "error" and wrong.error is not None and wrong.error["kind"] == "pg_error"
    rows = await pg(services, query=f"SELECT id, name FROM {table} ORDER BY id")
    assert rows.result["rows"] == [{"id": 1, "name": 0}, {"id": 2, "name": 7}]
