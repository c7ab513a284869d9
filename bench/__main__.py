"""``make bench``: runtime figures side by side with the raw JetStream figures of the same run.

Raw and runtime figures are measured interleaved, ``--repeat`` times, on one embedded server and
one event loop, and reported as medians (this machine is noisy: only same-run ratios hold).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from typing import Any

from bench import raw, runtime
from noetl_stream.embedded import EmbeddedNats
from noetl_stream.local import local_runtime
from noetl_stream.logs import configure
from noetl_stream.loop import run_event_loop


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def measure(url: str, quick: bool, repeat: int) -> dict[str, Any]:
    samples: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        samples.setdefault(key, []).append(value)

    scale = 0.2 if quick else 1.0
    items = int(10_000 * scale)
    async with local_runtime(url, workers=1, concurrency=128) as rt:
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
        _say(f"{items}-item parallel loops, max_in_flight 100 (local, distributed) ...")
        add("loop_local_iters_per_s", await runtime.loop_iters_per_s(rt, items, "local"))
        add("loop_distributed_iters_per_s", await runtime.loop_iters_per_s(rt, items, "distributed"))
        _say("request -> playbook.processed latency of a 2-step playbook ...")
        p50, p99 = await runtime.latency_ms(rt, int(200 * scale) or 20)
        add("latency_p50_ms", p50)
        add("latency_p99_ms", p99)
    out: dict[str, Any] = {k: statistics.median(v) for k, v in samples.items()}
    out["loop_items"] = items
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
    out["samples"] = samples
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of the raw/runtime pairs (medians)")
    parser.add_argument("--out", default="bench-results.json")
    args = parser.parse_args()
    configure("warning")
    t = time.time()
    with EmbeddedNats() as server:
        results = run_event_loop(measure(server.url, args.quick, max(1, args.repeat)))
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
