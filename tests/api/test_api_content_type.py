"""The REST API reads a request body only when it is sent as what the route takes, against a real runtime.

A security probe found ``POST /api/executions`` (and the other routes taking JSON) accepting a JSON body
sent as ``text/plain`` or ``application/x-www-form-urlencoded``: a web page may send those to any site
without the browser asking it first (no CORS preflight), so a page could start executions on an API it
reaches. Now such a body is a 415 and nothing is recorded; ``application/json`` (a UTF-8 ``charset``
allowed) and, for the catalog, the YAML types are read as before.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from apiserver import Api
from helpers import playbook

from noetl_stream.api.openapi import document
from noetl_stream.runtime.local import Runtime

GOOD = playbook("- step: start\n  tool: {kind: noop}\n")
START = json.dumps({"playbook": GOOD}).encode()
CATALOGUED = playbook("- step: start\n  tool: {kind: noop}\n", name="hostile-ct")  # path tests/hostile-ct


async def recorded(rt: Runtime) -> int:
    return (await rt.nc.jetstream().stream_info(rt.topology.events_stream)).state.messages


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "text/plain; charset=utf-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/octet-stream",
        "application/json; charset=latin-1",
        None,
    ],
)
async def test_a_start_not_sent_as_json_is_a_415_that_records_nothing(
    api: Api, runtime: Runtime, content_type: str | None
) -> None:
    before = await recorded(runtime)
    kwargs: dict[str, Any] = (
        {"headers": {"Content-Type": content_type}}
        if content_type is not None
        else {"skip_auto_headers": ["Content-Type"]}
    )

    reply = await api.json("POST", "/api/executions", 415, data=START, **kwargs)

    assert reply["error"] == "unsupported_media_type"
    assert "'Content-Type: application/json'" in reply["detail"]
    assert await recorded(runtime) == before


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/api/catalog", CATALOGUED.encode()),
        ("POST", "/api/catalog", json.dumps({"playbook": CATALOGUED}).encode()),
        ("PUT", "/api/keychain/hostile", json.dumps({"kind": "bearer", "fields": {"token": "t"}}).encode()),
        ("POST", "/api/executions/no-such-run/cancel", json.dumps({"reason": "a web page"}).encode()),
    ],
    ids=["catalog-yaml", "catalog-json", "keychain", "cancel"],
)
async def test_other_bodies_sent_as_text_plain_are_refused(
    api: Api, method: str, path: str, body: bytes
) -> None:
    reply = await api.json(method, path, 415, data=body, headers={"Content-Type": "text/plain"})

    assert reply["error"] == "unsupported_media_type" and "text/plain" in reply["detail"]


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=UTF-8", "Application/JSON"]
)
async def test_a_start_sent_as_json_is_accepted(api: Api, content_type: str) -> None:
    reply = await api.json("POST", "/api/executions", 201, data=START, headers={"Content-Type": content_type})

    assert reply["execution_id"]


@pytest.mark.parametrize("content_type", ["application/yaml", "application/x-yaml", "text/yaml"])
async def test_the_catalog_still_takes_yaml(api: Api, content_type: str) -> None:
    reply = await api.json(
        "POST", "/api/catalog", 201, data=CATALOGUED.encode(), headers={"Content-Type": content_type}
    )

    assert reply["path"] == "tests/hostile-ct"


async def test_a_control_without_a_body_needs_no_content_type(api: Api) -> None:
    """Nothing is read from an empty body (aiohttp sends it as ``application/octet-stream``, curl with
    none): the route answers as it would have."""
    reply = await api.json("POST", "/api/executions/no-such-run/cancel", 404)

    assert reply["error"] == "not_found"


def test_the_document_lists_the_415_of_every_route_taking_a_body() -> None:
    with_body = [
        (method, path, op)
        for path, ops in document()["paths"].items()
        for method, op in ops.items()
        if "requestBody" in op
    ]
    assert len(with_body) >= 5
    for method, path, op in with_body:
        assert "415" in op["responses"], (method, path)
