"""``make bench``: runtime figures side by side with the raw JetStream figures of the same run.

Raw and runtime figures are measured interleaved, ``--repeat`` times, on one embedded server and
one event loop, and reported as medians (this machine is noisy: only same-run ratios hold). The
tool figures (`bench.tools`) pair HTTP and Postgres work through the runtime with the same work done
directly with aiohttp/asyncpg, against a local aiohttp server and an embedded PostgreSQL
(`bench.services`); ``--no-services`` skips them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from bench import api, raw, runtime, tools
from bench.services import HttpServer, PgServer
from noetl_stream.embedded import EmbeddedNats
from noetl_stream.kv.keychain import Keychain, KeychainKey, generate_key
from noetl_stream.local import Runtime, local_runtime
from noetl_stream.logs import configure
from noetl_stream.loop import run_event_loop

API_CONCURRENCY = 16
"""Calls in flight at once for the API figures (`bench.api`)."""


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Services:
    """The local HTTP server and PostgreSQL the tool figures use, and their sizes."""

    def __init__(self, http: HttpServer, pg: PgServer, quick: bool) -> None:
        self.http, self.pg = http, pg
        scale = 0.2 if quick else 1.0
        self.http_n, self.http_concurrency = int(2000 * scale), 50
        self.pg_n, self.pg_concurrency = int(2000 * scale), 10
        self.pg_many_n = int(5000 * scale)

    def sizes(self) -> dict[str, int]:
        return {
            "http_requests": self.http_n,
            "http_concurrency": self.http_concurrency,
            "pg_inserts": self.pg_n,
            "pg_concurrency": self.pg_concurrency,
            "pg_executemany_rows": self.pg_many_n,
        }


async def _warm_tools(rt: Runtime, clients: tools.DirectClients, svc: Services) -> None:
    """First use creates the worker's HTTP session and pool, and the direct ones: not timed."""
    await tools.http_direct_per_s(clients, svc.http.url, 50, svc.http_concurrency)
    await tools.http_tasks_per_s(rt, svc.http.url, 50, svc.http_concurrency)
    await tools.pg_direct_inserts_per_s(clients, 50, svc.pg_concurrency)
    await tools.pg_tool_inserts_per_s(rt, clients, 50, svc.pg_concurrency)
    await tools.pg_tool_executemany_per_s(rt, clients, 50)


async def _tools_round(
    rt: Runtime, clients: tools.DirectClients, svc: Services, add: Callable[[str, float], None], label: str
) -> None:
    url = svc.http.url
    _say(f"{label}: {svc.http_n} http requests, {svc.http_concurrency} at once (direct, runtime) ...")
    add("http_direct_per_s", await tools.http_direct_per_s(clients, url, svc.http_n, svc.http_concurrency))
    add("http_tasks_per_s", await tools.http_tasks_per_s(rt, url, svc.http_n, svc.http_concurrency))
    _say(f"{label}: {svc.pg_n} postgres inserts, {svc.pg_concurrency} at once (direct, runtime) ...")
    add("pg_direct_inserts_per_s", await tools.pg_direct_inserts_per_s(clients, svc.pg_n, svc.pg_concurrency))
    add(
        "pg_tool_inserts_per_s",
        await tools.pg_tool_inserts_per_s(rt, clients, svc.pg_n, svc.pg_concurrency),
    )
    _say(f"{label}: {svc.pg_many_n} rows in one executemany (direct, runtime) ...")
    add("pg_direct_executemany_rows_per_s", await tools.pg_direct_executemany_per_s(clients, svc.pg_many_n))
    add(
        "pg_tool_executemany_rows_per_s",
        await tools.pg_tool_executemany_per_s(rt, clients, svc.pg_many_n),
    )


async def measure(url: str, quick: bool, repeat: int, svc: Services | None) -> dict[str, Any]:
    samples: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        samples.setdefault(key, []).append(value)

    scale = 0.2 if quick else 1.0
    items = int(10_000 * scale)
    key = KeychainKey([generate_key()])
    async with contextlib.AsyncExitStack() as stack:
        rt = await stack.enter_async_context(local_runtime(url, workers=1, concurrency=128, keychain_key=key))
        clients = None
        if svc is not None:
            await Keychain(rt.nc.jetstream(), rt.topology, key).put(
                tools.PG_CREDENTIAL, "postgres_credential", svc.pg.credential()
            )
            clients = await stack.enter_async_context(
                tools.DirectClients(svc.pg.dsn, max(svc.pg_concurrency, 1))
            )
        for i in range(repeat):
            _say(f"round {i + 1}/{repeat}: sequential chain (raw, runtime) ...")
            add("raw_seq_steps_per_s", await raw.raw_seq_steps_per_s(url, steps=int(600 * scale) or 50))
            add("seq_steps_per_s", await runtime.seq_steps_per_s(rt, 100))
            _say(f"round {i + 1}/{repeat}: 100 concurrent chains (raw, runtime) ...")
            add(
                "raw_concurrent_steps_per_s",
                await raw.raw_concurrent_steps_per_s(url, 100, int(40 * scale) or 5),
            )
            add("concurrent_steps_per_s", await runtime.concurrent_steps_per_s(rt, 100, 10))
        if svc is not None and clients is not None:
            await _warm_tools(rt, clients, svc)
            for i in range(repeat):
                await _tools_round(rt, clients, svc, add, f"tools round {i + 1}/{repeat}")
        api_n = int(1000 * scale)
        await api.measure(rt, url, add, repeat=repeat, n=api_n, concurrency=API_CONCURRENCY, say=_say)
        _say(f"{items}-item parallel loops, max_in_flight 100 (local, distributed) ...")
        add("loop_local_iters_per_s", await runtime.loop_iters_per_s(rt, items, "local"))
        add("loop_distributed_iters_per_s", await runtime.loop_iters_per_s(rt, items, "distributed"))
        _say("request -> playbook.processed latency of a 2-step playbook ...")
        p50, p99 = await runtime.latency_ms(rt, int(200 * scale) or 20)
        add("latency_p50_ms", p50)
        add("latency_p99_ms", p99)
    out: dict[str, Any] = {k: statistics.median(v) for k, v in samples.items()}
    out["loop_items"] = items
    out["api_executions"], out["api_concurrency"] = api_n, API_CONCURRENCY
    if svc is not None:
        out.update(svc.sizes())
    return _ratios(out, samples)


async def measure_sync_always(url: str, repeat: int) -> dict[str, Any]:
    """The cost of durability: the same step figures on a server that fsyncs every write."""
    samples: dict[str, list[float]] = {}
    async with local_runtime(url, workers=1, concurrency=128) as rt:
        for i in range(repeat):
            _say(f"sync_interval=always, round {i + 1}/{repeat} ...")
            samples.setdefault("seq_steps_per_s_sync_always", []).append(
                await runtime.seq_steps_per_s(rt, 100)
            )
            samples.setdefault("concurrent_steps_per_s_sync_always", []).append(
                await runtime.concurrent_steps_per_s(rt, 100, 10)
            )
    return {k: statistics.median(v) for k, v in samples.items()}


def _ratios(out: dict[str, Any], samples: dict[str, list[float]]) -> dict[str, Any]:
    out["seq_ratio"] = out["seq_steps_per_s"] / out["raw_seq_steps_per_s"]
    out["concurrent_ratio"] = out["concurrent_steps_per_s"] / out["raw_concurrent_steps_per_s"]
    for ratio, num, den in (
        ("http_ratio", "http_tasks_per_s", "http_direct_per_s"),
        ("pg_ratio", "pg_tool_inserts_per_s", "pg_direct_inserts_per_s"),
        ("pg_executemany_ratio", "pg_tool_executemany_rows_per_s", "pg_direct_executemany_rows_per_s"),
    ):
        if num in out and den in out:
            out[ratio] = out[num] / out[den]
    api.ratios(out)
    out["samples"] = samples
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of the raw/runtime pairs (medians)")
    parser.add_argument("--out", default="bench-results.json")
    parser.add_argument(
        "--no-services", action="store_true", help="skip the HTTP/Postgres tool figures (no servers started)"
    )
    args = parser.parse_args()
    configure("warning")
    t = time.time()
    with contextlib.ExitStack() as stack:
        svc = None
        if not args.no_services:
            _say("starting the bench http server and an embedded PostgreSQL ...")
            svc = Services(stack.enter_context(HttpServer()), stack.enter_context(PgServer()), args.quick)
        server = stack.enter_context(EmbeddedNats())
        results = run_event_loop(measure(server.url, args.quick, max(1, args.repeat), svc))
    with EmbeddedNats(sync_interval="always") as server:
        results.update(run_event_loop(measure_sync_always(server.url, max(1, args.repeat))))
    results["sync_always_seq_cost"] = results["seq_steps_per_s_sync_always"] / results["seq_steps_per_s"]
    results["machine"] = {"python": platform.python_version(), "platform": platform.platform()}
    results["duration_s"] = round(time.time() - t, 1)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    width = max(len(k) for k in results)
    for k, v in results.items():
        if isinstance(v, float):
            print(f"{k:<{width}}  {v:,.2f}")
        elif isinstance(v, int):
            print(f"{k:<{width}}  {v}")
    print(f"(medians of {args.repeat} rounds; all samples in {args.out})")


if __name__ == "__main__":
    main()
