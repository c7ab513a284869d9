"""Records published straight onto the events subjects, past the intake (a security probe did): a
``playbook.execution.requested`` whose request the intake would have refused is rejected by the
controller instead of breaking its fold (``'str' object has no attribute 'get'``, retried for ever) or
running; an event whose body is not what its subject names is refused. Real nats-server and runtime."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import structlog
from apiserver import serve
from helpers import playbook

from noetl_stream.client.tracking import Tracker, follow
from noetl_stream.kv.history import read_events
from noetl_stream.protocol import events as E
from noetl_stream.protocol.wire import Event, now_iso
from noetl_stream.runtime.local import Runtime

GOOD = playbook("- step: start\n  tool: {kind: noop, result: 7}\n")


@contextlib.contextmanager
def logs() -> Iterator[list[dict[str, Any]]]:
    with structlog.testing.capture_logs() as captured:
        yield captured


def requested(execution_id: str, request: Any) -> Event:
    return Event(
        event_id=f"{execution_id}:execution:{E.EXECUTION_REQUESTED}",
        execution_id=execution_id,
        name=E.EXECUTION_REQUESTED,
        source="server",
        entity_type="playbook",
        entity_id="forged",
        status="in_progress",
        timestamp=now_iso(),
        payload={"request": request},
    )


@pytest.mark.parametrize(
    ("request_", "fragment"),
    [
        pytest.param("xx", "the recorded request is a str, not a mapping", id="not-a-mapping"),
        pytest.param(
            {"playbook": GOOD, "payload": [1, 2]},
            "bad request: wrong shape at $.payload: expected an object, got an array",
            id="payload-not-a-mapping",
        ),
        pytest.param(
            {"playbook": GOOD, "execution_id": "someone-else"},
            "the recorded request is for execution 'someone-else'",
            id="another-execution",
        ),
    ],
)
async def test_a_forged_request_record_is_rejected_by_the_controller(
    runtime: Runtime, request_: Any, fragment: str
) -> None:
    eid = f"forged-{abs(hash(fragment)) % 10_000}"
    forged = requested(eid, request_)
    js = runtime.nc.jetstream()
    await js.publish(runtime.topology.event_subject(eid, forged.name), msgspec.json.encode(forged))

    summary = await follow(runtime.nc, runtime.topology, eid, timeout=20)

    assert summary.status == "rejected" and summary.error is not None
    assert summary.error["kind"] == "bad_request" and fragment in summary.error["message"]
    tracker = Tracker(eid)  # what `status` folds: no AttributeError on the forged record
    async for _, ev in read_events(js, runtime.topology, eid):
        tracker.apply(ev)
    assert tracker.summary.status == "rejected"
    ok = await runtime.run_playbook(GOOD, "good.yaml", timeout=20)
    assert (ok.status, ok.result) == ("success", 7)


async def test_an_event_whose_body_is_not_what_its_subject_names_is_refused(
    runtime: Runtime, eventually: Any
) -> None:
    topology = runtime.topology
    victim = requested("victim-x", {"playbook": GOOD})
    with logs() as captured:  # published under execution 'decoy', folded as 'victim-x' before
        await runtime.nc.jetstream().publish(
            topology.event_subject("decoy", E.EXECUTION_REQUESTED), msgspec.json.encode(victim)
        )
        await eventually(lambda: any(line["event"] == "controller.bad_event" for line in captured))

    (bad,) = [line for line in captured if line["event"] == "controller.bad_event"]
    assert "not what its subject names" in bad["error"] and ".decoy." in bad["subject"]
    assert [ev async for ev in read_events(runtime.nc.jetstream(), topology, "victim-x")] == []


async def test_status_of_an_execution_whose_only_record_is_unreadable_is_a_404(runtime: Runtime) -> None:
    raw = msgspec.json.encode(requested("unreadable-x", {"playbook": "PLAYBOOK"}))
    raw = raw.replace(b'"PLAYBOOK"', b'"\xff\xfe"')
    topology = runtime.topology
    await runtime.nc.jetstream().publish(topology.event_subject("unreadable-x", E.PLAYBOOK_PROCESSED), raw)
    async with serve(runtime) as api:
        reply = await api.json("GET", "/api/executions/unreadable-x", 404)
    assert reply["error"] == "not_found"
