"""Read-only tokens (``--api-read-token``, NOETL_API_READ_TOKENS): every GET route, 403 for anything that
changes something; ``GET /api/session`` says what a token may do. A real aiohttp server on the controller
of a real runtime, and the real ``controller`` command for the start-up checks."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from typing import Any

import pytest
from apiserver import OTHER_TOKEN, READ_TOKEN, Api, sse
from helpers import playbook

from noetl_stream.api.app import READ_METHODS, check_token_kinds
from noetl_stream.api.routes import ROUTES
from noetl_stream.api.server import READ_TOKENS_ENV, TOKENS_ENV, tokens_from
from noetl_stream.errors import ConfigurationError

READ_ONLY = "this token may only read"
ONE_STEP = playbook("- step: start\n  tool: {kind: noop, result: 7}", name="readable")
AS_READER = {"Authorization": f"Bearer {READ_TOKEN}"}


async def as_reader(api: Api, method: str, path: str, expect: int, **kwargs: Any) -> Any:
    return await api.json(method, path, expect, headers=AS_READER, **kwargs)


async def ended(api: Api, execution_id: str) -> dict[str, Any]:
    async with api.request("GET", f"/api/executions/{execution_id}/events?follow=1") as resp:
        await sse(resp)  # ends after playbook.processed
    return await api.json("GET", f"/api/executions/{execution_id}")  # type: ignore[no-any-return]


async def test_a_read_only_token_reads_and_is_refused_every_change(api: Api) -> None:
    started = await api.json("POST", "/api/executions", 201, json={"playbook": ONE_STEP})
    execution_id = started["execution_id"]
    assert (await ended(api, execution_id))["status"] == "success"

    # it reads: the list, the execution, its graph, its steps, its events (a page and the live stream)
    listed = await as_reader(api, "GET", "/api/executions", 200)
    assert execution_id in [i["execution_id"] for i in listed["items"]]
    assert (await as_reader(api, "GET", f"/api/executions/{execution_id}", 200))["status"] == "success"
    graph = await as_reader(api, "GET", f"/api/executions/{execution_id}/graph", 200)
    assert [s["name"] for s in graph["steps"]] == ["start"]
    step = await as_reader(api, "GET", f"/api/executions/{execution_id}/steps/start", 200)
    assert step["runs"]
    events = await as_reader(api, "GET", f"/api/executions/{execution_id}/events", 200)
    assert events["events"][-1]["event"]["name"] == "playbook.processed"
    async with api.request(
        "GET", f"/api/executions/{execution_id}/events?follow=1", headers=AS_READER
    ) as resp:
        assert resp.status == 200
        streamed = await sse(resp)
    assert streamed[-1]["event"] == "playbook.processed"
    await as_reader(api, "GET", "/api/catalog", 200)
    async with api.request("GET", "/metrics", headers=AS_READER) as resp:
        assert resp.status == 200

    # every change answers 403 with the API's refusal body, before the body is even looked at
    refused = [
        ("POST", "/api/executions", {"json": {"playbook": ONE_STEP}}),
        ("POST", f"/api/executions/{execution_id}/cancel", {"json": {"reason": "no"}}),
        ("POST", f"/api/executions/{execution_id}/pause", {}),
        ("POST", f"/api/executions/{execution_id}/resume", {}),
        ("POST", f"/api/executions/{execution_id}/retry", {"json": {"from_steps": ["start"]}}),
        ("POST", "/api/catalog", {"data": ONE_STEP, "headers": {"Content-Type": "application/yaml"}}),
        ("DELETE", "/api/catalog/playbook?path=readable", {}),
        ("PUT", "/api/keychain/x", {"json": {"kind": "bearer", "fields": {"token": "t"}}}),
        ("DELETE", "/api/keychain/x", {}),
    ]
    for method, path, kwargs in refused:
        headers = {**AS_READER, **kwargs.pop("headers", {})}
        body = await api.json(method, path, 403, headers=headers, **kwargs)
        assert body["error"] == "forbidden" and body["detail"].startswith(READ_ONLY), (method, path, body)
    listed = await api.json("GET", "/api/executions")
    assert [i["execution_id"] for i in listed["items"]] == [execution_id]  # nothing was started
    assert (await api.json("GET", f"/api/executions/{execution_id}"))["status"] == "success"

    # an operator token still does everything (here: a retry from the step)
    retried = await api.json(
        "POST", f"/api/executions/{execution_id}/retry", 201, json={"from_steps": ["start"]}
    )
    assert (await ended(api, retried["execution_id"]))["status"] == "success"


def test_every_route_that_is_not_a_get_is_refused_to_a_read_only_token() -> None:
    """The table has no other method a read-only token could slip through (the middleware keys on the
    method, so a new POST route is refused without a change)."""
    methods = {r.method for r in ROUTES}
    assert methods <= {"GET", "POST", "PUT", "DELETE"}, methods
    assert READ_METHODS & methods == {"GET"}


async def test_the_session_route_says_what_the_token_may_do(api: Api) -> None:
    assert await api.json("GET", "/api/session") == {"may": ["read", "operate"]}
    other = {"Authorization": f"Bearer {OTHER_TOKEN}"}
    assert await api.json("GET", "/api/session", headers=other) == {"may": ["read", "operate"]}
    assert await as_reader(api, "GET", "/api/session", 200) == {"may": ["read"]}
    refused = await api.json("GET", "/api/session", 401, headers={"Authorization": "Bearer nope"})
    assert refused["error"] == "unauthorized"


def test_token_kinds_at_start() -> None:
    assert check_token_kinds((" a ", "b"), ("r",)) == (("a", "b"), ("r",))
    assert check_token_kinds((), ("r", " r ")) == ((), ("r",))  # read-only tokens alone are enough
    with pytest.raises(ConfigurationError, match=r"at least one bearer token.*--api-read-token"):
        check_token_kinds(("",), (" ",))
    with pytest.raises(ConfigurationError, match="give each token as one kind only"):
        check_token_kinds(("a", "b"), ("b ",))
    env = {TOKENS_ENV: "a, b", READ_TOKENS_ENV: "r1,r2"}
    assert tokens_from(("x",), env) == ("x", "a", " b")
    assert tokens_from((), env, READ_TOKENS_ENV) == ("r1", "r2")


@pytest.mark.parametrize("how", ["options", "environment"])
def test_a_controller_given_a_token_as_both_kinds_refuses_to_start(how: str) -> None:
    """Exit 2 (a configuration error) with one line, before it connects to NATS (none is running)."""
    args = ["controller", "--nats", "nats://127.0.0.1:1", "--prefix", "p" + uuid.uuid4().hex[:8]]
    args += ["--http", "127.0.0.1:0"]
    env: dict[str, str] = {}
    if how == "options":
        args += ["--api-token", "same-token", "--api-read-token", "same-token"]
    else:
        env = {TOKENS_ENV: "op,same-token", READ_TOKENS_ENV: "same-token"}
    base = {k: v for k, v in os.environ.items() if k not in (TOKENS_ENV, READ_TOKENS_ENV, "NOETL_NATS_URL")}
    proc = subprocess.run(
        [sys.executable, "-m", "noetl_stream", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**base, **env},
    )
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 1 token(s) given both as an operator token"), last
