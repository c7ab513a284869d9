"""Invariants over a randomized run with kills (``make stress``; excluded from ``make test``).

At least 500 executions mixing chains, local and distributed loops, retries and failures run while
the controller and workers are killed (SIGKILL) and restarted at random. Afterwards every execution has
exactly one ``playbook.processed`` with the status its playbook must end in, no step run was scheduled
twice, and replaying each execution's events gives its live snapshot. ``NOETL_FAULT_SEED`` replays a
run's choices; ``NOETL_FAULT_DUMP_DIR`` keeps the process logs and a post-mortem of stuck executions.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import os
import random
import time
from pathlib import Path

import msgspec
import pytest
from eventlog import (
    count_by_execution,
    post_mortem,
    processed,
    read_named,
    replay_differences,
    scheduled_twice,
    wait_processed,
)
from faultbooks import STRESS_MIX, submit_many
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from procs import Processes, replay_verify

from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.provision import provision
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology

ACK_WAIT_S = 2.0
CHAOS_S = 120.0  # kills go on while the run lasts, at most this long; then the survivors finish in peace


@pytest.mark.stress
@pytest.mark.timeout(900)
async def test_stress_every_execution_processed_once_and_replay_equals_live_despite_kills(
    nats_server: EmbeddedNats, topology: Topology, js: JetStreamContext, nc: NATS, tmp_path: Path
) -> None:
    seed = int(os.environ.get("NOETL_FAULT_SEED", time.time_ns() % 1_000_000))
    rnd = random.Random(seed)
    print(f"NOETL_FAULT_SEED={seed}")
    # Enough deliveries that repeated kills of the same command do not turn it into a poison failure.
    topo = msgspec.structs.replace(topology, command_ack_wait_s=ACK_WAIT_S, command_max_deliver=50)
    await provision(js, topo, ("default",))
    per_kind = 63  # x 8 kinds = 504 executions
    kinds = [k for k in STRESS_MIX for _ in range(per_kind)]
    rnd.shuffle(kinds)
    out_dir = Path(os.environ.get("NOETL_FAULT_DUMP_DIR") or tmp_path)  # logs and post-mortem
    timeline: list[str] = []
    with Processes(nats_server.url, topo, out_dir / "logs") as procs:
        controller = procs.controller()
        workers = [procs.worker(f"w{i}", concurrency=6) for i in range(1, 4)]
        expected: dict[str, str] = {}
        kind_of: dict[str, str] = {}
        kills: collections.Counter[str] = collections.Counter()

        async def chaos() -> None:
            """Every 0.5-1.5 s kill (SIGKILL) the controller or a random worker, in turns; restart it
            after 0-1 s."""
            for n in itertools.count():
                await asyncio.sleep(rnd.uniform(0.5, 1.5))
                victim = controller if n % 2 == 0 else rnd.choice(workers)
                victim.kill()
                kills[victim.name] += 1
                timeline.append(f"{_now()} killed {victim.name}")
                await asyncio.sleep(rnd.uniform(0, 1.0))
                victim.start()
                timeline.append(f"{_now()} started {victim.name}")

        chaos_task = asyncio.create_task(chaos())
        try:
            for i in range(0, len(kinds), 84):  # in waves, so that kills land on every phase of a run
                for n, kind in enumerate(kinds[i : i + 84], start=i):
                    text, status = STRESS_MIX[kind]
                    # Every execution its own playbook text (as with many playbooks): nothing any
                    # controller compiled for one execution stands in for another's.
                    text += f"# stress execution {n}\n"
                    (eid,) = await submit_many(nc, topo, [(text, {})], file=f"{kind}.yaml")
                    expected[eid], kind_of[eid] = status, kind
                await asyncio.sleep(rnd.uniform(2.0, 4.0))
            # Chaos goes on while the run lasts, up to a budget; then the survivors finish in peace.
            with contextlib.suppress(TimeoutError):
                await wait_processed(js, topo, expected, timeout=CHAOS_S, tolerate_disconnects=True)
        finally:
            chaos_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await chaos_task
        for proc in procs.all:
            if not proc.alive:
                proc.start()
        try:
            counts = await wait_processed(js, topo, expected, timeout=120)
        except TimeoutError as exc:
            stuck = sorted(set(expected) - set(await count_by_execution(js, topo, E.PLAYBOOK_PROCESSED)))
            dump = await post_mortem(js, topo, stuck, kind_of, timeline, out_dir / "stuck.txt")
            kinds_stuck = collections.Counter(kind_of[e] for e in stuck)
            raise AssertionError(
                f"{exc} (seed {seed}, kills {dict(kills)}, stuck by kind {dict(kinds_stuck)}, see {dump})"
            ) from None

        print(f"kills: {dict(kills)}")
        assert kills[controller.name] >= 3 and sum(kills.values()) - kills[controller.name] >= 3, kills
        assert len(expected) >= 500
        twice = {eid: n for eid, n in counts.items() if n != 1}
        if twice:
            dump = await post_mortem(js, topo, sorted(twice), kind_of, timeline, out_dir / "twice.txt")
            raise AssertionError(f"seed {seed}: playbook.processed more than once: {twice} (see {dump})")
        ends = await processed(js, topo)
        wrong = {
            eid: (kind_of[eid], ends[eid].payload.get("status"), ends[eid].payload.get("error"))
            for eid in expected
            if ends[eid].payload.get("status") != expected[eid]
        }
        assert wrong == {}, f"seed {seed}"
        scheduled = [ev for _, ev in await read_named(js, topo, E.STEP_SCHEDULED)]
        doubled = scheduled_twice(scheduled)
        if doubled:
            ids = sorted({eid for eid, _ in doubled})
            dump = await post_mortem(js, topo, ids, kind_of, timeline, out_dir / "scheduled_twice.txt")
            raise AssertionError(f"seed {seed}: step runs scheduled twice: {doubled} (see {dump})")
        differ = await replay_differences(js, topo, list(expected))
        if differ:
            dump = await post_mortem(js, topo, sorted(differ), kind_of, timeline, out_dir / "differ.txt")
            raise AssertionError(f"seed {seed}: replay differs from live for {differ} (see {dump})")
        await replay_verify(procs.env, rnd.sample(list(expected), 5))


def _now() -> str:
    return time.strftime("%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}"
