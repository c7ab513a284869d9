"""Where one task's time goes: a parallel local loop of ``kind: http`` tasks on a real worker process.

A fresh installation (`bench.procs`: one ``noetl-stream controller``, one ``noetl-stream worker``) runs
rounds of the loop `bench.tools.http_playbook` writes (``--items`` GETs, ``max_in_flight`` 50, against the
local aiohttp server of `bench.services`) for ``--duration`` seconds while ``py-spy record`` samples the
worker. Each sample goes to the innermost frame that names a piece of a task's work (`CATEGORIES`):

* the tool itself: the http tool's code and aiohttp (what a direct aiohttp call does too);
* rendering templates: the task's config, the loop's ``in`` (jinja2 and ours);
* evaluating policies: a task's policy, the step's ``next`` is the controller's;
* building and publishing events and checkpoints: making, encoding and carrying the events, the outbox,
  the publisher and nats-py's writes; a pipeline's checkpoints;
* hiding secrets: the redactor over what a task reports;
* the pipeline and the loop: what runs a task and an iteration (scopes, results, the loop's slots);
* taking and settling commands: the worker's puller, its acks;
* the event loop: asyncio and uvloop between all of these.

Each category's share of the samples, times the worker's CPU per item (``/proc/<pid>/stat``, measured
without the profiler attached first), is its µs per item; the controller's CPU per item is beside it.

    .venv/bin/python -m bench.taskprofile [--duration 20] [--items 2000] [--rate 250] [--out-dir DIR]

py-spy comes with the dev extra; it attaches to the worker this run started (as root, or with ptrace
allowed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench import tools
from bench.procs import Deployment, Proc, cpu_s
from bench.runtime import run_one
from bench.services import HttpServer
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.logs import configure
from noetl_stream.loop import run_event_loop

__all__ = ["CATEGORIES", "categorize", "main"]

CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("hiding secrets", ("noetl_stream/kv/keychain.py",)),
    ("rendering templates", ("noetl_stream/dsl/templates.py", "jinja2/", "dataplane/taskconfig.py")),
    ("evaluating policies", ("noetl_stream/dsl/policy.py", "apply_policy ")),
    ("checkpoints", ("dataplane/checkpoints.py", "kv/checkpoints.py")),
    (
        "building and publishing events",
        (
            "dataplane/run_events.py",
            "dataplane/task_events.py",
            "dataplane/fitting.py",
            "protocol/wire.py",
            "protocol/carried.py",
            "jetstream/outbox.py",
            "jetstream/publish.py",
            "jetstream/confirm.py",
            "record ",
            "on_iteration ",
        ),
    ),
    (
        "the tool itself (http tool, aiohttp)",
        ("dataplane/tools/", "aiohttp/", "yarl/", "multidict/", "aiohappyeyeballs/"),
    ),
    (
        "the pipeline and the loop",
        ("dataplane/pipeline.py", "dataplane/loops.py", "dataplane/loop_step.py", "dataplane/command.py"),
    ),
    ("taking and settling commands", ("dataplane/worker.py", "jetstream/puller.py", "jetstream/fastpath.py")),
    ("nats-py (reading, writing)", ("nats/",)),
    ("the event loop (asyncio, uvloop)", ("asyncio/", "uvloop/", "Runner.run ")),
]
"""Each category and the markers (file paths, function names) of its frames; the innermost frame with a
marker decides, in this order within a frame."""


def categorize(frames: list[str]) -> str:
    """The category of one sample: the innermost frame that has a category's marker."""
    for frame in reversed(frames):
        for name, markers in CATEGORIES:
            if any(m in frame for m in markers):
                return name
    return "other"


def fold(raw: str) -> tuple[int, Counter[str]]:
    """Samples, and samples by category, from py-spy's raw output (``frame;frame;... count``)."""
    counts: Counter[str] = Counter()
    samples = 0
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        samples += int(n)
        counts[categorize(stack.split(";"))] += int(n)
    return samples, counts


async def _rounds(d: Deployment, url: str, items: int, duration: float) -> tuple[int, float]:
    """Loops of `items` http tasks until `duration` is over: (items, seconds)."""
    text = tools.http_playbook(url, items, 50)
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < duration:
        await run_one(d, text, "http_loop.yaml")  # type: ignore[arg-type]  # (a client: nc, topology)
        done += items
    return done, time.perf_counter() - t0


async def measure(
    url: str, http_url: str, duration: float, items: int, rate: int, out: Path
) -> dict[str, Any]:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    async with Deployment(url, log_dir=out) as d:
        procs: dict[str, Proc] = {"controller": d.controller(), "worker": d.worker()}
        await asyncio.sleep(1.0)
        await _rounds(d, http_url, 200, 0.1)  # (warm: the plan, the session, the pull windows)
        await _rounds(d, http_url, items, 2.0)

        def cpu() -> dict[str, float]:
            return {role: cpu_s(p.pid) for role, p in procs.items()}

        before = cpu()
        n, seconds = await _rounds(d, http_url, items, duration / 2)
        after = cpu()
        result: dict[str, Any] = {
            "items_per_s": n / seconds,
            "cpu_us_per_item": {k: (after[k] - before[k]) / n * 1e6 for k in after},
        }
        raw = out / "worker.txt"
        argv = [py_spy, "record", "--pid", str(procs["worker"].pid), "--rate", str(rate)]
        argv += ["--duration", str(int(duration)), "--format", "raw", "--nolineno", "-o", str(raw)]
        spy = subprocess.Popen([*argv, "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            await asyncio.sleep(0.5)
            await _rounds(d, http_url, items, duration - 1.0)
            await asyncio.to_thread(spy.wait, duration + 60)
        finally:
            if spy.poll() is None:
                os.kill(spy.pid, signal.SIGINT)
                spy.wait(30)
    if not raw.exists():
        raise RuntimeError(f"py-spy wrote nothing: {spy.stderr.read().decode() if spy.stderr else ''}")
    samples, counts = fold(raw.read_text())
    worker_us = result["cpu_us_per_item"]["worker"]
    result["worker_us_per_item_by_category"] = {
        name: worker_us * c / max(1, samples) for name, c in counts.most_common()
    }
    result["samples"] = samples
    return result


def report(result: dict[str, Any]) -> str:
    cpu = result["cpu_us_per_item"]
    lines = [
        f"{result['items_per_s']:.0f} http tasks/s; CPU per item: worker {cpu['worker']:.0f} µs, "
        f"controller {cpu['controller']:.0f} µs ({result['samples']} worker samples)",
        "",
        "| where the worker's time goes | µs per item | share |",
        "| --- | ---: | ---: |",
    ]
    for name, us in result["worker_us_per_item_by_category"].items():
        lines.append(f"| {name} | {us:.1f} | {100 * us / cpu['worker']:.0f}% |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.taskprofile")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds under the profiler")
    parser.add_argument("--items", type=int, default=2000, help="http tasks per loop")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--out-dir", type=Path, default=None, help="keep the raw samples and logs here")
    args = parser.parse_args()
    configure("warning")
    out = args.out_dir or Path(tempfile.mkdtemp(prefix="noetl-taskprofile-"))
    out.mkdir(parents=True, exist_ok=True)
    with HttpServer() as http, EmbeddedNats() as server:
        result = run_event_loop(measure(server.url, http.url, args.duration, args.items, args.rate, out))
    (out / "taskprofile.json").write_text(json.dumps(result, indent=2))
    print(report(result))


if __name__ == "__main__":
    main()
