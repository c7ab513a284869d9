"""The REST API as a client uses it: a real aiohttp server on the controller of a real runtime."""

from __future__ import annotations

import asyncio
import datetime
import itertools
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from apiserver import OTHER_TOKEN, TOKEN, Api, serve, sse
from helpers import playbook

from noetl_stream.api.routes import ROUTES
from noetl_stream.client.tracking import follow
from noetl_stream.kv.history import read_events
from noetl_stream.runtime.local import Runtime

JSON_BODY = {"Content-Type": "application/json"}  # raw bytes: say what they are

ROOT = Path(__file__).resolve().parents[2]
HELLO = (ROOT / "playbooks" / "hello.yaml").read_text()

SLOW = playbook(
    """
    - step: start
      tool:
        - name: nap
          kind: python
          code: |
            import time
            time.sleep(0.4)
            result = 1
        - name: again
          kind: python
          code: |
            import time
            time.sleep(0.4)
            result = 2
      next:
        arcs: [{step: after}]
    - step: after
      tool: {kind: noop, result: done}
    """,
    name="slow",
)

RETRIES = playbook(
    """
    - step: start
      tool:
        - name: flaky
          kind: python
          args: {attempt: "{{ _attempt }}"}
          code: |
            if attempt < 3:
                raise ConnectionError(f"attempt {attempt}")
            result = attempt
          spec:
            policy:
              rules:
                - when: "{{ outcome.status == 'error' }}"
                  then: {do: retry, attempts: 3, delay: 0}
    """,
    name="flaky",
)


async def start(api: Api, body: dict[str, Any]) -> str:
    reply = await api.json("POST", "/api/executions", 201, json=body)
    return str(reply["execution_id"])


async def finish(api: Api, rt: Runtime, execution_id: str) -> dict[str, Any]:
    await follow(rt.nc, rt.topology, execution_id, timeout=30)
    for _ in range(200):  # the terminal snapshot / live state follows the processed event closely
        status = await api.json("GET", f"/api/executions/{execution_id}")
        if status["status"] not in ("pending", "running"):
            return dict(status)
        await asyncio.sleep(0.02)
    raise AssertionError(f"{execution_id} did not finish: {status}")


def concrete(path: str) -> str:
    return path.replace("{execution_id}", "some-id").replace("{name}", "some-name")


# -- authentication ---------------------------------------------------------------------------------


async def test_health_needs_no_token_and_every_other_route_answers_401_without_one(api: Api) -> None:
    async with api.session.get(api.url + "/health") as resp:
        assert (resp.status, await resp.json()) == (200, {"status": "ok"})
    for route in ROUTES:
        if not route.auth:
            continue
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
            async with api.session.request(
                route.method, api.url + concrete(route.path), headers=headers
            ) as resp:
                body = await resp.json()
                assert resp.status == 401, (route.method, route.path, headers, body)
                assert body["error"] == "unauthorized" and body["detail"]
                assert resp.headers["WWW-Authenticate"].startswith("Bearer")


async def test_any_configured_token_is_accepted(api: Api) -> None:
    for token in (TOKEN, OTHER_TOKEN):
        async with api.session.get(api.url + "/ready", headers={"Authorization": f"Bearer {token}"}) as resp:
            assert resp.status == 200
            body = await resp.json()
            assert body["status"] == "ready" and all(body["streams"].values())


# -- executions -------------------------------------------------------------------------------------


async def test_start_then_status_ctx_list_and_paged_events(api: Api, runtime: Runtime) -> None:
    async with api.request(
        "POST", "/api/executions", json={"playbook": HELLO, "payload": {"who": "rest"}}
    ) as resp:
        assert resp.status == 201
        execution_id = (await resp.json())["execution_id"]
        assert resp.headers["Location"] == f"/api/executions/{execution_id}"
    status = await finish(api, runtime, execution_id)
    assert status["status"] == "success"
    assert status["steps"] == {"start": "done", "stats": "done", "report": "done"}
    assert status["path"] == "examples/hello" and len(status["content_hash"]) == 64

    ctx = await api.json("GET", f"/api/executions/{execution_id}/ctx")
    assert ctx["ctx"] == {"total": 31} and ctx["revision"] >= 1

    stored = [
        (seq, ev.name)
        async for seq, ev in read_events(runtime.nc.jetstream(), runtime.topology, execution_id)
    ]
    pages, after = [], 0
    while True:
        page = await api.json("GET", f"/api/executions/{execution_id}/events?limit=4&after={after}")
        pages.append(page)
        if page.get("next_after") is None:
            break
        after = page["next_after"]
    got = [(r["seq"], r["event"]["name"]) for p in pages for r in p["events"]]
    assert got == stored and len(pages) > 1
    # A page ends at a message's end: the events one message holds (carried.py) share a page.
    assert any(a == b for (a, _), (b, _) in itertools.pairwise(stored)), "nothing was carried"
    for page, following in itertools.pairwise(pages):
        seqs = [r["seq"] for r in page["events"]]
        assert len(seqs) >= 4 and len(set(seqs[3:])) == 1 and following["events"][0]["seq"] > seqs[-1]

    listed = await api.json("GET", "/api/executions?status=success&playbook=examples/hello")
    assert execution_id in [s["execution_id"] for s in listed["items"]]
    assert (await api.json("GET", "/api/executions?status=failed"))["items"] == []
    future = await api.json("GET", "/api/executions?since=2999-01-01T00:00:00Z")
    assert future == {"items": [], "total": 0, "offset": 0, "limit": 50}
    one = await api.json("GET", "/api/executions?limit=1&offset=0")
    assert len(one["items"]) == 1 and one["total"] >= 1


async def test_the_list_orders_and_filters_by_when_each_execution_last_changed(
    api: Api, runtime: Runtime
) -> None:
    """Executions the controller still holds carry the time they last changed, not the time of the
    question: an execution that finished earlier lists after one that finished later, and `until`
    and `since` filter on those times."""

    def iso(t: datetime.datetime) -> str:
        return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")

    first = await start(api, {"playbook": HELLO, "payload": {"who": "first"}})
    assert (await finish(api, runtime, first))["status"] == "success"
    await asyncio.sleep(0.3)
    between = datetime.datetime.now(datetime.UTC)
    await asyncio.sleep(0.3)
    second = await start(api, {"playbook": HELLO, "payload": {"who": "second"}})
    assert (await finish(api, runtime, second))["status"] == "success"
    await asyncio.sleep(0.3)
    after = datetime.datetime.now(datetime.UTC)
    await asyncio.sleep(1.0)  # a list made "now" would put both after this

    listed = (await api.json("GET", "/api/executions?limit=2"))["items"]
    assert [s["execution_id"] for s in listed] == [second, first]
    times = {s["execution_id"]: s["updated_at"] for s in listed}
    assert times[first] < iso(between) < times[second] < iso(after)
    assert (await api.json("GET", f"/api/executions/{first}"))["updated_at"] == times[first]
    until = (await api.json("GET", f"/api/executions?until={iso(between)}"))["items"]
    assert first in [s["execution_id"] for s in until] and second not in [s["execution_id"] for s in until]
    since = (await api.json("GET", f"/api/executions?since={iso(after)}"))["items"]
    assert [s["execution_id"] for s in since] == []


async def test_start_by_catalog_path_and_unknown_path(api: Api, runtime: Runtime) -> None:
    entry = await api.json("POST", "/api/catalog", 201, json={"playbook": HELLO})
    execution_id = await start(api, {"path": "examples/hello"})
    status = await finish(api, runtime, execution_id)
    assert status["status"] == "success" and status["content_hash"] == entry["content_hash"]

    missing = await api.json("POST", "/api/executions", 404, json={"path": "examples/nowhere"})
    assert missing["error"] == "unknown_playbook"
    assert "unknown playbook path 'examples/nowhere'" in missing["detail"]
    assert (await api.json("GET", f"/api/executions/{missing['execution_id']}"))["status"] == "rejected"


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{not json", "bad request: not valid JSON at line 1, column 2 (offset 1)"),
        (b"[]", "bad request: wrong shape at $: expected an object, got an array"),
        (json.dumps({"payload": {}}).encode(), "give 'playbook'"),
        (
            json.dumps({"playbook": HELLO, "surprise": 1}).encode(),
            "wrong shape at $: unknown field 'surprise'",
        ),
        (json.dumps({"playbook": HELLO, "execution_id": "a.b"}).encode(), "execution id"),
    ],
)
async def test_a_malformed_start_is_a_400_that_records_nothing(
    api: Api, runtime: Runtime, body: bytes, fragment: str
) -> None:
    before = (await runtime.nc.jetstream().stream_info(runtime.topology.events_stream)).state.messages
    reply = await api.json("POST", "/api/executions", 400, data=body, headers=JSON_BODY)
    assert reply["error"] == "bad_request" and fragment in reply["detail"]
    after = (await runtime.nc.jetstream().stream_info(runtime.topology.events_stream)).state.messages
    assert after == before


async def test_an_invalid_playbook_is_a_422_with_diagnostics_and_a_complete_rejection(
    api: Api, runtime: Runtime
) -> None:
    bad = playbook("- step: start\n  tool: {kind: noop}\n  retries: 3\n", name="bad")
    reply = await api.json("POST", "/api/executions", 422, json={"playbook": bad, "file": "bad.yaml"})
    assert reply["error"] == "invalid_playbook" and "bad.yaml:" in reply["detail"]
    assert any("retries" in d for d in reply["diagnostics"])
    summary = await follow(runtime.nc, runtime.topology, reply["execution_id"], timeout=10)
    assert summary.status == "rejected"


@pytest.mark.parametrize(
    ("method", "path", "status", "error"),
    [
        ("GET", "/api/executions/a.b", 400, "bad_request"),
        ("GET", "/api/executions/no-such-run", 404, "not_found"),
        ("GET", "/api/executions/no-such-run/events", 404, "not_found"),
        ("GET", "/api/executions/no-such-run/events?follow=1", 404, "not_found"),
        ("GET", "/api/executions/no-such-run/ctx", 404, "not_found"),
        ("POST", "/api/executions/no-such-run/cancel", 404, "not_found"),
        ("POST", "/api/executions/no-such-run/pause", 404, "not_found"),
        ("GET", "/api/executions/x/events?limit=0", 400, "bad_request"),
        ("GET", "/api/executions/x/events?after=-1", 400, "bad_request"),
        ("GET", "/api/executions/x/events?follow=maybe", 400, "bad_request"),
        ("GET", "/api/executions?limit=abc", 400, "bad_request"),
        ("GET", "/api/executions?limit=100000", 400, "bad_request"),
        # what int() takes but an integer query parameter is not: spaces, '_', other scripts' digits
        ("GET", "/api/executions?limit=%205", 400, "bad_request"),
        ("GET", "/api/executions?limit=1_0", 400, "bad_request"),
        ("GET", "/api/executions?offset=%D9%A3", 400, "bad_request"),
        ("GET", "/api/executions/x/events?after=%2B1", 400, "bad_request"),
        ("GET", "/api/executions?since=yesterday", 400, "bad_request"),
        ("GET", "/api/catalog/playbook", 400, "bad_request"),
        ("GET", "/api/catalog/playbook?path=none/such", 404, "not_found"),
        ("DELETE", "/api/catalog/playbook?path=none/such", 404, "not_found"),
        ("GET", "/api/keychain/bad%20name", 400, "bad_request"),
        ("GET", "/api/keychain/nothing", 404, "not_found"),
        ("DELETE", "/api/keychain/nothing", 404, "not_found"),
        ("PUT", "/api/keychain/x", 400, "bad_request"),
        ("GET", "/api/nowhere", 404, "not_found"),
        ("DELETE", "/api/executions", 405, "method_not_allowed"),
    ],
)
async def test_refusals_are_4xx_with_error_and_detail(
    api: Api, method: str, path: str, status: int, error: str
) -> None:
    reply = await api.json(method, path, status)
    assert reply["error"] == error and isinstance(reply["detail"], str) and reply["detail"]


async def test_control_body_must_be_an_object_with_known_fields(api: Api, runtime: Runtime) -> None:
    execution_id = await start(api, {"playbook": HELLO})
    await api.json("POST", f"/api/executions/{execution_id}/cancel", 400, data=b"[1]", headers=JSON_BODY)
    await api.json("POST", f"/api/executions/{execution_id}/cancel", 400, json={"why": "x"})
    await follow(runtime.nc, runtime.topology, execution_id, timeout=30)


async def test_follow_streams_server_sent_events_until_the_execution_ends(api: Api, runtime: Runtime) -> None:
    execution_id = await start(api, {"playbook": SLOW})
    async with api.request("GET", f"/api/executions/{execution_id}/events?follow=1") as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        events = await asyncio.wait_for(sse(resp), 30)
    names = [e["event"] for e in events]
    assert names[0] == "playbook.execution.requested" and names[-1] == "playbook.processed"
    assert "task.done" in names
    ids = [e["id"] for e in events]
    order = [sse_position(i) for i in ids]
    assert order == sorted(order) and len(set(order)) == len(order)
    assert [json.loads(e["data"])["name"] for e in events] == names
    # the events a message carries come before it, as "<seq>-<k>"; a client that saw some resumes in it
    carried = next(i for i, e in enumerate(events) if "-" in e["id"])
    seq = ids[carried].split("-")[0]
    headers = {"Last-Event-ID": ids[carried]}
    async with api.request("GET", f"/api/executions/{execution_id}/events?follow=1", headers=headers) as resp:
        rest = await asyncio.wait_for(sse(resp), 10)
    assert [e["id"] for e in rest] == ids[carried + 1 :] and rest[0]["id"].startswith(seq)

    # resuming after the last id: the execution is over, the stream ends at once and empty
    headers = {"Last-Event-ID": ids[-1]}
    async with api.request("GET", f"/api/executions/{execution_id}/events?follow=1", headers=headers) as resp:
        assert resp.status == 200
        assert await asyncio.wait_for(sse(resp), 5) == []
    # resuming from the middle gives the rest
    async with api.request("GET", f"/api/executions/{execution_id}/events?follow=1&after={ids[2]}") as resp:
        rest = await asyncio.wait_for(sse(resp), 10)
    assert [e["id"] for e in rest] == ids[3:]


def sse_position(event_id: str) -> tuple[int, float]:
    """Where an SSE id puts its event: ``<seq>`` a message, ``<seq>-<k>`` the k-th event it carries."""
    seq, _, k = event_id.partition("-")
    return int(seq), float(k) if k else float("inf")


async def test_cancel_pause_and_resume_through_rest(api: Api, runtime: Runtime) -> None:
    paused = await start(api, {"playbook": SLOW})
    reply = await api.json("POST", f"/api/executions/{paused}/pause", 202)
    assert reply == {"execution_id": paused, "accepted": "execution.pause.requested"}
    for _ in range(250):  # the list filters on it (the status stays running; `paused` says it waits)
        listed = await api.json("GET", "/api/executions?status=paused")
        if listed["items"]:
            break
        await asyncio.sleep(0.02)
    assert [(e["execution_id"], e["status"], e["paused"]) for e in listed["items"]] == [
        (paused, "running", True)
    ]
    await api.json("POST", f"/api/executions/{paused}/resume", 202, data=b"")
    assert (await finish(api, runtime, paused))["status"] == "success"

    cancelled = await start(api, {"playbook": SLOW})
    await api.json("POST", f"/api/executions/{cancelled}/cancel", 202, json={"reason": "operator"})
    status = await finish(api, runtime, cancelled)
    assert status["status"] == "cancelled"
    again = await api.json("POST", f"/api/executions/{cancelled}/cancel", 409)
    assert again["error"] == "conflict" and "has finished (cancelled)" in again["detail"]
    assert "operator" in json.dumps(status["error"])


# -- catalog ------------------------------------------------------------------------------------------


async def test_catalog_routes(api: Api) -> None:
    text = playbook("- step: start\n  tool: {kind: noop, result: 1}\n", name="cat")
    first = await api.json("POST", "/api/catalog", 201, json={"playbook": text})
    assert (first["path"], first["version"], first["latest"]) == ("tests/cat", "1", True)
    again = await api.json(
        "POST", "/api/catalog", 200, data=text.encode(), headers={"Content-Type": "application/yaml"}
    )
    assert again["version"] == "1"
    second_text = text.replace("result: 1", "result: 2")
    second = await api.json(
        "POST", "/api/catalog", 201, data=second_text.encode(), headers={"Content-Type": "application/yaml"}
    )
    assert second["version"] == "2"

    listed = await api.json("GET", "/api/catalog?path=tests/cat")
    assert [(e["version"], e.get("latest", False)) for e in listed["items"]] == [("1", False), ("2", True)]
    shown = await api.json("GET", "/api/catalog/playbook?path=tests/cat&version=1")
    assert shown["playbook"] == text and shown["entry"]["content_hash"] == first["content_hash"]
    assert (await api.json("GET", "/api/catalog/playbook?path=tests/cat"))["entry"]["version"] == "2"

    pinned = text.replace(
        "metadata: {name: cat, path: tests/cat}", "metadata: {name: cat, path: tests/cat, version: '2'}"
    )
    conflict = await api.json("POST", "/api/catalog", 409, json={"playbook": pinned})
    assert conflict["error"] == "conflict" and "tests/cat@2" in conflict["detail"]
    invalid = await api.json("POST", "/api/catalog", 400, json={"playbook": "kind: nothing"})
    assert invalid["error"] == "invalid_playbook" and invalid["diagnostics"]
    await api.json("POST", "/api/catalog", 400, json={"text": text})

    deleted = await api.json("DELETE", "/api/catalog/playbook?path=tests/cat&version=2")
    assert deleted == {"path": "tests/cat", "versions": ["2"]}
    assert (await api.json("GET", "/api/catalog/playbook?path=tests/cat"))["entry"]["version"] == "1"
    await api.json("GET", "/api/catalog/playbook?path=tests/cat&version=2", 404)
    assert (await api.json("DELETE", "/api/catalog/playbook?path=tests/cat"))["versions"] == ["1"]
    assert (await api.json("GET", "/api/catalog"))["items"] == []


# -- metrics ------------------------------------------------------------------------------------------


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of the exposition (0 if absent)."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        m = re.fullmatch(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)", line)
        if m is None or m.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(m.group(3))
    return 0.0


async def test_metrics_after_runs(api: Api, runtime: Runtime) -> None:
    ok = await start(api, {"playbook": HELLO})
    flaky = await start(api, {"playbook": RETRIES})
    bad = playbook("- step: start\n  tool: {kind: python, code: 'raise ValueError(1)'}\n", name="boom")
    failed = await start(api, {"playbook": bad})
    for eid in (ok, flaky, failed):
        await finish(api, runtime, eid)
    async with api.request("GET", "/metrics") as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    assert metric(text, "noetl_executions_started_total", playbook="examples/hello") == 1
    assert metric(text, "noetl_executions_finished_total", playbook="examples/hello", status="success") == 1
    assert metric(text, "noetl_executions_finished_total", playbook="tests/flaky", status="success") == 1
    assert metric(text, "noetl_executions_finished_total", playbook="tests/boom", status="failed") == 1
    assert metric(text, "noetl_executions_running") == 0
    assert metric(text, "noetl_step_duration_seconds_count", kind="python") == 5
    assert metric(text, "noetl_task_duration_seconds_count", kind="python") >= 7  # 3 + 3 attempts + 1
    assert metric(text, "noetl_task_retries_total", kind="python") == 2
    assert metric(text, "noetl_controller_events_total", direction="folded") == 8  # 3 requests, 5 boundaries
    assert metric(text, "noetl_commands_pending", pool="default") == 0
    assert "noetl_commands_in_flight" in text
    stored = metric(text, "noetl_events_stream_last_seq")
    assert stored > 20
    async with api.request("GET", "/metrics") as resp:
        assert "noetl_events_per_second" in await resp.text()


# -- the document ---------------------------------------------------------------------------------------


async def test_unknown_routes_and_methods_are_json(api: Api) -> None:
    async with api.request("GET", "/nothing/here") as resp:
        assert resp.status == 404 and (await resp.json())["error"] == "not_found"
    async with api.session.get(api.url + "/nothing/here") as resp:  # no token: 401 before routing
        assert resp.status == 401


async def test_a_missing_bucket_or_stream_is_a_503_that_says_to_provision(api: Api, runtime: Runtime) -> None:
    """Someone deleted part of the installation under a running controller: the routes that need it
    answer 503 'unavailable' with what to do, not a 500."""
    js = runtime.nc.jetstream()
    await js.delete_key_value(runtime.topology.executions_bucket)
    for path in ("/api/executions", "/api/executions/some-run"):
        reply = await api.json("GET", path, 503)
        assert reply["error"] == "unavailable" and "noetl-stream provision" in reply["detail"], reply
    await js.delete_stream(runtime.topology.events_stream)
    reply = await api.json("GET", "/api/executions/some-run/events", 503)
    assert reply["error"] == "unavailable" and "stream" in reply["detail"], reply


def test_the_app_needs_a_token() -> None:
    from noetl_stream.api.app import check_token_kinds
    from noetl_stream.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="bearer token"):
        check_token_kinds(("", " "))
    assert check_token_kinds((" a ", "b")) == (("a", "b"), ())


async def test_a_client_that_goes_away_mid_stream_leaves_the_server_serving(
    api: Api, runtime: Runtime
) -> None:
    execution_id = await start(api, {"playbook": SLOW})
    async with api.request("GET", f"/api/executions/{execution_id}/events?follow=1") as resp:
        await resp.content.readline()
    async with aiohttp.ClientSession() as other, other.get(api.url + "/health") as resp:
        assert resp.status == 200
    await finish(api, runtime, execution_id)


async def test_a_step_waiting_for_a_worker_shows_as_scheduled(api: Api, runtime: Runtime) -> None:
    """Its command waits in the work queue (no worker serves its pool): the summary shows the step as
    `scheduled`, as `status` and the graph do, not as if it did not exist."""
    text = playbook(
        """
        - step: start
          tool: {kind: noop}
          next:
            arcs: [{step: g}]
        - step: g
          spec: {pool: nobody}
          tool: {kind: noop}
        """
    )
    eid = await start(api, {"playbook": text})
    for _ in range(250):
        status = await api.json("GET", f"/api/executions/{eid}")
        if "g" in status.get("steps", {}):
            break
        await asyncio.sleep(0.02)
    assert status["steps"] == {"start": "done", "g": "scheduled"}, status
    await api.json("POST", f"/api/executions/{eid}/cancel", 202, json={"reason": "test over"})


async def test_stopping_the_server_ends_its_event_streams(api: Api, runtime: Runtime, tmp_path: Path) -> None:
    """A client following a running execution does not hold the controller's shutdown: the server ends
    the stream (the client sees it end and reconnects with Last-Event-ID), instead of waiting out the
    shutdown timeout (5 s) for the client to leave."""
    from viewer_support import GATE_BOOK, open_gate, start

    gate = tmp_path / "gate"
    execution_id = await start(api, GATE_BOOK, {"gate": str(gate)})
    async with api.request("GET", f"/api/executions/{execution_id}/events?follow=1") as resp:
        assert resp.status == 200
        await resp.content.readuntil(b"\n\n")  # the stream is open: its first event arrived
        assert len(api.server.context.streams) == 1
        await asyncio.wait_for(api.server.stop(), 30)  # a liveness bound: the asserts below show how
        assert not api.server.context.streams
        rest = await asyncio.wait_for(resp.content.read(), 10)
        assert b"playbook.processed" not in rest  # ended by the server, not by the execution
    open_gate(gate)
    await follow(runtime.nc, runtime.topology, execution_id, timeout=30)


async def test_a_keychain_entry_no_tool_could_use_is_refused(nats_server: Any, topology: Any) -> None:
    """As `keychain set` does: a kind no tool knows, or an entry without what its kind needs, is a 400
    and nothing is stored (it used to surface as a task's credential_error)."""
    from noetl_stream.kv.keychain import KeychainKey, generate_key
    from noetl_stream.runtime.local import local_runtime

    key = KeychainKey([generate_key()])
    async with (
        local_runtime(nats_server.url, topology=topology, keychain_key=key) as rt,
        serve(rt, key) as api,
    ):
        for body, said in (
            ({"kind": "nosuchkind", "fields": {"a": "b"}}, "unknown keychain entry kind 'nosuchkind'"),
            ({"kind": "bearer", "fields": {"notoken": "b"}}, "(its fields: notoken)"),
        ):
            reply = await api.json("PUT", "/api/keychain/k", 400, json=body)
            assert reply["error"] == "bad_request" and said in reply["detail"], reply
        await api.json("GET", "/api/keychain/k", 404)
        put = await api.json("PUT", "/api/keychain/k", json={"kind": "bearer", "fields": {"token": "t"}})
        assert put == {"name": "k", "kind": "bearer"}
        assert (await api.json("GET", "/api/keychain/k"))["kind"] == "bearer"
