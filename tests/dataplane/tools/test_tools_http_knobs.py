"""The ``http`` tool's knobs and bodies, against real aiohttp servers: timeouts given as text, an
explicit ``json: null``, and an error status whose body is longer than ``spec.max_body_bytes``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from helpers import playbook, run
from httpserver import HttpServer

from noetl_stream.dataplane.tools.base import ToolContext, WorkerServices
from noetl_stream.dataplane.tools.http import run_http
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import local_runtime


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


def context(services: WorkerServices, **spec: Any) -> ToolContext:
    return ToolContext(execution_id="e1", step="s", task="t", spec=spec, services=services)


# --- spec.timeout (and max_body_bytes) as text, as python's and script's spec.timeout -----------------


@pytest.mark.parametrize(
    "timeout",
    ["5", " 5 ", "2.5", {"connect": "5", "read": "10"}, {"connect": 5, "read": "10", "total": "30"}],
)
async def test_timeouts_given_as_text_are_seconds(
    server: HttpServer, services: WorkerServices, timeout: Any
) -> None:
    out = await run_http({"url": f"{server.url}/json"}, context(services, timeout=timeout))
    assert out.status == "ok", out.error
    assert out.result["data"]["ok"] is True


@pytest.mark.parametrize("timeout", ["0.3", {"connect": "5", "read": "0.3"}])
async def test_a_timeout_given_as_text_still_bounds_the_request(
    server: HttpServer, services: WorkerServices, timeout: Any
) -> None:
    out = await run_http({"url": f"{server.url}/slow?s=3"}, context(services, timeout=timeout))
    assert out.error is not None and out.error["kind"] == "timeout", out.error
    assert "read timed out after 0.3s" in out.error["message"]


@pytest.mark.parametrize(
    ("timeout", "message"),
    [
        (
            "soon",
            "spec.timeout must be a non-negative number of seconds (or {connect, read, total}), got 'soon'",
        ),
        ("-1", "spec.timeout must be a non-negative number of seconds (or {connect, read, total}), got '-1'"),
        (
            "inf",
            "spec.timeout must be a non-negative number of seconds (or {connect, read, total}), got 'inf'",
        ),
        (True, "spec.timeout must be a non-negative number of seconds (or {connect, read, total}), got True"),
        ([5], "spec.timeout must be a non-negative number of seconds (or {connect, read, total}), got [5]"),
        ({"read": "soon"}, "spec.timeout.read must be a non-negative number of seconds, got 'soon'"),
        ({"connect": "nan"}, "spec.timeout.connect must be a non-negative number of seconds, got 'nan'"),
        ({"total": -2}, "spec.timeout.total must be a non-negative number of seconds, got -2"),
    ],
)
async def test_a_timeout_that_is_not_a_number_is_a_config_error(
    server: HttpServer, services: WorkerServices, timeout: Any, message: str
) -> None:
    # like python's and script's `spec.timeout: soon`: a config_error naming the knob and the value
    out = await run_http({"url": f"{server.url}/json"}, context(services, timeout=timeout))
    assert out.error is not None and out.error["kind"] == "config_error", out.error
    assert out.error["message"] == message and out.error["retryable"] is False


async def test_max_body_bytes_given_as_text(server: HttpServer, services: WorkerServices) -> None:
    small = await run_http({"url": f"{server.url}/big?bytes=2000"}, context(services, max_body_bytes="1000"))
    assert small.error is not None and small.error["kind"] == "response_too_large", small.error
    fits = await run_http({"url": f"{server.url}/big?bytes=500"}, context(services, max_body_bytes="1000"))
    assert fits.status == "ok" and fits.result["data"] == "x" * 500
    bad = await run_http({"url": f"{server.url}/json"}, context(services, max_body_bytes="lots"))
    assert bad.error is not None and bad.error["kind"] == "config_error"
    assert "spec.max_body_bytes" in bad.error["message"] and "'lots'" in bad.error["message"]


async def test_the_probes_quoted_timeout_runs_end_to_end(
    nats_server: EmbeddedNats, topology: Topology, server: HttpServer
) -> None:
    text = playbook(
        f'- step: start\n  tool: {{kind: http, url: "{server.url}/json", spec: {{timeout: "1"}}}}'
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "success", r.summary.error
    assert r.result["data"]["ok"] is True


# --- json: null ---------------------------------------------------------------------------------------


async def test_json_null_sends_the_json_body_null(server: HttpServer, services: WorkerServices) -> None:
    out = await run_http({"method": "POST", "url": f"{server.url}/echo", "json": None}, context(services))
    assert out.status == "ok", out.error
    assert out.result["data"]["body"] == "null"
    assert out.result["data"]["content_type"] == "application/json"


async def test_a_null_body_form_or_data_sends_no_body(server: HttpServer, services: WorkerServices) -> None:
    for key in ("body", "form", "data"):
        out = await run_http({"method": "POST", "url": f"{server.url}/echo", key: None}, context(services))
        assert out.status == "ok", out.error
        echo = out.result["data"]
        assert echo["body"] == "" and echo["content_type"] != "application/json", key


async def test_json_null_comes_before_another_body(server: HttpServer, services: WorkerServices) -> None:
    out = await run_http(
        {"method": "POST", "url": f"{server.url}/echo", "json": None, "body": "x"}, context(services)
    )
    assert out.status == "ok", out.error
    assert out.result["data"]["body"] == "null"  # `json` first, even null: `body` is ignored


async def test_json_null_from_a_playbook(
    nats_server: EmbeddedNats, topology: Topology, server: HttpServer
) -> None:
    text = playbook(
        f"""
        - step: start
          tool:
            - {{name: literal, kind: http, method: PUT, url: "{server.url}/echo", json: null}}
            - {{name: rendered, kind: http, method: PUT, url: "{server.url}/echo", json: "{{{{ workload.nothing }}}}"}}
            - {{name: none, kind: http, method: PUT, url: "{server.url}/echo"}}
            - {{name: out, kind: noop, result: {{literal: "{{{{ literal.data.body }}}}", rendered: "{{{{ rendered.data.body }}}}"}}}}
        """,
        workload={"nothing": None},
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "success", r.summary.error
    assert r.result == {"literal": "null", "rendered": "null"}
    literal, rendered, absent = server.seen
    assert (literal["content_type"], literal["body"]) == ("application/json", "null")
    assert (rendered["content_type"], rendered["body"]) == ("application/json", "null")
    # a task without `json` (the key absent) still sends no body
    assert absent["body"] == "" and absent["content_type"] != "application/json"


# --- an error status with a body above spec.max_body_bytes --------------------------------------------


@pytest.mark.parametrize("chunked", ["0", "1"])
async def test_an_error_status_with_a_large_body_is_still_that_status(
    server: HttpServer, services: WorkerServices, chunked: str
) -> None:
    url = f"{server.url}/big?status=404&bytes=5000&chunked={chunked}"
    out = await run_http({"url": url}, context(services, max_body_bytes=1000))
    assert out.error is not None and out.error["kind"] == "not_found", out.error
    assert out.error["status"] == 404 and out.error["retryable"] is False
    assert out.error["message"].startswith(f"GET {url} -> 404 Not Found")
    assert "cut to its first 1000 bytes" in out.error["message"]
    http = out.as_scope()["http"]
    assert http["status"] == 404 and http["truncated"] is True
    assert out.result["data"] == "x" * 1000


async def test_a_large_5xx_body_stays_retryable(server: HttpServer, services: WorkerServices) -> None:
    out = await run_http(
        {"url": f"{server.url}/big?status=503&bytes=5000&chunked=1"}, context(services, max_body_bytes=1000)
    )
    assert out.error is not None and out.error["kind"] == "server_error"
    assert out.error["status"] == 503 and out.error["retryable"] is True


async def test_a_cut_body_is_text_not_json_and_splits_no_character(
    server: HttpServer, services: WorkerServices
) -> None:
    cut_json = await run_http(
        {"url": f"{server.url}/big?status=400&bytes=5000&type=application/json"},
        context(services, max_body_bytes=999),
    )
    assert cut_json.error is not None and cut_json.error["status"] == 400
    assert cut_json.result["data"] == "x" * 999
    assert "json_error" not in cut_json.as_scope()["http"]
    # "é" is two bytes: the 999th byte would be half of one; it is dropped, not replaced by U+FFFD
    split = await run_http(
        {"url": f"{server.url}/big?status=500&bytes=5000&char=%C3%A9"}, context(services, max_body_bytes=999)
    )
    assert split.error is not None and split.error["status"] == 500
    assert split.result["data"] == "é" * 499


async def test_a_large_2xx_body_is_still_too_large(server: HttpServer, services: WorkerServices) -> None:
    out = await run_http({"url": f"{server.url}/big?bytes=5000"}, context(services, max_body_bytes=1000))
    assert out.error is not None and out.error["kind"] == "response_too_large"


async def test_a_policy_routes_on_the_404_of_a_large_body(
    nats_server: EmbeddedNats, topology: Topology, server: HttpServer
) -> None:
    # only the outcome of the 404 (not_found) continues: anything else fails the step
    text = playbook(
        f"""
        - step: start
          tool:
            - name: fetch
              kind: http
              url: "{server.url}/big?status=404&bytes=5000"
              spec:
                max_body_bytes: 1000
                policy:
                  rules:
                    - when: "{{{{ outcome.http.status == 404 and outcome.error.kind == 'not_found' }}}}"
                      then: {{do: continue}}
                    - when: true
                      then: {{do: fail}}
            - {{name: out, kind: noop, result: {{cut: "{{{{ _prev.data | length }}}}"}}}}
        """
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "success", r.summary.error
    assert r.result == {"cut": 1000}
    [fetch] = r.tasks("start", "fetch")
    assert fetch.payload["error"]["status"] == 404
