"""``duckdb``: database files attached under an alias (read-only or not), next to the pipeline's database."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from noetl_stream.dataplane.tools import close_resources
from noetl_stream.dataplane.tools.base import ToolContext
from noetl_stream.dataplane.tools.duckdb import run_duckdb


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
