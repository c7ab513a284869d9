"""The ``duckdb`` tool's results in NoETL's shape (the last statement's, plus ``command_<i>``), its
scripts and ``commands``/``cmds``, and its databases: ``database:`` files, and without it one file per
execution (tables survive from step to step, never into another execution); against real DuckDB files."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from helpers import playbook, run

from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.dataplane.tools import close_resources
from noetl_stream.dataplane.tools.base import ToolContext
from noetl_stream.dataplane.tools.duckdb import run_duckdb
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import local_runtime


@pytest.fixture
def executions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's directory of execution database files (``NOETL_DUCKDB_DIR``)."""
    folder = tmp_path / "executions"
    monkeypatch.setenv("NOETL_DUCKDB_DIR", str(folder))
    return folder


@pytest.fixture
def ctx(executions: Path) -> Iterator[ToolContext]:
    context = ToolContext(execution_id=uuid.uuid4().hex, step="s", task="t", spec={})
    yield context
    close_resources(context.resources)


async def duck(ctx: ToolContext, **config: Any) -> Outcome:
    return await run_duckdb(config, ctx)


def tables(path: Path) -> list[str]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return sorted(
            r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()
        )
    finally:
        con.close()


# --- the result's shape ---------------------------------------------------------------------------


async def test_a_select_gives_rows_row_count_and_columns_in_order(ctx: ToolContext) -> None:
    out = await duck(ctx, query="SELECT * FROM (VALUES (2, 'x'), (1, 'y')) AS t(b, a)")
    assert out.status == "ok", out.error
    assert out.result == {
        "rows": [{"b": 2, "a": "x"}, {"b": 1, "a": "y"}],
        "row_count": 2,
        "columns": ["b", "a"],
        "command_0": {
            "rows": [{"b": 2, "a": "x"}, {"b": 1, "a": "y"}],
            "row_count": 2,
            "columns": ["b", "a"],
        },
    }
    none = await duck(ctx, query="SELECT 1 AS one, 'a' AS two WHERE false")
    assert (none.result["rows"], none.result["row_count"], none.result["columns"]) == ([], 0, ["one", "two"])


async def test_dml_gives_the_rows_it_changed_and_a_message(ctx: ToolContext) -> None:
    def shape(out: Outcome) -> tuple[Any, Any, Any]:
        assert out.status == "ok", out.error
        assert "rows" not in out.result
        return out.result["row_count"], out.result["affected_rows"], out.result["message"]

    assert shape(await duck(ctx, command="CREATE TABLE t (id INT, v TEXT)")) == (0, 0, "CREATE")
    assert shape(await duck(ctx, command="INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c')")) == (
        3,
        3,
        "INSERT 3",
    )
    assert shape(await duck(ctx, command="UPDATE t SET v = 'RETURNING' WHERE id > 1")) == (2, 2, "UPDATE 2")
    assert shape(await duck(ctx, command="DELETE FROM t WHERE id = 3")) == (1, 1, "DELETE 1")
    assert shape(await duck(ctx, command="CREATE TABLE u AS SELECT * FROM t")) == (2, 2, "CREATE 2")
    assert shape(await duck(ctx, command="DROP TABLE u")) == (0, 0, "DROP")
    returning = await duck(ctx, command="INSERT INTO t VALUES (9, 'z') RETURNING id, v")
    assert returning.result["rows"] == [{"id": 9, "v": "z"}] and returning.result["columns"] == ["id", "v"]
    counted = await duck(
        ctx, query='SELECT count(*) AS "Count" FROM t'
    )  # a SELECT's rows, whatever their name
    assert counted.result["rows"] == [{"Count": 3}]


async def test_a_script_gives_the_last_result_and_each_as_command_i(ctx: ToolContext) -> None:
    out = await duck(
        ctx,
        command="""
            CREATE TABLE t (id INT, note TEXT);
            INSERT INTO t VALUES (1, 'one'), (2, 'two');
            SELECT id, note FROM t ORDER BY id;
            DELETE FROM t WHERE id = 2
        """,
    )
    assert out.status == "ok", out.error
    assert {k: v for k, v in out.result.items() if not k.startswith("command_")} == {
        "row_count": 1,
        "affected_rows": 1,
        "message": "DELETE 1",
    }
    assert out.result["command_0"] == {"row_count": 0, "affected_rows": 0, "message": "CREATE"}
    assert out.result["command_1"] == {"row_count": 2, "affected_rows": 2, "message": "INSERT 2"}
    assert out.result["command_2"]["rows"] == [{"id": 1, "note": "one"}, {"id": 2, "note": "two"}]
    assert out.result["command_3"] == {"row_count": 1, "affected_rows": 1, "message": "DELETE 1"}
    assert out.helpers["duckdb"]["statements"] == 4


async def test_a_script_keeps_strings_identifiers_dollar_quotes_and_comments_whole(ctx: ToolContext) -> None:
    out = await duck(
        ctx,
        command="""
            -- a comment; with a semicolon
            CREATE TABLE "odd;name" (s TEXT);
            CREATE MACRO twice(x) AS x || ';' || x;
            /* a block comment; with a semicolon */
            INSERT INTO "odd;name" VALUES ('it''s; fine'), ($$dollar; quoted$$), ($tag$a;b$tag$);
            SELECT twice(s) AS s FROM "odd;name" ORDER BY s;
        """,
    )
    assert out.status == "ok", out.error
    assert out.helpers["duckdb"]["statements"] == 4
    assert out.result["rows"] == [
        {"s": "a;b;a;b"},
        {"s": "dollar; quoted;dollar; quoted"},
        {"s": "it's; fine;it's; fine"},
    ]


@pytest.mark.parametrize("key", ["commands", "cmds"])
async def test_commands_and_cmds_take_a_list_or_one_text(ctx: ToolContext, key: str) -> None:
    listed = await duck(
        ctx, **{key: ["CREATE TABLE t (a INT)", "INSERT INTO t VALUES (1); INSERT INTO t VALUES (2)"]}
    )
    assert listed.status == "ok", listed.error
    assert [listed.result[f"command_{i}"]["message"] for i in range(3)] == ["CREATE", "INSERT 1", "INSERT 1"]
    one = await duck(ctx, **{key: "SELECT sum(a) AS total FROM t"})
    assert one.result["rows"] == [{"total": 3}]
    for bad in ([], [""], ["SELECT 1", 5], 5):
        out = await duck(ctx, **{key: bad})
        assert out.error is not None and out.error["kind"] == "config_error", bad
        assert f"duckdb '{key}' must be SQL text or a non-empty list of SQL texts" == out.error["message"]


async def test_sql_given_twice_params_with_a_script_or_no_statement_are_config_errors(
    ctx: ToolContext,
) -> None:
    for config, said in [
        ({"query": "SELECT 1", "commands": ["SELECT 2"]}, "give 'query' or 'commands', not both"),
        ({"command": "SELECT ?; SELECT 2", "params": [1]}, "holds 2 statements and 'params' bind one"),
        ({"cmds": ["SELECT ?", "SELECT 2"], "params": [1]}, "holds 2 statements and 'params' bind one"),
        ({"command": "-- nothing; here"}, "holds no SQL statement"),
        ({"query": "SELECT 1", "database": "a.duckdb", "db_path": "b.duckdb"}, "'database' or 'db_path'"),
    ]:
        out = await duck(ctx, **config)
        assert out.error is not None and out.error["kind"] == "config_error", config
        assert said in out.error["message"], (config, out.error)


# --- databases ------------------------------------------------------------------------------------


async def test_tables_survive_from_task_to_task_of_one_execution_not_into_another(executions: Path) -> None:
    def step_of(execution_id: str) -> ToolContext:
        return ToolContext(execution_id=execution_id, step="s", task="t", spec={})

    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    made = await run_duckdb({"command": "CREATE TABLE kept AS SELECT 42 AS answer"}, step_of(first))
    assert made.status == "ok", made.error
    later = await run_duckdb({"query": "SELECT answer FROM kept"}, step_of(first))  # another pipeline
    assert later.status == "ok", later.error
    assert later.result["rows"] == [{"answer": 42}]
    other = await run_duckdb({"query": "SELECT answer FROM kept"}, step_of(second))
    assert other.error is not None and other.error["kind"] == "duckdb_error"
    assert "kept" in other.error["message"]
    assert tables(executions / f"{first}.duckdb") == ["kept"]
    assert tables(executions / f"{second}.duckdb") == []


async def test_steps_of_one_execution_share_its_tables_and_two_executions_never(
    nats_server: EmbeddedNats, topology: Topology, executions: Path
) -> None:
    text = playbook(
        """
        - step: start
          tool:
            - {name: create, kind: duckdb, command: "CREATE TABLE visits (who TEXT)"}
            - {name: add, kind: duckdb, command: "INSERT INTO visits VALUES (?)", params: ["{{ workload.who }}"]}
          next: {arcs: [{step: count, when: "{{ event.name == 'step.done' }}"}]}
        - step: count
          tool:
            kind: duckdb
            query: "SELECT list(who) AS who, count(*) AS n FROM visits"
        """
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        # (a CREATE TABLE, so a shared database would fail the second execution's first step)
        runs = [await run(rt, text, {"who": who}) for who in ("ann", "bob")]
    for r, who in zip(runs, ("ann", "bob"), strict=True):
        assert r.status == "success", r.summary
        assert r.step_result("count")["rows"] == [{"who": [who], "n": 1}]
    assert sorted(p.name for p in executions.iterdir()) == sorted(
        f"{r.summary.execution_id}.duckdb" for r in runs
    )


async def test_database_is_a_file_and_db_path_its_older_name(ctx: ToolContext, tmp_path: Path) -> None:
    for key in ("database", "db_path"):
        path = tmp_path / f"{key}.duckdb"
        out = await duck(
            ctx, command="CREATE TABLE t AS SELECT 1 AS a; INSERT INTO t VALUES (2)", **{key: str(path)}
        )
        assert out.status == "ok", out.error
        again = await duck(ctx, query="SELECT sum(a) AS s FROM t", **{key: str(path)})
        assert again.result["rows"] == [{"s": 3}]
        assert tables(path) == ["t"]
    not_here = await duck(ctx, query="SELECT * FROM t")  # the execution's own file has no such table
    assert not_here.error is not None and "t" in not_here.error["message"]


async def test_an_in_memory_database_lasts_one_pipeline_run(executions: Path) -> None:
    one = ToolContext(execution_id="same", step="s", task="t", spec={})
    made = await run_duckdb({"command": "CREATE TABLE m AS SELECT 1 AS a", "database": ":memory:"}, one)
    read = await run_duckdb({"query": "SELECT a FROM m", "database": ":memory:"}, one)
    assert made.status == read.status == "ok" and read.result["rows"] == [{"a": 1}]
    close_resources(one.resources)
    two = ToolContext(execution_id="same", step="s", task="t", spec={})
    gone = await run_duckdb({"query": "SELECT a FROM m", "database": ":memory:"}, two)
    assert gone.error is not None and gone.error["kind"] == "duckdb_error"
    assert not executions.exists()  # no execution file was made


async def test_files_unused_for_longer_than_the_max_age_are_removed(
    ctx: ToolContext, executions: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOETL_DUCKDB_MAX_AGE_S", "3600")
    executions.mkdir()
    old, recent = executions / "old.duckdb", executions / "recent.duckdb"
    for path in (old, recent):
        duckdb.connect(str(path)).close()
    (executions / "old.duckdb.wal").write_bytes(b"")
    two_hours_ago = time.time() - 7200
    for path in (old, executions / "old.duckdb.wal"):
        os.utime(path, (two_hours_ago, two_hours_ago))
    out = await duck(ctx, query="SELECT 1 AS one")
    assert out.status == "ok", out.error
    assert sorted(p.name for p in executions.iterdir()) == sorted(
        [f"{ctx.execution_id}.duckdb", "recent.duckdb"]
    )


async def test_a_max_age_that_is_no_number_is_a_config_error(
    ctx: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOETL_DUCKDB_MAX_AGE_S", "a day")
    out = await duck(ctx, query="SELECT 1")
    assert out.error is not None and out.error["kind"] == "config_error"
    assert "NOETL_DUCKDB_MAX_AGE_S='a day'" in out.error["message"]


async def test_a_file_another_process_holds_is_a_retryable_error(ctx: ToolContext, executions: Path) -> None:
    """Two workers running steps of one execution on one host: one waits for the other's task to end."""
    executions.mkdir()
    path = executions / f"{ctx.execution_id}.duckdb"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import duckdb, time; c = duckdb.connect({str(path)!r}); print(1, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"1"
        out = await duck(ctx, query="SELECT 1 AS one")
    finally:
        holder.kill()
        holder.wait()
    assert out.error is not None and out.error["kind"] == "duckdb_error"
    assert out.error["retryable"] is True
    again = await duck(ctx, query="SELECT 1 AS one")  # the holder is gone
    assert again.status == "ok" and again.result["rows"] == [{"one": 1}]
