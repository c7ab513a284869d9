"""Probe 67: result values are the same every time they are computed (no memory address of a default
repr), and DuckDB's infinite timestamps and dates are ``infinity``/``-infinity``."""

from __future__ import annotations

from noetl_stream.dataplane.outcome import json_safe
from noetl_stream.dataplane.tools.base import ToolContext
from noetl_stream.dataplane.tools.duckdb import run_duckdb


class Opaque:
    pass


def test_an_object_without_a_json_form_has_no_memory_address() -> None:
    assert json_safe({"x": Opaque()}) == {"x": f"<{__name__}.Opaque object>"}
    assert json_safe(Opaque()) == json_safe(Opaque())


async def test_duckdb_infinite_timestamps_and_dates_are_the_words() -> None:
    ctx = ToolContext(execution_id="e1", step="s", task="t", spec={})
    out = await run_duckdb(
        {
            "query": "SELECT 'infinity'::timestamp AS a, '-infinity'::timestamp AS b, 'infinity'::date AS c, "
            "'-infinity'::date AS d, '9999-12-31'::date AS real_end",
            "database": ":memory:",
        },
        ctx,
    )
    assert out.status == "ok", out.error
    assert out.result["rows"] == [
        {"a": "infinity", "b": "-infinity", "c": "infinity", "d": "-infinity", "real_end": "9999-12-31"}
    ]
