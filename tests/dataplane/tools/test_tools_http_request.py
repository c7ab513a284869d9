"""What an ``http`` task sends, against a real aiohttp server that echoes the request: the body from
the first given of ``json``, ``form``, ``body``, ``payload``, ``data``; ``payload`` and ``data`` by
their value; ``data`` as a GET's query; ``endpoint`` as an alias of ``url``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from httpserver import HttpServer

from noetl_stream.dataplane.tools.base import ToolContext, WorkerServices
from noetl_stream.dataplane.tools.http import run_http
from noetl_stream.dsl import compile_playbook

FORM = "application/x-www-form-urlencoded"
ALL_BODIES: dict[str, Any] = {
    "json": {"from": "json"},
    "form": {"from": "form"},
    "body": "from body",
    "payload": "from payload",
    "data": {"from": "data"},
}


@pytest.fixture
async def server() -> AsyncIterator[HttpServer]:
    srv = await HttpServer().start()
    yield srv
    await srv.stop()


@pytest.fixture
async def services() -> AsyncIterator[WorkerServices]:
    svc = WorkerServices()
    yield svc
    await svc.close()


async def sent(server: HttpServer, services: WorkerServices, **config: Any) -> dict[str, Any]:
    """What the server saw of the request `config` describes (POST to /echo unless it says)."""
    ctx = ToolContext(execution_id="e1", step="s", task="t", spec={}, services=services)
    out = await run_http({"method": "POST", "url": f"{server.url}/echo", **config}, ctx)
    assert out.status == "ok", out.error
    echo: dict[str, Any] = out.result["data"]
    return echo


@pytest.mark.parametrize(
    ("first", "content_type", "body"),
    [
        ("json", "application/json", '{"from":"json"}'),
        ("form", FORM, "from=form"),
        ("body", "text/plain", "from body"),
        ("payload", "text/plain", "from payload"),
        ("data", "application/json", '{"from":"data"}'),
    ],
)
async def test_the_first_body_key_by_precedence_is_the_body(
    server: HttpServer, services: WorkerServices, first: str, content_type: str, body: str
) -> None:
    # every key from `first` on is given: the first wins, the others are not sent
    keys = list(ALL_BODIES)
    given = {k: ALL_BODIES[k] for k in keys[keys.index(first) :]}
    echo = await sent(server, services, **given)
    assert (echo["content_type"], echo["body"]) == (content_type, body)


@pytest.mark.parametrize(
    ("payload", "content_type", "body"),
    [
        ("raw text", "text/plain", "raw text"),
        (b"raw bytes", "application/octet-stream", "raw bytes"),
        ({"a": 1}, "application/json", '{"a":1}'),
        ([1, "two"], "application/json", '[1,"two"]'),
    ],
)
async def test_payload_is_a_body_for_text_and_json_for_a_mapping_or_list(
    server: HttpServer, services: WorkerServices, payload: Any, content_type: str, body: str
) -> None:
    echo = await sent(server, services, payload=payload)
    assert (echo["content_type"], echo["body"]) == (content_type, body)


async def test_data_is_json_unless_the_content_type_says_form(
    server: HttpServer, services: WorkerServices
) -> None:
    as_json = await sent(server, services, data={"a": 1, "b": [2]})
    assert as_json["content_type"] == "application/json"
    assert msgspec.json.decode(as_json["body"]) == {"a": 1, "b": [2]}
    as_form = await sent(server, services, data={"a": 1, "b": "x y"}, headers={"content-type": FORM})
    assert (as_form["content_type"], as_form["body"]) == (FORM, "a=1&b=x+y")
    as_text = await sent(server, services, method="PUT", data="a=1")
    assert (as_text["method"], as_text["body"]) == ("PUT", "a=1")


async def test_data_of_a_get_is_its_query_merged_with_params(
    server: HttpServer, services: WorkerServices
) -> None:
    echo = await sent(
        server,
        services,
        method="GET",
        params={"page": 2, "size": 10},
        data={"page": 9, "q": "rivers", "tag": ["a", "b"], "none": None},
    )
    # `params` keeps its names (page=2), `data` adds the others; no body
    assert echo["query"] == [["page", "2"], ["size", "10"], ["q", "rivers"], ["tag", "a"], ["tag", "b"]]
    assert echo["body"] == ""
    with_json = await sent(server, services, method="GET", data={"q": "x"}, json={"n": 1})
    assert with_json["query"] == [["q", "x"]] and with_json["body"] == '{"n":1}'


async def test_data_of_a_get_must_be_a_mapping(server: HttpServer, services: WorkerServices) -> None:
    ctx = ToolContext(execution_id="e1", step="s", task="t", spec={}, services=services)
    out = await run_http({"url": f"{server.url}/echo", "data": "q=1"}, ctx)
    assert out.error is not None and out.error["kind"] == "config_error"
    assert out.error["message"] == "'data' must be a mapping, got str"
    assert server.seen == []


async def test_endpoint_is_an_alias_of_url(server: HttpServer, services: WorkerServices) -> None:
    ctx = ToolContext(execution_id="e1", step="s", task="t", spec={}, services=services)
    out = await run_http({"endpoint": f"{server.url}/json"}, ctx)
    assert out.status == "ok" and out.result["data"]["ok"] is True
    both = await run_http({"url": f"{server.url}/json", "endpoint": f"{server.url}/text"}, ctx)
    assert both.error is not None and both.error["kind"] == "config_error"
    assert both.error["message"] == "give 'url' or its alias 'endpoint', not both"


def _task(keys: str) -> str:
    return (
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: t, path: tests/t}\nworkflow:\n"
        f"  - step: start\n    tool: {{kind: http, {keys}}}\n"
    )


def test_the_compiler_takes_endpoint_or_url_not_both_nor_neither() -> None:
    assert compile_playbook(_task("endpoint: http://h/x, payload: {a: 1}"), "t.yaml").diagnostics == ()
    both = compile_playbook(_task("url: http://h/x, endpoint: http://h/y"), "t.yaml")
    assert [d.format() for d in both.errors] == [
        "t.yaml:6:41: step 'start' task 'start_task': kind 'http' takes 'url' or 'endpoint', not both "
        "(at workflow[0].tool.endpoint)"
    ]
    neither = compile_playbook(_task("method: GET"), "t.yaml")
    assert [d.code for d in neither.errors] == ["missing"]
    assert "kind 'http' needs 'url' or 'endpoint'" in neither.errors[0].format()
