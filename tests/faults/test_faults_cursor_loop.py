"""A worker killed in a cursor loop: the next worker runs the rows the dead one claimed and did not finish,
never a finished one again beyond those in flight, then claims on (docs/semantics.md, Loops)."""

from __future__ import annotations

import asyncio
import collections
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import msgspec
import pytest
from eventlog import history, wait_processed
from faultbooks import submit_many
from helpers import playbook
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from pgserver import PgServer
from procs import Processes, provisioned

from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology

ROWS, FRAME, IN_FLIGHT = 120, 10, 2


@pytest.fixture
def topo(topology: Topology) -> Topology:
    return msgspec.structs.replace(topology, command_ack_wait_s=2.0)


@pytest.fixture
async def procs(
    nats_server: EmbeddedNats, js: JetStreamContext, topo: Topology, tmp_path: Path
) -> AsyncIterator[Processes]:
    async with provisioned(nats_server.url, js, topo, tmp_path / "logs") as p:
        yield p


@pytest.fixture
async def queue(pg: PgServer) -> AsyncIterator[str]:
    name = "q_" + uuid.uuid4().hex[:10]
    conn = await asyncpg.connect(pg.dsn)
    try:
        await conn.execute(
            f"CREATE TABLE {name} (id int PRIMARY KEY, claimed bool NOT NULL DEFAULT false);"
            f"INSERT INTO {name} (id) SELECT generate_series(1, {ROWS})"
        )
        yield name
    finally:
        await conn.execute(f"DROP TABLE IF EXISTS {name}")
        await conn.close()


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


async def test_worker_killed_mid_cursor_loop_resumes_the_claimed_rows(
    procs: Processes, topo: Topology, js: JetStreamContext, nc: NATS, pg: PgServer, queue: str, tmp_path: Path
) -> None:
    effects = tmp_path / "rows.txt"
    claim = (
        f"UPDATE {queue} SET claimed = true WHERE id IN (SELECT id FROM {queue} WHERE NOT claimed ORDER BY id "
        "LIMIT {{ __frame_max_rows }} FOR UPDATE SKIP LOCKED) RETURNING id"
    )
    text = playbook(
        f"""
        - step: start
          loop:
            iterator: row
            spec: {{mode: cursor, frame: {{max_rows: {FRAME}}}, max_in_flight: {IN_FLIGHT}}}
            cursor: {{kind: postgres, dsn: "{{{{ workload.dsn }}}}", claim: "{claim}"}}
          tool:
            kind: python
            args: {{path: "{{{{ workload.path }}}}", id: "{{{{ iter.row.id }}}}"}}
            code: |
              import os, time
              fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
              try:
                  os.write(fd, f"{{id}}\\n".encode())
              finally:
                  os.close(fd)
              time.sleep(0.02)
              result = id
        """,
        name="cursor",
    )
    procs.controller()
    first = procs.worker("w1", concurrency=2)
    (eid,) = await submit_many(nc, topo, [(text, {"dsn": pg.dsn, "path": str(effects)})])
    deadline = time.monotonic() + 45
    while len(lines(effects)) < 35:
        assert time.monotonic() < deadline, procs.logs()
        await asyncio.sleep(0.02)
    first.kill()
    at_kill = len(lines(effects))
    procs.worker("w2", concurrency=2)

    await wait_processed(js, topo, [eid], timeout=60)

    events = await history(js, topo, eid)
    (end,) = [e for e in events if e.name == E.PLAYBOOK_PROCESSED]
    assert end.payload["status"] == "success", end.payload
    recorded = {
        e.payload["index"]: e.payload["item"]["id"] for e in events if e.name == E.LOOP_ITERATION_STARTED
    }
    assert end.payload["result"] == [recorded[i] for i in range(len(recorded))]  # each claimed row, once
    runs = collections.Counter(int(x) for x in lines(effects))
    assert set(runs) == set(recorded.values())
    # A row is claimed once; only rows a dead worker claimed and never recorded (killed between the claim
    # and its record) are not run: the claim query's concern, at most one frame.
    assert len(recorded) >= ROWS - FRAME and len(set(recorded.values())) == len(recorded)
    repeated = sum(n - 1 for n in runs.values())
    print(f"killed after {at_kill} rows; {repeated} ran again")
    assert at_kill < ROWS, "the loop finished before the kill"
    assert repeated <= IN_FLIGHT, f"{repeated} rows ran again after the crash at {at_kill}"
