"""The ``http`` tool against a real aiohttp server: bodies, statuses, retries, timeouts, auth, redaction."""

from __future__ import annotations

import datetime
import socket
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from helpers import credentials, playbook, run, ts
from httpserver import HttpServer

from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.dataplane.tools import TOOLS
from noetl_stream.dataplane.tools.base import ToolContext, WorkerServices
from noetl_stream.dataplane.tools.http import retry_after_seconds, run_http
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.keychain import Keychain, KeychainKey, generate_key
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import local_runtime

TOKEN = "tok-SECRET-7f3a9c2e"
PASSWORD = "pw-SECRET-b81d44"
API_KEY = "key-SECRET-5e6f70"
CREDS: dict[str, dict[str, Any]] = {
    "tok": {"kind": "bearer", "token": TOKEN},
    "basic": {"kind": "http_basic", "username": "alice", "password": PASSWORD},
    "hdr": {"kind": "api_key", "header": "X-Token", "value": API_KEY},
    "qry": {"kind": "api_key", "param": "api_key", "value": API_KEY},
    "pg": {"kind": "postgres_credential", "host": "h", "password": PASSWORD},
}
SECRETS = (TOKEN, PASSWORD, API_KEY)


resolve = credentials(CREDS)


@pytest.fixture
async def server() -> AsyncIterator[HttpServer]:
    srv = await HttpServer().start()
    yield srv
    await srv.stop()


@pytest.fixture
async def services() -> AsyncIterator[WorkerServices]:
    svc = WorkerServices(credentials=resolve)
    yield svc
    await svc.close()


def context(services: WorkerServices | None, timeout: Any = None) -> ToolContext:
    spec = {"timeout": timeout if timeout is not None else {"connect": 5, "read": 10}}
    return ToolContext(execution_id="e1", step="s", task="t", spec=spec, services=services)


def encoded(outcome: Outcome) -> str:
    return msgspec.json.encode(outcome).decode()


async def test_registered() -> None:
    assert TOOLS["http"] is run_http


async def test_json_body_and_http_helpers(server: HttpServer, services: WorkerServices) -> None:
    out = await run_http({"url": f"{server.url}/json"}, context(services))
    assert out.status == "ok"
    assert out.result["data"] == {"ok": True, "items": [1, 2, 3], "nested": {"a": "b"}}
    http = out.as_scope()["http"]
    assert http["status"] == 200
    assert http["headers"]["content-type"].startswith("application/json")
    assert all(name == name.lower() for name in http["headers"])
    assert http["url"] == f"{server.url}/json"
    assert http["method"] == "GET"
    assert http["elapsed_s"] >= 0
    assert http["retry_after"] is None


async def test_text_binary_and_empty_bodies(server: HttpServer, services: WorkerServices) -> None:
    text = await run_http({"url": f"{server.url}/text"}, context(services))
    assert text.result["data"] == "hello, world"
    assert text.helpers["http"]["headers"]["x-custom"] == "yes"
    binary = await run_http({"url": f"{server.url}/bin"}, context(services))
    assert binary.result["data"] == "//4AgA=="
    assert binary.helpers["http"]["encoding"] == "base64"
    empty = await run_http({"url": f"{server.url}/empty"}, context(services))
    assert empty.status == "ok" and empty.result["data"] is None and empty.helpers["http"]["status"] == 204


async def test_params_headers_and_bodies(server: HttpServer, services: WorkerServices) -> None:
    out = await run_http(
        {
            "method": "post",
            "url": f"{server.url}/echo",
            "params": {"page": 2, "flag": True, "tag": ["a", "b"], "skip": None},
            "headers": {"X-Trace": "abc", "X-Num": 7},
            "json": {"name": "x", "n": [1, 2]},
        },
        context(services),
    )
    assert out.status == "ok", out.error
    echo = out.result["data"]
    assert echo["method"] == "POST"
    assert echo["query"] == [["page", "2"], ["flag", "true"], ["tag", "a"], ["tag", "b"]]
    assert echo["headers"]["X-Trace"] == "abc" and echo["headers"]["X-Num"] == "7"
    assert echo["content_type"] == "application/json"
    assert msgspec.json.decode(echo["body"]) == {"name": "x", "n": [1, 2]}

    form = await run_http(
        {"method": "POST", "url": f"{server.url}/echo", "form": {"a": "1", "b": 2}}, context(services)
    )
    assert form.result["data"]["content_type"] == "application/x-www-form-urlencoded"
    assert form.result["data"]["body"] == "a=1&b=2"

    raw = await run_http(
        {
            "method": "PUT",
            "url": f"{server.url}/echo",
            "body": "plain text",
            "headers": {"Content-Type": "text/x"},
        },
        context(services),
    )
    assert raw.result["data"]["body"] == "plain text" and raw.result["data"]["content_type"] == "text/x"


async def test_config_errors(server: HttpServer, services: WorkerServices) -> None:
    two = await run_http({"url": f"{server.url}/echo", "endpoint": f"{server.url}/json"}, context(services))
    assert two.status == "error" and two.error is not None
    assert two.error["kind"] == "config_error" and "not both" in two.error["message"]
    no_url = await run_http({}, context(services))
    assert no_url.error is not None and no_url.error["kind"] == "config_error"
    bad_timeout = await run_http({"url": server.url}, context(services, timeout={"read": "soon"}))
    assert bad_timeout.error is not None and "spec.timeout.read" in bad_timeout.error["message"]


@pytest.mark.parametrize(
    ("code", "kind", "retryable"),
    [
        (400, "client_error", False),
        (401, "auth", False),
        (403, "auth", False),
        (404, "not_found", False),
        (409, "client_error", False),
        (429, "rate_limit", True),
        (500, "server_error", True),
        (503, "server_error", True),
        (304, "http_error", False),
    ],
)
async def test_non_2xx_is_a_task_error_of_its_kind(
    server: HttpServer, services: WorkerServices, code: int, kind: str, retryable: bool
) -> None:
    out = await run_http({"url": f"{server.url}/status/{code}"}, context(services))
    assert out.status == "error" and out.error is not None
    assert out.error["kind"] == kind
    assert out.error["retryable"] is retryable
    assert out.error["status"] == code
    assert str(code) in out.error["message"]
    assert out.helpers["http"]["status"] == code
    assert out.result["status_code"] == code
    if code != 304:  # (a 304 has no body)
        assert out.result["data"] == {"error": {"code": code}}  # the error body stays readable by policies


async def test_retry_after_header(server: HttpServer, services: WorkerServices) -> None:
    out = await run_http({"url": f"{server.url}/status/503?retry_after=2"}, context(services))
    http = out.as_scope()["http"]
    assert http["headers"]["retry-after"] == "2"
    assert http["retry_after"] == 2.0
    now = datetime.datetime(2030, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
    assert retry_after_seconds("Tue, 01 Jan 2030 12:00:30 GMT", now) == 30.0
    assert retry_after_seconds("garbage") is None
    assert retry_after_seconds("-5") == 0.0


async def test_read_timeout(server: HttpServer, services: WorkerServices) -> None:
    out = await run_http(
        {"url": f"{server.url}/slow?s=5"}, context(services, timeout={"connect": 5, "read": 0.2})
    )
    assert out.status == "error" and out.error is not None
    assert out.error["kind"] == "timeout" and out.error["retryable"] is True
    assert "read timed out after 0.2s" in out.error["message"]
    assert out.helpers["http"]["status"] is None


async def test_connection_refused(services: WorkerServices) -> None:
    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        out = await run_http({"url": f"http://127.0.0.1:{port}/x"}, context(services))
    assert out.status == "error" and out.error is not None
    assert out.error["kind"] == "connection_error" and out.error["retryable"] is True
    assert out.helpers["http"]["status"] is None


async def test_one_pooled_session_per_worker(server: HttpServer, services: WorkerServices) -> None:
    ports = []
    for _ in range(3):
        out = await run_http({"url": f"{server.url}/echo"}, context(services))
        ports.append(out.result["data"]["client_port"])
    assert len(set(ports)) == 1  # keep-alive: one connection reused by the shared session


async def test_cookies_never_travel_between_requests(server: HttpServer, services: WorkerServices) -> None:
    first = await run_http({"url": f"{server.url}/setcookie"}, context(services))
    assert first.helpers["http"]["headers"]["set-cookie"] == "***"
    assert "cookie-secret-value" not in encoded(first)
    second = await run_http({"url": f"{server.url}/echo"}, context(services))
    assert "Cookie" not in second.result["data"]["headers"]


async def test_works_without_worker_services(server: HttpServer) -> None:
    out = await run_http({"url": f"{server.url}/json"}, context(None))
    assert out.status == "ok" and out.result["data"]["ok"] is True


@pytest.mark.parametrize(
    ("auth", "header", "expected"),
    [
        ("tok", "Authorization", f"Bearer {TOKEN}"),
        ("basic", "Authorization", "Basic YWxpY2U6cHctU0VDUkVULWI4MWQ0NA=="),
        ("hdr", "X-Token", API_KEY),
    ],
)
async def test_auth_headers_are_sent_and_redacted(
    server: HttpServer, services: WorkerServices, auth: str, header: str, expected: str
) -> None:
    out = await run_http({"url": f"{server.url}/echo", "auth": auth}, context(services))
    assert out.status == "ok", out.error
    assert server.seen[-1]["headers"][header] == expected  # the server really got the credential
    text = encoded(out)
    for secret in SECRETS:
        assert secret not in text  # ... but the echo of it in the result is masked
    if auth != "basic":
        assert "***" in text


async def test_api_key_as_query_parameter_is_redacted_from_url(
    server: HttpServer, services: WorkerServices
) -> None:
    out = await run_http({"url": f"{server.url}/status/500", "auth": "qry"}, context(services))
    assert server.seen == [] and out.status == "error"
    text = encoded(out)
    assert API_KEY not in text
    assert "api_key=***" in out.helpers["http"]["url"]


async def test_credential_errors(server: HttpServer, services: WorkerServices) -> None:
    missing = await run_http({"url": server.url, "auth": "nope"}, context(services))
    assert missing.error is not None and missing.error["kind"] == "credential_error"
    assert "no keychain entry 'nope'" in missing.error["message"]
    wrong_kind = await run_http({"url": server.url, "auth": "pg"}, context(services))
    assert wrong_kind.error is not None and wrong_kind.error["kind"] == "config_error"
    assert "postgres_credential" in wrong_kind.error["message"] and PASSWORD not in encoded(wrong_kind)
    no_resolver = await run_http({"url": server.url, "auth": "tok"}, context(None))
    assert no_resolver.error is not None and no_resolver.error["kind"] == "credential_error"


# --- end to end: playbooks through local_runtime ------------------------------------------------------


async def test_playbook_retries_503_then_succeeds(
    nats_server: EmbeddedNats, topology: Topology, server: HttpServer
) -> None:
    text = playbook(
        """
        - step: start
          tool:
            - name: fetch
              kind: http
              url: "{{ api }}/flaky/e2e?fail=2"
              spec:
                timeout: {connect: 5, read: 5}
                policy:
                  rules:
                    - when: "{{ outcome.status == 'error' and outcome.http.status in [429, 500, 502, 503, 504] }}"
                      then: {do: retry, attempts: 5, backoff: exponential, delay: 0.05}
                    - else:
                        then:
                          do: continue
                          set_iter: {status: "{{ outcome.http.status }}"}
            - name: after
              kind: noop
              result: {attempt: "{{ fetch.data.attempt }}", status: "{{ iter.status }}"}
        """,
        workload={"api": server.url},
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "success", r.summary
    assert r.step_result("start") == {"attempt": 3, "status": 200}
    assert server.calls["e2e"] == 3
    done = r.tasks("start", "fetch")
    assert [e.payload["status"] for e in done] == ["error", "error", "ok"]
    assert [e.payload["do"] for e in done] == ["retry", "retry", "continue"]
    assert done[0].payload["error"]["kind"] == "server_error"


async def test_playbook_404_is_not_retried_and_fails_the_step(
    nats_server: EmbeddedNats, topology: Topology, server: HttpServer
) -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: http
            url: "{{ api }}/flaky/gone?fail=9&code=404"
            spec:
              policy:
                rules:
                  - when: "{{ outcome.status == 'error' and outcome.error.retryable }}"
                    then: {do: retry, attempts: 5, delay: 0}
                  - when: "{{ outcome.status == 'error' and outcome.http.status in [401, 403, 404] }}"
                    then: {do: fail}
        """,
        workload={"api": server.url},
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "failed"
    err = r.step_error("start")
    assert err["kind"] == "not_found" and err["status"] == 404 and err["retryable"] is False
    assert server.calls["gone"] == 1


async def test_playbook_bearer_from_keychain_never_shows_the_token(
    nats_server: EmbeddedNats, topology: Topology, server: HttpServer
) -> None:
    key = KeychainKey([generate_key()])
    text = playbook(
        """
        - step: start
          tool:
            - name: call
              kind: http
              method: POST
              url: "{{ api }}/echo"
              auth: api_token
              json: {hello: world}
            - name: fail_on_purpose
              kind: http
              url: "{{ api }}/status/401"
              auth: api_token
              spec:
                policy:
                  rules:
                    - when: "{{ outcome.status == 'error' }}"
                      then: {do: continue}
            - name: out
              kind: noop
              result: {sent: "{{ call.data.headers.Authorization }}", status: "{{ _prev.data.error.code }}"}
        """,
        workload={"api": server.url},
    )
    async with local_runtime(nats_server.url, topology=topology, keychain_key=key) as rt:
        await Keychain(rt.nc.jetstream(), topology, key).put("api_token", "bearer", {"token": TOKEN})
        r = await run(rt, text)
    assert r.status == "success", r.summary
    assert server.seen[0]["headers"]["Authorization"] == f"Bearer {TOKEN}"
    assert r.step_result("start") == {"sent": "Bearer ***", "status": 401}
    everything = msgspec.json.encode(r.events).decode()
    assert TOKEN not in everything


async def test_playbook_retry_after_header_drives_the_delay(
    nats_server: EmbeddedNats, topology: Topology, server: HttpServer
) -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: http
            url: "{{ api }}/flaky/ra?fail=1&retry_after=1.5"
            spec:
              policy:
                rules:
                  - when: "{{ outcome.status == 'error' and outcome.http.status == 503 }}"
                    then: {do: retry, attempts: 2, delay: "{{ outcome.http.retry_after }}"}
        """,
        workload={"api": server.url},
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "success", r.summary
    first_done = r.tasks("start")[0]
    second_start = r.tasks("start", name="task.started")[1]
    assert (ts(second_start) - ts(first_done)).total_seconds() >= 1.5  # not the 1 s default
