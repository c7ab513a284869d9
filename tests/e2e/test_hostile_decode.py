"""Hostile bytes on every way in, against a real nats-server and runtime.

A security probe found them: invalid UTF-8 inside a JSON string (msgspec before 0.23 raised
``UnicodeDecodeError``), JSON nested past msgspec's depth limit (``RecursionError``), and the handlers
caught only msgspec's errors. An execution request, an event or a command carrying them failed its
handler at every delivery, for ever (``puller.handler_failed`` about once a second: the controller's
consumers never give up), a command then failed the controller's poison handler for ever too, and the
REST API and the ``noetl`` micro service answered a 500. Each is now refused once, with one log line
saying why in our own words (`noetl_stream.protocol.decoding`), whatever msgspec's release says.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import msgspec
import pytest
import structlog
from apiserver import Api, serve
from helpers import playbook
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError

from noetl_stream.client.tracking import follow
from noetl_stream.kv.catalog import LATEST, encode_part
from noetl_stream.protocol import events as E
from noetl_stream.protocol.wire import decode_command, decode_event, decode_request
from noetl_stream.runtime.local import Runtime

GOOD = playbook(
    """
    - step: start
      tool: {kind: noop, result: "{{ workload.x }}"}
    """,
    workload={"x": "hello"},
)
NOT_UTF8 = b"\xff\xfe"
DEEP = b"[" * 100_000 + b"]" * 100_000
TOO_DEEP = "JSON nested too deeply"


def not_utf8(raw: bytes) -> str:
    """What we say of `raw`, whose first invalid UTF-8 is its first byte 0xff."""
    return f"not valid UTF-8: byte 0xff at offset {raw.index(0xFF)}"


def request(execution_id: str | None, playbook_text: bytes = NOT_UTF8, eid: bytes | None = None) -> bytes:
    """A request whose playbook (or, with `eid`, whose execution id) is a JSON string of invalid UTF-8."""
    claimed = eid if eid is not None else json.dumps(execution_id).encode()
    return b'{"playbook": "%s", "execution_id": %s}' % (playbook_text, claimed)


def event(execution_id: str, *, worker: bytes = b'"w1"', result: bytes = b"1") -> bytes:
    """A ``step.done`` of `execution_id`, with raw JSON for its ``worker`` and its result."""
    return (
        b'{"event_id": "%(eid)s:start-1:step.done", "execution_id": "%(eid)s", "name": "step.done", '
        b'"source": "worker", "entity_type": "step", "entity_id": "start-1", "status": "success", '
        b'"timestamp": "2026-11-23T06:56:09.115Z", "step": "start", "step_run_id": "start-1", '
        b'"worker": %(worker)s, "payload": {"result": %(result)s}}'
    ) % {b"eid": execution_id.encode(), b"worker": worker, b"result": result}


@contextlib.contextmanager
def logs() -> Iterator[list[dict[str, Any]]]:
    with structlog.testing.capture_logs() as captured:
        yield captured


def named(captured: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [line for line in captured if line["event"] == name]


async def call(rt: Runtime, endpoint: str, raw: bytes) -> tuple[str | None, dict[str, Any]]:
    msg: Msg = await rt.nc.request(rt.topology.api_subject(endpoint), raw, timeout=10)
    return (msg.headers or {}).get("Nats-Service-Error-Code"), json.loads(msg.data)


async def settled(rt: Runtime, stream: str, consumer: str) -> bool:
    info = await rt.nc.jetstream().consumer_info(stream, consumer)
    return info.num_pending == 0 and info.num_ack_pending == 0 and info.delivered.stream_seq > 0


async def redelivered(rt: Runtime, stream: str, consumer: str) -> int:
    return (await rt.nc.jetstream().consumer_info(stream, consumer)).num_redelivered


async def assert_still_serving(rt: Runtime) -> None:
    summary = await rt.run_playbook(GOOD, "good.yaml", {"x": "after"}, timeout=20)
    assert (summary.status, summary.result) == ("success", "after")


@pytest.fixture
async def api(runtime: Runtime) -> AsyncIterator[Api]:
    async with serve(runtime) as client:
        yield client


# -- the wire decoders --------------------------------------------------------------------------------
# Only a field of any JSON value (an event's or a request's ``payload``) can hold JSON nested too deeply:
# msgspec refuses a typed field's wrong type before it descends.


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param(
            b'{"execution_id": "\xff"}',
            "not valid UTF-8: byte 0xff at offset 18",
            id="invalid-utf8-in-a-string",
        ),
        pytest.param(b'{"payload": {"x": %s}}' % DEEP, TOO_DEEP, id="nested-too-deeply"),
    ],
)
@pytest.mark.parametrize("decode", [decode_event, decode_command, decode_request])
def test_every_wire_decoder_raises_a_decode_error_for_hostile_bytes(
    decode: Any, raw: bytes, message: str
) -> None:
    with pytest.raises(msgspec.DecodeError) as info:
        decode(raw)
    assert str(info.value) == message


# -- execution requests -------------------------------------------------------------------------------


async def test_a_request_with_invalid_utf8_on_the_subject_is_rejected_once(
    runtime: Runtime, eventually: Any
) -> None:
    topology = runtime.topology
    with logs() as captured:
        await runtime.nc.jetstream().publish(topology.request_subject, request("hostile-utf8"))
        summary = await follow(runtime.nc, topology, "hostile-utf8", timeout=10)
        await eventually(
            lambda: settled(runtime, topology.requests_stream, topology.controller_requests_consumer)
        )

    assert summary.status == "rejected"
    assert (summary.error or {})["message"] == f"bad request: {not_utf8(request('hostile-utf8'))}"
    assert [line["execution_id"] for line in named(captured, "intake.rejected")] == ["hostile-utf8"]
    assert named(captured, "puller.handler_failed") == []
    assert await redelivered(runtime, topology.requests_stream, topology.controller_requests_consumer) == 0
    await assert_still_serving(runtime)


async def test_a_request_whose_execution_id_is_invalid_utf8_is_rejected_under_an_id_of_its_own(
    runtime: Runtime, eventually: Any
) -> None:
    topology = runtime.topology
    raw = request(None, GOOD.replace("\n", "\\n").replace('"', '\\"').encode(), eid=b'"\xff-id"')
    with logs() as captured:
        await runtime.nc.jetstream().publish(topology.request_subject, raw)
        await eventually(
            lambda: settled(runtime, topology.requests_stream, topology.controller_requests_consumer)
        )

    rejected = named(captured, "intake.rejected")
    assert len(rejected) == 1 and rejected[0]["error"] == f"bad request: {not_utf8(raw)}"
    summary = await follow(runtime.nc, topology, rejected[0]["execution_id"], timeout=10)
    assert summary.status == "rejected"
    assert named(captured, "puller.handler_failed") == []
    await assert_still_serving(runtime)


async def test_execute_answers_a_request_with_invalid_utf8_with_a_400(runtime: Runtime) -> None:
    code, reply = await call(runtime, "execute", request("hostile-micro"))

    assert code == "400" and reply["detail"] == f"bad request: {not_utf8(request('hostile-micro'))}", reply
    assert reply["execution_id"] == "hostile-micro"
    summary = await follow(runtime.nc, runtime.topology, "hostile-micro", timeout=10)
    assert summary.status == "rejected"
    await assert_still_serving(runtime)


@pytest.mark.parametrize(
    ("endpoint", "raw"),
    [
        pytest.param("catalog.register", b'{"playbook": "\xff\xfe"}', id="register-utf8"),
        pytest.param("status", b'{"execution_id": "\xff"}', id="status-utf8"),
        pytest.param("cancel", b'{"execution_id": "x", "reason": "\xff"}', id="cancel-utf8"),
    ],
)
async def test_micro_endpoints_answer_hostile_bytes_with_a_400(
    runtime: Runtime, endpoint: str, raw: bytes
) -> None:
    code, reply = await call(runtime, endpoint, raw)

    assert (code, reply["error"]) == ("400", "bad_request"), reply
    assert reply["detail"] == f"bad request: {not_utf8(raw)}", reply


@pytest.mark.parametrize(
    ("method", "path", "raw"),
    [
        pytest.param("POST", "/api/executions", request("hostile-rest"), id="start-utf8"),
        pytest.param("POST", "/api/catalog", b'{"playbook": "\xff"}', id="register-utf8"),
        pytest.param("PUT", "/api/keychain/k", b'{"kind": "\xff"}', id="keychain-utf8"),
        pytest.param("POST", "/api/executions/x/cancel", b'{"reason": "\xff"}', id="cancel-utf8"),
    ],
)
async def test_rest_answers_hostile_bytes_with_a_400(
    api: Api, runtime: Runtime, method: str, path: str, raw: bytes
) -> None:
    before = (await runtime.nc.jetstream().stream_info(runtime.topology.events_stream)).state.messages

    reply = await api.json(method, path, 400, data=raw, headers={"Content-Type": "application/json"})

    assert reply["error"] == "bad_request" and not_utf8(raw) in reply["detail"], reply
    after = (await runtime.nc.jetstream().stream_info(runtime.topology.events_stream)).state.messages
    assert after == before  # REST validates a start before recording anything


# -- catalog entries ------------------------------------------------------------------------------------


async def test_a_catalog_entry_with_invalid_utf8_rejects_its_requests_once(
    runtime: Runtime, api: Api, eventually: Any
) -> None:
    """A key of the catalog bucket written by something else (``nats kv put``): a request naming its path
    failed intake's handler at every redelivery, and listing the catalog was a 500."""
    topology = runtime.topology
    kv = await runtime.nc.jetstream().key_value(topology.catalog_bucket)
    await kv.put(f"{encode_part('tests/hostile')}.{LATEST}", b'{"version": "\xff", "seq": 1}')
    raw = json.dumps({"path": "tests/hostile", "execution_id": "hostile-catalog"}).encode()
    with logs() as captured:
        await runtime.nc.jetstream().publish(topology.request_subject, raw)
        summary = await follow(runtime.nc, topology, "hostile-catalog", timeout=10)
        await eventually(
            lambda: settled(runtime, topology.requests_stream, topology.controller_requests_consumer)
        )

    assert summary.status == "rejected" and "cannot be read" in (summary.error or {})["message"]
    assert named(captured, "puller.handler_failed") == []
    assert (await api.json("GET", "/api/catalog"))["items"] == []  # the bad key is skipped (and logged)


# -- events -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        pytest.param(
            {"worker": b'"\xff\xfe"'},
            not_utf8(event("hostile-event", worker=b'"\xff\xfe"')),
            id="invalid-utf8-in-a-string",
        ),
        pytest.param({"result": DEEP}, TOO_DEEP, id="nested-too-deeply"),
    ],
)
async def test_a_hostile_event_is_terminated_once_by_the_controller(
    runtime: Runtime, eventually: Any, fields: dict[str, bytes], message: str
) -> None:
    topology = runtime.topology
    eid = "hostile-event"
    consumer = topology.controller_events_consumer(topology.partition_of(eid))
    with logs() as captured:
        await runtime.nc.jetstream().publish(topology.event_subject(eid, E.STEP_DONE), event(eid, **fields))
        await eventually(lambda: named(captured, "controller.bad_event") != [])
        await eventually(lambda: settled(runtime, topology.events_stream, consumer))
        await assert_still_serving(runtime)

    bad = named(captured, "controller.bad_event")
    assert len(bad) == 1 and bad[0]["error"] == message, bad
    assert named(captured, "puller.handler_failed") == []
    assert await redelivered(runtime, topology.events_stream, consumer) == 0


# -- commands -----------------------------------------------------------------------------------------


async def test_a_command_with_invalid_utf8_is_terminated_once_by_the_worker(
    runtime: Runtime, eventually: Any
) -> None:
    topology = runtime.topology
    consumer = topology.pool_consumer("default")
    with logs() as captured:
        subject = topology.command_subject("default", "hostile-command")
        await runtime.nc.jetstream().publish(subject, b'{"execution_id": "\xff"}')  # offset 18
        await eventually(lambda: named(captured, "worker.bad_command") != [])
        await eventually(lambda: settled(runtime, topology.commands_stream, consumer))
        await assert_still_serving(runtime)

    bad = named(captured, "worker.bad_command")
    assert len(bad) == 1 and bad[0]["error"] == "not valid UTF-8: byte 0xff at offset 18", bad
    assert named(captured, "puller.handler_failed") == []
    assert await redelivered(runtime, topology.commands_stream, consumer) == 0


async def test_the_poison_handler_removes_an_unreadable_command_once(
    runtime: Runtime, eventually: Any
) -> None:
    """A command JetStream gave up on (as a worker that failed on it every time left it): the controller
    reads it back to write its step's failure, and failed on it at every redelivery of the advisory."""
    topology = runtime.topology
    js = runtime.nc.jetstream()
    # a pool no worker takes: the command stays for the advisory to name it
    ack = await js.publish(topology.command_subject("nobody", "hostile-poison"), b'{"execution_id": "\xff"}')
    advisory = {"stream_seq": ack.seq, "deliveries": 5}
    subject = topology.max_deliveries_subject.replace(">", topology.pool_consumer("nobody"))
    with logs() as captured:
        await js.publish(subject, json.dumps(advisory).encode())
        await eventually(lambda: named(captured, "controller.poison_unreadable") != [])
        await eventually(
            lambda: settled(runtime, topology.advisories_stream, topology.controller_advisories_consumer)
        )

    unreadable = named(captured, "controller.poison_unreadable")
    assert len(unreadable) == 1 and unreadable[0]["error"] == "not valid UTF-8: byte 0xff at offset 18", (
        unreadable
    )
    assert named(captured, "puller.handler_failed") == []
    with pytest.raises(NotFoundError):
        await js.get_msg(topology.commands_stream, ack.seq)
    await assert_still_serving(runtime)


async def test_an_advisory_nested_too_deeply_is_terminated_once(runtime: Runtime, eventually: Any) -> None:
    topology = runtime.topology
    subject = topology.max_deliveries_subject.replace(">", topology.pool_consumer("nobody"))
    with logs() as captured:
        await runtime.nc.jetstream().publish(subject, DEEP)
        await eventually(lambda: named(captured, "controller.bad_advisory") != [])
        await eventually(
            lambda: settled(runtime, topology.advisories_stream, topology.controller_advisories_consumer)
        )

    bad = named(captured, "controller.bad_advisory")
    assert len(bad) == 1 and bad[0]["error"] == TOO_DEEP, bad
    assert named(captured, "puller.handler_failed") == []
