"""Reading what a run left in JetStream: counts per execution, events by name, completion, replay checks.

Fault tests judge a run by what is stored in JetStream (the source of truth), not by what a client
happened to see: a client subscription misses messages while its server restarts.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Iterable
from pathlib import Path

import nats.errors
from nats.js import JetStreamContext, api

from noetl_stream.control import replay
from noetl_stream.control.core.state import ExecutionState
from noetl_stream.kv.history import read_events
from noetl_stream.kv.snapshots import SnapshotStore
from noetl_stream.protocol import events as E
from noetl_stream.protocol.carried import decode_all, subject_names
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event


def any_execution(topology: Topology, name: str) -> str:
    """The stored subject of event `name` of every execution: ``<prefix>.events.*.*.<name>``."""
    return topology.stored_any_execution_filter(name)


async def count_by_execution(js: JetStreamContext, topology: Topology, name: str) -> dict[str, int]:
    """How many messages each execution has stored on the subject of event `name` (one server request):
    its `name` events, but for those carried inside a boundary's message (noetl_stream/protocol/carried.py)."""
    info = await js.stream_info(topology.events_stream, subjects_filter=any_execution(topology, name))
    out: dict[str, int] = {}
    for subject, n in (info.state.subjects or {}).items():
        out[subject.split(".")[2]] = n
    return out


async def total(js: JetStreamContext, topology: Topology, name: str) -> int:
    return sum((await count_by_execution(js, topology, name)).values())


async def read_named(js: JetStreamContext, topology: Topology, *names: str) -> list[tuple[int, Event]]:
    """Every stored event with one of `names`, of every execution, in stream order (the events a
    message carries, with its sequence: a carried name reads the carriers' subjects too)."""
    wanted = frozenset(names)
    filters = [any_execution(topology, n) for n in sorted(subject_names(wanted))]
    config = api.ConsumerConfig(
        ack_policy=api.AckPolicy.NONE,
        deliver_policy=api.DeliverPolicy.ALL,
        inactive_threshold=30.0,
        mem_storage=True,
        filter_subjects=filters if len(filters) > 1 else None,
        filter_subject=filters[0] if len(filters) == 1 else None,
    )
    sub = await js.pull_subscribe(
        filters[0] if len(filters) == 1 else "", stream=topology.events_stream, config=config
    )
    out: list[tuple[int, Event]] = []
    name = None
    try:
        info = await sub.consumer_info()
        name = info.name
        remaining = info.num_pending or 0
        while remaining > 0:
            try:
                msgs = await sub.fetch(min(1000, remaining), timeout=5)
            except (TimeoutError, nats.errors.TimeoutError):
                break
            for msg in msgs:
                remaining -= 1
                seq = msg.metadata.sequence.stream
                out.extend((seq, ev) for ev in decode_all(msg.data) if ev.name in wanted)
    finally:
        try:
            await sub.unsubscribe()
            if name:
                await js.delete_consumer(topology.events_stream, name)
        except Exception:
            pass
    return out


async def wait_processed(
    js: JetStreamContext,
    topology: Topology,
    execution_ids: Iterable[str],
    timeout: float,
    *,
    tolerate_disconnects: bool = False,
) -> dict[str, int]:
    """Poll the stream until every execution has a ``playbook.processed``; return the counts.

    Raises `TimeoutError` naming how many executions are still unfinished.
    """
    wanted = set(execution_ids)
    deadline = time.monotonic() + timeout
    counts: dict[str, int] = {}
    while True:
        try:
            counts = await count_by_execution(js, topology, E.PLAYBOOK_PROCESSED)
        except (nats.errors.Error, TimeoutError, OSError):
            if not tolerate_disconnects:
                raise
        missing = wanted - counts.keys()
        if not missing:
            return counts
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{len(missing)} of {len(wanted)} executions have no playbook.processed "
                f"after {timeout:.0f}s, e.g. {sorted(missing)[:3]}"
            )
        await asyncio.sleep(0.2)


def scheduled_twice(scheduled: Iterable[Event]) -> dict[tuple[str, str], int]:
    """``(execution_id, step_run_id)`` pairs with more than one ``step.scheduled`` event."""
    runs = collections.Counter((e.execution_id, e.step_run_id or "") for e in scheduled)
    return {k: n for k, n in runs.items() if n > 1}


async def history(js: JetStreamContext, topology: Topology, execution_id: str) -> list[Event]:
    return [ev async for _, ev in read_events(js, topology, execution_id)]


async def cancels(
    js: JetStreamContext, topology: Topology, execution_id: str
) -> list[tuple[str | None, str]]:
    """Who recorded each ``execution.cancel.requested`` of an execution (the controller's id, None for a
    worker or the intake) and why (its reason)."""
    return [
        (ev.controller, str(ev.payload.get("reason")))
        for ev in await history(js, topology, execution_id)
        if ev.name == E.EXECUTION_CANCEL_REQUESTED
    ]


async def histories(
    js: JetStreamContext, topology: Topology, ids: Iterable[str], *, concurrency: int = 8
) -> dict[str, list[tuple[int, Event]]]:
    """Each execution's ``(stream sequence, event)`` in stream order, read `concurrency` at a time."""
    slots = asyncio.Semaphore(concurrency)

    async def one(eid: str) -> list[tuple[int, Event]]:
        async with slots:
            return [item async for item in read_events(js, topology, eid)]

    wanted = list(ids)
    return dict(zip(wanted, await asyncio.gather(*(one(eid) for eid in wanted)), strict=True))


async def processed(js: JetStreamContext, topology: Topology) -> dict[str, Event]:
    """Each execution's ``playbook.processed`` (asserting there is exactly one)."""
    out: dict[str, Event] = {}
    for _, ev in await read_named(js, topology, E.PLAYBOOK_PROCESSED):
        assert ev.execution_id not in out, f"second playbook.processed for {ev.execution_id}"
        out[ev.execution_id] = ev
    return out


async def replay_differences(
    js: JetStreamContext, topology: Topology, ids: list[str], *, concurrency: int = 8
) -> dict[str, list[str]]:
    """Executions whose replay differs from the live snapshot (the check behind ``replay --verify``).

    Executions are verified `concurrency` at a time (each one's check waits mostly on server round trips)."""
    slots = asyncio.Semaphore(concurrency)

    async def one(eid: str) -> list[str]:
        async with slots:
            diffs, _ = await replay.verify(js, topology, eid)
            return diffs

    found = await asyncio.gather(*(one(eid) for eid in ids))
    return {eid: diffs for eid, diffs in zip(ids, found, strict=True) if diffs}


async def post_mortem(
    js: JetStreamContext,
    topology: Topology,
    stuck: list[str],
    kind_of: dict[str, str],
    timeline: list[str],
    path: Path,
) -> Path:
    """Write what a stuck run looks like: kills, consumer state, each stuck execution's events and snapshot."""
    snapshots = await SnapshotStore.open(js, topology, ExecutionState)
    with path.open("w") as f:
        f.write("\n".join(timeline) + "\n")
        for stream, consumer in (
            *[
                (topology.events_stream, topology.controller_events_consumer(p))
                for p in range(topology.partitions)
            ],
            (topology.commands_stream, topology.pool_consumer("default")),
        ):
            info = await js.consumer_info(stream, consumer)
            f.write(
                f"consumer {consumer}: pending={info.num_pending} ack_pending={info.num_ack_pending} "
                f"redelivered={info.num_redelivered} ack_floor={info.ack_floor}\n"
            )
        for eid in stuck:
            f.write(f"=== {eid} {kind_of[eid]}\n")
            async for seq, ev in read_events(js, topology, eid):
                error = ev.payload.get("error")
                index = ev.payload.get("index")
                who = ev.worker or f"{ev.controller}@{ev.fence}"
                f.write(
                    f"{seq} {ev.timestamp} {ev.name} {ev.step_run_id} {index} {who} {ev.event_id} {error}\n"
                )
            snap = await snapshots.get(eid)
            if snap is None:
                f.write("snapshot: none\n")
            else:
                runs = {
                    k: (r.status, r.loop and (r.loop.next_index, r.loop.in_flight))
                    for k, r in snap.runs.items()
                }
                f.write(f"snapshot: last_seq={snap.last_seq} status={snap.status} runs={runs}\n")
            # What the reducer makes of the whole stored history, and what its last fold would publish.
            reducer = replay.Reducer(replay.PlanCache())
            state: ExecutionState | None = None
            async for seq, ev in read_events(js, topology, eid, names=E.CONTROLLER_INPUT_EVENTS):
                state, fx = reducer.apply(state, ev, seq)
                if fx.events or fx.commands:
                    f.write(
                        f"  fold {seq} {ev.name} {ev.step_run_id} {ev.payload.get('index')} -> "
                        f"{[e.name for e in fx.events]} +{len(fx.commands)} commands\n"
                    )
            if state is not None:
                loops = {
                    k: {
                        "next": r.loop.next_index,
                        "in_flight": r.loop.in_flight,
                        "done": r.loop.done,
                        "failed": r.loop.failed,
                        "finished": r.loop.finished,
                        "stopping": r.loop.stopping,
                        "have": [i for i in range(r.loop.total) if r.loop.is_settled(i)],
                    }
                    for k, r in state.runs.items()
                    if r.loop is not None
                }
                f.write(f"replayed: last_seq={state.last_seq} status={state.status} loops={loops}\n")
    return path


async def running_snapshot(
    js: JetStreamContext, topology: Topology, execution_id: str, timeout: float = 20.0
) -> ExecutionState:
    """The execution's snapshot, once one is stored while it still runs (raises TimeoutError)."""
    snapshots = await SnapshotStore.open(js, topology, ExecutionState)
    async with asyncio.timeout(timeout):
        while True:
            state = await snapshots.get(execution_id, record=False)
            if state is not None and not state.terminal:
                return state
            await asyncio.sleep(0.02)
