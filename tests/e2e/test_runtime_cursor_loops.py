"""Loops as NoETL's playbooks write them, run for real: ``in`` rendering to null runs no iteration (local
and distributed), and cursor loops (``spec.mode: cursor``) claim frames of rows from PostgreSQL until a
claim returns none (docs/semantics.md, Loops)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
from helpers import playbook, run
from pgserver import PgServer

from noetl_stream.protocol import events as E
from noetl_stream.runtime.local import Runtime


@pytest.fixture
async def queue(pg: PgServer) -> AsyncIterator[str]:
    """A table of 7 jobs (ids 1..7), none claimed."""
    name = "q_" + uuid.uuid4().hex[:10]
    conn = await asyncpg.connect(pg.dsn)
    try:
        await conn.execute(
            f"CREATE TABLE {name} (id int PRIMARY KEY, claimed bool NOT NULL DEFAULT false, done_by text);"
            f"INSERT INTO {name} (id) SELECT generate_series(1, 7)"
        )
        yield name
    finally:
        await conn.execute(f"DROP TABLE IF EXISTS {name}")
        await conn.close()


def claim(table: str) -> str:
    return (
        f"UPDATE {table} SET claimed = true WHERE id IN (SELECT id FROM {table} WHERE NOT claimed "
        "ORDER BY id LIMIT {{ __frame_max_rows }} FOR UPDATE SKIP LOCKED) RETURNING id"
    )


@pytest.mark.parametrize("exec_", ["local", "distributed"])
async def test_in_rendering_to_null_runs_no_iteration_and_the_loop_is_done(
    runtime: Runtime, exec_: str
) -> None:
    text = playbook(
        f"""
        - step: start
          loop:
            in: "{{{{ workload.backlog }}}}"
            iterator: entry
            spec: {{policy: {{exec: {exec_}}}}}
          tool: {{kind: python, code: "raise RuntimeError('no iteration should run')"}}
          next: {{arcs: [{{step: after, when: "{{{{ event.name == 'loop.done' }}}}"}}]}}
        - step: after
          tool: {{kind: noop, result: "{{{{ start | length }}}}"}}
        """,
        workload={"backlog": None},
    )
    r = await run(runtime, text)
    assert r.status == "success", r.summary.error
    assert r.summary.result == 0


async def test_in_rendering_to_a_mapping_still_fails_the_step(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          loop: {in: "{{ workload.one }}", iterator: entry}
          tool: {kind: noop}
        """,
        workload={"one": {"a": 1}},
    )
    r = await run(runtime, text)
    assert r.status == "failed"
    assert r.step_error("start")["kind"] == "loop_error"


async def test_a_cursor_loop_claims_frames_until_a_claim_returns_no_row(
    runtime: Runtime, pg: PgServer, queue: str
) -> None:
    text = playbook(
        f"""
        - step: start
          loop:
            iterator: job
            spec: {{mode: cursor, frame: {{max_rows: 3}}}}
            cursor: {{kind: postgres, dsn: "{{{{ workload.dsn }}}}", claim: "{claim(queue)}"}}
          tool:
            kind: postgres
            dsn: "{{{{ workload.dsn }}}}"
            command: "UPDATE {queue} SET done_by = 'it{{{{ iter.index }}}}' WHERE id = {{{{ iter.job.id }}}} RETURNING id"
        """,
        workload={"dsn": pg.dsn},
    )
    r = await run(runtime, text)
    assert r.status == "success", r.summary.error
    # each row is recorded when its frame is claimed (3, 3, then 1), its index in claim order
    started = sorted(r.named(E.LOOP_ITERATION_STARTED), key=lambda e: e.payload["index"])
    claimed = [e.payload["item"]["id"] for e in started]
    assert [set(claimed[:3]), set(claimed[3:6]), claimed[6:]] == [{1, 2, 3}, {4, 5, 6}, [7]]
    assert [row["rows"][0]["id"] for row in r.step_result("start")] == claimed  # results in index order
    done = await _fetch(pg.dsn, f"SELECT id, done_by FROM {queue}")
    assert {x["id"]: x["done_by"] for x in done} == {row: f"it{i}" for i, row in enumerate(claimed)}
    (end,) = r.named(E.LOOP_DONE)
    assert (end.payload["total"], end.payload["done"], end.payload["failed"]) == (7, 7, 0)
    (started,) = r.named(E.LOOP_STARTED)
    assert (started.payload["mode"], started.payload["frame_max_rows"]) == ("cursor", 3)


async def test_a_cursor_frame_runs_up_to_max_in_flight_rows_at_once_in_index_order(
    runtime: Runtime, pg: PgServer, queue: str
) -> None:
    text = playbook(
        f"""
        - step: start
          loop:
            iterator: job
            spec: {{mode: cursor, max_in_flight: "{{{{ workload.n }}}}"}}
            cursor: {{kind: postgres, dsn: "{{{{ workload.dsn }}}}", claim: "{claim(queue)}"}}
          tool:
            kind: python
            input: {{id: "{{{{ job.id if job is defined else iter.job.id }}}}"}}
            code: |
              import time
              time.sleep(0.05 * (8 - id))
              result = id
        """,
        workload={"dsn": pg.dsn, "n": 4},
    )
    r = await run(runtime, text)
    assert r.status == "success", r.summary.error
    assert sorted(r.step_result("start")) == [1, 2, 3, 4, 5, 6, 7]
    started = sorted(r.named(E.LOOP_ITERATION_STARTED), key=lambda e: e.payload["index"])
    assert r.step_result("start") == [e.payload["item"]["id"] for e in started]  # in index order
    (started,) = r.named(E.LOOP_STARTED)
    assert (started.payload["max_in_flight"], started.payload["frame_max_rows"]) == (4, 100)


async def test_a_failing_claim_fails_the_step_and_a_claim_without_rows_is_refused(
    runtime: Runtime, pg: PgServer, queue: str
) -> None:
    text = playbook(
        f"""
        - step: start
          loop:
            iterator: job
            spec: {{mode: cursor}}
            cursor: {{kind: postgres, dsn: "{{{{ workload.dsn }}}}", claim: "SELECT nosuch FROM {queue}"}}
          tool: {{kind: noop}}
        - step: other
          loop:
            iterator: job
            spec: {{mode: cursor}}
            cursor: {{kind: postgres, dsn: "{{{{ workload.dsn }}}}", claim: "UPDATE {queue} SET claimed = true"}}
          tool: {{kind: noop}}
        """,
        workload={"dsn": pg.dsn},
    )
    first = await run(runtime, text)
    assert first.status == "failed"
    error = first.step_error("start")
    assert error["kind"] == "pg_error" and error["message"].startswith("step 'start' loop.cursor.claim: ")
    second = await run(
        runtime, text.replace("- step: start", "- step: unused").replace("- step: other", "- step: start")
    )
    assert second.status == "failed"
    error = second.step_error("start")
    assert error["kind"] == "loop_error" and "RETURNING" in error["message"]


async def _fetch(dsn: str, query: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(query))
    finally:
        await conn.close()
