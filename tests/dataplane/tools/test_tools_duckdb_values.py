"""``duckdb`` values as the ``postgres`` tool gives them (``JSON`` decoded, ``DECIMAL`` as ``numeric``),
and what a text of several statements does (docs/tools.md)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import playbook, run
from pgserver import PgServer

from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.dataplane.tools import close_resources
from noetl_stream.dataplane.tools.base import ToolContext
from noetl_stream.dataplane.tools.duckdb import run_duckdb
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import local_runtime


@pytest.fixture
def ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ToolContext]:
    monkeypatch.setenv("NOETL_DUCKDB_DIR", str(tmp_path))
    context = ToolContext(execution_id=uuid.uuid4().hex, step="s", task="t", spec={})
    yield context
    close_resources(context.resources)


async def duck(ctx: ToolContext, **config: Any) -> Outcome:
    return await run_duckdb(config, ctx)


async def test_json_columns_are_decoded(ctx: ToolContext) -> None:
    out = await duck(
        ctx,
        query="""SELECT '{"a": [1, 2], "b": {"c": true}}'::JSON AS obj, '"text"'::JSON AS s,
                        'null'::JSON AS json_null, NULL::JSON AS sql_null, '1.5'::JSON AS n,
                        '1e400'::JSON AS too_big, 'plain' AS not_json""",
    )
    assert out.status == "ok", out.error
    assert out.result["rows"] == [
        {
            "obj": {"a": [1, 2], "b": {"c": True}},
            "s": "text",
            "json_null": None,
            "sql_null": None,
            "n": 1.5,
            "too_big": "1e400",  # a number out of range stays text
            "not_json": "plain",
        }
    ]


async def test_json_inside_lists_arrays_structs_and_maps_is_decoded(ctx: ToolContext) -> None:
    out = await duck(
        ctx,
        query="""SELECT ['{"x": 1}'::JSON, NULL] AS list, [['[3]'::JSON]] AS nested,
                        ['[1]'::JSON, '2'::JSON]::JSON[2] AS arr,
                        {'k': '[1]'::JSON, 'o': '[1]'} AS struct, MAP {'a': '{"b": 2}'::JSON} AS map""",
    )
    assert out.status == "ok", out.error
    assert out.result["rows"] == [
        {
            "list": [{"x": 1}, None],
            "nested": [[[3]]],
            "arr": [[1], 2],
            "struct": {"k": [1], "o": "[1]"},  # `o` is VARCHAR: its text stays text
            "map": {"a": {"b": 2}},
        }
    ]


async def test_json_rows_from_a_table(ctx: ToolContext) -> None:
    await duck(ctx, command="CREATE TABLE docs (id INT, doc JSON)")
    await duck(ctx, command="""INSERT INTO docs VALUES (1, '{"tags": ["a"]}'), (2, '[]')""")
    out = await duck(ctx, query="SELECT id, doc FROM docs ORDER BY id")
    assert out.result["rows"] == [{"id": 1, "doc": {"tags": ["a"]}}, {"id": 2, "doc": []}]


async def test_json_and_decimal_values_are_those_of_postgres(
    nats_server: EmbeddedNats, topology: Topology, pg: PgServer
) -> None:
    """The same values selected by both tools come back alike: ``json``/``jsonb`` and ``JSON`` decoded,
    ``numeric`` and ``DECIMAL`` an integer when whole (below 2^53), else a float (digits lost), and their
    text exact."""
    values = (
        """'{{"a": [1, 2.5, null]}}'::{json} AS j, '[true]'::{json} AS l, 1.10::{dec}(10, 2) AS small,"""
        """ 3::{dec}(10, 0) AS whole, 12345678901234567890123456789012345.67::{dec}(38, 2) AS big,"""
        """ (12345678901234567890123456789012345.67::{dec}(38, 2))::{text} AS exact"""
    )
    pg_sql = json.dumps("SELECT " + values.format(json="jsonb", dec="numeric", text="text"))
    duck_sql = json.dumps("SELECT " + values.format(json="JSON", dec="DECIMAL", text="VARCHAR"))
    text = playbook(
        f"""
        - step: start
          tool:
            - {{name: pg, kind: postgres, dsn: "{{{{ dsn }}}}", query: {pg_sql}}}
            - {{name: duck, kind: duckdb, query: {duck_sql}}}
            - {{name: out, kind: noop, result: {{pg: "{{{{ pg.rows }}}}", duck: "{{{{ duck.rows }}}}"}}}}
        """,
        workload={"dsn": pg.dsn},
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "success", r.summary.error
    assert r.result["duck"] == r.result["pg"]
    assert r.result["duck"] == [
        {
            "j": {"a": [1, 2.5, None]},
            "l": [True],
            "small": 1.1,
            "whole": 3,
            "big": 1.2345678901234568e34,
            "exact": "12345678901234567890123456789012345.67",
        }
    ]


async def test_several_statements_run_in_order_and_give_the_last_result(ctx: ToolContext) -> None:
    # docs/tools.md: each committed as it ends, up to the first that fails; the last one's result
    made = await duck(
        ctx, command="CREATE TABLE t (a INT); INSERT INTO t VALUES (1); SELECT count(*) AS n FROM t"
    )
    assert made.status == "ok" and made.result["rows"] == [{"n": 1}]
    failed = await duck(ctx, command="INSERT INTO t VALUES (2); SELECT nope")
    assert failed.error is not None and failed.error["kind"] == "duckdb_error"
    assert failed.helpers["duckdb"]["statement"] == 1
    atomic = await duck(ctx, command="BEGIN; INSERT INTO t VALUES (3); SELECT nope; COMMIT")
    assert atomic.error is not None and atomic.error["kind"] == "duckdb_error"
    rows = await duck(ctx, query="SELECT a FROM t ORDER BY a")
    assert rows.result["rows"] == [
        {"a": 1},
        {"a": 2},
    ]  # 2 stayed done; 3 was rolled back with its transaction
    both = await duck(ctx, command="INSERT INTO t VALUES (4); SELECT ?::INT + 1 AS p", params=[41])
    assert both.error is not None and both.error["kind"] == "config_error"
    assert "holds 2 statements and 'params' bind one" in both.error["message"]
    one = await duck(ctx, command="SELECT ?::INT + 1 AS p; -- one statement", params=[41])
    assert one.result["rows"] == [{"p": 42}]
    assert (await duck(ctx, query="SELECT count(*) AS n FROM t")).result["rows"] == [{"n": 2}]  # 4 never ran
