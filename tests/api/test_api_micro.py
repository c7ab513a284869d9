"""The ``noetl`` micro service: query and catalog endpoints over NATS, with replies valid per schemas/api."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from helpers import playbook

from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import follow
from noetl_stream.control.endpoints import ENDPOINTS
from noetl_stream.protocol.schemas import API_SCHEMAS, api_schema, render
from noetl_stream.runtime.local import Runtime

ROOT = Path(__file__).resolve().parents[2]
HELLO = (ROOT / "playbooks" / "hello.yaml").read_text()
REPLY_TYPES = {name: reply for name, (_, _, reply) in ENDPOINTS.items()}


async def call(rt: Runtime, endpoint: str, body: Any) -> tuple[dict[str, Any], str | None, str | None]:
    """``(reply body, error code, error description)`` of one request."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    msg = await rt.nc.request(rt.topology.api_subject(endpoint), raw, timeout=10)
    headers = msg.headers or {}
    return json.loads(msg.data), headers.get("Nats-Service-Error-Code"), headers.get("Nats-Service-Error")


async def ok(rt: Runtime, endpoint: str, body: Any, reply_type: str) -> dict[str, Any]:
    reply, code, description = await call(rt, endpoint, body)
    assert code is None, (endpoint, code, description)
    jsonschema.validate(reply, api_schema(reply_type))
    return reply


@pytest.mark.parametrize("name", sorted(API_SCHEMAS))
def test_published_api_schemas_are_in_sync(name: str) -> None:
    published = (ROOT / "schemas" / "api" / f"{name}.schema.json").read_text(encoding="utf-8")
    assert published == render(api_schema(name)), (
        f"schemas/api/{name}.schema.json is stale: run `python -m noetl_stream.protocol.schemas schemas`"
    )


async def test_the_service_lists_every_endpoint_with_its_schemas(runtime: Runtime) -> None:
    msg = await runtime.nc.request(f"$SRV.INFO.{runtime.topology.service_name}", b"", timeout=5)
    info = json.loads(msg.data)
    endpoints = {e["name"]: e for e in info["endpoints"]}
    assert set(endpoints) == {"execute", "cancel", "pause", "resume", *ENDPOINTS}
    assert endpoints["catalog-register"]["subject"] == runtime.topology.api_subject("catalog.register")
    for name, endpoint in endpoints.items():
        for key in ("request_schema", "reply_schema"):
            assert (ROOT / endpoint["metadata"][key]).is_file(), (name, endpoint["metadata"])


async def test_status_events_ctx_and_list_of_a_finished_execution(runtime: Runtime) -> None:
    execution_id = await submit(runtime.nc, runtime.topology, request_for(HELLO, "hello.yaml"))
    await follow(runtime.nc, runtime.topology, execution_id, timeout=30)

    status = await ok(runtime, "status", {"execution_id": execution_id}, "ExecutionSummary")
    assert status["status"] == "success" and status["source"] == "live"
    assert status["steps"] == {"start": "done", "stats": "done", "report": "done"}
    ctx = await ok(runtime, "ctx", {"execution_id": execution_id}, "CtxReply")
    assert ctx["ctx"] == {"total": 31}

    first = await ok(runtime, "events", {"execution_id": execution_id, "limit": 5}, "EventsPage")
    # a page ends at a message's end (the events a message carries share its page): 5 or a few more
    seqs = [r["seq"] for r in first["events"]]
    assert len(seqs) >= 5 and len(set(seqs[4:])) == 1
    assert first["events"][0]["event"]["name"] == "playbook.execution.requested"
    rest = await ok(
        runtime,
        "events",
        {"execution_id": execution_id, "after": first["next_after"], "limit": 1000},
        "EventsPage",
    )
    assert "next_after" not in rest and rest["events"][-1]["event"]["name"] == "playbook.processed"
    assert rest["events"][0]["seq"] > first["events"][-1]["seq"]

    listed = await ok(runtime, "executions", {"playbook": "examples/hello"}, "ExecutionList")
    assert [s["execution_id"] for s in listed["items"]] == [execution_id]
    assert (await ok(runtime, "executions", {"status": "failed"}, "ExecutionList"))["total"] == 0


async def test_status_falls_back_to_the_snapshot_and_the_stream(runtime: Runtime) -> None:
    execution_id = await submit(runtime.nc, runtime.topology, request_for(HELLO, "hello.yaml"))
    await follow(runtime.nc, runtime.topology, execution_id, timeout=30)
    await asyncio.sleep(0.1)  # the terminal snapshot
    runtime.controller.states.clear()  # as if another controller answered
    status = await ok(runtime, "status", {"execution_id": execution_id}, "ExecutionSummary")
    assert (status["status"], status["source"]) == ("success", "snapshot")

    # rejected at intake before any state exists: the stream says so
    reply, code, _ = await call(runtime, "execute", {"execution_id": "never-valid", "payload": []})
    assert code == "400" and reply["execution_id"] == "never-valid"
    await follow(runtime.nc, runtime.topology, "never-valid", timeout=10)
    status = await ok(runtime, "status", {"execution_id": "never-valid"}, "ExecutionSummary")
    assert (status["status"], status["source"]) == ("rejected", "stream")


@pytest.mark.parametrize(
    ("endpoint", "body", "code", "fragment"),
    [
        ("status", {"execution_id": "nope"}, "404", "no execution nope"),
        ("status", {"execution_id": "a.b"}, "400", "execution id"),
        ("status", {}, "400", "bad request: wrong shape at $: missing field 'execution_id'"),
        ("status", b"{bad", "400", "bad request: not valid JSON at line 1, column 2 (offset 1)"),
        ("events", {"execution_id": "nope"}, "404", "no execution nope"),
        ("events", {"execution_id": "x", "limit": 0}, "400", "'limit'"),
        ("ctx", {"execution_id": "nope"}, "404", "no execution nope"),
        ("executions", {"limit": -1}, "400", "'limit'"),
        ("executions", {"since": "soon"}, "400", "ISO-8601"),
        ("executions", {"surprise": 1}, "400", "bad request: wrong shape at $: unknown field 'surprise'"),
        ("catalog.register", {"playbook": "kind: x"}, "400", "invalid playbook"),
        ("catalog.show", {"path": "none/such"}, "404", "unknown playbook path 'none/such'"),
        ("catalog.delete", {"path": "none/such"}, "404", "unknown playbook path"),
        ("catalog.show", {}, "400", "bad request: wrong shape at $: missing field 'path'"),
    ],
)
async def test_refusals(runtime: Runtime, endpoint: str, body: Any, code: str, fragment: str) -> None:
    reply, got, description = await call(runtime, endpoint, body)
    assert got == code, (reply, description)
    jsonschema.validate(reply, api_schema("ErrorReply"))
    assert fragment in reply["detail"] and description == reply["detail"]


async def test_catalog_endpoints_and_execute_by_path(runtime: Runtime) -> None:
    text = playbook("- step: start\n  tool: {kind: noop, result: 42}\n", name="m")
    entry = await ok(runtime, "catalog.register", {"playbook": text}, "CatalogEntryInfo")
    assert (entry["path"], entry["version"]) == ("tests/m", "1")
    listed = await ok(runtime, "catalog.list", {}, "CatalogList")
    assert [e["path"] for e in listed["items"]] == ["tests/m"]
    shown = await ok(runtime, "catalog.show", {"path": "tests/m", "version": "1"}, "CatalogPlaybook")
    assert shown["playbook"] == text

    reply = await ok(runtime, "execute", {"path": "tests/m"}, "ExecuteReply")
    summary = await follow(runtime.nc, runtime.topology, reply["execution_id"], timeout=20)
    assert summary.result == 42
    status = await ok(runtime, "status", {"execution_id": reply["execution_id"]}, "ExecutionSummary")
    assert status["content_hash"] == entry["content_hash"]

    deleted = await ok(runtime, "catalog.delete", {"path": "tests/m"}, "CatalogDeleted")
    assert deleted == {"path": "tests/m", "versions": ["1"]}
    reply, code, description = await call(runtime, "execute", {"path": "tests/m"})
    assert code == "400" and "unknown playbook path 'tests/m'" in str(description)
