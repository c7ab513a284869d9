"""``duckdb`` results of every common type reach the pipeline, end to end (``TIMESTAMPTZ`` included)."""

from __future__ import annotations

import datetime

from helpers import playbook, run

from noetl_stream.embedded import EmbeddedNats
from noetl_stream.local import local_runtime
from noetl_stream.subjects import Topology


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
    [row] = r.step_result("start")
    expected = datetime.datetime(2024, 5, 1, 10, 30, tzinfo=datetime.UTC)
    assert datetime.datetime.fromisoformat(row["ts"]) == expected
    assert row["id"] == 1 and row["later"] is True and row["none"] is None
    assert "2024-05-01" in str(row["tss"])
