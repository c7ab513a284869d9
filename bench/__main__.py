"""``make bench``: runtime figures side by side with the raw JetStream figures of the same run.

Raw and runtime figures are measured interleaved, ``--repeat`` times, on one embedded server and
one event loop, and reported as medians (this machine is noisy: only same-run ratios hold). The
tool figures (`bench.tools`) pair HTTP and Postgres work through the runtime with the same work done
directly with aiohttp/asyncpg, against a local aiohttp server and an embedded PostgreSQL
(`bench.services`); ``--no-services`` skips them. `bench.footprint` counts what one noop step writes.

Then, on the same server, the figures with the controller and the workers as separate processes
(`bench.scale`, the real ``noetl-stream controller``/``worker``): loops and chains at 1k/10k/100k
(``--growth-sizes``) with their per-item cost and RSS, and throughput with 1/2/4 worker processes and
1/2 controllers, each next to the raw two-process figure measured just before it. ``--no-procs`` skips
them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

from bench import api, footprint, raw, runtime, scale, tools
from bench.reference import js_limits_concurrent_steps_per_s
from bench.services import HttpServer, PgServer
from noetl_stream.dataplane.worker import CLOCK_SKEW_S
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.keychain import Keychain, KeychainKey, generate_key
from noetl_stream.logs import configure
from noetl_stream.loop import run_event_loop
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import local_runtime

API_CONCURRENCY = 16
INFORMATIVE_PREFIX = "noetlinf"
"""Calls in flight at once for the API figures (`bench.api`)."""

CONCURRENT_CHAIN = 40
"""Steps per chain of the 100-concurrent figure, raw and runtime alike: the same workload on both sides
(100 chains of 40 steps; `concurrent_short_steps_per_s` is the runtime with 10-step executions, where
starting and finishing an execution weighs 4x as much)."""


def concurrent_chain(quick: bool) -> int:
    """`CONCURRENT_CHAIN`, scaled down for ``--quick`` as the other sizes are."""
    return int(CONCURRENT_CHAIN * (0.2 if quick else 1.0)) or 5


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def measure(url: str, quick: bool, repeat: int, svc: tools.Services | None) -> dict[str, Any]:
    samples: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        samples.setdefault(key, []).append(value)

    factor = 0.2 if quick else 1.0
    items = int(10_000 * factor)
    chain = concurrent_chain(quick)
    key = KeychainKey([generate_key()])
    async with contextlib.AsyncExitStack() as stack:
        rt = await stack.enter_async_context(local_runtime(url, workers=1, concurrency=128, keychain_key=key))
        # The same runtime whose worker writes `--task-events informative` (its own prefix: its own
        # controller and partitions on the same server), measured in the same rounds.
        informative = await stack.enter_async_context(
            local_runtime(
                url,
                topology=Topology(prefix=INFORMATIVE_PREFIX),
                workers=1,
                concurrency=128,
                task_events="informative",
            )
        )
        # Warm-up, not timed, the same for both and past the first seconds after a start, which pay for
        # what a steady runtime does not: caches filling, and a worker looking up the end of every
        # execution whose commands were issued before it listened for ends (plus CLOCK_SKEW_S).
        warm_until = time.monotonic() + CLOCK_SKEW_S + 1.0
        while time.monotonic() < warm_until:
            await runtime.concurrent_steps_per_s(rt, 100, 10)
            await runtime.concurrent_steps_per_s(informative, 100, 10)
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
            add("raw_seq_steps_per_s", await raw.raw_seq_steps_per_s(url, steps=int(600 * factor) or 50))
            add("seq_steps_per_s", await runtime.seq_steps_per_s(rt, 100))
            _say(f"round {i + 1}/{repeat}: 100 concurrent chains (raw, runtime x{chain}, runtime x10) ...")

            async def default_block() -> None:
                # raw, the runtime, js_limits.py: the runtime's figure sits between its two denominators.
                add("raw_concurrent_steps_per_s", await raw.raw_concurrent_steps_per_s(url, 100, chain))
                add("concurrent_steps_per_s", await runtime.concurrent_steps_per_s(rt, 100, chain))
                reference = await asyncio.to_thread(js_limits_concurrent_steps_per_s, quick)
                if reference is not None:
                    add("js_limits_concurrent_steps_per_s", reference)

            async def informative_block() -> None:
                add(
                    "raw_concurrent_informative_steps_per_s",
                    await raw.raw_concurrent_steps_per_s(url, 100, chain),
                )
                add(
                    "concurrent_informative_steps_per_s",
                    await runtime.concurrent_steps_per_s(informative, 100, chain),
                )

            # Each 100 x 40 figure right after a raw figure of its own (the machine's speed drifts within
            # a round), and the two blocks swap places from one round to the next.
            blocks = [default_block, informative_block]
            for block in blocks if i % 2 == 0 else blocks[::-1]:
                await block()
            add("concurrent_short_steps_per_s", await runtime.concurrent_steps_per_s(rt, 100, 10))
        if svc is not None and clients is not None:
            await tools.warm(rt, clients, svc)
            for i in range(repeat):
                await tools.round_of(rt, clients, svc, add, f"tools round {i + 1}/{repeat}")
        api_n = int(1000 * factor)
        await api.measure(rt, url, add, repeat=repeat, n=api_n, concurrency=API_CONCURRENCY, say=_say)
        _say(f"{items}-item parallel loops, max_in_flight 100 (local, distributed) ...")
        add("loop_local_iters_per_s", await runtime.loop_iters_per_s(rt, items, "local"))
        add("loop_distributed_iters_per_s", await runtime.loop_iters_per_s(rt, items, "distributed"))
        _say("request -> playbook.processed latency of a 2-step playbook ...")
        p50, p99 = await runtime.latency_ms(rt, int(200 * factor) or 20)
        add("latency_p50_ms", p50)
        add("latency_p99_ms", p99)
        fp = await footprint.footprint(rt, url, 5 if quick else 10, 25 if quick else 110, _say)
        fp_informative = await footprint.footprint(
            informative, url, 5 if quick else 10, 25 if quick else 110, _say
        )
        for name in ("messages", "bytes", "events", "event_bytes"):
            fp[f"footprint_informative_{name}_per_step"] = fp_informative[f"footprint_{name}_per_step"]
    out: dict[str, Any] = {k: statistics.median(v) for k, v in samples.items()}
    out.update(fp)
    out["loop_items"] = items
    out["api_executions"], out["api_concurrency"] = api_n, API_CONCURRENCY
    if svc is not None:
        out.update(svc.sizes())
    return _ratios(out, samples)


async def measure_sync_always(url: str, repeat: int, chain: int) -> dict[str, Any]:
    """The cost of durability: the same step figures on a server that fsyncs every write."""
    samples: dict[str, list[float]] = {}
    async with local_runtime(url, workers=1, concurrency=128) as rt:
        for i in range(repeat):
            _say(f"sync_interval=always, round {i + 1}/{repeat} ...")
            samples.setdefault("seq_steps_per_s_sync_always", []).append(
                await runtime.seq_steps_per_s(rt, 100)
            )
            samples.setdefault("concurrent_steps_per_s_sync_always", []).append(
                await runtime.concurrent_steps_per_s(rt, 100, chain)
            )
    return {k: statistics.median(v) for k, v in samples.items()}


async def measure_procs(
    url: str, quick: bool, repeat: int, sizes: tuple[int, ...], svc: tools.Services | None = None
) -> dict[str, Any]:
    """The figures with the controller and workers as separate processes (`bench.scale`), and a loop of
    http tasks, local and distributed, on two worker processes (`tools.http_loops_in_processes`)."""
    out: dict[str, Any] = {}
    if svc is not None:
        out.update(
            await tools.http_loops_in_processes(url, svc.http.url, 2000 if quick else 10_000, say=_say)
        )
    rows, flat = await scale.growth(url, sizes, _say, quick)
    out.update(flat)
    out["growth"] = rows
    srows, sflat = await scale.scaling(url, 1 if quick else repeat, 100, concurrent_chain(quick), _say, quick)
    out.update(sflat)
    out["scaling"] = srows
    return out


def _paired(out: dict[str, Any], samples: dict[str, list[float]], name: str, num: str, den: str) -> None:
    """``<name>_paired``: the median of the rounds' own ratios (each round's runtime figure over the raw
    figure measured just before it), with ``_min`` and ``_max``. Steadier than the ratio of the medians
    when the machine's speed drifts between rounds."""
    a, b = samples.get(num), samples.get(den)
    if not a or not b or len(a) != len(b):
        return
    rounds = [x / y for x, y in zip(a, b, strict=True)]
    out[f"{name}_paired"] = statistics.median(rounds)
    out[f"{name}_paired_min"], out[f"{name}_paired_max"] = min(rounds), max(rounds)


def _ratios(out: dict[str, Any], samples: dict[str, list[float]]) -> dict[str, Any]:
    _paired(out, samples, "seq_ratio", "seq_steps_per_s", "raw_seq_steps_per_s")
    _paired(out, samples, "concurrent_ratio", "concurrent_steps_per_s", "raw_concurrent_steps_per_s")
    _paired(
        out,
        samples,
        "concurrent_informative_ratio",
        "concurrent_informative_steps_per_s",
        "raw_concurrent_informative_steps_per_s",
    )
    _paired(
        out,
        samples,
        "concurrent_ratio_js_limits",
        "concurrent_steps_per_s",
        "js_limits_concurrent_steps_per_s",
    )
    out["seq_ratio"] = out["seq_steps_per_s"] / out["raw_seq_steps_per_s"]
    out["concurrent_ratio"] = out["concurrent_steps_per_s"] / out["raw_concurrent_steps_per_s"]
    out["concurrent_short_ratio"] = out["concurrent_short_steps_per_s"] / out["raw_concurrent_steps_per_s"]
    out["concurrent_informative_ratio"] = (
        out["concurrent_informative_steps_per_s"] / out["raw_concurrent_informative_steps_per_s"]
    )
    if "js_limits_concurrent_steps_per_s" in out:
        reference = out["js_limits_concurrent_steps_per_s"]
        out["concurrent_ratio_js_limits"] = out["concurrent_steps_per_s"] / reference
        out["concurrent_short_ratio_js_limits"] = out["concurrent_short_steps_per_s"] / reference
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
    parser.add_argument("--repeat", type=int, default=5, help="rounds of the raw/runtime pairs (medians)")
    parser.add_argument("--out", default="bench-results.json")
    parser.add_argument(
        "--no-services", action="store_true", help="skip the HTTP/Postgres tool figures (no servers started)"
    )
    parser.add_argument(
        "--no-procs",
        action="store_true",
        help="skip the figures with controller/worker processes (bench.scale)",
    )
    parser.add_argument(
        "--growth-sizes",
        default=None,
        help="comma-separated item counts of the growth figures (default 1000,10000,100000; --quick 100,1000)",
    )
    args = parser.parse_args()
    if args.growth_sizes:
        sizes = tuple(int(x) for x in args.growth_sizes.split(","))
    else:
        sizes = (100, 1_000) if args.quick else (1_000, 10_000, 100_000)
    configure("warning")
    t = time.time()
    with contextlib.ExitStack() as stack:
        svc = None
        if not args.no_services:
            _say("starting the bench http server and an embedded PostgreSQL ...")
            svc = tools.Services(
                stack.enter_context(HttpServer()), stack.enter_context(PgServer()), args.quick
            )
        server = stack.enter_context(EmbeddedNats())
        results = run_event_loop(measure(server.url, args.quick, max(1, args.repeat), svc))
        if not args.no_procs:
            results.update(
                run_event_loop(measure_procs(server.url, args.quick, max(1, args.repeat), sizes, svc))
            )
    with EmbeddedNats(sync_interval="always") as server:
        chain = concurrent_chain(args.quick)
        results.update(run_event_loop(measure_sync_always(server.url, max(1, args.repeat), chain)))
    results["sync_always_seq_cost"] = results["seq_steps_per_s_sync_always"] / results["seq_steps_per_s"]
    results["sync_always_concurrent_cost"] = (
        results["concurrent_steps_per_s_sync_always"] / results["concurrent_steps_per_s"]
    )
    results["machine"] = {"python": platform.python_version(), "platform": platform.platform()}
    results["duration_s"] = round(time.time() - t, 1)
    results["load_average"] = os.getloadavg()
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(report(results))
    print(f"(medians of {args.repeat} rounds; all samples in {args.out})")


_PAIRS = (
    ("sequential chain, steps/s", "raw_seq_steps_per_s", "seq_steps_per_s"),
    (
        "100 concurrent executions, chains as raw, steps/s",
        "raw_concurrent_steps_per_s",
        "concurrent_steps_per_s",
    ),
    (
        "same, worker --task-events informative, steps/s",
        "raw_concurrent_informative_steps_per_s",
        "concurrent_informative_steps_per_s",
    ),
    (
        "100 concurrent executions x 10 steps, steps/s",
        "raw_concurrent_steps_per_s",
        "concurrent_short_steps_per_s",
    ),
    (
        "100 concurrent, chains as raw, against js_limits.py's raw",
        "js_limits_concurrent_steps_per_s",
        "concurrent_steps_per_s",
    ),
    (
        "100 concurrent executions x 10 steps, against js_limits.py's raw",
        "js_limits_concurrent_steps_per_s",
        "concurrent_short_steps_per_s",
    ),
    ("messages per noop step", "raw_messages_per_step", "footprint_messages_per_step"),
    ("bytes per noop step", "raw_bytes_per_step", "footprint_bytes_per_step"),
    (
        "messages per noop step, --task-events informative",
        "raw_messages_per_step",
        "footprint_informative_messages_per_step",
    ),
    (
        "bytes per noop step, --task-events informative",
        "raw_bytes_per_step",
        "footprint_informative_bytes_per_step",
    ),
)


def report(results: dict[str, Any]) -> str:
    """The printed tables: raw vs runtime pairs, growth, scaling, the per-step footprint, the rest."""
    lines = [f"{'figure':<62} {'raw':>10} {'runtime':>10} {'ratio':>7}"]
    shown: set[str] = set()
    for label, raw_key, key in _PAIRS:
        if key in results and raw_key in results:
            r, v = results[raw_key], results[key]
            lines.append(f"{label:<62} {r:>10,.1f} {v:>10,.1f} {v / r:>7.2f}")
            shown |= {raw_key, key}
    for row in results.get("scaling", []):
        label = (
            f"{row['controllers']} ctl ({row['partitions']} partitions), {row['worker_processes']} worker procs, "
            "steps/s (raw: 2 procs)"
        )
        lines.append(
            f"{label:<62} {row['raw_2proc_steps_per_s']:>10,.1f} {row['steps_per_s']:>10,.1f} {row['ratio']:>7.2f}"
        )
    if results.get("growth"):
        lines += [
            "",
            f"{'growth':<17} {'N':>7} {'per s':>8} {'raw 2p':>8} {'ratio':>6} {'wall us':>8} {'ctl cpu':>8} "
            f"{'wrk cpu':>8}  controller MB base/peak/end  worker MB base/peak/end",
        ]
        for g in results["growth"]:
            lines.append(
                f"{g['workload']:<17} {g['n']:>7} {g['per_s']:>8,.0f} {g['raw_2proc_per_s']:>8,.0f} "
                f"{g['ratio']:>6.2f} {g['us_per']:>8,.0f} {g['controller_cpu_us_per']:>8,.0f} "
                f"{g['worker_cpu_us_per']:>8,.0f}  {g['controller_base_mb']:>9.1f} {g['controller_peak_mb']:>6.1f} "
                f"{g['controller_end_mb']:>6.1f}  {g['worker_base_mb']:>9.1f} {g['worker_peak_mb']:>6.1f} "
                f"{g['worker_end_mb']:>6.1f}"
            )
    if "footprint" in results:
        lines += ["", footprint.table(results)]
    lines.append("")
    skip = shown | {k for k in results if k.startswith(("scaling_", "footprint_", "growth_"))}
    rest = [(k, v) for k, v in results.items() if k not in skip and isinstance(v, (int, float))]
    width = max((len(k) for k, _ in rest), default=10)
    for k, v in rest:
        lines.append(f"{k:<{width}}  {v:,.2f}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
