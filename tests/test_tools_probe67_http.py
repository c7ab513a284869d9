"""Probe 67: an http body of a JSON content type: a UTF-8 byte order mark before the JSON is skipped,
and a body that does not decode is the text with ``outcome.http.json_error`` saying so."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from noetl_stream.dataplane.tools.base import ToolContext, WorkerServices
from noetl_stream.dataplane.tools.http import run_http

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
