"""Worker events carried inside their boundary's message (noetl_stream/protocol/carried.py): what is carried and
what is not, readers that take them out, forged carried records, and ``--task-events separate``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest
from eventlog import count_by_execution, total
from helpers import Run, playbook, run
from structlog.testing import capture_logs

from noetl_stream.control.core.effects import server_event
from noetl_stream.control.replay import verify
from noetl_stream.dataplane.fitting import MAX_EVENT_BYTES
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.history import read_events, scan
from noetl_stream.protocol import events as E
from noetl_stream.protocol.carried import (
    CARRY_MAX_BYTES,
    ITERATIONS_MAX_BYTES,
    MAX_CARRIED,
    carry,
    decode_all,
    expand,
    subject_names,
)
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event, decode_event, encode, event_id, now_iso
from noetl_stream.runtime.local import Runtime, local_runtime


def event(name: str, execution_id: str = "e1", payload: dict[str, object] | None = None) -> Event:
    return Event(
        event_id=event_id(execution_id, "start-1", name),
        execution_id=execution_id,
        name=name,
        source="worker",
        entity_type="task" if name.startswith("task.") else "step",
        entity_id="start-1",
        status="success",
        timestamp=now_iso(),
        payload=payload or {},
        step="start",
        step_run_id="start-1",
    )


def worker_names(r: Run, step: str) -> list[str]:
    """The names of `step`'s worker events, in stream order."""
    return [e.name for e in r.events if e.step == step and e.source == "worker"]


def ready(*events: Event) -> list[tuple[Event, bytes]]:
    return [(e, encode(e)) for e in events]


RUN = (E.STEP_STARTED, E.TASK_STARTED, E.TASK_DONE)
LIMIT = MAX_EVENT_BYTES


def test_a_step_runs_events_travel_in_its_boundarys_message() -> None:
    evs = [event(n) for n in (*RUN, E.STEP_DONE)]
    (out,) = carry(ready(*evs), LIMIT)
    carrier, data = out
    assert carrier.name == E.STEP_DONE and data == encode(carrier)
    assert [bytes(r) for r in carrier.carried] == [encode(e) for e in evs[:3]]
    # what a reader takes out of the stored message is what was written, in order
    assert decode_all(data) == evs
    assert expand(decode_event(data))[-1].carried == []


@pytest.mark.parametrize("boundary", sorted(E.CARRIERS))
def test_every_worker_boundary_carries(boundary: str) -> None:
    (out,) = carry(ready(event(E.TASK_STARTED), event(E.TASK_DONE), event(boundary)), LIMIT)
    assert out[0].name == boundary and len(out[0].carried) == 2


def test_each_boundary_carries_the_run_right_before_it() -> None:
    # a local loop's iterations: each boundary carries its own task events, and the order is kept
    evs = [event(n) for n in (E.TASK_STARTED, E.TASK_DONE, E.LOOP_ITERATION_DONE, E.TASK_DONE, E.LOOP_DONE)]
    out = carry(ready(*evs), LIMIT)
    assert [(e.name, len(e.carried)) for e, _ in out] == [(E.LOOP_ITERATION_DONE, 2), (E.LOOP_DONE, 1)]
    assert [x for e, _ in out for x in expand(e)] == evs
    # what is not carried keeps its place
    evs = [event(n) for n in (E.STEP_STARTED, E.LOOP_STARTED, E.TASK_DONE, E.STEP_DONE)]
    out = carry(ready(*evs), LIMIT)
    assert [(e.name, len(e.carried)) for e, _ in out] == [
        (E.STEP_STARTED, 0),
        (E.LOOP_STARTED, 0),
        (E.STEP_DONE, 1),
    ]


def server(name: str, run_id: str) -> Event:
    return server_event("e1", name, "step", run_id, "success", run_id, {}, run_id.split("-")[0], run_id)


def test_the_controllers_events_are_never_carried() -> None:
    # (an older controller resuming an execution would not see a carried effect as stored: see CARRIED_BY)
    evs = ready(
        server(E.CTX_PATCHED, "start-1"),
        server(E.NEXT_EVALUATED, "start-1"),
        server(E.STEP_SCHEDULED, "a-1"),
        server(E.STEP_DONE, "start-1"),  # (a router step's, written by the controller)
    )
    assert carry(evs, LIMIT) is evs
    mixed = ready(event(E.TASK_DONE), server(E.STEP_DONE, "start-1"))
    assert carry(mixed, LIMIT) is mixed
    for carrier in (server(E.STEP_SCHEDULED, "a-1"), server(E.STEP_DONE, "start-1")):
        forged_one = msgspec.structs.replace(
            carrier, carried=[msgspec.Raw(encode(server(E.NEXT_EVALUATED, "start-1")))]
        )
        with capture_logs() as logs:
            assert expand(decode_event(encode(forged_one))) == [
                msgspec.structs.replace(forged_one, carried=[])
            ]
        assert "only in a worker's boundary" in logs[0]["error"]


def test_nothing_is_carried_without_a_final_boundary() -> None:
    # progress of a long step (published while it runs): each event stays a message of its own
    evs = ready(event(E.STEP_STARTED), event(E.TASK_STARTED))
    assert carry(evs, LIMIT) == evs
    lone = ready(event(E.STEP_DONE))
    assert carry(lone, LIMIT) == lone
    server = ready(event(E.TASK_DONE), event(E.NEXT_EVALUATED))
    assert carry(server, LIMIT) == server


def test_events_of_another_execution_are_not_carried() -> None:
    evs = ready(event(E.TASK_DONE, "other"), event(E.STEP_DONE))
    assert carry(evs, LIMIT) == evs


def test_large_events_are_published_on_their_own() -> None:
    big = event(E.TASK_DONE, payload={"result": "x" * CARRY_MAX_BYTES})
    evs = ready(event(E.STEP_STARTED), event(E.TASK_STARTED), big, event(E.STEP_DONE))
    assert carry(evs, LIMIT) == evs
    small = ready(big, event(E.TASK_STARTED), event(E.TASK_DONE), event(E.STEP_DONE))
    out = carry(small, LIMIT)
    assert [e.name for e, _ in out] == [E.TASK_DONE, E.STEP_DONE] and len(out[1][0].carried) == 2


def test_a_carrier_stays_within_the_message_limit() -> None:
    boundary = event(E.STEP_DONE, payload={"result": "x" * 5000})
    evs = ready(event(E.STEP_STARTED), event(E.TASK_STARTED), boundary)
    size = len(encode(boundary))
    carrier, _ = carry(evs, LIMIT)[-1]
    assert len(carrier.carried) == 2
    # room for one of them only: the one right before the boundary is carried, the other goes on its own
    room = size + 32 + len(evs[1][1]) + 1
    out = carry(evs, room)
    assert [e.name for e, _ in out] == [E.STEP_STARTED, E.STEP_DONE] and len(out[1][0].carried) == 1
    assert all(len(d) <= room for _, d in out)
    assert carry(evs, size + 10) == evs


def test_events_of_another_step_run_are_not_carried() -> None:
    other = msgspec.structs.replace(event(E.TASK_DONE), step_run_id="start-2")
    evs = ready(other, event(E.STEP_DONE))
    assert carry(evs, LIMIT) == evs


def test_readers_asking_for_a_carried_name_read_the_carriers_too() -> None:
    assert subject_names([E.TASK_DONE]) == {E.TASK_DONE} | E.CARRIERS
    assert subject_names([E.NEXT_EVALUATED]) == {E.NEXT_EVALUATED}
    assert subject_names([E.STEP_SCHEDULED]) == {E.STEP_SCHEDULED}


def forged(carried: list[bytes], execution_id: str = "e1") -> Event:
    return msgspec.structs.replace(
        event(E.STEP_DONE, execution_id), carried=[msgspec.Raw(c) for c in carried]
    )


@pytest.mark.parametrize(
    ("record", "why"),
    [
        (b'{"not": "an event"}', "not an event"),
        (encode(event(E.TASK_DONE, "someone-else")), "another execution (someone-else)"),
        (encode(event(E.WORKFLOW_FINISHED)), "'workflow.finished' event, which it never carries"),
        (
            encode(
                msgspec.structs.replace(
                    event(E.TASK_DONE), carried=[msgspec.Raw(encode(event(E.TASK_STARTED)))]
                )
            ),
            "carries events itself",
        ),
    ],
)
def test_a_forged_carried_record_is_skipped_and_logged(record: bytes, why: str) -> None:
    good = encode(event(E.TASK_STARTED))
    carrier = decode_event(encode(forged([good, record])))
    with capture_logs() as logs:
        out = expand(carrier)
    assert [e.name for e in out] == [E.TASK_STARTED, E.STEP_DONE]
    (entry,) = [x for x in logs if x["event"] == "events.bad_carried"]
    assert why in entry["error"] and entry["carrier"] == carrier.event_id


def test_a_carrier_of_too_many_records_or_from_the_server_is_forged() -> None:
    records = [encode(event(E.TASK_STARTED))] * (MAX_CARRIED + 1)
    with capture_logs() as logs:
        assert [e.name for e in expand(decode_event(encode(forged(records))))] == [E.STEP_DONE]
        server = msgspec.structs.replace(forged([encode(event(E.TASK_STARTED))]), source="server")
        assert [e.name for e in expand(decode_event(encode(server)))] == [E.STEP_DONE]
    assert [x["event"] for x in logs] == ["events.bad_carried", "events.bad_carried"]


def test_a_carried_record_of_another_step_run_is_skipped() -> None:
    other = msgspec.structs.replace(event(E.TASK_DONE), step_run_id="start-2")
    with capture_logs() as logs:
        out = expand(decode_event(encode(forged([encode(other)]))))
    assert [e.name for e in out] == [E.STEP_DONE] and "another step run" in logs[0]["error"]


async def test_scan_refuses_names_that_may_be_carried(runtime: Runtime) -> None:
    with pytest.raises(ValueError, match="read_events"):
        await scan(runtime.nc.jetstream(), runtime.topology, "e1", lambda _: True, names=(E.TASK_DONE,))


CHAIN = """
    - step: start
      tool: {kind: noop, result: 1}
      next: {arcs: [{step: second}]}
    - step: second
      tool: {kind: noop, result: "{{ start + 1 }}"}
"""


async def test_a_fast_step_stores_one_worker_message(runtime: Runtime, no_progress: None) -> None:
    r = await run(runtime, playbook(CHAIN))
    assert r.status == "success" and r.result == 2, r.summary.error
    eid = r.summary.execution_id
    js, topology = runtime.nc.jetstream(), runtime.topology

    # stored: one message per step run for the worker, none on the task subjects ...
    for name in (E.STEP_STARTED, E.TASK_STARTED, E.TASK_DONE):
        assert (await count_by_execution(js, topology, name)).get(eid, 0) == 0, name
    assert (await count_by_execution(js, topology, E.STEP_DONE))[eid] == 2
    # ... and the controller's events each a message of its own
    assert (await count_by_execution(js, topology, E.NEXT_EVALUATED))[eid] == 2
    assert (await count_by_execution(js, topology, E.STEP_SCHEDULED))[eid] == 2
    # ... and every event reads back, in order, for the client and for a history read
    for step in ("start", "second"):
        assert worker_names(r, step) == [*RUN, E.STEP_DONE]
    history = [(seq, e) async for seq, e in read_events(js, topology, eid)]
    assert [e for _, e in history] == r.events
    assert [e.name for _, e in history if e.step == "start"][1:5] == [*RUN, E.STEP_DONE]
    named = [e.name async for _, e in read_events(js, topology, eid, names=(E.TASK_DONE, E.STEP_SCHEDULED))]
    assert named == [E.STEP_SCHEDULED, E.TASK_DONE, E.STEP_SCHEDULED, E.TASK_DONE]
    routed = [e.step async for _, e in read_events(js, topology, eid, names=(E.NEXT_EVALUATED,))]
    assert routed == ["start", "second"]
    diffs, _ = await verify(js, topology, eid)
    assert diffs == []


@pytest.fixture
async def separate(nats_server: EmbeddedNats, topology: Topology) -> AsyncIterator[Runtime]:
    async with local_runtime(nats_server.url, topology=topology, task_events="separate") as rt:
        yield rt


async def test_informative_carries_step_started(informative: Runtime, no_progress: None) -> None:
    r = await run(informative, playbook(CHAIN))
    assert r.status == "success" and r.result == 2, r.summary.error
    js, topology = informative.nc.jetstream(), informative.topology
    eid = r.summary.execution_id
    assert (await count_by_execution(js, topology, E.STEP_STARTED)).get(eid, 0) == 0
    for step in ("start", "second"):
        assert worker_names(r, step) == [E.STEP_STARTED, E.STEP_DONE]


async def test_distributed_iterations_carry_their_task_events(runtime: Runtime, no_progress: None) -> None:
    r = await run(
        runtime,
        playbook(
            """
            - step: start
              loop:
                in: "{{ [1, 2, 3] }}"
                iterator: n
                spec: {mode: parallel, policy: {exec: distributed}}
              tool:
                - name: twice
                  kind: python
                  args: {n: "{{ iter.n }}"}
                  code: |
                    result = n * 2
                    if n == 3:
                        raise ValueError("three")
            """
        ),
    )
    js, topology = runtime.nc.jetstream(), runtime.topology
    eid = r.summary.execution_id
    ends = [e for e in r.events if e.name in (E.LOOP_ITERATION_DONE, E.LOOP_ITERATION_FAILED)]
    assert sorted(e.name for e in ends) == [
        E.LOOP_ITERATION_DONE,
        E.LOOP_ITERATION_DONE,
        E.LOOP_ITERATION_FAILED,
    ]
    assert len(r.named(E.TASK_DONE)) == 3 and len(r.named(E.TASK_STARTED)) == 3
    assert (await count_by_execution(js, topology, E.TASK_DONE)).get(eid, 0) == 0
    # each boundary a message of its own: the controller folds them (never carried, unlike a local loop's)
    assert (await count_by_execution(js, topology, E.LOOP_ITERATION_DONE))[eid] == 2
    assert (await count_by_execution(js, topology, E.LOOP_ITERATION_FAILED))[eid] == 1
    for end in ends:  # each iteration's task events, right before its boundary
        i = r.events.index(end)
        assert [e.name for e in r.events[i - 2 : i]] == [E.TASK_STARTED, E.TASK_DONE]
        assert r.events[i - 1].payload["status"] == ("ok" if end.name == E.LOOP_ITERATION_DONE else "error")
    diffs, _ = await verify(js, topology, eid)
    assert diffs == []


def iteration(index: int, end: str = E.LOOP_ITERATION_DONE) -> list[Event]:
    """One local-loop iteration's events (start-1 is the loop step's run)."""
    scope = f"start-1.{index}"
    events = [event(E.LOOP_ITERATION_STARTED), event(E.TASK_STARTED), event(E.TASK_DONE), event(end)]
    return [msgspec.structs.replace(e, entity_id=scope, event_id=f"{e.event_id}.{index}") for e in events]


def test_a_batch_of_local_iterations_is_one_message_holding_them_all_in_order() -> None:
    events = iteration(0) + iteration(1, E.LOOP_ITERATION_FAILED) + iteration(2)
    (message,) = carry(ready(*events), LIMIT, ITERATIONS_MAX_BYTES, iterations=True)
    carrier, data = message
    assert carrier.event_id == events[-1].event_id and len(carrier.carried) == len(events) - 1
    assert expand(decode_event(data)) == events
    assert decode_all(data) == events


def test_outside_a_local_loop_an_iteration_boundary_is_never_carried() -> None:
    """A distributed iteration's command (or anything but a local loop's run) carries task events only:
    an iteration boundary the controller folds is never inside another's message."""
    events = [*iteration(0), *iteration(1, E.LOOP_ITERATION_FAILED)]
    out = carry(ready(*events), LIMIT, ITERATIONS_MAX_BYTES)
    assert [e.name for e, _ in out] == [
        E.LOOP_ITERATION_STARTED,
        E.LOOP_ITERATION_DONE,
        E.LOOP_ITERATION_STARTED,
        E.LOOP_ITERATION_FAILED,
    ]
    assert [e for m, _ in out for e in expand(m)] == events


def test_a_loops_end_carries_no_iteration_records() -> None:
    events = [*iteration(0), event(E.LOOP_DONE)]
    out = carry(ready(*events), LIMIT, ITERATIONS_MAX_BYTES, iterations=True)
    assert [e.name for e, _ in out] == [E.LOOP_ITERATION_DONE, E.LOOP_DONE]
    assert [e for m, _ in out for e in expand(m)] == events


def test_a_batch_of_iterations_stays_within_its_bytes_and_count() -> None:
    events = [e for i in range(100) for e in iteration(i)]
    out = carry(ready(*events), LIMIT, ITERATIONS_MAX_BYTES, iterations=True)
    assert 1 < len(out) < 100
    for message, _ in out:
        assert len(message.carried) <= MAX_CARRIED
        assert sum(len(r) + 1 for r in message.carried) <= ITERATIONS_MAX_BYTES
        assert message.name == E.LOOP_ITERATION_DONE
    assert [e for m, _ in out for e in expand(m)] == events
    # the default bytes of a step's boundary: batches of a few iterations
    assert len(carry(ready(*events), LIMIT)) > len(out)


async def test_a_parallel_local_loop_stores_its_iterations_in_few_messages(
    runtime: Runtime, no_progress: None
) -> None:
    items = 60
    r = await run(
        runtime,
        playbook(
            f"""
            - step: start
              loop:
                in: "{{{{ range({items}) | list }}}}"
                iterator: n
                spec: {{mode: parallel, max_in_flight: 20}}
              tool: {{kind: noop, result: "{{{{ iter.n * 2 }}}}"}}
            """
        ),
    )
    assert r.status == "success" and r.result == [n * 2 for n in range(items)], r.summary.error
    js, topology = runtime.nc.jetstream(), runtime.topology
    eid = r.summary.execution_id
    stored = 0
    for name in (E.LOOP_ITERATION_STARTED, E.LOOP_ITERATION_DONE, E.TASK_STARTED, E.TASK_DONE):
        stored += (await count_by_execution(js, topology, name)).get(eid, 0)
    assert stored < items  # four records per iteration, 4 * items before batches
    done = [e async for _, e in read_events(js, topology, eid, names=(E.LOOP_ITERATION_DONE,))]
    assert sorted(e.payload["index"] for e in done) == list(range(items))
    assert len(r.named(E.LOOP_ITERATION_STARTED)) == len(r.named(E.TASK_DONE)) == items
    diffs, _ = await verify(js, topology, eid)
    assert diffs == []


async def test_separate_stores_each_event_on_its_own_subject(separate: Runtime) -> None:
    r = await run(separate, playbook(CHAIN))
    assert r.status == "success" and r.result == 2, r.summary.error
    js, topology = separate.nc.jetstream(), separate.topology
    for name in (E.STEP_STARTED, E.TASK_STARTED, E.TASK_DONE, E.STEP_DONE):
        assert await total(js, topology, name) == 2, name
    assert not any(e.carried for e in r.events)
    for step in ("start", "second"):
        assert worker_names(r, step) == [*RUN, E.STEP_DONE]


async def test_a_long_steps_progress_is_not_held_for_its_boundary(runtime: Runtime) -> None:
    # still running after PROGRESS_EVERY_S: its step.started and task.started are published as progress
    r = await run(
        runtime,
        playbook(
            """
            - step: start
              tool:
                - name: slow
                  kind: python
                  code: |
                    import time
                    time.sleep(1.5)
                    result = 1
            """
        ),
    )
    assert r.status == "success", r.summary.error
    js, topology = runtime.nc.jetstream(), runtime.topology
    eid = r.summary.execution_id
    assert (await count_by_execution(js, topology, E.STEP_STARTED))[eid] == 1
    assert (await count_by_execution(js, topology, E.TASK_STARTED))[eid] == 1
    assert (await count_by_execution(js, topology, E.TASK_DONE)).get(eid, 0) == 0  # carried by step.done
    assert [e.name for e in r.events if e.source == "worker"] == [*RUN, E.STEP_DONE]


async def test_a_forged_carrier_gives_readers_only_its_own_executions_events(runtime: Runtime) -> None:
    js, topology = runtime.nc.jetstream(), runtime.topology
    victim = event(E.TASK_DONE, "victim00000000000000000000000000")
    carrier = forged([encode(event(E.TASK_STARTED, "forger00000000000000000000000000")), encode(victim)])
    carrier = msgspec.structs.replace(
        carrier, execution_id="forger00000000000000000000000000", event_id="forged-1"
    )
    await js.publish(topology.event_subject(carrier.execution_id, E.STEP_DONE), encode(carrier))

    with capture_logs() as logs:
        got = [e async for _, e in read_events(js, topology, carrier.execution_id)]
    assert [(e.name, e.execution_id) for e in got] == [
        (E.TASK_STARTED, carrier.execution_id),
        (E.STEP_DONE, carrier.execution_id),
    ]
    # (the controller, reading the unknown execution's history for the forged boundary, may log it too)
    bad = {x["error"] for x in logs if x["event"] == "events.bad_carried"}
    assert bad == {
        f"a 'step.done' event carries an event of another execution ({victim.execution_id}); it is skipped"
    }
    assert [e async for _, e in read_events(js, topology, victim.execution_id)] == []
