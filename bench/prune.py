"""How `noetl-stream prune` scales with the number of objects in the results store.

For each size N (1k, 10k, 100k; ``--quick``: 1k, 10k) a fresh installation (own prefix) on one embedded
nats-server gets N result objects written by `ResultStore.put`, as the runtime writes results above the
inline limit, two per execution (``<id>/<id>-s1/result`` and ``<id>/<id>-l1/items``):

* half of them belong to executions whose history expired (no snapshot, no event left): pruned;
* a quarter to running executions whose snapshot refers to their result (the items: running, kept);
* a quarter to executions with a history and no snapshot yet (kept after one history lookup).

Then ``prune`` runs in a child process (so its peak RSS, ``VmHWM``, is its own), first ``--dry-run``
(listing, snapshot scan, history lookups) and then for real, with a ``now`` two hours ahead so every
object is past the default grace period, and once more (nothing left to prune: it must keep every
object left, the running executions' results as referenced). The JetStream API requests each run made
are counted in the child (its connection's ``request``, by kind; the pull consumers' fetches, one per
256 objects or 64 snapshots, are publishes and not counted).

Columns: ``dry s`` the dry run's seconds; ``prune s``, ``µs/obj`` (per object listed), ``cpu s`` (the
child's), ``requests``, ``peak RSS`` those of the real run; ``rerun s`` the run with nothing to prune.

    python -m bench.prune [--quick] [--sizes 1000,10000]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from typing import Any

from noetl_stream.control.core.state import ExecutionState
from noetl_stream.jetstream.connection import connect
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.provision import provision, stream_names
from noetl_stream.kv.results import ResultStore
from noetl_stream.kv.snapshots import SnapshotStore
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event, encode, event_id, now_iso

__all__ = ["main", "populate"]

SIZES = (1_000, 10_000, 100_000)
QUICK_SIZES = (1_000, 10_000)
CONCURRENCY = 64
"""Writes in flight while populating (the bench's setup, not what is measured)."""
AHEAD = datetime.timedelta(hours=2)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _requested(eid: str) -> Event:
    """The ``playbook.execution.requested`` intake stores: the execution's history exists."""
    return Event(
        event_id=event_id(eid, "execution", "playbook.execution.requested"),
        execution_id=eid,
        name="playbook.execution.requested",
        source="server",
        entity_type="playbook",
        entity_id="bench.yaml",
        status="in_progress",
        timestamp=now_iso(),
        payload={},
    )


async def populate(js: Any, topology: Topology, n: int) -> dict[str, int]:
    """`n` objects (rounded down to a multiple of 8): half pruneable, half kept (see the module)."""
    results = ResultStore(js, topology)
    snapshots = await SnapshotStore.open(js, topology, ExecutionState)
    sem = asyncio.Semaphore(CONCURRENCY)
    units = n // 8  # 8 objects: 2 gone executions, 1 running with a snapshot, 1 with a history only
    blob = {"rows": list(range(64))}

    async def one(i: int) -> None:
        async with sem:
            for eid in (f"g{i:07d}a", f"g{i:07d}b", f"r{i:07d}", f"y{i:07d}"):
                ref = await results.put(f"{eid}/{eid}-s1/result", blob)
                await results.put(f"{eid}/{eid}-l1/items", [blob])
                if eid[0] == "r":
                    state = ExecutionState(execution_id=eid, status="running", results={"s1": ref})
                    await snapshots.put_any(eid, state)
                elif eid[0] == "y":
                    await js.publish(
                        topology.event_subject(eid, "playbook.execution.requested"), encode(_requested(eid))
                    )

    await asyncio.gather(*(one(i) for i in range(units)))
    return {"objects": units * 8, "expected_pruned": units * 4}


def _kind(subject: str) -> str:
    """``STREAM.PURGE`` for ``$JS.API.STREAM.PURGE.<stream>``, and so on."""
    parts = subject.split(".")
    if parts[:2] == ["$JS", "API"]:
        return ".".join(
            p for p in parts[2:4] if p.isupper() and not p.startswith("OBJ_") and not p.startswith("KV_")
        )
    return parts[0]


def _vm_hwm_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


async def _child(url: str, prefix: str, dry_run: bool, concurrency: int | None) -> dict[str, Any]:
    from noetl_stream.control import prune as module

    if concurrency is not None:
        module.CONCURRENCY = concurrency

    nc = await connect(url, name="bench-prune", connect_wait_s=10)
    kinds: Counter[str] = Counter()
    request = nc.request

    async def counted(subject: str, *args: Any, **kwargs: Any) -> Any:
        kinds[_kind(subject)] += 1
        return await request(subject, *args, **kwargs)

    nc.request = counted  # type: ignore[method-assign]
    try:
        js = nc.jetstream(timeout=30)
        base = _vm_hwm_kib()
        start = time.perf_counter()
        cpu = time.process_time()
        report = await module.prune(
            js,
            Topology(prefix=prefix),
            dry_run=dry_run,
            now=datetime.datetime.now(datetime.UTC) + AHEAD,
        )
        return {
            "seconds": time.perf_counter() - start,
            "cpu_seconds": time.process_time() - cpu,
            "scanned": report.scanned,
            "pruned": len(report.pruned),
            "kept": report.kept,
            "referenced": report.referenced,
            "errors": report.errors[:5],
            "rss_base_kib": base,
            "rss_peak_kib": _vm_hwm_kib(),
            "client_requests": dict(kinds),
            "in_msgs": nc.stats["in_msgs"],
        }
    finally:
        await nc.close()


def _run_prune(server: EmbeddedNats, prefix: str, dry_run: bool, concurrency: int | None) -> dict[str, Any]:
    args = [sys.executable, "-m", "bench.prune", "--child", server.url, prefix]
    args += ["--concurrency", str(concurrency)] if concurrency is not None else []
    out = subprocess.run(
        args + (["--dry-run"] if dry_run else []), capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"prune child failed: {out.stderr[-2000:]}")
    row: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    row["requests"] = sum(row["client_requests"].values())
    return row


async def _measure(server: EmbeddedNats, n: int, concurrency: int | None) -> dict[str, Any]:
    topology = Topology(prefix="bp" + uuid.uuid4().hex[:8])
    nc = await connect(server.url, name="bench-prune-setup", connect_wait_s=10)
    js = nc.jetstream(timeout=30)
    try:
        await provision(js, topology)
        start = time.perf_counter()
        made = await populate(js, topology, n)
        setup_s = time.perf_counter() - start
        _say(f"  {made['objects']} objects written in {setup_s:.1f}s")
        dry = await asyncio.to_thread(_run_prune, server, topology.prefix, True, concurrency)
        _say(f"  dry run: {dry['seconds']:.1f}s")
        real = await asyncio.to_thread(_run_prune, server, topology.prefix, False, concurrency)
        _say(f"  prune: {real['seconds']:.1f}s")
        again = await asyncio.to_thread(_run_prune, server, topology.prefix, False, concurrency)
        left = made["objects"] - made["expected_pruned"]
        if not dry["pruned"] == real["pruned"] == made["expected_pruned"] or real["errors"]:
            raise RuntimeError(f"prune did not delete what it should: {made} {dry} {real}")
        if again["pruned"] or again["scanned"] != left or again["referenced"] != made["objects"] // 8:
            raise RuntimeError(f"prune deleted something still needed: {made} {again}")
        return {"n": made["objects"], "setup_s": setup_s, "dry": dry, "real": real, "again": again}
    finally:
        for name in stream_names(topology):
            try:
                await js.delete_stream(name)
            except Exception:
                pass
        await nc.close()


def _table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'objects':>8} {'deleted':>8} {'kept':>7} {'dry s':>7} {'prune s':>8} {'µs/obj':>7} "
        f"{'cpu s':>6} {'requests':>9} {'req/obj':>7} {'peak RSS':>9} {'rerun s':>8}"
    )
    lines = [head]
    for r in rows:
        real, dry, again = r["real"], r["dry"], r["again"]
        n, seconds, requests, rss_mb = r["n"], real["seconds"], real["requests"], real["rss_peak_kib"] / 1024
        lines.append(
            f"{n:>8} {real['pruned']:>8} {real['kept']:>7} {dry['seconds']:>7.2f} {seconds:>8.2f} "
            f"{seconds / n * 1e6:>7.0f} {real['cpu_seconds']:>6.2f} {requests:>9} {requests / n:>7.2f} "
            f"{rss_mb:>7.0f}MB {again['seconds']:>8.2f}"
        )
    return "\n".join(lines)


async def _main(sizes: tuple[int, ...], concurrency: int | None) -> list[dict[str, Any]]:
    rows = []
    with EmbeddedNats() as server:
        for n in sizes:
            _say(f"prune, {n} objects")
            rows.append(await _measure(server, n, concurrency))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.prune", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1k and 10k objects only")
    parser.add_argument("--sizes", default=None, help="comma-separated object counts")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="executions pruned at once (default: prune's CONCURRENCY)",
    )
    parser.add_argument("--child", nargs=2, metavar=("URL", "PREFIX"), help=argparse.SUPPRESS)
    parser.add_argument("--dry-run", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        url, prefix = args.child
        print(json.dumps(asyncio.run(_child(url, prefix, args.dry_run, args.concurrency))))
        return
    sizes = (
        tuple(int(s) for s in args.sizes.split(",")) if args.sizes else QUICK_SIZES if args.quick else SIZES
    )
    rows = asyncio.run(_main(sizes, args.concurrency))
    command = " ".join(["python -m bench.prune", *(argv if argv is not None else sys.argv[1:])])
    print(f"{command}  ({datetime.date.today()}, {os.cpu_count()} CPUs)")
    print(_table(rows))
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
