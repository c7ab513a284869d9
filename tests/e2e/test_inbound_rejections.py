"""Bad inbound messages, against a real nats-server and runtime: each gets a specific error, is recorded
where a request's rejection belongs, is settled (never redelivered forever), and the controller keeps its
connection and runs the next good request.

Found by an audit of the request subject, the ``noetl`` micro service, the REST API and the client: an
id of a few thousand characters made subjects longer than the server's control line, and the server
closed the controller's connection; a request too large to record (or JSON nested too deeply, or an error
quoting a huge field) received no answer (micro), a 500 (REST) or was redelivered forever (request
subject); a large playbook held the controller's event loop for seconds; an endpoint that failed left its
caller waiting; a few settings were silently ignored.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from apiserver import Api, serve
from helpers import playbook
from nats.aio.msg import Msg

from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import follow
from noetl_stream.control.endpoints import MAX_SEQ
from noetl_stream.dsl import compile_playbook
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import MAX_NEW_ID_LENGTH, MAX_TOKEN_LENGTH, SubjectError
from noetl_stream.runtime.local import Runtime

JSON_BODY = {"Content-Type": "application/json"}  # raw bytes: say what they are

GOOD = playbook(
    """
    - step: start
      tool: {kind: noop, result: "{{ workload.x }}"}
    """,
    workload={"x": "hello"},
)
LONG = "a" * 5000


@pytest.fixture
async def api(runtime: Runtime) -> AsyncIterator[Api]:
    async with serve(runtime) as client:
        yield client


async def call(rt: Runtime, endpoint: str, body: Any, timeout: float = 10) -> Msg:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return await rt.nc.request(rt.topology.api_subject(endpoint), raw, timeout=timeout)


def refusal(msg: Msg) -> tuple[str | None, dict[str, Any]]:
    return (msg.headers or {}).get("Nats-Service-Error-Code"), json.loads(msg.data)


async def assert_still_serving(rt: Runtime) -> None:
    assert not rt.nc.is_closed
    summary = await rt.run_playbook(GOOD, "good.yaml", {"x": "after"}, timeout=20)
    assert (summary.status, summary.result) == ("success", "after")


async def requests_settled(rt: Runtime) -> bool:
    info = await rt.nc.jetstream().consumer_info(
        rt.topology.requests_stream, rt.topology.controller_requests_consumer
    )
    return info.num_pending == 0 and info.num_ack_pending == 0


# -- ids the controller refuses -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "what"),
    [
        pytest.param({"playbook": GOOD, "execution_id": LONG}, "execution id", id="execution-id"),
        pytest.param({"playbook": GOOD, "pool": LONG}, "pool", id="pool"),
        pytest.param({"playbook": GOOD, "parent_execution_id": LONG}, "parent execution id", id="parent"),
        pytest.param({"playbook": GOOD, "trace_id": LONG}, "'trace_id'", id="trace-id"),
        pytest.param(
            {"payload": [], "execution_id": LONG},
            "wrong shape at $.payload: expected an object, got an array",
            id="malformed-claiming-it",
        ),
    ],
)
async def test_execute_refuses_an_id_too_long_for_a_subject(runtime: Runtime, body: Any, what: str) -> None:
    code, reply = refusal(await call(runtime, "execute", body))

    assert code == "400" and what in reply["detail"], reply
    assert len(reply["execution_id"]) <= MAX_NEW_ID_LENGTH
    summary = await follow(runtime.nc, runtime.topology, reply["execution_id"], timeout=10)
    assert summary.status == "rejected"
    await assert_still_serving(runtime)


@pytest.mark.parametrize("execution_id", ["a.b", "a b", "*", LONG])
async def test_the_client_refuses_an_execution_id_before_publishing_it(
    runtime: Runtime, execution_id: str
) -> None:
    """The controller would reject it under an id of its own: the client's caller would wait for nothing."""
    js = runtime.nc.jetstream()
    before = (await js.stream_info(runtime.topology.requests_stream)).state.last_seq

    with pytest.raises(SubjectError, match="execution id"):
        await submit(runtime.nc, runtime.topology, request_for(GOOD, "good.yaml", execution_id=execution_id))

    assert (await js.stream_info(runtime.topology.requests_stream)).state.last_seq == before
    await assert_still_serving(runtime)


async def test_the_request_subject_rejects_an_id_too_long_for_a_subject(runtime: Runtime) -> None:
    raw = json.dumps({"playbook": GOOD, "execution_id": LONG}).encode()
    await runtime.nc.jetstream().publish(runtime.topology.request_subject, raw)

    await assert_still_serving(runtime)
    assert await requests_settled(runtime)


@pytest.mark.parametrize("endpoint", ["status", "events", "ctx", "cancel", "pause", "resume"])
async def test_query_and_control_endpoints_refuse_an_id_too_long_for_a_subject(
    runtime: Runtime, endpoint: str
) -> None:
    code, reply = refusal(await call(runtime, endpoint, {"execution_id": LONG}))

    assert code == "400" and f"at most {MAX_TOKEN_LENGTH}" in reply["detail"], reply
    await assert_still_serving(runtime)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", f"/api/executions/{LONG}"),
        ("GET", f"/api/executions/{LONG}/events"),
        ("GET", f"/api/executions/{LONG}/graph"),
        ("GET", f"/api/executions/{LONG}/ctx"),
        ("POST", f"/api/executions/{LONG}/cancel"),
        ("GET", f"/api/keychain/{LONG}"),
    ],
)
async def test_rest_refuses_an_id_too_long_for_a_subject(
    api: Api, runtime: Runtime, method: str, path: str
) -> None:
    reply = await api.json(method, path, 400)

    assert reply["error"] == "bad_request" and "at most " in reply["detail"]
    await assert_still_serving(runtime)


async def test_a_control_reason_too_long_is_refused(runtime: Runtime, api: Api) -> None:
    """The reason travels in the control event: a megabyte of it made the event too large (a 500)."""
    summary = await runtime.run_playbook(GOOD, "good.yaml", timeout=20)
    reason = "r" * (runtime.nc.max_payload - 100)

    body = {"execution_id": summary.execution_id, "reason": reason}
    code, reply = refusal(await call(runtime, "cancel", json.dumps(body, separators=(",", ":")).encode()))
    assert code == "400" and "'reason'" in reply["detail"], reply
    reply = await api.json(
        "POST", f"/api/executions/{summary.execution_id}/cancel", 400, json={"reason": reason}
    )
    assert "'reason'" in reply["detail"]
    await assert_still_serving(runtime)


# -- requests too large to record --------------------------------------------------------------------


def too_large(rt: Runtime, execution_id: str) -> bytes:
    """A request that fits in a message, but not once recorded in ``playbook.execution.requested``."""
    filler = "x" * (rt.nc.max_payload - 300)
    body = {"playbook": GOOD, "execution_id": execution_id, "payload": {"x": filler}}
    raw = json.dumps(body, separators=(",", ":")).encode()
    assert len(raw) < rt.nc.max_payload
    return raw


async def test_execute_answers_a_request_too_large_to_record(runtime: Runtime) -> None:
    code, reply = refusal(await call(runtime, "execute", too_large(runtime, "huge-micro")))

    assert code == "400" and "request too large" in reply["detail"], reply
    summary = await follow(runtime.nc, runtime.topology, "huge-micro", timeout=10)
    assert summary.status == "rejected" and "request too large" in (summary.error or {})["message"]
    await assert_still_serving(runtime)


async def test_the_request_subject_rejects_a_request_too_large_to_record_once(runtime: Runtime) -> None:
    await runtime.nc.jetstream().publish(runtime.topology.request_subject, too_large(runtime, "huge-stream"))

    summary = await follow(runtime.nc, runtime.topology, "huge-stream", timeout=10)

    assert summary.status == "rejected" and "request too large" in (summary.error or {})["message"]
    await assert_still_serving(runtime)
    assert await requests_settled(runtime)


async def test_a_request_whose_record_fits_only_without_its_headers_is_rejected(runtime: Runtime) -> None:
    """The recorded event a few dozen bytes under ``max_payload``: with its headers it is over, and the
    server closed the controller's connection for good (every lease lost) when intake sent it."""
    js = runtime.nc.jetstream()

    def request(execution_id: str, filler: int) -> bytes:
        body = {"playbook": GOOD, "execution_id": execution_id, "payload": {"x": "x" * filler}}
        return json.dumps(body, separators=(",", ":")).encode()

    await js.publish(runtime.topology.request_subject, request("probe-size", 1000))
    await follow(runtime.nc, runtime.topology, "probe-size", timeout=10)
    subject = runtime.topology.stored_event_filter("probe-size", E.EXECUTION_REQUESTED)
    overhead = len((await js.get_last_msg(runtime.topology.events_stream, subject)).data) - 1000
    filler = runtime.nc.max_payload - overhead - 60 + len("probe-size") - len("near-limit")
    await js.publish(runtime.topology.request_subject, request("near-limit", filler))

    summary = await follow(runtime.nc, runtime.topology, "near-limit", timeout=10)

    assert summary.status == "rejected" and "request too large" in (summary.error or {})["message"]
    await assert_still_serving(runtime)


async def test_rest_answers_a_body_too_large_to_record_with_a_400(api: Api, runtime: Runtime) -> None:
    body = json.dumps({"playbook": GOOD, "payload": {"x": "x" * 2_000_000}}).encode()

    reply = await api.json("POST", "/api/executions", 400, data=body, headers=JSON_BODY)

    assert reply["error"] == "bad_request" and "request too large" in reply["detail"]
    await assert_still_serving(runtime)


@pytest.mark.parametrize(
    ("field", "fragment"),
    [("key", "unknown field"), ("path", "invalid catalog path")],
)
async def test_a_rejection_quoting_a_huge_field_is_recorded_once(
    runtime: Runtime, field: str, fragment: str
) -> None:
    """The error quotes an unknown field's name, or the path (which also names the rejection events):
    uncut, the rejection events would not fit in a message."""
    huge = "k" * (runtime.nc.max_payload - 100)
    body = {huge: 1} if field == "key" else {"path": huge}
    raw = json.dumps({**body, "execution_id": "huge-field"}, separators=(",", ":")).encode()
    await runtime.nc.jetstream().publish(runtime.topology.request_subject, raw)

    summary = await follow(runtime.nc, runtime.topology, "huge-field", timeout=10)

    assert summary.status == "rejected"
    message = (summary.error or {})["message"]
    assert fragment in message and len(message) < 2000
    await assert_still_serving(runtime)
    assert await requests_settled(runtime)


NESTED = b'{"payload": {"x": %s}}' % (b"[" * 5000 + b"]" * 5000)


async def test_json_nested_too_deeply_is_rejected_by_execute(runtime: Runtime) -> None:
    """msgspec raises RecursionError (not a DecodeError) past its depth limit: ``execute`` left its
    caller waiting."""
    code, reply = refusal(await call(runtime, "execute", NESTED))

    assert code == "400" and reply["detail"] == "bad request: JSON nested too deeply", reply
    summary = await follow(runtime.nc, runtime.topology, reply["execution_id"], timeout=10)
    assert (
        summary.status == "rejected"
        and (summary.error or {})["message"] == "bad request: JSON nested too deeply"
    )
    await assert_still_serving(runtime)


async def test_json_nested_too_deeply_is_a_400_from_rest(runtime: Runtime, api: Api) -> None:
    """... and was a 500 from REST."""
    reply = await api.json("POST", "/api/executions", 400, data=NESTED, headers=JSON_BODY)

    assert (reply["error"], reply["detail"]) == ("bad_request", "bad request: JSON nested too deeply")


async def test_json_nested_too_deeply_is_rejected_from_the_subject_once(
    runtime: Runtime, eventually: Any
) -> None:
    """... and was redelivered forever from the request subject."""
    await runtime.nc.jetstream().publish(runtime.topology.request_subject, NESTED)

    await eventually(lambda: requests_settled(runtime))

    info = await runtime.nc.jetstream().consumer_info(
        runtime.topology.requests_stream, runtime.topology.controller_requests_consumer
    )
    assert info.num_redelivered == 0
    await assert_still_serving(runtime)


# -- other fields ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"playbook": GOOD, "path": "tests/other"}, id="playbook-and-path"),
        pytest.param({"playbook": GOOD, "version": "2"}, id="playbook-and-version"),
    ],
)
async def test_a_request_naming_both_a_text_and_a_catalog_entry_is_refused(
    runtime: Runtime, body: Any
) -> None:
    code, reply = refusal(await call(runtime, "execute", body))

    assert code == "400" and "not both" in reply["detail"], reply


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        pytest.param({"playbook": GOOD, "deadline_s": -5}, "'deadline_s'", id="negative-deadline"),
        pytest.param({"playbook": GOOD, "deadline_s": 0}, "'deadline_s'", id="zero-deadline"),
        pytest.param({"playbook": GOOD, "return_step": "nowhere"}, "'return_step'", id="unknown-return-step"),
    ],
)
async def test_a_setting_that_would_be_ignored_is_refused(runtime: Runtime, body: Any, fragment: str) -> None:
    """A negative deadline used to switch the playbook's own deadline off; a ``return_step`` naming no
    step made the result silently ``None``."""
    code, reply = refusal(await call(runtime, "execute", body))

    assert code == "400" and fragment in reply["detail"], reply
    summary = await follow(runtime.nc, runtime.topology, reply["execution_id"], timeout=10)
    assert summary.status == "rejected" and fragment in (summary.error or {})["message"]
    ok = await call(runtime, "execute", {"playbook": GOOD, "return_step": "start", "deadline_s": 30})
    summary = await follow(runtime.nc, runtime.topology, json.loads(ok.data)["execution_id"], timeout=20)
    assert (summary.status, summary.result) == ("success", "hello")


async def test_events_refuse_an_after_out_of_range(runtime: Runtime, api: Api) -> None:
    summary = await runtime.run_playbook(GOOD, "good.yaml", timeout=20)
    eid = summary.execution_id
    for after in (-1, 2**64 + 5):
        code, reply = refusal(await call(runtime, "events", {"execution_id": eid, "after": after}))
        assert code == "400" and "'after'" in reply["detail"], reply
    page = await api.json("GET", f"/api/executions/{eid}/events?after={MAX_SEQ}")
    assert page["events"] == []

    reply = await api.json("GET", f"/api/executions/{eid}/events?after={2**64 + 5}", 400)
    assert "'after'" in reply["detail"]
    # a resuming client's bogus Last-Event-ID is ignored, not a 500
    page = await api.json("GET", f"/api/executions/{eid}/events", headers={"Last-Event-ID": "9" * 30})
    assert page["events"][0]["event"]["name"] == "playbook.execution.requested"


# -- a large playbook --------------------------------------------------------------------------------


async def test_a_large_playbook_does_not_hold_up_other_requests(runtime: Runtime) -> None:
    """Compiling ~150 KB of YAML takes seconds: done on the event loop, nothing else moved meanwhile."""
    big = {"playbook": "- {}\n" * 30_000, "file": "big.yaml"}
    checking = asyncio.ensure_future(call(runtime, "execute", big, timeout=60))

    summary = await runtime.run_playbook(GOOD, "good.yaml", {"x": "meanwhile"}, timeout=20)

    assert (summary.status, summary.result) == ("success", "meanwhile")
    assert not checking.done()
    code, reply = refusal(await checking)
    assert code == "400" and reply["error"] == "invalid_playbook"


def big_valid_playbook(steps: int = 3000) -> str:
    """~250 KB that compiles without a diagnostic (about 3 s here): `start` runs, its one arc is never
    taken, and the other steps route among themselves."""
    body = [
        '- step: start\n  tool: {kind: noop}\n  next:\n    arcs:\n      - step: s1\n        when: "{{ false }}"'
    ]
    for i in range(1, steps):
        body.append(
            f"- step: s{i}\n  tool: {{kind: noop}}\n  next:\n    arcs:\n      - step: s{i % (steps - 1) + 1}"
        )
    return playbook("\n".join(body), name="big")


async def test_a_large_valid_playbook_is_compiled_off_the_controllers_event_loop(runtime: Runtime) -> None:
    """Intake compiles it in a thread and hands the plan to the reducer, which compiled it a second time
    on the event loop: every execution of the controller (and its leases) stood still meanwhile."""
    text = big_valid_playbook()
    loop = asyncio.get_running_loop()
    gaps: list[float] = []
    done = asyncio.Event()

    async def probe() -> None:  # how long the event loop goes without running anything else
        last = loop.time()
        while not done.is_set():
            await asyncio.sleep(0.01)
            now = loop.time()
            gaps.append(now - last)
            last = now

    started = time.perf_counter()
    await asyncio.to_thread(compile_playbook, text, "big.yaml")
    one_compile = time.perf_counter() - started  # the yardstick: what a stall would cost, on this machine now
    probing = asyncio.ensure_future(probe())
    request = await asyncio.to_thread(request_for, text, "big.yaml")  # the client compiles it too
    execution_id = await submit(runtime.nc, runtime.topology, request)
    summary = await follow(runtime.nc, runtime.topology, execution_id, timeout=120)
    done.set()
    await probing
    assert summary.status == "success", summary.error
    # compiled on the event loop, it would stand still for a whole compile (twice: intake and reducer)
    assert max(gaps) < one_compile / 2, (
        f"the event loop stood still for {max(gaps):.2f} s; one compile takes {one_compile:.2f} s"
    )


# -- failures of the controller, not of the request --------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [("execute", {"path": "tests/anything"}), ("catalog.list", {}), ("catalog.show", {"path": "tests/x"})],
)
async def test_an_endpoint_that_fails_answers_with_an_error_at_once(
    runtime: Runtime, endpoint: str, body: Any
) -> None:
    """The catalog bucket is gone (an installation half provisioned): ``execute`` used to leave its caller
    waiting for a timeout, the query endpoints answered a bare 500 without the ``{error, detail}`` body."""
    await runtime.nc.jetstream().delete_key_value(runtime.topology.catalog_bucket)

    code, reply = refusal(await call(runtime, endpoint, body))

    assert code == "500" and reply["error"] == "internal", reply
    assert reply["detail"].startswith("BucketNotFoundError")
    await assert_still_serving(runtime)


async def test_a_malformed_catalog_reference_is_a_bad_request_not_an_invalid_playbook(
    runtime: Runtime, api: Api
) -> None:
    for endpoint, body in [
        ("catalog.show", {"path": "p" * 300}),
        ("catalog.show", {"path": "tests/x", "version": "\n"}),
    ]:
        code, reply = refusal(await call(runtime, endpoint, body))
        assert (code, reply["error"]) == ("400", "bad_request"), (endpoint, reply)
    reply = await api.json("GET", "/api/catalog/playbook?path=" + "p" * 300, 400)
    assert reply["error"] == "bad_request" and "invalid catalog path" in reply["detail"]
