"""Scale figures with the controller and the workers as separate processes (`bench.procs`).

* **Growth** (`growth`): one execution of a parallel loop of N noop items (``max_in_flight: 100``, local
  and distributed) and a chain of N noop steps (one step routing back to itself N times), at each N of
  ``sizes`` (1k, 10k, 100k). Each (workload, N) gets a fresh installation, one controller process and one
  worker process, warmed up with a 3-step execution before the clock starts. Reported per row: items/s,
  wall µs per item, CPU µs per item of the controller and of the worker (``/proc``; far less sensitive than
  the wall clock to other processes taking the CPUs, though on a VM that does not report stolen time it
  still rises with the host's load; linear cost means a flat CPU µs/item as N grows tenfold), and per role
  the RSS after the warm-up (``base``), the peak during the run (``VmHWM``) and the RSS at the end.
* **Scaling** (`scaling`): 100 concurrent executions of 40 noop steps (the ``concurrent_steps_per_s``
  workload) with 1, 2 and 4 worker processes (``noetl-stream worker --processes N``) behind one
  controller, and with 1 and 2 controllers (``--partitions 4``, leases settled before the clock starts)
  and 2 worker processes. Each configuration's rounds are interleaved with the raw two-process step figure
  (`bench.raw`, 100 chains of as many steps, worker side in a child process) of the same run, their ratio
  is reported.

Every growth row is preceded by its raw two-process figure (one chain for ``steps``, 100 chains for the
loops) and reports the ratio. ``python -m bench.scale [--quick]`` runs both alone.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench import raw, runtime
from bench.procs import Deployment
from noetl_stream.dataplane.worker import CLOCK_SKEW_S

__all__ = ["WORKLOADS", "growth", "scaling", "warm"]

Say = Callable[[str], None]

WORKLOADS: dict[str, Callable[[int], str]] = {
    "loop_local": lambda n: runtime.loop_playbook(n, 100, "local"),
    "loop_distributed": lambda n: runtime.loop_playbook(n, 100, "distributed"),
    "steps": lambda n: runtime.selfloop_playbook(n),
}
"""What one unit is: an iteration of a parallel noop loop, or one step of a chain."""


async def warm(d: Deployment, timeout: float = 60.0) -> None:
    """Run a 3-step execution: the controller, the workers and the client are all up and connected."""
    deadline = time.monotonic() + timeout
    while True:
        d.check_alive()
        try:
            await runtime.run_one(d, runtime.chain_playbook(3, "warmup"), "warmup.yaml", timeout=10)
            return
        except TimeoutError:
            if time.monotonic() > deadline:
                raise


async def raw_for(url: str, workload: str, quick: bool) -> float:
    """The raw two-process figure a workload's rate is compared with: one chain for ``steps``, 100
    concurrent chains for the loops (a local loop's iterations are no round trips: it may exceed it)."""
    if workload == "steps":
        return await raw.raw_seq_steps_per_s(url, 100 if quick else 600, worker_process=True)
    return await raw.raw_concurrent_steps_per_s(url, 100, 5 if quick else 40, worker_process=True)


async def growth_row(url: str, workload: str, n: int) -> dict[str, Any]:
    """One execution of `workload` at size `n` on fresh controller and worker processes."""
    text = WORKLOADS[workload](n)
    async with Deployment(url) as d:
        ctl, wrk = d.controller(), d.worker()
        await warm(d)
        base_c, base_w = ctl.memory(), wrk.memory()
        cpu_c, cpu_w = ctl.cpu_s(), wrk.cpu_s()
        dt = await runtime.run_one(d, text, f"{workload}.yaml", timeout=1800)
        cpu_c, cpu_w = ctl.cpu_s() - cpu_c, wrk.cpu_s() - cpu_w
        end_c, end_w = ctl.memory(), wrk.memory()
    row: dict[str, Any] = {
        "workload": workload,
        "n": n,
        "seconds": dt,
        "per_s": n / dt,
        "us_per": dt / n * 1e6,
        "controller_cpu_us_per": cpu_c / n * 1e6,
        "worker_cpu_us_per": cpu_w / n * 1e6,
    }
    for role, base, end in (("controller", base_c, end_c), ("worker", base_w, end_w)):
        row[f"{role}_base_mb"], row[f"{role}_peak_mb"], row[f"{role}_end_mb"] = (
            base.rss_mb,
            end.hwm_mb,
            end.rss_mb,
        )
    return row


async def growth(
    url: str, sizes: tuple[int, ...], say: Say, quick: bool = False
) -> tuple[list[dict[str, Any]], dict[str, float | None]]:
    """Rows of (workload, N) and the flat figures: per-unit cost and peak RSS at each N, and their growth
    from one N to the next (``growth_<workload>_us_<a>_<b>``, ``growth_<workload>_<role>_cpu_<a>_<b>``,
    ``growth_<workload>_<role>_peak_<a>_<b>``: the figure at b over the figure at a; 1.0 is flat).
    Each row is preceded by its raw two-process figure (`raw_for`), and reports the ratio."""
    rows: list[dict[str, Any]] = []
    flat: dict[str, float | None] = {}
    for workload in WORKLOADS:
        for n in sizes:
            say(
                f"growth: {workload} of {n:,} (raw two-process figure, then controller and worker processes) ..."
            )
            raw_figure = await raw_for(url, workload, quick)
            row = await growth_row(url, workload, n)
            row["raw_2proc_per_s"], row["ratio"] = raw_figure, row["per_s"] / raw_figure
            rows.append(row)
            key = f"growth_{workload}_{n}"
            flat[f"{key}_per_s"] = row["per_s"]
            flat[f"{key}_raw_2proc_per_s"] = raw_figure
            flat[f"{key}_ratio"] = row["ratio"]
            flat[f"{key}_us_per"] = row["us_per"]
            for role in ("controller", "worker"):
                flat[f"{key}_{role}_peak_mb"] = row[f"{role}_peak_mb"]
                flat[f"{key}_{role}_cpu_us_per"] = row[f"{role}_cpu_us_per"]
        by_n = {r["n"]: r for r in rows if r["workload"] == workload}
        for a, b in itertools.pairwise(sizes):
            flat[f"growth_{workload}_us_{a}_{b}"] = _over(by_n[b]["us_per"], by_n[a]["us_per"])
            for role in ("controller", "worker"):
                flat[f"growth_{workload}_{role}_peak_{a}_{b}"] = _over(
                    by_n[b][f"{role}_peak_mb"], by_n[a][f"{role}_peak_mb"]
                )
                flat[f"growth_{workload}_{role}_cpu_{a}_{b}"] = _over(
                    by_n[b][f"{role}_cpu_us_per"], by_n[a][f"{role}_cpu_us_per"]
                )
    return rows, flat


def _over(b: float, a: float) -> float | None:
    """b / a, or None when a is 0 (a small run's CPU time, read from /proc in 10 ms ticks, can be 0)."""
    return b / a if a else None


# --- scaling ---------------------------------------------------------------------------------------------

CONFIGS: tuple[tuple[str, int, int, int], ...] = (
    # name, controllers, worker processes, partitions
    ("workers_1", 1, 1, 1),
    ("workers_2", 1, 2, 1),
    ("workers_4", 1, 4, 1),
    ("controllers_1", 1, 2, 4),
    ("controllers_2", 2, 2, 4),
)


QUICK_CONFIGS = ("workers_1", "workers_2", "controllers_2")


async def scaling(
    url: str, repeat: int, executions: int, steps: int, say: Say, quick: bool = False
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Per configuration: medians of `repeat` rounds of `executions` concurrent `steps`-step executions,
    each round after a raw two-process round of 100 chains of `steps` steps (the same workload)."""
    rows: list[dict[str, Any]] = []
    flat: dict[str, float] = {}
    for name, controllers, workers, partitions in CONFIGS:
        if quick and name not in QUICK_CONFIGS:
            continue
        say(
            f"scaling: {name} ({controllers} controller(s), {workers} worker process(es), {partitions} partitions)"
        )
        samples: dict[str, list[float]] = {"raw": [], "runtime": []}
        async with Deployment(url, partitions=partitions) as d:
            for i in range(controllers):
                d.controller(f"ctl-{i + 1}")
            d.worker(processes=workers)
            owners = await d.wait_leases(stable_s=1.0 if quick else 2.0)
            await warm(d)
            # Past the first seconds after the workers' start, as the in-process figures are (bench.__main__)
            warm_until = time.monotonic() + CLOCK_SKEW_S + 1.0
            while time.monotonic() < warm_until:
                await runtime.concurrent_steps_per_s(d, executions, min(steps, 10))
            for _ in range(repeat):
                samples["raw"].append(
                    await raw.raw_concurrent_steps_per_s(url, 100, steps, worker_process=True)
                )
                samples["runtime"].append(await runtime.concurrent_steps_per_s(d, executions, steps))
            mem = {p.name: p.memory() for p in d.procs}
        raw_med, rt_med = statistics.median(samples["raw"]), statistics.median(samples["runtime"])
        rows.append(
            {
                "config": name,
                "controllers": controllers,
                "worker_processes": workers,
                "partitions": partitions,
                "leases": {str(p): o for p, o in sorted(owners.items())},
                "raw_2proc_steps_per_s": raw_med,
                "steps_per_s": rt_med,
                "ratio": rt_med / raw_med,
                "samples": samples,
                "peak_mb": {k: m.hwm_mb for k, m in mem.items()},
            }
        )
        flat[f"scaling_{name}_steps_per_s"] = rt_med
        flat[f"scaling_{name}_raw_2proc_steps_per_s"] = raw_med
        flat[f"scaling_{name}_ratio"] = rt_med / raw_med
    return rows, flat


async def _main(quick: bool) -> None:  # pragma: no cover - manual entry point
    from noetl_stream.jetstream.embedded import EmbeddedNats

    def say(s: str) -> None:
        print(s, flush=True)

    with EmbeddedNats() as server:
        sizes = (100, 1_000) if quick else (1_000, 10_000, 100_000)
        rows, flat = await growth(server.url, sizes, say, quick)
        for r in rows:
            print(r)
        srows, sflat = await scaling(server.url, 1 if quick else 3, 100, 8 if quick else 40, say, quick)
        for r in srows:
            print(r)
        print({**flat, **sflat})


if __name__ == "__main__":
    import sys

    from noetl_stream.logs import configure
    from noetl_stream.loop import run_event_loop

    if {"-h", "--help"} & set(sys.argv):
        print(
            "python -m bench.scale [--quick]: growth (1k/10k/100k) and scaling figures, processes as in make bench"
        )
        raise SystemExit(0)
    configure("warning")
    run_event_loop(_main("--quick" in sys.argv))
