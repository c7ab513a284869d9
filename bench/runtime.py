"""Runtime benchmarks: the figures `make bench` reports next to the raw JetStream baseline."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Protocol

from nats.aio.client import Client as NATS

from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import Completions
from noetl_stream.protocol.subjects import Topology


class Runtime(Protocol):
    """Where executions are submitted: `noetl_stream.runtime.local.Runtime`, or a `bench.procs.Deployment`
    whose controller and workers are separate processes."""

    @property
    def nc(self) -> NATS: ...

    @property
    def topology(self) -> Topology: ...


def chain_playbook(steps: int, name: str = "chain") -> str:
    """``start`` (a router) then ``steps`` noop steps in a line."""
    lines = [
        "apiVersion: noetl.io/v2",
        "kind: Playbook",
        f"metadata: {{name: {name}, path: bench/{name}}}",
        "workflow:",
        "  - step: start",
        "    next: {arcs: [{step: s1}]}",
    ]
    for i in range(1, steps + 1):
        lines.append(f"  - step: s{i}")
        lines.append("    tool: {kind: noop}")
        if i < steps:
            lines.append(f"    next: {{arcs: [{{step: s{i + 1}}}]}}")
    return "\n".join(lines) + "\n"


def selfloop_playbook(steps: int, name: str = "tick") -> str:
    """``start`` (a router) then one noop step that routes back to itself ``steps`` times: a chain of
    any length in one execution without a playbook of that length (the per-step cost as it grows)."""
    return f"""apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: {name}, path: bench/{name}}}
workload: {{n: {steps}}}
workflow:
  - step: start
    next: {{arcs: [{{step: tick, args: {{i: 1}}}}]}}
  - step: tick
    tool: {{kind: noop}}
    next:
      arcs:
        - step: tick
          when: "{{{{ args.i < workload.n }}}}"
          args: {{i: "{{{{ args.i + 1 }}}}"}}
"""


def loop_playbook(items: int, max_in_flight: int, exec_: str) -> str:
    return f"""apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: loop_{exec_}, path: bench/loop_{exec_}}}
workload:
  n: {items}
workflow:
  - step: start
    loop:
      in: "{{{{ range(workload.n) | list }}}}"
      iterator: item
      spec:
        mode: parallel
        max_in_flight: {max_in_flight}
        policy: {{exec: {exec_}}}
    tool:
      - name: touch
        kind: noop
        result: "{{{{ iter.item }}}}"
"""


async def run_one(rt: Runtime, text: str, file: str, timeout: float = 600) -> float:
    """Submit one execution and wait for its ``playbook.processed`` (no full event follow)."""
    async with Completions(rt.nc, rt.topology) as done:
        t = time.perf_counter()
        execution_id = await submit(rt.nc, rt.topology, request_for(text, file))
        ev = await done.wait(execution_id, timeout=timeout)
        dt = time.perf_counter() - t
    if ev.payload.get("status") != "success":
        raise RuntimeError(f"{file}: {ev.payload.get('status')} {ev.payload.get('error')}")
    return dt


async def seq_steps_per_s(rt: Runtime, steps: int = 100) -> float:
    text = chain_playbook(steps)
    await run_one(rt, chain_playbook(3, "warmup"), "warmup.yaml")
    dt = await run_one(rt, text, "chain.yaml")
    return steps / dt


async def concurrent_steps_per_s(rt: Runtime, executions: int = 100, steps: int = 10) -> float:
    text = chain_playbook(steps, "cchain")
    async with Completions(rt.nc, rt.topology) as done:
        t = time.perf_counter()
        # All submitted at once, as the raw figure starts its chains (and `js_limits.py` its own): one
        # awaited submit after another would start the last execution a hundred acks after the first.
        ids = await asyncio.gather(
            *(submit(rt.nc, rt.topology, request_for(text, "cchain.yaml")) for _ in range(executions))
        )
        results = await asyncio.gather(*(done.wait(i, timeout=600) for i in ids))
        dt = time.perf_counter() - t
    bad = [r for r in results if r.payload.get("status") != "success"]
    if bad:
        raise RuntimeError(f"{len(bad)} executions did not succeed: {bad[0].payload.get('error')}")
    return executions * steps / dt


async def loop_iters_per_s(rt: Runtime, items: int, exec_: str, max_in_flight: int = 100) -> float:
    dt = await run_one(rt, loop_playbook(items, max_in_flight, exec_), f"loop_{exec_}.yaml")
    return items / dt


LATENCY_WARMUP_RUNS = 20
"""Runs before the latency samples: the figure before it in `make bench` (10,000-item loops after a
thousand API executions) leaves its snapshots and deletions running for tens of milliseconds, which the
first samples would otherwise measure (they were the 99th percentile)."""


async def latency_ms(rt: Runtime, runs: int = 200) -> tuple[float, float]:
    text = chain_playbook(2, "lat")
    for _ in range(LATENCY_WARMUP_RUNS):
        await run_one(rt, text, "lat.yaml")
    samples = [await run_one(rt, text, "lat.yaml") * 1000 for _ in range(runs)]
    samples.sort()
    p99 = samples[min(len(samples) - 1, round(0.99 * (len(samples) - 1)))]
    return statistics.median(samples), p99
