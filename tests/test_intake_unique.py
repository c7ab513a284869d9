"""An execution id is recorded once, against a real nats-server: `Intake.admit` publishes an accepted
request's ``playbook.execution.requested`` only onto a subject with no message yet, so a request for
an execution that exists (a client's retry, a redelivery) is answered without a second one, whatever
its ``Nats-Msg-Id`` and however late it comes, and it never writes rejection events for it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec
import pytest
from helpers import Clustered, playbook
from helpers import requested as requested_event
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from noetl_stream import events as E
from noetl_stream.client import request_for
from noetl_stream.control.intake import Intake
from noetl_stream.kv.history import read_events
from noetl_stream.kv.provision import provision
from noetl_stream.subjects import Topology
from noetl_stream.wire import Event, ExecutionRequest, derived_execution_id, encode

GOOD = playbook("- step: start\n  tool: {kind: noop}\n")
INVALID = playbook("- step: start\n  tool: {kind: noop}\n  retries: 3\n")


@pytest.fixture
async def intake(nc: NATS, js: JetStreamContext, topology: Topology) -> AsyncIterator[Intake]:
    """An intake on the test's own topology, not started: the tests call it as its endpoints do."""
    await provision(js, topology, ("default",))
    yield Intake(nc, topology)


async def history(js: JetStreamContext, topology: Topology, execution_id: str) -> list[Event]:
    return [ev async for _, ev in read_events(js, topology, execution_id)]


def requested(events: list[Event]) -> list[Event]:
    return [ev for ev in events if ev.name == E.EXECUTION_REQUESTED]


def no_default() -> str:
    raise AssertionError("the default id is made only for a request that brings none")


async def test_a_request_admitted_again_is_recorded_once(
    intake: Intake, js: JetStreamContext, topology: Topology
) -> None:
    raw = encode(request_for(GOOD, "good.yaml", execution_id="twice"))

    assert await intake.admit(raw, no_default) == ("twice", None)
    assert await intake.admit(raw, no_default) == ("twice", None)
    assert await intake.submit(raw, no_default, redelivered=True) == ("twice", None)

    events = await history(js, topology, "twice")
    assert [ev.name for ev in events] == [E.EXECUTION_REQUESTED]


async def test_an_execution_recorded_beyond_the_duplicate_window_is_not_recorded_again(
    intake: Intake, nc: NATS, js: JetStreamContext, topology: Topology
) -> None:
    # The execution's request event is stored under a Nats-Msg-Id the server does not dedupe the new
    # one against (as when the duplicate window has forgotten it): only the subject says it exists.
    earlier = msgspec.structs.replace(
        requested_event("late", GOOD, "good.yaml"),
        event_id="earlier:execution:requested",
        payload={"marker": "earlier"},
    )
    await js.publish(
        topology.event_subject("late", E.EXECUTION_REQUESTED),
        encode(earlier),
        headers={"Nats-Msg-Id": "other"},
    )

    raw = encode(request_for(GOOD, "good.yaml", execution_id="late"))
    assert await intake.admit(raw, no_default) == ("late", None)

    (only,) = requested(await history(js, topology, "late"))
    assert only.payload == {"marker": "earlier"}


async def test_a_redelivered_request_without_an_id_is_recorded_once_under_its_default_id(
    intake: Intake, js: JetStreamContext, topology: Topology
) -> None:
    raw = encode(ExecutionRequest(playbook=GOOD, file="good.yaml"))
    made: list[str] = []

    def default_id() -> str:
        made.append("derived-1")
        return "derived-1"

    assert await intake.admit(raw, default_id) == ("derived-1", None)
    assert await intake.admit(raw, default_id, redelivered=True) == ("derived-1", None)

    assert made == ["derived-1", "derived-1"]
    assert len(requested(await history(js, topology, "derived-1"))) == 1


async def test_a_late_duplicate_of_an_accepted_request_writes_no_rejection(
    intake: Intake, js: JetStreamContext, topology: Topology
) -> None:
    assert await intake.admit(encode(request_for(GOOD, "good.yaml", execution_id="ran")), no_default) == (
        "ran",
        None,
    )

    # The same id with a playbook that does not compile now, or a catalog path that is not there: the
    # execution exists, so nothing is rejected (or written).
    invalid = encode(request_for(INVALID, "bad.yaml", execution_id="ran"))
    assert await intake.admit(invalid, no_default) == ("ran", None)
    unknown = encode(ExecutionRequest(path="tests/nowhere", execution_id="ran"))
    assert await intake.admit(unknown, no_default) == ("ran", None)
    redelivered = encode(ExecutionRequest(path="tests/nowhere"))
    assert await intake.admit(redelivered, lambda: "ran", redelivered=True) == ("ran", None)

    assert [ev.name for ev in await history(js, topology, "ran")] == [E.EXECUTION_REQUESTED]


async def test_a_new_request_that_cannot_run_is_still_rejected_once(
    intake: Intake, js: JetStreamContext, topology: Topology
) -> None:
    invalid = encode(request_for(INVALID, "bad.yaml", execution_id="bad"))
    execution_id, error = await intake.admit(invalid, no_default)
    assert execution_id == "bad" and error is not None and error["kind"] == "invalid_playbook"
    assert await intake.admit(invalid, no_default) == ("bad", None)  # it exists now (as rejected)

    unknown = encode(ExecutionRequest(path="tests/nowhere", execution_id="unknown"))
    execution_id, error = await intake.admit(unknown, no_default)
    assert execution_id == "unknown" and error is not None and error["kind"] == "unknown_playbook"

    names = [ev.name for ev in await history(js, topology, "bad")]
    assert names == [E.EXECUTION_REQUESTED, E.REQUEST_REJECTED, E.PLAYBOOK_PROCESSED]
    (ev,) = requested(await history(js, topology, "bad"))
    assert ev.payload["rejected"]["kind"] == "invalid_playbook"
    names = [ev.name for ev in await history(js, topology, "unknown")]
    assert names == [E.REQUEST_REJECTED, E.PLAYBOOK_PROCESSED]


async def test_a_request_on_the_subject_without_an_id_runs_under_the_id_of_its_stream_position(
    intake: Intake, nc: NATS, js: JetStreamContext, topology: Topology
) -> None:
    """The id derived from the request's stream, sequence and time (what makes a redelivery after a
    crash land on the same execution) is the same as before it was made lazily."""
    await js.publish(topology.request_subject, encode(ExecutionRequest(playbook=GOOD, file="good.yaml")))
    sub = await js.pull_subscribe_bind(
        durable=topology.controller_requests_consumer, stream=topology.requests_stream
    )
    (msg,) = await sub.fetch(1, timeout=10)

    await intake._on_stream_request(msg)  # what the controller's puller calls with each delivery

    meta = msg.metadata
    expected = derived_execution_id(topology.requests_stream, meta.sequence.stream, meta.timestamp)
    assert len(requested(await history(js, topology, expected))) == 1
    await sub.unsubscribe()


# --- a clustered (R3) events stream ----------------------------------------------------------------


@pytest.mark.cluster
async def test_concurrent_admissions_of_one_request_on_a_cluster_record_it_once(r3: Clustered) -> None:
    """A clustered stream refuses a conditional publish with "wrong last sequence" (no number) while
    another on the subject is being stored; the outbox tries again until the answer is final."""
    intake = Intake(r3.nc, r3.topology)
    raw = encode(request_for(GOOD, "good.yaml", execution_id="raced"))

    results = await asyncio.gather(*(intake.admit(raw, no_default) for _ in range(20)))

    assert results == [("raced", None)] * 20
    assert [ev.name for ev in await history(r3.js, r3.topology, "raced")] == [E.EXECUTION_REQUESTED]
