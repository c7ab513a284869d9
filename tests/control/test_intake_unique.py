"""An execution id is decided once, against a real nats-server: `Intake.admit` publishes an execution's
first record (its ``playbook.execution.requested``, or the ``playbook.request.rejected`` of a request
that names no runnable playbook) only while the execution has no ``playbook.*`` record, so a request
for an execution that is decided (a client's retry, a redelivery, another request with the same id,
even one racing it) is answered with what was decided, whatever its ``Nats-Msg-Id`` and however late
it comes: an execution never has both a request that runs and a rejection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec
import pytest
from helpers import Clustered, playbook
from helpers import requested as requested_event
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from noetl_stream.client.submit import request_for
from noetl_stream.client.tracking import follow
from noetl_stream.control.core.reducer import rejection_events
from noetl_stream.control.inspect import Inspector
from noetl_stream.control.intake import Intake
from noetl_stream.kv.history import read_events
from noetl_stream.kv.provision import provision
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event, ExecutionRequest, derived_execution_id, encode

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
    assert await intake.submit(raw, no_default) == ("twice", None)  # as a redelivery

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
    assert await intake.admit(raw, default_id) == ("derived-1", None)  # redelivered

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
    assert await intake.admit(redelivered, lambda: "ran") == ("ran", None)

    assert [ev.name for ev in await history(js, topology, "ran")] == [E.EXECUTION_REQUESTED]


async def test_a_new_request_that_cannot_run_is_still_rejected_once(
    intake: Intake, js: JetStreamContext, topology: Topology
) -> None:
    invalid = encode(request_for(INVALID, "bad.yaml", execution_id="bad"))
    execution_id, error = await intake.admit(invalid, no_default)
    assert execution_id == "bad" and error is not None and error["kind"] == "invalid_playbook"
    # Again (a retry, a redelivery): answered with the recorded rejection, nothing written.
    again_id, again = await intake.admit(invalid, no_default)
    assert again_id == "bad" and again is not None and again["kind"] == "invalid_playbook"
    assert again["message"].startswith("execution 'bad' is recorded as rejected: ")

    unknown = encode(ExecutionRequest(path="tests/nowhere", execution_id="unknown"))
    execution_id, error = await intake.admit(unknown, no_default)
    assert execution_id == "unknown" and error is not None and error["kind"] == "unknown_playbook"
    _, again = await intake.admit(unknown, no_default)
    assert (
        again is not None
        and again["kind"] == "unknown_playbook"
        and "recorded as rejected" in again["message"]
    )

    # Its request event carries the rejection; the controller, folding it, writes the rejection events
    # (no controller runs here: tests/e2e/test_runtime_requests.py runs one).
    names = [ev.name for ev in await history(js, topology, "bad")]
    assert names == [E.EXECUTION_REQUESTED]
    (ev,) = requested(await history(js, topology, "bad"))
    assert ev.payload["rejected"]["kind"] == "invalid_playbook"
    names = [ev.name for ev in await history(js, topology, "unknown")]
    assert names == [E.REQUEST_REJECTED, E.PLAYBOOK_PROCESSED]


def decided(events: list[Event]) -> str:
    """What an execution's history (as intake writes it) says was decided: "accepted" or "rejected", and
    only one of them: one request event, or none and one rejection."""
    names = [ev.name for ev in events]
    reqs = requested(events)
    assert len(reqs) <= 1, names
    if reqs:
        assert E.REQUEST_REJECTED not in names and E.PLAYBOOK_PROCESSED not in names, names
        return "rejected" if "rejected" in reqs[0].payload else "accepted"
    assert names == [E.REQUEST_REJECTED, E.PLAYBOOK_PROCESSED], names
    return "rejected"


@pytest.mark.parametrize("other", ["invalid", "unknown", "malformed"])
async def test_a_valid_and_a_failing_request_for_one_id_at_once_decide_it_one_way(
    intake: Intake, js: JetStreamContext, topology: Topology, other: str
) -> None:
    """Two requests with the same id, admitted at the same moment, one that runs and one that is
    rejected (a playbook that does not compile, a catalog path that is not there, a request that does
    not parse): the execution is either accepted or rejected, never both, and both callers are told
    what was decided."""
    for n in range(12):
        eid = f"race-{other}-{n}"
        good = encode(request_for(GOOD, "good.yaml", execution_id=eid))
        bad = {
            "invalid": encode(request_for(INVALID, "bad.yaml", execution_id=eid)),
            "unknown": encode(ExecutionRequest(path="tests/nowhere", execution_id=eid)),
            "malformed": b'{"execution_id": "%s", "playbook": 7}' % eid.encode(),
        }[other]
        pair = (good, bad) if n % 2 else (bad, good)
        answers = await asyncio.gather(*(intake.admit(raw, no_default) for raw in pair))

        outcome = decided(await history(js, topology, eid))
        for answer_id, error in answers:
            assert answer_id == eid
            assert (error is None) == (outcome == "accepted"), (outcome, answers)


async def test_a_request_for_an_id_rejected_before_is_told_so_and_records_nothing(
    intake: Intake, js: JetStreamContext, topology: Topology
) -> None:
    unknown = encode(ExecutionRequest(path="tests/nowhere", execution_id="taken"))
    _, first = await intake.admit(unknown, no_default)
    assert first is not None and first["kind"] == "unknown_playbook"
    before = [ev.event_id for ev in await history(js, topology, "taken")]

    # A request that would run, with the same id: the id is decided (rejected), so nothing runs.
    execution_id, error = await intake.admit(
        encode(request_for(GOOD, "good.yaml", execution_id="taken")), no_default
    )
    assert execution_id == "taken" and error is not None and error["kind"] == "unknown_playbook"
    assert error["message"] == f"execution 'taken' is recorded as rejected: {first['message']}"
    assert [ev.event_id for ev in await history(js, topology, "taken")] == before


async def test_a_rejection_whose_writer_stopped_halfway_is_completed_by_the_next_delivery(
    intake: Intake, js: JetStreamContext, topology: Topology
) -> None:
    """Intake writes an execution's deciding record first and ``playbook.processed`` after it: a crash
    in between leaves the request unacknowledged, and its redelivery writes what is missing (once)."""
    error = {"kind": "unknown_playbook", "message": "no playbook 'tests/nowhere' in the catalog"}
    rejected, _ = rejection_events("half", "tests/nowhere", error, None)
    await js.publish(
        topology.event_subject("half", E.REQUEST_REJECTED), encode(rejected), headers={"Nats-Msg-Id": "other"}
    )
    unknown = encode(ExecutionRequest(path="tests/nowhere", execution_id="half"))
    _, answer = await intake.admit(unknown, no_default)
    assert answer is not None and answer["kind"] == "unknown_playbook"
    names = [ev.name for ev in await history(js, topology, "half")]
    assert names == [E.REQUEST_REJECTED, E.PLAYBOOK_PROCESSED]
    (processed,) = [ev for ev in await history(js, topology, "half") if ev.name == E.PLAYBOOK_PROCESSED]
    assert processed.payload == {"status": "rejected", "error": error}

    # Written once: a third delivery finds it complete.
    await intake.admit(unknown, no_default)
    assert len(await history(js, topology, "half")) == 2


async def test_a_half_written_rejection_is_final_to_its_readers(
    intake: Intake, nc: NATS, js: JetStreamContext, topology: Topology
) -> None:
    """Until a redelivery completes it, a rejection without its ``playbook.processed`` (its writer
    stopped in between; a request-reply caller may never send it again) is final to `follow`, to
    ``status`` and to the API's status: they waited for ``playbook.processed`` for ever, or found no
    such execution. A complete rejection is read to
    its ``playbook.processed``."""
    error = {"kind": "unknown_playbook", "message": "no playbook 'tests/nowhere' in the catalog"}
    rejected, _ = rejection_events("halfread", "tests/nowhere", error, None)
    await js.publish(topology.event_subject("halfread", E.REQUEST_REJECTED), encode(rejected))
    summary = await follow(nc, topology, "halfread", timeout=10)
    assert (summary.status, summary.error, summary.events) == ("rejected", error, 1)
    inspector = Inspector(js, topology)  # the API's status: it said "no such execution"
    assert await inspector.exists("halfread")
    status = await inspector.status("halfread")
    assert status is not None and (status.status, status.error) == ("rejected", error)

    unknown = encode(ExecutionRequest(path="tests/nowhere", execution_id="halfread"))
    await intake.admit(unknown, no_default)  # the next delivery completes it
    seen: list[str] = []
    summary = await follow(nc, topology, "halfread", lambda ev: seen.append(ev.name), timeout=10)
    assert summary.status == "rejected" and seen == [E.REQUEST_REJECTED, E.PLAYBOOK_PROCESSED]


async def test_an_id_whose_first_records_expired_is_answered_by_those_left(
    intake: Intake, js: JetStreamContext, topology: Topology
) -> None:
    """The events stream's max_age removes an execution's oldest events first: its request may be gone
    while its ``playbook.processed`` is kept. A request for that id is still answered with the decision."""
    for eid, payload in (
        ("old-ok", {"status": "success"}),
        ("old-bad", {"status": "rejected", "error": {"kind": "bad_request", "message": "m"}}),
    ):
        processed = msgspec.structs.replace(
            requested_event(eid, GOOD, "good.yaml"),
            name=E.PLAYBOOK_PROCESSED,
            event_id=f"{eid}:p",
            payload=payload,
        )
        await js.publish(
            topology.event_subject(eid, E.PLAYBOOK_PROCESSED),
            encode(processed),
            headers={"Nats-Msg-Id": f"{eid}:p"},
        )
    assert await intake.admit(encode(request_for(GOOD, "good.yaml", execution_id="old-ok")), no_default) == (
        "old-ok",
        None,
    )
    _, error = await intake.admit(encode(request_for(GOOD, "good.yaml", execution_id="old-bad")), no_default)
    assert error is not None and error["kind"] == "bad_request" and "recorded as rejected" in error["message"]
    assert [ev.name for ev in await history(js, topology, "old-ok")] == [E.PLAYBOOK_PROCESSED]


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


@pytest.mark.cluster
async def test_a_valid_and_a_failing_request_for_one_id_at_once_on_a_cluster_decide_it_one_way(
    r3: Clustered,
) -> None:
    """On a cluster the same race: there a request event whose ``Nats-Msg-Id`` was stored moments
    before (a valid and an invalid request for one id share it) is acked as a duplicate before the
    expected sequence is looked at; the loser must still learn what was decided."""
    intake = Intake(r3.nc, r3.topology)
    for other in ("invalid", "unknown"):
        for n in range(8):
            eid = f"race-{other}-{n}"
            good = encode(request_for(GOOD, "good.yaml", execution_id=eid))
            bad = (
                encode(request_for(INVALID, "bad.yaml", execution_id=eid))
                if other == "invalid"
                else encode(ExecutionRequest(path="tests/nowhere", execution_id=eid))
            )
            pair = (good, bad) if n % 2 else (bad, good)
            answers = await asyncio.gather(*(intake.admit(raw, no_default) for raw in pair))

            outcome = decided(await history(r3.js, r3.topology, eid))
            for answer_id, error in answers:
                assert answer_id == eid
                assert (error is None) == (outcome == "accepted"), (other, n, outcome, answers)
