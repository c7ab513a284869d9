"""Interleaved A/B of two source trees on the 100-concurrent figure (not part of `make bench`).

    .venv/bin/python -m bench.ab --a /path/to/tree-a --b /path/to/tree-b [--rounds 16]
        [--env-a KEY=VALUE ...] [--env-b KEY=VALUE ...] [--out FILE]

Each side is a process of its own (this file run as ``side``, with the tree's ``noetl_stream`` and ``bench``
first on the path: a tree from before this file works too), with its own embedded nats-server and one in-process runtime (controller and
worker, as `make bench`'s), warmed up past the first seconds after its start. The rounds alternate between
the sides (A B, B A, ...); in each, a side measures the raw round trip of `bench.raw` and then 100
executions of 40 noop steps, with its own CPU time per step (``time.process_time``) and its server's
(``/proc``). The report gives each side's medians and the medians of the per-round B/A ratios with their
interquartile range: this machine's speed drifts by ±20 % within minutes, so only such paired, interleaved
comparisons show changes of a few percent. A worktree of the code before a change (``git worktree add
/tmp/before HEAD``) is the usual A; ``--env-b NOETL_X=1`` compares two settings of one tree. ``--out FILE``
keeps the report as JSON: each tree (path, ``git describe``) and its settings, every round's figures of both
sides, the medians and the ratios. A side's stderr is shown once it ended; if its process ends or prints
anything but a result, the run stops with the side, its tree, the exit code and the end of its stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

ROUND_EXECUTIONS = 100
ROUND_STEPS = 40


def _server_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def side() -> None:  # pragma: no cover - a child process of `main`
    """One side: start a server and a runtime, then one round per line read on stdin (an empty line ends)."""
    import asyncio

    from bench import raw, runtime
    from noetl_stream.dataplane import worker
    from noetl_stream.jetstream.embedded import EmbeddedNats
    from noetl_stream.logs import configure
    from noetl_stream.loop import run_event_loop
    from noetl_stream.runtime.local import local_runtime

    # The tree's own modules, or it is no tree: the editable install's would be found in their place.
    tree = Path.cwd().resolve()
    for module in (raw, worker):
        if not Path(str(module.__file__)).resolve().is_relative_to(tree):
            sys.exit(f"{module.__name__} comes from {module.__file__}, not from the tree {tree}")

    async def rounds(url: str, pid: int) -> None:
        loop = asyncio.get_running_loop()
        async with local_runtime(url, workers=1, concurrency=128) as rt:
            clock_skew_s = getattr(worker, "CLOCK_SKEW_S", 5.0)  # a tree from before it: its value then
            warm_until = time.monotonic() + clock_skew_s + 1.0
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


class SideError(RuntimeError):
    """A side's process ended, or printed anything but a result."""


@dataclass
class _Side:
    name: str  # "A" or "B"
    tree: str
    proc: subprocess.Popen[str]
    stderr: IO[str]  # a temporary file: its tail goes into a SideError, the rest is shown once the side ended
    failed: bool = False


STDERR_TAIL_LINES = 20


def _start(name: str, tree: str, env: dict[str, str]) -> _Side:
    if not Path(tree).is_dir():
        raise SideError(f"side {name} (--{name.lower()} {tree}): not a directory")
    full = dict(os.environ, **env)
    full["PYTHONPATH"] = os.pathsep.join([tree, full.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115 - it lives as long as the side (closed in _close)
    proc = (
        subprocess.Popen(  # this file, run as a script: the tree's bench and noetl_stream (first on the path)
            [sys.executable, str(Path(__file__).resolve()), "side"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=full,
            cwd=tree,
        )
    )
    side = _Side(name, tree, proc, stderr)
    if not _read(side, "its start").get("ready"):
        raise _failure(side, "its start", "a line without ready")
    return side


def _failure(side: _Side, what: str, got: str) -> SideError:
    """The error for a side that gave no result for `what`: its exit code and the tail of its stderr."""
    side.failed = True
    try:
        ended = f"its process ended with exit code {side.proc.wait(timeout=10)}"
    except subprocess.TimeoutExpired:
        side.proc.kill()
        side.proc.wait()
        ended = "its process was still running 10 s later (killed)"
    side.stderr.seek(0)
    tail = side.stderr.read().splitlines()[-STDERR_TAIL_LINES:]
    stderr = "\n".join(f"    {line}" for line in tail) if tail else "    (empty)"
    return SideError(
        f"side {side.name} (--{side.name.lower()} {side.tree}): no result for {what} ({got}); {ended}; "
        f"the end of its stderr:\n{stderr}"
    )


def _read(side: _Side, what: str) -> dict[str, Any]:
    """The side's next line, a JSON object."""
    assert side.proc.stdout is not None
    line = side.proc.stdout.readline()
    if not line:
        raise _failure(side, what, "nothing on its stdout")
    try:
        out = json.loads(line)
    except json.JSONDecodeError:
        out = None
    if not isinstance(out, dict):
        raise _failure(side, what, f"printed {line.strip()[:200]!r}")
    return out


def _round(side: _Side, index: int) -> dict[str, float]:
    assert side.proc.stdin is not None
    try:
        side.proc.stdin.write("round\n")
        side.proc.stdin.flush()
    except (BrokenPipeError, OSError) as err:
        raise _failure(side, f"round {index + 1}", f"its stdin: {err}") from err
    out: dict[str, float] = _read(side, f"round {index + 1}")
    out["ratio"] = out["runtime"] / out["raw"]
    return out


def _close(side: _Side) -> None:
    """End a side (an empty line), then show its stderr unless a SideError already gave it."""
    try:
        if side.proc.stdin is not None:
            side.proc.stdin.write("\n")
            side.proc.stdin.flush()
    except (BrokenPipeError, OSError):
        pass  # it ended already: its exit code is read below
    try:
        code = side.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        side.proc.kill()
        code = side.proc.wait()
        print(f"side {side.name} ({side.tree}) did not end within 60 s: killed", file=sys.stderr)
    if not side.failed:
        side.stderr.seek(0)
        text = side.stderr.read()
        if text.strip():
            print(f"side {side.name} ({side.tree}), its stderr:\n{text.rstrip()}", file=sys.stderr)
        if code:
            print(f"side {side.name} ({side.tree}) ended with exit code {code}", file=sys.stderr)
    side.stderr.close()


def _describe(tree: str) -> str | None:
    """`git describe --always --dirty` of the tree (None outside git)."""
    try:
        done = subprocess.run(
            ["git", "-C", tree, "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


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
    parser.add_argument("--out", metavar="FILE", help="the report as JSON, every round's figures too")
    args = parser.parse_args()
    if args.out and not Path(args.out).resolve().parent.is_dir():
        parser.error(f"--out {args.out}: no such directory")
    envs = [dict(e.split("=", 1) for e in args.env_a), dict(e.split("=", 1) for e in args.env_b)]
    trees = [str(Path(args.a).resolve()), str(Path(args.b).resolve())]
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    sides: list[_Side] = []
    results: list[list[dict[str, float]]] = [[], []]
    rounds: list[dict[str, Any]] = []
    failure: SideError | None = None
    try:
        for name, tree, env in zip("AB", trees, envs, strict=True):
            sides.append(_start(name, tree, env))
        for i in range(max(2, args.rounds)):
            order = (0, 1) if i % 2 == 0 else (1, 0)
            for side_index in order:
                results[side_index].append(_round(sides[side_index], i))
            a, b = results[0][-1], results[1][-1]
            rounds.append({"round": i + 1, "first": "AB"[order[0]], "A": a, "B": b})
            print(
                f"round {i + 1}: A {a['runtime']:,.0f} steps/s {a['cpu_us']:.0f} us | "
                f"B {b['runtime']:,.0f} steps/s {b['cpu_us']:.0f} us",
                flush=True,
            )
    except SideError as err:
        failure = err
    finally:
        for started_side in sides:
            _close(started_side)
    if failure is not None:
        sys.exit(f"bench.ab: {failure}")
    report: dict[str, Any] = {
        "started": started,
        "sides": {
            name: {"tree": tree, "git": _describe(tree), "env": env}
            for name, tree, env in zip("AB", trees, envs, strict=True)
        },
        "executions": ROUND_EXECUTIONS,
        "steps": ROUND_STEPS,
        "median": {},
        "ratio_b_over_a": {},
        "rounds": rounds,
    }
    for name, rows in zip("AB", results, strict=True):
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        report["median"][name] = med
        print(
            f"{name}: {med['runtime']:,.0f} steps/s, Python {med['cpu_us']:.1f} us/step, server "
            f"{med['server_cpu_us']:.1f} us/step, raw {med['raw']:,.0f} ({med['raw_cpu_us']:.1f} us/step), "
            f"paired ratio {med['ratio']:.3f}"
        )
    for key, label in (("cpu_us", "Python CPU per step"), ("runtime", "steps/s")):
        ratios = [b[key] / a[key] for a, b in zip(results[0], results[1], strict=True)]
        low, high = _quartiles(ratios)
        report["ratio_b_over_a"][key] = {"median": statistics.median(ratios), "q1": low, "q3": high}
        print(f"B/A {label}: {statistics.median(ratios):.3f} (interquartile {low:.3f}-{high:.3f})")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        print(f"report (every round's figures too) written to {args.out}")


if __name__ == "__main__":
    main()
