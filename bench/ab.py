"""Interleaved A/B of two source trees on the 100-concurrent figure (not part of `make bench`).

    .venv/bin/python -m bench.ab --a /path/to/tree-a --b /path/to/tree-b [--rounds 16]
        [--env-a KEY=VALUE ...] [--env-b KEY=VALUE ...]

Each side is a process of its own (this file run as ``side``, with the tree's ``noetl_stream`` and ``bench``
first on the path: a tree from before this file works too), with its own embedded nats-server and one in-process runtime (controller and
worker, as `make bench`'s), warmed up past the first seconds after its start. The rounds alternate between
the sides (A B, B A, ...); in each, a side measures the raw round trip of `bench.raw` and then 100
executions of 40 noop steps, with its own CPU time per step (``time.process_time``) and its server's
(``/proc``). The report gives each side's medians and the medians of the per-round B/A ratios with their
interquartile range: this machine's speed drifts by ±20 % within minutes, so only such paired, interleaved
comparisons show changes of a few percent. A worktree of the code before a change (``git worktree add
/tmp/before HEAD``) is the usual A; ``--env-b NOETL_X=1`` compares two settings of one tree.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROUND_EXECUTIONS = 100
ROUND_STEPS = 40


def _server_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def side() -> None:  # pragma: no cover - a child process of `main`
    """One side: start a server and a runtime, then one round per line read on stdin (an empty line ends)."""
    import asyncio

    from bench import raw, runtime
    from noetl_stream.dataplane.worker import CLOCK_SKEW_S
    from noetl_stream.embedded import EmbeddedNats
    from noetl_stream.local import local_runtime
    from noetl_stream.logs import configure
    from noetl_stream.loop import run_event_loop

    async def rounds(url: str, pid: int) -> None:
        loop = asyncio.get_running_loop()
        async with local_runtime(url, workers=1, concurrency=128) as rt:
            warm_until = time.monotonic() + CLOCK_SKEW_S + 1.0
            while time.monotonic() < warm_until:
                await runtime.concurrent_steps_per_s(rt, ROUND_EXECUTIONS, 10)
            print(json.dumps({"ready": True}), flush=True)
            steps = ROUND_EXECUTIONS * ROUND_STEPS
            while (await loop.run_in_executor(None, sys.stdin.readline)).strip():
                cpu = time.process_time()
                out: dict[str, float] = {"raw": await raw.raw_concurrent_steps_per_s(url, 100, ROUND_STEPS)}
                out["raw_cpu_us"] = (time.process_time() - cpu) / steps * 1e6
                cpu, server = time.process_time(), _server_cpu_s(pid)
                out["runtime"] = await runtime.concurrent_steps_per_s(rt, ROUND_EXECUTIONS, ROUND_STEPS)
                out["cpu_us"] = (time.process_time() - cpu) / steps * 1e6
                out["server_cpu_us"] = (_server_cpu_s(pid) - server) / steps * 1e6
                print(json.dumps(out), flush=True)

    configure("warning")
    with EmbeddedNats() as server:
        assert server.pid is not None
        run_event_loop(rounds(server.url, server.pid))


def _start(tree: str, env: dict[str, str]) -> subprocess.Popen[str]:
    full = dict(os.environ, **env)
    full["PYTHONPATH"] = os.pathsep.join([tree, full.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = (
        subprocess.Popen(  # this file, run as a script: the tree's bench and noetl_stream (first on the path)
            [sys.executable, str(Path(__file__).resolve()), "side"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=full,
            cwd=tree,
        )
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line or not json.loads(line).get("ready"):
        proc.kill()
        raise RuntimeError(f"the side of {tree} did not start")
    return proc


def _round(proc: subprocess.Popen[str]) -> dict[str, float]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("round\n")
    proc.stdin.flush()
    out: dict[str, float] = json.loads(proc.stdout.readline())
    out["ratio"] = out["runtime"] / out["raw"]
    return out


def _quartiles(values: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def main() -> None:
    if sys.argv[1:2] == ["side"]:
        side()
        return
    parser = argparse.ArgumentParser(prog="python -m bench.ab")
    parser.add_argument("--a", required=True, help="source tree A (the one before)")
    parser.add_argument("--b", required=True, help="source tree B")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--env-a", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--env-b", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    envs = [dict(e.split("=", 1) for e in args.env_a), dict(e.split("=", 1) for e in args.env_b)]
    procs = [_start(str(Path(args.a).resolve()), envs[0]), _start(str(Path(args.b).resolve()), envs[1])]
    results: list[list[dict[str, float]]] = [[], []]
    try:
        for i in range(max(2, args.rounds)):
            for side_index in (0, 1) if i % 2 == 0 else (1, 0):
                results[side_index].append(_round(procs[side_index]))
            a, b = results[0][-1], results[1][-1]
            print(
                f"round {i + 1}: A {a['runtime']:,.0f} steps/s {a['cpu_us']:.0f} us | "
                f"B {b['runtime']:,.0f} steps/s {b['cpu_us']:.0f} us",
                flush=True,
            )
    finally:
        for proc in procs:
            if proc.stdin is not None:
                proc.stdin.write("\n")
                proc.stdin.flush()
            proc.wait(timeout=60)
    report: dict[str, Any] = {}
    for name, rows in zip("AB", results, strict=True):
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        report[name] = med
        print(
            f"{name}: {med['runtime']:,.0f} steps/s, Python {med['cpu_us']:.1f} us/step, server "
            f"{med['server_cpu_us']:.1f} us/step, raw {med['raw']:,.0f} ({med['raw_cpu_us']:.1f} us/step), "
            f"paired ratio {med['ratio']:.3f}"
        )
    for key, label in (("cpu_us", "Python CPU per step"), ("runtime", "steps/s")):
        ratios = [b[key] / a[key] for a, b in zip(results[0], results[1], strict=True)]
        low, high = _quartiles(ratios)
        print(f"B/A {label}: {statistics.median(ratios):.3f} (interquartile {low:.3f}-{high:.3f})")


if __name__ == "__main__":
    main()
