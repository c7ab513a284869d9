"""Tool figures: HTTP and Postgres work through the runtime next to the same work done directly.

Each pair does the same operations against the same server process, with the same concurrency, in
the same process and event loop; the ratio (runtime / direct) is the runtime's overhead:

* HTTP: `n` ``GET /item?i=<i>`` requests reading and JSON-decoding the body (msgspec, as the tool
  does). Direct: one ``aiohttp.ClientSession`` (no cookie jar, a 256-connection pool, as the tool's),
  `concurrency` coroutines taking the next request. Runtime: one execution whose parallel local loop
  runs `n` ``kind: http`` tasks with ``max_in_flight: concurrency``.
* Postgres, one INSERT per row: `n` single-row ``INSERT ... VALUES ($1, $2, $3)``. Direct: an asyncpg
  pool of `concurrency` connections and `concurrency` coroutines each executing the next insert
  (individual statements, not executemany). Runtime: a parallel local loop of `n` ``kind: postgres``
  tasks (``auth`` from the keychain, ``spec.pool_size: concurrency``, ``max_in_flight: concurrency``).
* Postgres, one batch: the same `n` rows in one ``executemany`` on one connection. Direct: asyncpg
  ``executemany``. Runtime: one ``kind: postgres`` task with ``many: true`` whose ``params`` is the rows
  (they travel in the execution request and the command).

The runtime side is timed from submitting the request to ``playbook.processed``, so it includes
compiling the playbook, scheduling the step and every event its tasks publish. Each measurement
checks its work (HTTP tasks succeeded, the table holds `n` rows).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import asyncpg
import msgspec

from bench.runtime import run_one
from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import Completions
from noetl_stream.runtime.local import Runtime

__all__ = [
    "HTTP_PATH",
    "PG_CREDENTIAL",
    "TABLE",
    "DirectClients",
    "http_direct_per_s",
    "http_tasks_per_s",
    "pg_direct_executemany_per_s",
    "pg_direct_inserts_per_s",
    "pg_tool_executemany_per_s",
    "pg_tool_inserts_per_s",
    "prepare_table",
]

PG_CREDENTIAL = "pg_bench"
TABLE = "bench_items"
INSERT = f"INSERT INTO {TABLE} (id, name, amount) VALUES ($1, $2, $3)"
HTTP_PATH = "/item"


def _row(i: int) -> tuple[int, str, float]:
    return i, f"item-{i}", i * 0.5


class DirectClients:
    """The direct side's long-lived client objects, created once like the worker's (not timed)."""

    def __init__(self, pg_dsn: str, concurrency: int) -> None:
        self.pg_dsn = pg_dsn
        self.concurrency = concurrency
        self.session: aiohttp.ClientSession | None = None
        self.pool: Any = None

    async def __aenter__(self) -> DirectClients:
        self.session = aiohttp.ClientSession(
            cookie_jar=aiohttp.DummyCookieJar(), connector=aiohttp.TCPConnector(limit=256, ttl_dns_cache=60)
        )
        self.pool = await asyncpg.create_pool(self.pg_dsn, min_size=0, max_size=self.concurrency)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.session is not None:
            await self.session.close()
        if self.pool is not None:
            await self.pool.close()


async def _workers(n: int, concurrency: int, one: Callable[[int], Awaitable[None]]) -> float:
    """Run ``one(i)`` for i in 0..n-1 with `concurrency` at once; the elapsed seconds."""
    next_i = 0

    async def worker() -> None:
        nonlocal next_i
        while next_i < n:
            i = next_i
            next_i += 1
            await one(i)

    t = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, n))))
    return time.perf_counter() - t


# --- HTTP ---------------------------------------------------------------------------------------------


async def http_direct_per_s(clients: DirectClients, url: str, n: int, concurrency: int) -> float:
    session = clients.session
    assert session is not None
    decode = msgspec.json.decode
    bad = 0

    async def one(i: int) -> None:
        nonlocal bad
        async with session.get(f"{url}{HTTP_PATH}", params={"i": str(i)}) as resp:
            body = decode(await resp.read())
            if resp.status != 200 or body["i"] != i:
                bad += 1

    dt = await _workers(n, concurrency, one)
    if bad:
        raise RuntimeError(f"{bad} of {n} direct http requests failed")
    return n / dt


def http_playbook(url: str, n: int, concurrency: int) -> str:
    return f"""apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: http_loop, path: bench/http_loop}}
workload:
  url: {json.dumps(url)}
  n: {n}
workflow:
  - step: start
    loop:
      in: "{{{{ range(workload.n) | list }}}}"
      iterator: i
      spec: {{mode: parallel, max_in_flight: {concurrency}}}
    tool:
      - name: get
        kind: http
        url: "{{{{ workload.url }}}}{HTTP_PATH}"
        params: {{i: "{{{{ iter.i }}}}"}}
"""


async def http_tasks_per_s(rt: Runtime, url: str, n: int, concurrency: int) -> float:
    dt = await run_one(rt, http_playbook(url, n, concurrency), "http_loop.yaml")
    return n / dt


# --- Postgres -----------------------------------------------------------------------------------------


async def prepare_table(clients: DirectClients) -> None:
    """An empty ``bench_items`` (created the first time)."""
    async with clients.pool.acquire() as conn:
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {TABLE} (id integer PRIMARY KEY, name text, amount double precision);"
            f"TRUNCATE {TABLE}"
        )


async def _check_rows(clients: DirectClients, n: int, what: str) -> None:
    async with clients.pool.acquire() as conn:
        count, total = await conn.fetchrow(f"SELECT count(*), coalesce(sum(id), 0) FROM {TABLE}")
    if count != n or total != n * (n - 1) // 2:
        raise RuntimeError(f"{what}: expected {n} rows in {TABLE}, found {count}")


async def pg_direct_inserts_per_s(clients: DirectClients, n: int, concurrency: int) -> float:
    await prepare_table(clients)
    pool = clients.pool

    async def one(i: int) -> None:
        async with pool.acquire() as conn:
            await conn.execute(INSERT, *_row(i))

    dt = await _workers(n, concurrency, one)
    await _check_rows(clients, n, "direct inserts")
    return n / dt


def pg_insert_playbook(n: int, concurrency: int) -> str:
    return f"""apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: pg_inserts, path: bench/pg_inserts}}
keychain:
  - {{name: {PG_CREDENTIAL}, kind: postgres_credential}}
workload:
  n: {n}
workflow:
  - step: start
    loop:
      in: "{{{{ range(workload.n) | list }}}}"
      iterator: i
      spec: {{mode: parallel, max_in_flight: {concurrency}}}
    tool:
      - name: insert
        kind: postgres
        auth: {PG_CREDENTIAL}
        command: "{INSERT}"
        params: ["{{{{ iter.i }}}}", "item-{{{{ iter.i }}}}", "{{{{ iter.i * 0.5 }}}}"]
        spec: {{pool_size: {concurrency}}}
"""


async def pg_tool_inserts_per_s(rt: Runtime, clients: DirectClients, n: int, concurrency: int) -> float:
    await prepare_table(clients)
    dt = await run_one(rt, pg_insert_playbook(n, concurrency), "pg_inserts.yaml")
    await _check_rows(clients, n, "postgres tool inserts")
    return n / dt


async def pg_direct_executemany_per_s(clients: DirectClients, n: int) -> float:
    await prepare_table(clients)
    rows = [_row(i) for i in range(n)]
    t = time.perf_counter()
    async with clients.pool.acquire() as conn:
        await conn.executemany(INSERT, rows)
    dt = time.perf_counter() - t
    await _check_rows(clients, n, "direct executemany")
    return n / dt


def pg_many_playbook() -> str:
    return f"""apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: pg_many, path: bench/pg_many}}
keychain:
  - {{name: {PG_CREDENTIAL}, kind: postgres_credential}}
workload:
  rows: []
workflow:
  - step: start
    tool:
      - name: insert_all
        kind: postgres
        auth: {PG_CREDENTIAL}
        command: "{INSERT}"
        many: true
        params: "{{{{ workload.rows }}}}"
"""


async def pg_tool_executemany_per_s(rt: Runtime, clients: DirectClients, n: int) -> float:
    await prepare_table(clients)
    rows = [list(_row(i)) for i in range(n)]
    dt = await _run_with_payload(rt, pg_many_playbook(), "pg_many.yaml", {"rows": rows})
    await _check_rows(clients, n, "postgres tool executemany")
    return n / dt


async def _run_with_payload(rt: Runtime, text: str, file: str, payload: dict[str, Any]) -> float:
    """`bench.runtime.run_one` with a workload payload."""
    async with Completions(rt.nc, rt.topology) as done:
        t = time.perf_counter()
        execution_id = await submit(rt.nc, rt.topology, request_for(text, file, payload))
        ev = await done.wait(execution_id, timeout=600)
        dt = time.perf_counter() - t
    if ev.payload.get("status") != "success":
        raise RuntimeError(f"{file}: {ev.payload.get('status')} {ev.payload.get('error')}")
    return dt
