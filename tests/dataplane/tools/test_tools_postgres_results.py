"""The ``postgres`` tool's results in NoETL's shape (the last statement's, plus ``command_<i>``), and
scripts split into statements with dollar-quoted bodies, strings, identifiers and comments intact;
against a real PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from helpers import credentials, playbook, run
from pgserver import PgServer

from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.dataplane.tools.base import ToolContext, WorkerServices
from noetl_stream.dataplane.tools.postgres import run_postgres
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import local_runtime


@pytest.fixture
async def services(pg: PgServer) -> AsyncIterator[WorkerServices]:
    svc = WorkerServices(credentials=credentials({"pg": {"kind": "postgres_credential", **pg.credential()}}))
    yield svc
    await svc.close()


@pytest.fixture
def table() -> str:
    return "t_" + uuid.uuid4().hex[:12]


async def pg_run(services: WorkerServices, **config: Any) -> Outcome:
    ctx = ToolContext(execution_id="e1", step="s", task="t", spec={}, services=services)
    return await run_postgres({"auth": "pg", **config}, ctx)


async def test_a_select_gives_rows_row_count_and_columns_in_order(services: WorkerServices) -> None:
    out = await pg_run(services, query="SELECT 2 AS b, 'x' AS a, now() AS ts UNION ALL SELECT 1, 'y', now()")
    assert out.status == "ok", out.error
    assert out.result["columns"] == ["b", "a", "ts"]
    assert out.result["row_count"] == 2
    assert [(r["b"], r["a"]) for r in out.result["rows"]] == [(2, "x"), (1, "y")]
    assert isinstance(out.result["rows"][0]["ts"], str)  # a timestamp is ISO text
    assert out.result["command_0"] == {k: out.result[k] for k in ("rows", "row_count", "columns")}
    none = await pg_run(services, query="SELECT 1 AS one, 'a' AS two WHERE false")
    assert none.result["rows"] == [] and none.result["row_count"] == 0
    assert none.result["columns"] == ["one", "two"]  # known without a row


async def test_dml_gives_the_rows_it_changed_and_its_tag(services: WorkerServices, table: str) -> None:
    made = await pg_run(services, command=f"CREATE TABLE {table} (id int, v text)")
    assert made.result == {
        "row_count": 0,
        "affected_rows": 0,
        "message": "CREATE TABLE",
        "command_0": {"row_count": 0, "affected_rows": 0, "message": "CREATE TABLE"},
    }
    ins = await pg_run(
        services,
        command=f"INSERT INTO {table} VALUES ($1, $2), ($3, $4), ($5, $6)",
        params=[1, "a", 2, "b", 3, "c"],
    )
    assert {k: ins.result[k] for k in ("row_count", "affected_rows", "message")} == {
        "row_count": 3,
        "affected_rows": 3,
        "message": "INSERT 0 3",
    }
    upd = await pg_run(services, command=f"UPDATE {table} SET v = upper(v) WHERE id > $1", params=[1])
    assert (upd.result["affected_rows"], upd.result["message"]) == (2, "UPDATE 2")
    returning = await pg_run(
        services, command=f"DELETE FROM {table} WHERE id = $1 RETURNING id, v", params=[3]
    )
    assert returning.result["rows"] == [{"id": 3, "v": "C"}]  # RETURNING returns rows
    many = await pg_run(
        services,
        command=f"INSERT INTO {table} VALUES ($1, $2) RETURNING id",
        many=True,
        params=[[7, "x"], [8, "y"]],
    )
    assert many.result["rows"] == [{"id": 7}, {"id": 8}] and many.result["row_count"] == 2


async def test_a_script_gives_the_last_statements_result_and_each_as_command_i(
    services: WorkerServices, table: str
) -> None:
    out = await pg_run(
        services,
        command=f"""
            CREATE TABLE {table} (id int, note text);
            INSERT INTO {table} VALUES (1, 'one'), (2, 'two');
            SELECT id, note FROM {table} ORDER BY id;
            DELETE FROM {table} WHERE id = 2
        """,
    )
    assert out.status == "ok", out.error
    assert out.helpers["pg"]["statements"] == 4
    assert {k: out.result[k] for k in ("row_count", "affected_rows", "message")} == {
        "row_count": 1,
        "affected_rows": 1,
        "message": "DELETE 1",
    }
    assert "rows" not in out.result
    assert out.result["command_0"]["message"] == "CREATE TABLE"
    assert out.result["command_1"] == {"row_count": 2, "affected_rows": 2, "message": "INSERT 0 2"}
    assert out.result["command_2"] == {
        "rows": [{"id": 1, "note": "one"}, {"id": 2, "note": "two"}],
        "row_count": 2,
        "columns": ["id", "note"],
    }
    assert sorted(k for k in out.result if k.startswith("command_")) == [f"command_{i}" for i in range(4)]


async def test_a_script_keeps_dollar_quoted_bodies_strings_identifiers_and_comments_whole(
    services: WorkerServices, table: str
) -> None:
    fn = f"{table}_fn"
    out = await pg_run(
        services,
        command=f"""
            -- a comment; with a semicolon
            CREATE TABLE {table} ("odd;name" text, body text);
            CREATE FUNCTION {fn}(x int) RETURNS text LANGUAGE plpgsql AS $body$
            DECLARE
              s text := 'a;b';
            BEGIN
              IF x > 0 THEN s := s || $$;x$$; END IF;
              RETURN s;
            END;
            $body$;
            /* a block comment; with a semicolon */
            INSERT INTO {table} VALUES ('it''s; fine', {fn}(1)), ('plain', {fn}(0));
            SELECT "odd;name", body FROM {table} ORDER BY 1;
        """,
    )
    assert out.status == "ok", out.error
    assert out.helpers["pg"]["statements"] == 4
    assert out.result["rows"] == [
        {"odd;name": "it's; fine", "body": "a;b;x"},
        {"odd;name": "plain", "body": "a;b"},
    ]
    assert out.result["command_1"]["message"] == "CREATE FUNCTION"


async def test_a_sql_function_body_with_begin_atomic_is_one_statement(
    services: WorkerServices, table: str
) -> None:
    out = await pg_run(
        services,
        command=f"""
            CREATE TABLE {table} (n int);
            CREATE PROCEDURE {table}_add() LANGUAGE sql BEGIN ATOMIC
              INSERT INTO {table} VALUES (1);
              INSERT INTO {table} VALUES (2);
            END;
            CALL {table}_add();
            SELECT sum(n) AS total FROM {table}
        """,
    )
    assert out.status == "ok", out.error
    assert out.helpers["pg"]["statements"] == 4 and out.result["rows"] == [{"total": 3}]


async def test_a_script_that_does_not_parse_runs_no_statement(services: WorkerServices, table: str) -> None:
    out = await pg_run(services, command=f"CREATE TABLE {table} (id int); SELEC 1")
    assert out.status == "error" and out.error is not None
    assert out.error["kind"] == "pg_error" and out.error["retryable"] is False
    assert out.helpers["pg"]["code"] == "42601"
    assert "no statement ran" in out.error["message"]
    exists = await pg_run(services, query="SELECT to_regclass($1)::text AS t", params=[table])
    assert exists.result["rows"] == [{"t": None}]


async def test_a_failing_statement_is_named_and_those_before_it_stay_done(
    services: WorkerServices, table: str
) -> None:
    out = await pg_run(
        services, command=f"CREATE TABLE {table} (id int primary key); INSERT INTO {table} VALUES (1), (1)"
    )
    assert out.error is not None and out.helpers["pg"]["code"] == "23505"
    assert out.helpers["pg"]["statement"] == 1
    count = await pg_run(services, query=f"SELECT count(*) AS n FROM {table}")
    assert count.result["rows"] == [{"n": 0}]  # the table (statement 0) stayed, autocommit


@pytest.mark.parametrize("key", ["query", "command"])
async def test_params_with_a_script_are_a_config_error(services: WorkerServices, key: str) -> None:
    out = await pg_run(services, **{key: "SELECT $1::int AS a; SELECT 2 AS b", "params": [1]})
    assert out.error is not None and out.error["kind"] == "config_error"
    assert "holds 2 statements and 'params' bind one" in out.error["message"]
    one = await pg_run(services, **{key: "SELECT $1::int AS a; -- done", "params": [1]})
    assert one.status == "ok", one.error
    assert one.result["rows"] == [{"a": 1}]


async def test_only_comments_is_a_config_error(services: WorkerServices) -> None:
    out = await pg_run(services, command="-- nothing; here\n;")
    assert out.error is not None and out.error["kind"] == "config_error"
    assert "no SQL statement" in out.error["message"]


async def test_a_playbook_reads_rows_and_command_i(
    nats_server: EmbeddedNats, topology: Topology, pg: PgServer, table: str
) -> None:
    text = playbook(
        f"""
        - step: start
          tool:
            - name: load
              kind: postgres
              dsn: "{{{{ dsn }}}}"
              command: >-
                CREATE TABLE {table} (x int, label text);
                INSERT INTO {table} VALUES (41, 'a;b'), (42, 'c');
                SELECT x, label FROM {table} ORDER BY x
            - name: read
              kind: noop
              result:
                first: "{{{{ load.rows[0].x }}}}"
                count: "{{{{ load.row_count }}}}"
                columns: "{{{{ load.columns }}}}"
                inserted: "{{{{ load.command_1.affected_rows }}}}"
                tag: "{{{{ load.command_1.message }}}}"
                last: "{{{{ load.command_2.rows[1].label }}}}"
        """,
        workload={"dsn": pg.dsn},
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "success", r.summary
    assert r.result == {
        "first": 41,
        "count": 2,
        "columns": ["x", "label"],
        "inserted": 2,
        "tag": "INSERT 0 2",
        "last": "c",
    }
    assert pg.password not in msgspec.json.encode(r.tasks("start")).decode()
