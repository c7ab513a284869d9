"""``make bench``: runtime figures side by side with the raw JetStream figures of the same run."""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from typing import Any

from bench import raw, runtime
from noetl_stream.embedded import EmbeddedNats
from noetl_stream.local import local_runtime
from noetl_stream.logs import configure
from noetl_stream.loop import run_event_loop


async def measure(url: str, quick: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    scale = 0.2 if quick else 1.0
    print("raw JetStream baseline ...", file=sys.stderr)
    out["raw_seq_steps_per_s"] = await raw.raw_seq_steps_per_s(url, steps=int(600 * scale) or 50)
    out["raw_concurrent_steps_per_s"] = await raw.raw_concurrent_steps_per_s(
        url, chains=100, steps=int(40 * scale) or 5
    )
    async with local_runtime(url, workers=1, concurrency=128) as rt:
        print("runtime: sequential chain ...", file=sys.stderr)
        out["seq_steps_per_s"] = await runtime.seq_steps_per_s(rt, 100)
        print("runtime: 100 concurrent executions ...", file=sys.stderr)
        out["concurrent_steps_per_s"] = await runtime.concurrent_steps_per_s(rt, 100, 10)
        items = int(10_000 * scale)
        print(f"runtime: {items}-item loops ...", file=sys.stderr)
        out["loop_items"] = items
        out["loop_local_iters_per_s"] = await runtime.loop_iters_per_s(rt, items, "local")
        out["loop_distributed_iters_per_s"] = await runtime.loop_iters_per_s(rt, items, "distributed")
        print("runtime: latency ...", file=sys.stderr)
        p50, p99 = await runtime.latency_ms(rt, int(200 * scale) or 20)
        out["latency_p50_ms"], out["latency_p99_ms"] = p50, p99
    out["seq_ratio"] = out["seq_steps_per_s"] / out["raw_seq_steps_per_s"]
    out["concurrent_ratio"] = out["concurrent_steps_per_s"] / out["raw_concurrent_steps_per_s"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    parser.add_argument("--out", default="bench-results.json")
    args = parser.parse_args()
    configure("warning")
    with EmbeddedNats() as server:
        t = time.time()
        results = run_event_loop(measure(server.url, args.quick))
    results["machine"] = {"python": platform.python_version(), "platform": platform.platform()}
    results["duration_s"] = round(time.time() - t, 1)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    width = max(len(k) for k in results)
    for k, v in results.items():
        if isinstance(v, float):
            print(f"{k:<{width}}  {v:,.2f}")
        elif not isinstance(v, dict):
            print(f"{k:<{width}}  {v}")
    print(f"(written to {args.out})")


if __name__ == "__main__":
    main()
