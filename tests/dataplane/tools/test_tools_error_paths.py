"""Tool error paths against real fixtures: each test failed before the fix it names.

A tool that throws, times out, or is handed credentials in its arguments gives a clear error outcome
and leaves the worker as it was: no exception reaches the event loop, no thread keeps running after
its task ended, no password or token shows in the outcome.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from helpers import free_port, playbook, run
from httpserver import HttpServer

from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.dataplane.tools.base import ToolContext, WorkerServices
from noetl_stream.dataplane.tools.duckdb import run_duckdb
from noetl_stream.dataplane.tools.http import run_http
from noetl_stream.dataplane.tools.postgres import run_postgres
from noetl_stream.dataplane.tools.python import run_python
from noetl_stream.dataplane.tools.urlmask import mask_urls
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import local_runtime

PASSWORD = "S3cret-pw-91c4"
TOKEN = "tok-a8f3e1d0"


def context(spec: dict[str, Any] | None = None, services: WorkerServices | None = None) -> ToolContext:
    return ToolContext(execution_id="e1", step="s", task="t", spec=spec or {}, services=services)


def encoded(outcome: Outcome) -> str:
    return msgspec.json.encode(outcome).decode()


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


# --- python ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("import sys\nsys.exit(3)", "SystemExit"),
        ("raise KeyboardInterrupt('stop')", "KeyboardInterrupt"),
        ("import asyncio\nraise asyncio.CancelledError()", "CancelledError"),
    ],
)
async def test_python_base_exceptions_are_task_errors(code: str, kind: str) -> None:
    # Before: the exception left run_python (SystemExit stopped the worker's event loop, CancelledError
    # made the command look cancelled, so it was redelivered forever).
    out = await run_python({"code": code}, context())
    assert out.status == "error" and out.error is not None
    assert out.error["kind"] == "python_error" and out.helpers["py"]["exception_type"] == kind
    assert out.helpers["py"]["line"] == code.count("\n") + 1


async def test_python_sys_exit_fails_the_step_and_the_worker_runs_on(
    nats_server: EmbeddedNats, topology: Topology
) -> None:
    text = playbook(
        f"""
        - step: start
          tool:
            kind: python
            code: {json.dumps("import sys; sys.exit('bye')")}
        """
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text, timeout=20)
        assert r.status == "failed"
        assert r.step_error("start")["kind"] == "python_error"
        assert "bye" in r.step_error("start")["message"]
        again = await run(rt, playbook("- step: start\n  tool: {kind: python, code: 'result = 7'}"))
    assert again.status == "success" and again.step_result("start") == 7


async def test_python_timeout_stops_the_code() -> None:
    # Before: a timed-out task's code ran on in its pool thread; a few such tasks took every thread of
    # the event loop's default executor and every later python/duckdb task (and DNS lookups) waited
    # forever.
    threads = min(32, (os.cpu_count() or 1) + 4)  # ThreadPoolExecutor's default max_workers
    runaway = [
        run_python({"code": "while True:\n    pass"}, context({"timeout": 0.2})) for _ in range(threads + 1)
    ]
    for out in await asyncio.gather(*runaway):
        assert out.error is not None and out.error["kind"] == "timeout"
    async with asyncio.timeout(20):
        out = await run_python({"code": "result = 'still here'"}, context())
    assert out.result == "still here"


async def test_python_output_keeps_the_last_lines() -> None:
    # Before: capture stopped after 128 KiB, so the tail shown was the middle of the output.
    code = "for i in range(100_000):\n    print('line', i)\nprint('THE END')\nresult = 1"
    out = await run_python({"code": code}, context())
    assert out.status == "ok"
    assert out.meta["stdout"].endswith("line 99999\nTHE END\n")
    assert len(out.meta["stdout"]) <= 64 * 1024


async def test_python_values_that_cannot_be_shown() -> None:
    # Before: a raising __repr__/__str__ escaped the tool as an unrelated RuntimeError.
    bad_repr = "class X:\n    def __repr__(self):\n        raise RuntimeError('no')\nresult = X()"
    out = await run_python({"code": bad_repr}, context())
    assert out.status == "ok" and out.result == "<X object>"
    bad_str = "class Oops(Exception):\n    def __str__(self):\n        raise RuntimeError('no')\nraise Oops()"
    out = await run_python({"code": bad_str}, context())
    assert out.error is not None and out.helpers["py"]["exception_type"] == "Oops"
    assert "line 4" in out.error["message"]
    addr = await run_python(
        {"code": "import ipaddress\nresult = ipaddress.ip_address('10.1.2.3')"}, context()
    )
    assert addr.result == "10.1.2.3"  # before: "IPv4Address('10.1.2.3')"


# --- duckdb ---------------------------------------------------------------------------------------


async def test_duckdb_timeout_interrupts_the_statement(nats_server: EmbeddedNats, topology: Topology) -> None:
    # Before: the statement ran on in its thread, closing the pipeline's database raised
    # ResourceInUseException out of the pipeline, the command failed without a step event and was
    # redelivered again and again.
    text = playbook(
        """
        - step: start
          tool:
            kind: duckdb
            query: "SELECT count(*) FROM range(10000000000) a, range(100000000) b"
            spec: {timeout_s: 0.5}
        """
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text, timeout=20)
    assert r.status == "failed"
    assert r.step_error("start")["kind"] == "timeout"
    assert r.started("start") == 1


async def test_duckdb_db_path_must_be_a_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: `db_path: 5` (a template that rendered a number) created a database file "5" in the
    # worker's working directory and ran there.
    monkeypatch.chdir(tmp_path)
    out = await run_duckdb({"query": "SELECT 1 AS one", "db_path": 5}, context())
    assert out.error is not None and out.error["kind"] == "config_error"
    assert "db_path" in out.error["message"] and list(tmp_path.iterdir()) == []


# --- http -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "params"),
    [
        ("http://bob:{pw}@127.0.0.1:{dead}/x", None),  # refused
        ("http://bob:{pw}@{live}/status/500", None),  # an error response
        ("http://bob:{pw}@127.0.0.1:99999/x", None),  # an invalid url
        ("http://127.0.0.1:{dead}/x?page=2&access_token={tok}", None),
        ("http://{live}/status/403", {"api_key": "{tok}"}),
        ("http://{live}/status/403", {"sig": "ab+cd/{tok}=="}),  # yarl's encoding of + and =
        ("http://{live}/status/403?x-amz-signature=Zm9v%2B{tok}%3D", None),
        ("http://bob:p@{live}/status/500", None),  # a short password, an @ in it
    ],
)
async def test_http_credentials_in_the_url_are_masked(
    server: HttpServer, services: WorkerServices, url: str, params: dict[str, str] | None
) -> None:
    # Before: the userinfo password and query tokens were in error.message and outcome.http.url.
    fill = {"pw": PASSWORD, "tok": TOKEN, "dead": free_port(), "live": f"127.0.0.1:{server.port}"}
    config: dict[str, Any] = {"url": url.format(**fill)}
    if params is not None:
        config["params"] = {k: v.format(**fill) for k, v in params.items()}
    out = await run_http(config, context({"timeout": {"connect": 5, "read": 5}}, services))
    assert out.status == "error" and out.error is not None
    text = encoded(out)
    assert PASSWORD not in text and TOKEN not in text
    assert "***" in out.error["message"] + str(out.helpers["http"]["url"])


@pytest.mark.parametrize(
    ("url", "message", "shown"),
    [
        (
            "http://bob:auth@{live}/status/401",
            "GET http://bob:***@{live}/status/401 -> 401 Unauthorized",
            "http://{live}/status/401",
        ),
        (
            "http://{live}/status/500?token=Error&page=1",
            "GET http://{live}/status/500?token=***&page=1 -> 500 Internal Server Error",
            "http://{live}/status/500?token=***&page=1",
        ),
    ],
)
async def test_http_credentials_are_masked_in_the_url_not_in_the_status_reason(
    server: HttpServer, services: WorkerServices, url: str, message: str, shown: str
) -> None:
    # Before: a URL's credential was replaced wherever its text occurred in the message, so a password
    # `auth` gave "-> 401 Un***orized" and `token=Error` gave "-> 500 Internal Server ***".
    live = f"127.0.0.1:{server.port}"
    out = await run_http({"url": url.format(live=live)}, context({}, services))
    assert out.error is not None and out.error["message"] == message.format(live=live)
    assert out.helpers["http"]["url"] == shown.format(live=live)


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("GET http://h/x?key=auth -> 401 Unauthorized", "GET http://h/x?key=*** -> 401 Unauthorized"),
        (
            "http://u:p@ss@h:99999/x?Access_Token=a%2Bb&n=1#sig=z",
            "http://u:***@h:99999/x?Access_Token=***&n=1#sig=***",
        ),
        (
            '<https://h/p?page=2&api_key=k1>; rel="next", </p?page=3&sig=k2>',
            '<https://h/p?page=2&api_key=***>; rel="next", </p?page=3&sig=***>',
        ),
        (
            "url='http://h/?x-amz-signature=abc' token=plain key=text",
            "url='http://h/?x-amz-signature=***' token=plain key=text",
        ),
        ("http://h/?token=&keys=1", "http://h/?token=&keys=1"),
    ],
)
def test_http_url_masking_follows_the_url_structure(text: str, masked: str) -> None:
    # Passwords and credential-named query/fragment values inside URLs, absolute or relative; the same
    # names outside a query string, empty values and other parameters are left alone.
    assert mask_urls(text) == masked


@pytest.mark.parametrize("chunked", ["0", "1"])
async def test_http_a_body_over_max_body_bytes_fails_without_being_read_whole(
    server: HttpServer, services: WorkerServices, chunked: str
) -> None:
    """Before: the whole body was read into memory, whatever its size (200 MB took 685 MB)."""
    url = f"{server.url}/big?bytes={3 * 1024 * 1024}&chunked={chunked}"
    out = await run_http({"url": url}, context({"max_body_bytes": 1024 * 1024}, services))
    assert out.status == "error" and out.error is not None
    assert out.error["kind"] == "response_too_large" and not out.error.get("retryable")
    assert "longer than 1048576 bytes" in out.error["message"]
    assert out.result is None and out.helpers["http"]["status"] == 200
    ok = await run_http({"url": url}, context({"max_body_bytes": 4 * 1024 * 1024}, services))
    assert ok.status == "ok" and len(ok.result["data"]) == 3 * 1024 * 1024


@pytest.mark.parametrize("status", [200, 500])
async def test_http_a_compressed_body_is_judged_by_what_it_inflates_to(
    server: HttpServer, services: WorkerServices, status: int
) -> None:
    """Its Content-Length is the compressed size (a few KiB for 3 MiB of one letter): within the limit,
    it must not let the inflated body through whole."""
    url = f"{server.url}/big?bytes={3 * 1024 * 1024}&gzip=1&status={status}"
    out = await run_http({"url": url}, context({"max_body_bytes": 1024 * 1024}, services))
    assert int(out.helpers["http"]["headers"]["content-length"]) < 1024 * 1024
    if status == 200:
        assert out.error is not None and out.error["kind"] == "response_too_large", out.error
    else:  # an error status is answered, its body cut at the limit
        assert out.helpers["http"].get("truncated") is True
        assert len(out.result["data"]) == 1024 * 1024


async def test_http_a_head_request_is_not_judged_by_the_length_it_announces(
    server: HttpServer, services: WorkerServices
) -> None:
    """HEAD announces the resource's length and sends no body: checking a size that way must work."""
    url = f"{server.url}/big?bytes={3 * 1024 * 1024}"
    out = await run_http({"url": url, "method": "HEAD"}, context({"max_body_bytes": 1024 * 1024}, services))
    assert out.status == "ok", out.error
    assert out.helpers["http"]["headers"]["content-length"] == str(3 * 1024 * 1024)


async def test_http_max_body_bytes_must_be_a_positive_number(
    server: HttpServer, services: WorkerServices
) -> None:
    out = await run_http({"url": f"{server.url}/text"}, context({"max_body_bytes": "1MB"}, services))
    assert out.error is not None and out.error["kind"] == "config_error"
    assert "spec.max_body_bytes" in out.error["message"]


async def test_http_a_total_timeout_stops_a_server_that_drips(
    server: HttpServer, services: WorkerServices
) -> None:
    """One byte every 0.1 s never trips a 1 s read timeout; ``spec.timeout.total`` bounds the request."""
    spec = {"timeout": {"connect": 5, "read": 1, "total": 0.5}}
    out = await run_http({"url": f"{server.url}/drip?s=5"}, context(spec, services))
    assert out.error is not None and out.error["kind"] == "timeout" and out.error.get("retryable")
    assert "request timed out after 0.5s" in out.error["message"]


# --- postgres -------------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1:notaport", "[::1"])
async def test_postgres_malformed_dsn_is_a_config_error(host: str) -> None:
    # Before: a raw ValueError left the tool (the pipeline reported kind "ValueError").
    out = await run_postgres({"query": "SELECT 1", "dsn": f"postgresql://u:{PASSWORD}@{host}/d"}, context())
    assert out.error is not None and out.error["kind"] == "config_error"
    assert "invalid connection settings" in out.error["message"]
    assert PASSWORD not in encoded(out)


# --- playbook -------------------------------------------------------------------------------------

SLOW_CHILD = playbook(
    """
    - step: start
      tool:
        kind: python
        code: "import time\\nwhile True:\\n    time.sleep(0.05)"
        spec: {timeout: 3}
    """,
    name="slow",
)


async def test_playbook_child_timeout_is_a_clear_error(
    nats_server: EmbeddedNats, topology: Topology, tmp_path: Path
) -> None:
    # Before: the runner's TimeoutError left the tool and the pipeline reported "task 'call' ran
    # longer than Nones", and the child ran on.
    (tmp_path / "children").mkdir()
    (tmp_path / "children" / "slow.yaml").write_text(SLOW_CHILD)
    parent = tmp_path / "parent.yaml"
    parent.write_text(
        playbook(
            """
            - step: start
              tool:
                name: call
                kind: playbook
                path: children/slow.yaml
                return_step: start
                spec: {child_timeout_s: 0.5}
            """,
            name="parent",
        )
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        summary = await rt.run_playbook(parent.read_text(), str(parent), timeout=30)
    assert summary.status == "failed" and summary.error is not None
    assert summary.error["kind"] == "timeout"
    assert "children/slow.yaml" in summary.error["message"] and "within 0.5 s" in summary.error["message"]
