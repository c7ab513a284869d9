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

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import asyncpg
import msgspec

from bench.procs import Deployment
from bench.runtime import run_one
from bench.scale import warm as warm_processes
from bench.services import HttpServer, PgServer
from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import Completions
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.keychain import Keychain, KeychainKey, generate_key
from noetl_stream.logs import configure
from noetl_stream.loop import run_event_loop
from noetl_stream.runtime.local import Runtime, local_runtime

__all__ = [
    "HTTP_PATH",
    "PG_CREDENTIAL",
    "TABLE",
    "DirectClients",
    "Services",
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


def http_playbook(url: str, n: int, concurrency: int, exec_mode: str = "local") -> str:
    policy = "" if exec_mode == "local" else f", policy: {{exec: {exec_mode}}}"
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
      spec: {{mode: parallel, max_in_flight: {concurrency}{policy}}}
    tool:
      - name: get
        kind: http
        url: "{{{{ workload.url }}}}{HTTP_PATH}"
        params: {{i: "{{{{ iter.i }}}}"}}
"""


async def http_loops_in_processes(
    nats_url: str, http_url: str, items: int, workers: int = 2, say: Callable[[str], None] | None = None
) -> dict[str, float]:
    """A loop of `items` http tasks on real processes (one controller, a worker supervising `workers`
    processes), local (one worker process runs them all) and distributed (each a command any worker
    process takes): items/s, and the controller's and the workers' CPU µs per item."""
    out: dict[str, float] = {}
    async with Deployment(nats_url) as d:
        ctl, wrk = d.controller(), d.worker(processes=workers)
        await warm_processes(d)
        for mode in ("local", "distributed"):
            text = http_playbook(http_url, items, 100, mode)
            await run_one(d, http_playbook(http_url, 200, 100, mode), "http_warm.yaml")  # type: ignore[arg-type]
            if say is not None:
                say(f"{items} http tasks, {mode} loop, {workers} worker processes ...")
            c0, w0 = ctl.cpu_s(), wrk.cpu_s()
            dt = await run_one(d, text, f"http_{mode}.yaml")  # type: ignore[arg-type]
            out[f"http_{mode}_{workers}proc_items_per_s"] = items / dt
            out[f"http_{mode}_{workers}proc_controller_cpu_us_per_item"] = (ctl.cpu_s() - c0) / items * 1e6
            out[f"http_{mode}_{workers}proc_worker_cpu_us_per_item"] = (wrk.cpu_s() - w0) / items * 1e6
    return out


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


class Services:
    """The local HTTP server and PostgreSQL the tool figures use, and their sizes."""

    def __init__(self, http: HttpServer, pg: PgServer, quick: bool) -> None:
        self.http, self.pg = http, pg
        factor = 0.2 if quick else 1.0
        self.http_n, self.http_concurrency = int(2000 * factor), 50
        self.pg_n, self.pg_concurrency = int(2000 * factor), 10
        self.pg_many_n = int(5000 * factor)

    def sizes(self) -> dict[str, int]:
        return {
            "http_requests": self.http_n,
            "http_concurrency": self.http_concurrency,
            "pg_inserts": self.pg_n,
            "pg_concurrency": self.pg_concurrency,
            "pg_executemany_rows": self.pg_many_n,
        }


async def warm(rt: Runtime, clients: DirectClients, svc: Services) -> None:
    """First use creates the worker's HTTP session and pool, and the direct ones: not timed."""
    await http_direct_per_s(clients, svc.http.url, 50, svc.http_concurrency)
    await http_tasks_per_s(rt, svc.http.url, 50, svc.http_concurrency)
    await pg_direct_inserts_per_s(clients, 50, svc.pg_concurrency)
    await pg_tool_inserts_per_s(rt, clients, 50, svc.pg_concurrency)
    await pg_tool_executemany_per_s(rt, clients, 50)


async def round_of(
    rt: Runtime, clients: DirectClients, svc: Services, add: Callable[[str, float], None], label: str
) -> None:
    url = svc.http.url
    _say(f"{label}: {svc.http_n} http requests, {svc.http_concurrency} at once (direct, runtime) ...")
    add("http_direct_per_s", await http_direct_per_s(clients, url, svc.http_n, svc.http_concurrency))
    add("http_tasks_per_s", await http_tasks_per_s(rt, url, svc.http_n, svc.http_concurrency))
    _say(f"{label}: {svc.pg_n} postgres inserts, {svc.pg_concurrency} at once (direct, runtime) ...")
    add("pg_direct_inserts_per_s", await pg_direct_inserts_per_s(clients, svc.pg_n, svc.pg_concurrency))
    add(
        "pg_tool_inserts_per_s",
        await pg_tool_inserts_per_s(rt, clients, svc.pg_n, svc.pg_concurrency),
    )
    _say(f"{label}: {svc.pg_many_n} rows in one executemany (direct, runtime) ...")
    add("pg_direct_executemany_rows_per_s", await pg_direct_executemany_per_s(clients, svc.pg_many_n))
    add(
        "pg_tool_executemany_rows_per_s",
        await pg_tool_executemany_per_s(rt, clients, svc.pg_many_n),
    )


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def _main(quick: bool, repeat: int, url: str, svc: Services) -> dict[str, Any]:
    samples: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        samples.setdefault(key, []).append(value)

    key = KeychainKey([generate_key()])
    async with local_runtime(url, workers=1, concurrency=128, keychain_key=key) as rt:
        await Keychain(rt.nc.jetstream(), rt.topology, key).put(
            PG_CREDENTIAL, "postgres_credential", svc.pg.credential()
        )
        async with DirectClients(svc.pg.dsn, max(svc.pg_concurrency, 1)) as clients:
            await warm(rt, clients, svc)
            for i in range(repeat):
                await round_of(rt, clients, svc, add, f"round {i + 1}/{repeat}")
    out: dict[str, Any] = {k: statistics.median(v) for k, v in samples.items()}
    for ratio, num, den in RATIOS:
        out[ratio] = out[num] / out[den]
        rounds = [a / b for a, b in zip(samples[num], samples[den], strict=True)]
        out[f"{ratio}_paired"] = statistics.median(rounds)
    out["samples"] = samples
    return out


RATIOS = (
    ("http_ratio", "http_tasks_per_s", "http_direct_per_s"),
    ("pg_ratio", "pg_tool_inserts_per_s", "pg_direct_inserts_per_s"),
    ("pg_executemany_ratio", "pg_tool_executemany_rows_per_s", "pg_direct_executemany_rows_per_s"),
)
"""Each tool figure's ratio: through the runtime over the same work done directly, same run."""


def main() -> None:
    """``python -m bench.tools [--quick] [--repeat N]``: the tool figures of ``make bench`` alone."""
    parser = argparse.ArgumentParser(prog="python -m bench.tools")
    parser.add_argument("--quick", action="store_true", help="a fifth of the sizes")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (medians, and paired ratios)")
    args = parser.parse_args()
    configure("warning")
    with HttpServer() as http, PgServer() as pg, EmbeddedNats() as server:
        svc = Services(http, pg, args.quick)
        out = run_event_loop(_main(args.quick, max(1, args.repeat), server.url, svc))
    for name, value in out.items():
        if name != "samples":
            print(f"{name:40} {value:12.3f}" if value < 100 else f"{name:40} {value:12.0f}")


if __name__ == "__main__":
    main()
