"""Requests whose execution id is held by a stored message that is not a noetl record, against a real
nats-server. Anyone who may publish on the events subjects can store one under ``playbook.*`` (a typo,
a buggy tool): it claims the id, and intake must answer a request for that id with a clear refusal,
not fail on it (a request on the subject was redelivered every second, for ever; the micro endpoint
answered 500)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec
import pytest
from helpers import playbook
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from noetl_stream.client.submit import request_for
from noetl_stream.control.intake import Intake
from noetl_stream.kv.provision import provision
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import encode
from noetl_stream.runtime.local import Runtime

GOOD = playbook("- step: start\n  tool: {kind: noop}\n")
NOT_AN_EVENT = (b"{not json", b'{"event_id": "x", "status": "completed"}')


@pytest.fixture
async def intake(nc: NATS, js: JetStreamContext, topology: Topology) -> AsyncIterator[Intake]:
    await provision(js, topology, ("default",))
    yield Intake(nc, topology)


def no_default() -> str:
    raise AssertionError("the request brings its id")


@pytest.mark.parametrize("garbage", NOT_AN_EVENT)
@pytest.mark.parametrize("name", [E.EXECUTION_REQUESTED, E.PLAYBOOK_PROCESSED])
async def test_a_request_for_an_id_held_by_a_stored_non_event_is_refused_clearly(
    intake: Intake, js: JetStreamContext, topology: Topology, garbage: bytes, name: str
) -> None:
    await js.publish(topology.event_subject("held", name), garbage)

    execution_id, error = await intake.admit(
        encode(request_for(GOOD, "good.yaml", execution_id="held")), no_default
    )

    assert execution_id == "held"
    assert error is not None and error["kind"] == "bad_request"
    assert "'held' is taken by a stored message" in error["message"]


async def test_a_request_on_the_subject_for_such_an_id_is_settled_not_redelivered_for_ever(
    runtime: Runtime, topology: Topology
) -> None:
    js = runtime.nc.jetstream()
    await js.publish(topology.event_subject("held2", E.EXECUTION_REQUESTED), b"{not json")
    await js.publish(topology.request_subject, encode(request_for(GOOD, "good.yaml", execution_id="held2")))
    # A request after it on the same consumer is handled too.
    follow_up = await runtime.run_playbook(GOOD, timeout=20)
    assert follow_up.status == "success"

    consumer = topology.controller_requests_consumer
    for _ in range(200):
        info = await js.consumer_info(topology.requests_stream, consumer)
        if info.num_ack_pending == 0 and info.num_pending == 0:
            break
        await asyncio.sleep(0.05)
    info = await js.consumer_info(topology.requests_stream, consumer)
    assert (info.num_ack_pending, info.num_pending, info.num_redelivered) == (0, 0, 0)


async def test_the_execute_endpoint_answers_such_an_id_with_a_400(
    runtime: Runtime, topology: Topology
) -> None:
    js = runtime.nc.jetstream()
    await js.publish(topology.event_subject("held3", E.PLAYBOOK_PROCESSED), b"\x00\xff")
    raw = encode(request_for(GOOD, "good.yaml", execution_id="held3"))

    reply = await runtime.nc.request(topology.api_subject("execute"), raw, timeout=10)

    assert reply.headers is not None and reply.headers.get("Nats-Service-Error-Code") == "400"
    body = msgspec.json.decode(reply.data)
    assert body["error"] == "bad_request" and "taken by a stored message" in body["detail"]


async def test_a_malformed_request_is_rejected_under_its_id_when_another_field_is_out_of_range(
    intake: Intake, js: JetStreamContext, topology: Topology
) -> None:
    # 1e999 is valid JSON that no decoder takes as a number: the rejection still goes where the client looks.
    raw = b'{"playbook": "x", "deadline_s": 1e999, "execution_id": "own-id"}'

    execution_id, error = await intake.admit(raw, no_default)

    assert execution_id == "own-id"
    assert (
        error is not None
        and error["message"] == "bad request: wrong shape at $.deadline_s: a number out of range"
    )
    last = await js.get_last_msg(
        topology.events_stream, topology.stored_event_filter("own-id", E.PLAYBOOK_PROCESSED)
    )
    assert msgspec.json.decode(last.data)["payload"]["status"] == "rejected"


@pytest.mark.parametrize("key", ["corrupt.1", "corrupt.latest"])
async def test_a_request_for_an_unreadable_catalog_entry_is_rejected_not_retried_for_ever(
    intake: Intake, js: JetStreamContext, topology: Topology, key: str
) -> None:
    # A key of the catalog bucket written by something else than the catalog (`nats kv put`).
    kv = await js.key_value(topology.catalog_bucket)
    await kv.put(key, b"{not a catalog record")
    version = {"version": "1"} if key.endswith(".1") else {}
    raw = msgspec.json.encode({"path": "corrupt", "execution_id": "cat", **version})

    execution_id, error = await intake.admit(raw, no_default)

    assert execution_id == "cat"
    assert error is not None and "the catalog entry of 'corrupt' cannot be read" in error["message"]
    last = await js.get_last_msg(
        topology.events_stream, topology.stored_event_filter("cat", E.PLAYBOOK_PROCESSED)
    )
    assert msgspec.json.decode(last.data)["payload"]["status"] == "rejected"
