"""Where the time goes: the controller and the worker, as separate processes, under ``py-spy record``.

A fresh installation with one controller process and one worker process (`bench.procs`) runs rounds of
100 concurrent executions of 10 noop steps (the ``concurrent_steps_per_s`` workload) for ``--duration``
seconds while ``py-spy record --pid`` samples each process (``--rate`` Hz, idle threads excluded, so a
process's sample count over ``rate * duration`` is the share of the wall clock it was on a CPU). The raw
stacks (``--format raw``, one ``frame;frame;... count`` line per stack) are folded into:

* ``own``: samples whose innermost Python frame is the function (C code it calls, e.g. msgspec or a
  socket write, counts for the calling Python function);
* ``total``: samples with the function anywhere on the stack;
* ``areas``: own samples by package (nats-py, asyncio, structlog, jinja2, noetl_stream.<module>, ...);
* ``buckets``: every sample given to the innermost frame that names a piece of work (`BUCKETS`: socket
  writes, publishing, publish acks, receiving, consumer acks, the reducer, snapshots, logging context, ...).

Next to the profile, CPU time per step of every process (``/proc/<pid>/stat``): controller, worker,
nats-server and the bench client, for the runtime without and with py-spy attached, and for the raw
two-process round trip (`bench.raw`) measured just before it on the same server.

    .venv/bin/python -m bench.profile [--duration 20] [--rate 200] [--out-dir DIR]

py-spy comes with the dev extra (``pip install -e '.[dev]'``); it attaches to processes this run started
(as root, or with ptrace allowed), which run at niceness `NICE` (see there why).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench import raw, runtime
from bench.procs import Deployment, cpu_s
from bench.scale import warm

__all__ = ["fold", "main"]


NICE = -10
SPY_OPTIONS: list[str] = ["--nonblocking"]
"""Sample without pausing the processes (``--blocking`` on the command line pauses them per sample)."""
"""BIAS: py-spy counts a thread that is runnable but waiting for a CPU as busy, and samples it where it was
preempted, which on a loaded machine is mostly right after a socket write that woke nats-server (the
writing process loses the CPU to it): the profile of a contended process over-weights those writes. The
profiled processes run at this niceness, so they rarely wait for a CPU, and the report shows both shares
(py-spy's non-idle samples and the CPU time from /proc): when they differ a lot, the machine was too busy."""


def _area(frame: str) -> str:
    """The package a frame belongs to: ``noetl_stream.control.controller``, ``nats``, ``asyncio``, ..."""
    path = frame[frame.rfind("(") + 1 : -1] if frame.endswith(")") else frame
    path = path.split("site-packages/", 1)[-1]
    if path.startswith("noetl_stream/"):
        return path.removesuffix(".py").replace("/", ".")
    top = path.split("/", 1)[0]
    if "/" in path and top in ("nats", "structlog", "jinja2", "asyncio", "uvloop", "msgspec", "click"):
        return top
    return "other:" + path


BUCKETS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("socket writes (nats-py flusher)", ("StreamWriter.writelines", "TcpTransport.writelines")),
    ("structlog context (bound, contextlib)", ("bound (noetl_stream/logs.py)", "(contextlib.py)")),
    ("consumer acks", ("Msg.ack ",)),
    ("publish acks (nats-py: parse PubAck)", ("JetStreamContext._handle_async_reply",)),
    ("publish_async (nats-py: id, semaphore)", ("JetStreamContext.publish_async",)),
    ("publish (nats-py: headers, PUB)", ("Client.publish ", "Client._send_publish")),
    ("awaiting acks (asyncio.wait_for)", ("Outbox._publish",)),
    ("receive and parse (nats-py)", ("Client._read_loop", "Subscription._wait_for_msgs", "Parser.parse")),
    ("message metadata (reply subject)", ("Msg.metadata",)),
    ("JSON decode (msgspec)", ("decode_event", "decode_command")),
    ("JSON encode (msgspec)", ("encode (noetl_stream/protocol/wire.py)",)),
    ("subjects (names, partition)", ("noetl_stream/protocol/subjects.py",)),
    ("snapshots", ("SnapshotWriter.after_fold", "SnapshotWriter.write")),
    ("intake (requests)", ("noetl_stream/control/intake.py",)),
    ("reducer (decisions)", ("Reducer.apply",)),
    (
        "controller fold (effects, bookkeeping)",
        ("Controller._fold", "Controller._drain", "Controller._handle"),
    ),
    ("worker: tool pipeline", ("run_pipeline",)),
    ("worker: events, timers, bookkeeping", ("noetl_stream/dataplane/worker.py",)),
    ("consumer (ContinuousPuller)", ("noetl_stream/jetstream/puller.py",)),
)
"""Where a sample goes: the first bucket (in this order) one of whose markers is in the innermost frame
that has any marker; samples with none go to their leaf's area (mostly the event loop itself)."""


def _bucket(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, markers in BUCKETS:
            if any(m in frame for m in markers):
                return name
    leaf = frames[-1]
    if leaf.startswith("Runner.run ") or _area(leaf) in ("asyncio", "uvloop"):
        return "event loop (uvloop, asyncio)"
    return "other: " + _area(leaf).removeprefix("other:")


def fold(raw: str) -> dict[str, Any]:
    """Own and total samples per function, and own samples per package, from py-spy's raw output."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    areas: Counter[str] = Counter()
    buckets: Counter[str] = Counter()
    samples = 0
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        frames = stack.split(";")
        samples += count
        own[frames[-1]] += count
        areas[_area(frames[-1])] += count
        buckets[_bucket(frames)] += count
        for f in set(frames):
            total[f] += count
    return {"samples": samples, "own": own, "total": total, "areas": areas, "buckets": buckets}


def _top(counter: Counter[str], samples: int, n: int, keep_all: bool = False) -> list[dict[str, Any]]:
    """The `n` largest entries, leaving out the frames of (nearly) every sample (``main``, ``run``, ...)."""
    entries = [(f, c) for f, c in counter.most_common() if keep_all or c < 0.97 * samples][:n]
    return [{"frame": f, "samples": c, "pct": 100.0 * c / max(1, samples)} for f, c in entries]


async def _load(d: Deployment, duration: float) -> tuple[int, float]:
    """Rounds of 100 concurrent 10-step executions until `duration` is over: (steps, seconds)."""
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < duration:
        await runtime.concurrent_steps_per_s(d, 100, 10)
        steps += 1000
    return steps, time.perf_counter() - t0


async def raw_cpu(url: str, server_pid: int, duration: float) -> dict[str, Any]:
    """CPU µs per step of each process of the raw two-process round trip (100 chains of 40 steps)."""
    c0, p0, s0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.process_time(), cpu_s(server_pid)
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < duration:
        await raw.raw_concurrent_steps_per_s(url, 100, 40, worker_process=True)
        steps += 4000
    seconds = time.perf_counter() - t0
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    worker = (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)  # the raw worker children, reaped
    cpu = {
        "controller+client": time.process_time() - p0,
        "worker": worker,
        "nats-server": cpu_s(server_pid) - s0,
    }
    return {"steps_per_s": steps / seconds, "cpu_us_per_step": {k: v / steps * 1e6 for k, v in cpu.items()}}


async def profile(
    url: str, server_pid: int, duration: float, rate: int, out_dir: Path, top: int
) -> dict[str, Any]:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"duration_s": duration, "rate_hz": rate}
    result["raw"] = await raw_cpu(url, server_pid, duration / 3)
    async with Deployment(url, log_dir=out_dir) as d:
        procs = {"controller": d.controller(), "worker": d.worker()}
        for proc in procs.values():  # see BIAS
            os.setpriority(os.PRIO_PROCESS, proc.pid, NICE)
        await warm(d)
        await runtime.concurrent_steps_per_s(d, 100, 10)  # warm the plan cache and the pull windows

        def cpu_now() -> dict[str, float]:
            now = {role: cpu_s(p.pid) for role, p in procs.items()}
            now["nats-server"], now["client"] = cpu_s(server_pid), time.process_time()
            return now

        def sys_now() -> dict[str, float]:
            now = {role: cpu_s(p.pid, system_only=True) for role, p in procs.items()}
            now["nats-server"] = cpu_s(server_pid, system_only=True)
            return now

        before, sys_before = cpu_now(), sys_now()  # first without the profiler (it costs a little)
        steps, seconds = await _load(d, duration / 3)
        after, sys_after = cpu_now(), sys_now()
        result["unprofiled"] = {
            "steps_per_s": steps / seconds,
            "cpu_us_per_step": {k: (after[k] - before[k]) / steps * 1e6 for k in after},
            "system_us_per_step": {k: (sys_after[k] - sys_before[k]) / steps * 1e6 for k in sys_after},
        }
        spies = {}
        for role, proc in procs.items():
            argv = [
                py_spy,
                "record",
                "--pid",
                str(proc.pid),
                "--rate",
                str(rate),
                "--duration",
                str(int(duration)),
            ]
            argv += ["--format", "raw", "--nolineno", "-o", str(out_dir / f"{role}.txt"), *SPY_OPTIONS]
            spies[role] = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            await asyncio.sleep(0.5)  # py-spy attached
            before = cpu_now()
            steps, seconds = await _load(d, duration - 1.0)
            after = cpu_now()
            for spy in spies.values():
                await asyncio.to_thread(spy.wait, duration + 60)
        finally:
            for spy in spies.values():
                if spy.poll() is None:
                    os.kill(spy.pid, signal.SIGINT)
                    spy.wait(30)
    result["steps_per_s"] = steps / seconds
    result["cpu_us_per_step"] = {k: (after[k] - before[k]) / steps * 1e6 for k in after}
    result["cpu_share"] = {k: (after[k] - before[k]) / seconds for k in after}
    for role in procs:
        path = out_dir / f"{role}.txt"
        if not path.exists():
            err = spies[role].stderr
            raise RuntimeError(f"py-spy wrote nothing for the {role}: {err.read().decode() if err else ''}")
        f = fold(path.read_text())
        n = f["samples"]
        result[role] = {
            "samples": n,
            "sampled_share": n / (rate * duration),
            "buckets": _top(f["buckets"], n, 100, keep_all=True),
            "areas": _top(f["areas"], n, top, keep_all=True),
            "own": _top(f["own"], n, top),
            "total": _top(f["total"], n, top),
        }
    return result


def report(result: dict[str, Any]) -> str:
    raw_fig = result["raw"]

    def cpu(figures: dict[str, float]) -> str:
        return ", ".join(f"{k} {v:,.0f}" for k, v in figures.items()) + f" (sum {sum(figures.values()):,.0f})"

    plain = result["unprofiled"]
    lines = [
        f"steps/s: runtime {plain['steps_per_s']:,.0f} ({result['steps_per_s']:,.0f} under the profiler, "
        f"{result['duration_s']:.0f} s), raw two-process round trip {raw_fig['steps_per_s']:,.0f}",
        "CPU us per step, runtime:           " + cpu(plain["cpu_us_per_step"]),
        "  of which system (kernel):         " + cpu(plain["system_us_per_step"]),
        "CPU us per step, under the profiler: " + cpu(result["cpu_us_per_step"]),
        "CPU us per step, raw:               " + cpu(raw_fig["cpu_us_per_step"]),
    ]
    for role in ("controller", "worker"):
        r = result[role]
        lines.append(
            f"\n== {role}: {r['samples']} samples, not idle in {100 * r['sampled_share']:.0f}% of them; "
            f"on a CPU {100 * result['cpu_share'][role]:.0f}% of the wall clock (/proc)"
        )
        for title in ("buckets", "areas", "own", "total"):
            lines.append(f"-- {title}")
            lines += [f"{e['pct']:6.1f}%  {e['frame']}" for e in r[title] if e["pct"] >= 0.1]
    return "\n".join(lines)


def main() -> None:
    from noetl_stream.jetstream.embedded import EmbeddedNats
    from noetl_stream.logs import configure
    from noetl_stream.loop import run_event_loop

    parser = argparse.ArgumentParser(prog="python -m bench.profile")
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out-dir", default=None, help="where the raw stacks go (default: a new temp dir)")
    parser.add_argument(
        "--report", metavar="PROFILE_JSON", help="print the report of an earlier run and exit"
    )
    parser.add_argument("--blocking", action="store_true", help="let py-spy pause the processes per sample")
    args = parser.parse_args()
    if args.blocking:
        SPY_OPTIONS.remove("--nonblocking")
    if args.report:
        print(report(json.loads(Path(args.report).read_text())))
        return
    configure("warning")
    out_dir = Path(args.out_dir or tempfile.mkdtemp(prefix="noetl-profile-"))
    with EmbeddedNats() as server:
        assert server.pid is not None
        result = run_event_loop(profile(server.url, server.pid, args.duration, args.rate, out_dir, args.top))
    (out_dir / "profile.json").write_text(json.dumps(result, indent=2))
    print(report(result))
    print(f"(raw stacks and profile.json in {out_dir})")


if __name__ == "__main__":
    main()
