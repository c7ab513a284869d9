"""``duckdb``: database files attached under an alias (read-only or not), next to the pipeline's database."""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest
from helpers import playbook, run

from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.dataplane.tools import close_resources
from noetl_stream.dataplane.tools.base import ToolContext
from noetl_stream.dataplane.tools.duckdb import run_duckdb
from noetl_stream.dataplane.tools.python import run_python
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import local_runtime


@pytest.fixture(autouse=True)
def executions_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The executions' database files of this test, in a directory of its own."""
    folder = tmp_path / "executions"
    monkeypatch.setenv("NOETL_DUCKDB_DIR", str(folder))
    return folder


def make_db(path: Path) -> None:
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE cities (name TEXT, pop INT)")
    con.execute("INSERT INTO cities VALUES ('Oslo', 700), ('Lima', 10000)")
    con.close()


async def test_attach_read_only_file_in_the_pipeline_database(tmp_path: Path) -> None:
    ref = tmp_path / "ref.duckdb"
    make_db(ref)
    ctx = ToolContext(execution_id="e", step="s", task="t", spec={})
    attach = [{"path": str(ref), "alias": "ref", "read_only": True}]
    try:
        out = await run_duckdb(
            {
                "query": "SELECT name FROM ref.cities WHERE pop > ? ORDER BY name",
                "params": [1000],
                "attach": attach,
            },
            ctx,
        )
        assert out.status == "ok", out.error
        assert out.result["rows"] == [{"name": "Lima"}]
        again = await run_duckdb({"query": "SELECT count(*) AS n FROM ref.cities", "attach": attach}, ctx)
        assert again.result["rows"] == [{"n": 2}]  # attaching twice is fine
        write = await run_duckdb({"command": "DELETE FROM ref.cities", "attach": attach}, ctx)
        assert write.error is not None and write.error["kind"] == "duckdb_error"
        after = await run_duckdb({"query": "SELECT count(*) AS n FROM ref.cities", "attach": attach}, ctx)
        assert after.result["rows"] == [{"n": 2}]  # nothing was deleted
    finally:
        close_resources(ctx.resources)


async def test_attach_writable_file_with_db_path_and_bare_path_alias(tmp_path: Path) -> None:
    target = tmp_path / "target.duckdb"
    make_db(target)
    main_db = tmp_path / "main.duckdb"
    ctx = ToolContext(execution_id="e", step="s", task="t", spec={})
    out = await run_duckdb(
        {
            "command": "CREATE TABLE big AS SELECT * FROM target.cities WHERE pop > 1000",
            "db_path": str(main_db),
            "attach": [str(target)],
        },
        ctx,
    )
    assert out.status == "ok", out.error
    con = duckdb.connect(str(main_db))
    assert con.execute("SELECT name FROM big").fetchall() == [("Lima",)]
    con.close()


async def test_attach_config_errors() -> None:
    ctx = ToolContext(execution_id="e", step="s", task="t", spec={})
    for attach, needle in [
        ({"path": "x"}, "must be a list"),
        ([{"alias": "x"}], "needs 'path'"),
        ([{"path": "a.db", "alias": "bad alias; DROP"}], "identifier"),
    ]:
        out = await run_duckdb({"query": "SELECT 1", "attach": attach}, ctx)
        assert out.error is not None and out.error["kind"] == "config_error"
        assert needle in out.error["message"]
    close_resources(ctx.resources)


# --- ``duckdb``, end to end: results of every common type (``TIMESTAMPTZ`` included), and the errors
# of a task with two SQL texts or a result with two columns of one name.


async def test_timestamptz_columns_are_returned(nats_server: EmbeddedNats, topology: Topology) -> None:
    # DuckDB hands TIMESTAMP WITH TIME ZONE values to Python only through pytz (a dependency since);
    # `now()` and `current_timestamp` are of that type. Without it every such result failed.
    text = playbook(
        """
        - step: start
          tool:
            - name: events
              kind: duckdb
              command: "CREATE TABLE ev AS SELECT 1 AS id, TIMESTAMPTZ '2024-05-01 12:30:00+02' AS ts"
            - name: read
              kind: duckdb
              query: |
                SELECT id, ts, now() >= ts AS later, [ts] AS tss, NULL::TIMESTAMPTZ AS none
                FROM ev WHERE id = $1  -- a trailing comment
              params: [1]
        """
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "success", r.summary
    [row] = r.step_result("start")["rows"]
    expected = datetime.datetime(2024, 5, 1, 10, 30, tzinfo=datetime.UTC)
    assert datetime.datetime.fromisoformat(row["ts"]) == expected
    assert row["id"] == 1 and row["later"] is True and row["none"] is None
    assert "2024-05-01" in str(row["tss"])


@pytest.mark.parametrize(
    ("tool", "config", "keys"),
    [
        (
            run_duckdb,
            {"query": "SELECT 1 AS one", "command": "CREATE TABLE t AS SELECT 2 AS two"},
            ("query", "command"),
        ),
        (run_python, {"code": "def main():\n    return 1", "module": "json:dumps"}, ("code", "module")),
    ],
)
async def test_two_exclusive_keys_together_are_a_config_error(
    tool: Callable[[dict[str, Any], ToolContext], Awaitable[Outcome]],
    config: dict[str, Any],
    keys: tuple[str, str],
) -> None:
    """Two SQL texts (or code and a module) for one task: which one ran would be a guess (one did). A
    playbook is refused at compile time (`kind '…' takes … not both`, test_dsl_invalid_tasks.py); the
    tool refuses a config that reaches it anyway (a plugin's, a rendered one)."""
    out = await tool(config, ToolContext(execution_id="e", step="s", task="t", spec={}))
    assert out.status == "error" and out.error is not None
    assert out.error["kind"] == "config_error" and out.error["retryable"] is False, out.error
    assert all(f"'{k}'" in out.error["message"] for k in keys) and "not both" in out.error["message"]


@pytest.mark.parametrize(
    ("sql", "names"),
    [
        ("SELECT 1 AS a, 2 AS a, 3 AS b", "'a'"),
        ("SELECT * FROM (SELECT 1 AS id, 'x' AS v) t JOIN (SELECT 1 AS id, 'y' AS v) u ON t.id = u.id",
         "'id', 'v'"),
        ("SELECT 1 AS a, 2 AS a WHERE false", "'a'"),  # no rows: the column names still tell
    ],
)  # fmt: skip
async def test_duplicate_column_names_are_an_error_naming_them(
    nats_server: EmbeddedNats, topology: Topology, sql: str, names: str
) -> None:
    # A row is a mapping: two columns of one name would keep one value and silently lose the other.
    text = playbook(
        """
        - step: start
          tool: {kind: duckdb, query: "{{ sql }}"}
        """,
        workload={"sql": sql},
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "failed"
    err = r.step_error("start")
    assert err["kind"] == "duckdb_error" and err["retryable"] is False, err
    assert f"duplicate column names {names}" in err["message"] and "alias" in err["message"], err
