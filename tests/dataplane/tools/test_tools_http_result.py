"""What an ``http`` task returns, against a real aiohttp server: the envelope ``{status_code, headers,
url, elapsed, data}`` with the body as ``data`` (which templates also read as ``body``), a task error of
its kind for a status that is not 2xx with the envelope still its result, and credentials masked in all
of it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from aiohttp import web
from helpers import credentials, free_port, playbook, run
from httpserver import HttpServer

from noetl_stream.dataplane.tools.base import ToolContext, WorkerServices
from noetl_stream.dataplane.tools.http import run_http
from noetl_stream.dsl import render_value
from noetl_stream.dsl.scope import build_scope
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import local_runtime

TOKEN = "tok-SECRET-envelope-31c9"
API_KEY = "key-SECRET-envelope-8d02"
ENVELOPE = {"status_code", "headers", "url", "elapsed", "data"}


@pytest.fixture
async def server() -> AsyncIterator[HttpServer]:
    srv = await HttpServer().start()
    yield srv
    await srv.stop()


@pytest.fixture
async def services() -> AsyncIterator[WorkerServices]:
    svc = WorkerServices(
        credentials=credentials(
            {
                "tok": {"kind": "bearer", "token": TOKEN},
                "qry": {"kind": "api_key", "param": "api_key", "value": API_KEY},
            }
        )
    )
    yield svc
    await svc.close()


def context(services: WorkerServices) -> ToolContext:
    spec = {"timeout": {"connect": 5, "read": 10}}
    return ToolContext(execution_id="e1", step="s", task="t", spec=spec, services=services)


async def test_the_result_is_the_envelope_with_the_body_as_data(
    server: HttpServer, services: WorkerServices
) -> None:
    server.pages["rivers"] = ["nile", "rhine", "volga"]
    out = await run_http(
        {"url": f"{server.url}/pages/rivers", "params": {"page": 1, "pageSize": 2}}, context(services)
    )
    assert out.status == "ok", out.error
    result = out.result
    assert set(result) == ENVELOPE
    assert result["status_code"] == 200
    # the body as the server sent it: no wrapping of its own around it
    assert result["data"] == {"data": ["nile", "rhine"], "paging": {"page": 1, "hasMore": True}}
    # templates read the body as `body` too: an alias of the view, not a second copy in the result
    view = build_scope(workload={}, ctx={}, execution_id="e1", results={"fetch": result})
    assert render_value("{{ fetch.body }}", view) is result["data"]
    assert render_value("{{ fetch.body.paging.page }}", view) == 1
    assert result["url"] == f"{server.url}/pages/rivers?page=1&pageSize=2"
    assert result["headers"]["content-type"].startswith("application/json")
    assert all(name == name.lower() for name in result["headers"])
    http = out.helpers["http"]
    assert result["elapsed"] == http["elapsed_s"] and 0 <= result["elapsed"] < 10  # seconds
    assert (http["status"], http["url"], http["headers"]) == (200, result["url"], result["headers"])


async def test_a_redirect_is_followed_and_url_is_the_final_one(
    server: HttpServer, services: WorkerServices
) -> None:
    out = await run_http({"url": f"{server.url}/redirect?to=/json"}, context(services))
    assert out.status == "ok", out.error
    assert out.result["status_code"] == 200
    assert out.result["url"] == f"{server.url}/json"
    assert out.result["data"]["ok"] is True


@pytest.mark.parametrize(
    ("ctype", "body", "data"),
    [
        ("text/plain", '{"a": [1, 2]}', {"a": [1, 2]}),
        ("application/octet-stream", " [1, 2]\n", [1, 2]),
        (None, '{"a": null}', {"a": None}),  # aiohttp labels a bare body application/octet-stream
        ("text/plain", "123", "123"),  # a bare number stays text: only an object or array is parsed
        ("text/plain", "true", "true"),
        ("text/plain", "{not json", "{not json"),
        ("text/html", "<p>{}</p>", "<p>{}</p>"),
    ],
)
async def test_a_json_object_or_array_is_parsed_whatever_its_content_type(
    server: HttpServer, services: WorkerServices, ctype: str | None, body: str, data: Any
) -> None:
    params = {"body": body} if ctype is None else {"body": body, "type": ctype}
    out = await run_http({"url": f"{server.url}/raw", "params": params}, context(services))
    assert out.status == "ok", out.error
    assert out.result["data"] == data
    assert "json_error" not in out.helpers["http"]  # it never claimed to be JSON


@pytest.mark.parametrize(
    ("code", "kind", "retryable"),
    [
        (404, "not_found", False),
        (403, "auth", False),
        (422, "client_error", False),
        (429, "rate_limit", True),
    ],
)
async def test_an_error_status_keeps_the_envelope_as_the_result(
    server: HttpServer, services: WorkerServices, code: int, kind: str, retryable: bool
) -> None:
    out = await run_http({"url": f"{server.url}/status/{code}"}, context(services))
    assert out.status == "error" and out.error is not None
    assert (out.error["kind"], out.error["retryable"], out.error["status"]) == (kind, retryable, code)
    assert set(out.result) == ENVELOPE
    assert out.result["status_code"] == code
    assert out.result["data"] == {"error": {"code": code}}


async def test_no_response_no_envelope(services: WorkerServices) -> None:
    # a refused connection: there is nothing to wrap (outcome.http.status is None)
    out = await run_http({"url": f"http://127.0.0.1:{free_port()}/x"}, context(services))
    assert out.error is not None and out.error["kind"] == "connection_error" and out.error["retryable"]
    assert out.result is None


async def test_credentials_are_masked_in_the_envelope(server: HttpServer, services: WorkerServices) -> None:
    echo = await run_http({"url": f"{server.url}/echo", "auth": "tok"}, context(services))
    assert server.seen[-1]["headers"]["Authorization"] == f"Bearer {TOKEN}"  # the server got it ...
    assert echo.result["data"]["headers"]["Authorization"] == "Bearer ***"  # ... its echo is masked
    cookie = await run_http({"url": f"{server.url}/setcookie"}, context(services))
    assert cookie.result["headers"]["set-cookie"] == "***"
    query = await run_http({"url": f"{server.url}/echo", "auth": "qry"}, context(services))
    assert query.result["url"] == f"{server.url}/echo?api_key=***"
    assert query.result["data"]["query"] == [["api_key", "***"]]
    for out in (echo, cookie, query):
        text = msgspec.json.encode(out).decode()
        assert TOKEN not in text and API_KEY not in text and "cookie-secret-value" not in text


# --- end to end: what policies and later tasks read ----------------------------------------------------


async def test_the_canonical_pagination_reads_the_envelope(
    nats_server: EmbeddedNats, topology: Topology, server: HttpServer
) -> None:
    # The paths of the spec's pagination example, `outcome.result.data.paging.hasMore` and
    # `outcome.result.data.data`, against an API whose body is `{data: [...], paging: {...}}`.
    server.pages["lakes"] = ["baikal", "ladoga", "onega", "titicaca", "victoria"]
    text = playbook(
        """
        - step: start
          tool:
            - name: first
              kind: noop
              spec: {policy: {rules: [{else: {then: {do: continue, set_iter: {page: 1, rows: []}}}}]}}
            - name: fetch
              kind: http
              endpoint: "{{ workload.api }}/pages/lakes"
              params: {page: "{{ iter.page }}", pageSize: 2}
              spec:
                policy:
                  rules:
                    - when: "{{ outcome.status == 'error' }}"
                      then: {do: fail}
                    - when: "{{ outcome.result.data.paging.hasMore }}"
                      then:
                        do: jump
                        to: fetch
                        set_iter:
                          rows: "{{ iter.rows + outcome.result.data.data }}"
                          page: "{{ iter.page + 1 }}"
                    - else:
                        then: {do: continue, set_iter: {rows: "{{ iter.rows + outcome.result.data.data }}"}}
            - {name: out, kind: noop, result: {rows: "{{ iter.rows }}", last: "{{ fetch.body.paging.page }}"}}
        """,
        workload={"api": server.url},
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "success", r.summary.error
    assert r.result == {"rows": server.pages["lakes"], "last": 3}
    assert server.calls["pages/lakes"] == 3


async def test_a_policy_reads_the_body_and_kind_of_an_error_status(
    nats_server: EmbeddedNats, topology: Topology, server: HttpServer
) -> None:
    text = playbook(
        """
        - step: start
          tool:
            - name: fetch
              kind: http
              url: "{{ workload.api }}/status/404"
              spec:
                policy:
                  rules:
                    - when: "{{ outcome.error.kind == 'not_found' and not outcome.error.retryable }}"
                      then:
                        do: continue
                        set_iter: {code: "{{ outcome.result.data.error.code }}", status: "{{ outcome.result.status_code }}"}
                    - else: {then: {do: fail}}
            - {name: out, kind: noop, result: {code: "{{ iter.code }}", status: "{{ iter.status }}"}}
        """,
        workload={"api": server.url},
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "success", r.summary.error
    assert r.result == {"code": 404, "status": 404}
    [done] = r.tasks("start", "fetch")
    assert done.payload["error"]["kind"] == "not_found" and done.payload["result"]["status_code"] == 404


async def test_a_charset_python_does_not_know_is_read_as_utf8(
    server: HttpServer, services: WorkerServices
) -> None:
    # Before: LookupError left the tool (a server names any charset it likes)
    params = {"body": "héllo", "type": "text/plain; charset=x-unheard-of"}
    out = await run_http({"url": f"{server.url}/raw", "params": params}, context(services))
    assert out.status == "ok", out.error
    assert out.result["data"] == "héllo"


# --- an http body of a JSON content type: a UTF-8 byte order mark before the JSON is skipped,
# and a body that does not decode is the text with ``outcome.http.json_error`` saying so.


BODIES = {
    "bom": b'\xef\xbb\xbf{"a": [1, 2]}',
    "broken": b"{not json",
    "huge": b"1e400",
    "fine": b'{"a": 1}',
}


@pytest.fixture
async def base_url() -> AsyncIterator[str]:
    async def body(request: web.Request) -> web.Response:
        return web.Response(body=BODIES[request.match_info["name"]], content_type="application/json")

    app = web.Application()
    app.router.add_get("/{name}", body)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    assert site._server is not None
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def _get(url: str) -> tuple[str, object, dict[str, object]]:
    services = WorkerServices()
    try:
        ctx = ToolContext(execution_id="e1", step="s", task="t", spec={}, services=services)
        out = await run_http({"url": url}, ctx)
    finally:
        await services.close()
    return out.status, out.result["data"], out.helpers["http"]


async def test_a_byte_order_mark_before_json_is_skipped(base_url: str) -> None:
    status, result, http = await _get(f"{base_url}/bom")
    assert (status, result) == ("ok", {"a": [1, 2]})
    assert "json_error" not in http


@pytest.mark.parametrize(("name", "text"), [("broken", "{not json"), ("huge", "1e400")])
async def test_a_json_body_that_does_not_decode_is_text_and_says_why(
    base_url: str, name: str, text: str
) -> None:
    status, result, http = await _get(f"{base_url}/{name}")
    assert (status, result) == ("ok", text)
    assert isinstance(http.get("json_error"), str) and http["json_error"]


async def test_a_json_body_has_no_json_error(base_url: str) -> None:
    status, result, http = await _get(f"{base_url}/fine")
    assert (status, result) == ("ok", {"a": 1}) and "json_error" not in http
