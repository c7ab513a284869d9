"""The ``postgres`` tool, probe 67: parameter values never echoed in errors, pool size, floats for
``numeric`` parameters, values without a JSON form (geometry, infinite timestamps)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import msgspec
import pytest
from helpers import credentials
from pgserver import PgServer

from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.dataplane.tools.base import ToolContext, WorkerServices
from noetl_stream.dataplane.tools.postgres import run_postgres

# A keychain value a task passes as a parameter: the tool does not know it is a secret.
SECRET = "tok_live_4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e"


@pytest.fixture
async def services(pg: PgServer) -> AsyncIterator[WorkerServices]:
    creds = {"pg": {"kind": "postgres_credential", **pg.credential()}}
    svc = WorkerServices(credentials=credentials(creds))
    yield svc
    await svc.close()


@pytest.fixture
def table() -> str:
    return "t_" + uuid.uuid4().hex[:12]


async def pg_run(services: WorkerServices, spec: dict[str, Any] | None = None, **config: Any) -> Outcome:
    config.setdefault("auth", "pg")
    ctx = ToolContext(execution_id="e1", step="s", task="t", spec=spec or {}, services=services)
    return await run_postgres(config, ctx)


def _leaks(outcome: Outcome, value: str) -> list[str]:
    """The pieces of `value` of 6 or more characters that the outcome shows."""
    dump = msgspec.json.encode(outcome).decode()
    return [value[i : i + 6] for i in range(len(value) - 5) if value[i : i + 6] in dump]


@pytest.mark.parametrize(
    "sql",
    ["SELECT $1::int AS x", "SELECT $1::uuid AS x", "SELECT $1::date AS x", "SELECT $1::numeric AS x"],
)
async def test_a_refused_parameter_value_is_not_quoted_even_in_part(
    services: WorkerServices, sql: str
) -> None:
    out = await pg_run(services, query=sql, params=[SECRET])
    assert out.status == "error" and out.error is not None
    assert out.error["kind"] == "pg_error"
    assert "the value of parameter $1 does not fit its type" in out.error["message"]
    assert _leaks(out, SECRET) == []


async def test_a_refused_value_of_executemany_names_its_element_not_its_value(
    services: WorkerServices, table: str
) -> None:
    await pg_run(services, command=f"CREATE TABLE {table} (id int)")
    out = await pg_run(
        services, command=f"INSERT INTO {table} VALUES ($1)", many=True, params=[[1], [SECRET]]
    )
    assert out.status == "error" and out.error is not None
    assert "the value of parameter $1 of row #1 of many does not fit its type" in out.error["message"]
    assert _leaks(out, SECRET) == []


async def test_a_float_for_a_numeric_column_is_stored_as_written(
    services: WorkerServices, table: str
) -> None:
    await pg_run(services, command=f"CREATE TABLE {table} (n numeric, f float8, i int, j jsonb, a numeric[])")
    out = await pg_run(
        services,
        command=f"INSERT INTO {table} VALUES ($1, $2, $3, $4, $5)",
        params=[0.1, 0.1, 2.0, [0.1, 1.0], [0.2, 19.99]],
    )
    assert out.status == "ok", out.error
    many = await pg_run(
        services,
        command=f"INSERT INTO {table} (n, a) VALUES ($1, $2)",
        many=True,
        params=[[1.15, [0.3]], [1e-7, []]],
    )
    assert many.status == "ok", many.error
    rows = await pg_run(
        services, query=f"SELECT n::text AS n, f, i, j::text AS j, a::text AS a FROM {table} ORDER BY n"
    )
    assert rows.status == "ok", rows.error
    assert rows.result["rows"] == [
        {"n": "0.0000001", "f": None, "i": None, "j": None, "a": "{}"},
        {"n": "0.1", "f": 0.1, "i": 2, "j": "[0.1, 1.0]", "a": "{0.2,19.99}"},
        {"n": "1.15", "f": None, "i": None, "j": None, "a": "{0.3}"},
    ]


def _pool_sizes(services: WorkerServices) -> list[int]:
    return sorted(p.get_max_size() for p in services._items.values() if isinstance(p, asyncpg.Pool))


async def test_pool_size_as_text_is_used_and_another_size_gets_its_own_pool(services: WorkerServices) -> None:
    first = await pg_run(services, {"pool_size": "2"}, query="SELECT 1 AS x")
    assert first.status == "ok", first.error
    assert _pool_sizes(services) == [2]
    second = await pg_run(services, {"pool_size": 3}, query="SELECT 1 AS x")
    assert second.status == "ok", second.error
    assert _pool_sizes(services) == [2, 3]


@pytest.mark.parametrize("size", [0, -1, "abc", 2.5, True, "", [2]])
async def test_an_invalid_pool_size_is_a_config_error(services: WorkerServices, size: Any) -> None:
    out = await pg_run(services, {"pool_size": size}, query="SELECT 1 AS x")
    assert out.status == "error" and out.error is not None
    assert out.error["kind"] == "config_error"
    assert "spec.pool_size must be a positive whole number" in out.error["message"]
    assert _pool_sizes(services) == []


async def test_geometry_has_a_json_form_and_no_memory_address(services: WorkerServices) -> None:
    out = await pg_run(
        services,
        query="SELECT '[(0,0),(1,2)]'::path AS open_path, '((0,0),(1,1),(1,0))'::polygon AS poly, "
        "'(1,2)'::point AS pt",
    )
    assert out.status == "ok", out.error
    assert out.result["rows"] == [
        {
            "open_path": {"points": [[0.0, 0.0], [1.0, 2.0]], "closed": False},
            "poly": {"points": [[0.0, 0.0], [1.0, 1.0], [1.0, 0.0]], "closed": True},
            "pt": [1.0, 2.0],
        }
    ]


async def test_infinite_timestamps_and_dates_are_the_words_real_extremes_stay(
    services: WorkerServices,
) -> None:
    out = await pg_run(
        services,
        query="SELECT 'infinity'::timestamptz AS a, '-infinity'::timestamptz AS b, 'infinity'::timestamp AS c, "
        "'-infinity'::date AS d, '9999-12-31'::date AS real_end, ARRAY['infinity'::date, '2024-01-02'] AS arr",
    )
    assert out.status == "ok", out.error
    assert out.result["rows"] == [
        {
            "a": "infinity",
            "b": "-infinity",
            "c": "infinity",
            "d": "-infinity",
            "real_end": "9999-12-31",
            "arr": ["infinity", "2024-01-02"],
        }
    ]
