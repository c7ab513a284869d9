"""A real aiohttp server on 127.0.0.1 and a free port, with the endpoints the http tests need."""

from __future__ import annotations

import asyncio
import collections
import gzip
import socket
from typing import Any

from aiohttp import web


class HttpServer:
    """Endpoints:

    ``/json``, ``/text``, ``/bin`` (bytes that are not UTF-8), ``/empty`` (204)
    ``/status/{code}?retry_after=S``   that status, a JSON body, optionally a ``Retry-After`` header
    ``/echo``                          method, query, headers, body and the client's port as JSON
    ``/slow?s=SECONDS``                sleeps before answering
    ``/flaky/{key}?fail=N&code=C&retry_after=S``  answers C (default 503) N times per key, then 200
    ``/setcookie``                     sets a cookie
    ``/pages/{name}?page=P&pageSize=Z`` a paginated API: ``{data: [...], paging: {page, hasMore}}``
    ``/redirect?to=PATH``              302 to PATH
    ``/raw?type=T&body=B``             B as the body, T (default none) as its content type
    ``/big?bytes=N&chunked=1&status=S&type=T&char=C``  that status (200) and N bytes of C (``x``; a
                                       multi-byte C counts its bytes), with a Content-Length or (chunked)
                                       without one; ``gzip=1``: compressed (its Content-Length too)
    ``/drip?s=SECONDS``                a JSON body sent one byte every 0.1 s for that long
    """

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.seen: list[dict[str, Any]] = []
        self.pages: dict[str, list[Any]] = {}
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> HttpServer:
        app = web.Application()
        app.router.add_get("/json", self._json)
        app.router.add_get("/text", self._text)
        app.router.add_get("/bin", self._bin)
        app.router.add_get("/empty", self._empty)
        app.router.add_route("*", "/status/{code}", self._status)
        app.router.add_route("*", "/echo", self._echo)
        app.router.add_get("/slow", self._slow)
        app.router.add_route("*", "/flaky/{key}", self._flaky)
        app.router.add_get("/setcookie", self._setcookie)
        app.router.add_get("/pages/{name}", self._pages)
        app.router.add_get("/big", self._big)
        app.router.add_get("/drip", self._drip)
        app.router.add_route("*", "/redirect", self._redirect)
        app.router.add_get("/raw", self._raw)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _json(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "items": [1, 2, 3], "nested": {"a": "b"}})

    async def _text(self, request: web.Request) -> web.Response:
        return web.Response(text="hello, world", headers={"X-Custom": "yes"})

    async def _bin(self, request: web.Request) -> web.Response:
        return web.Response(body=bytes([0xFF, 0xFE, 0x00, 0x80]), content_type="application/octet-stream")

    async def _empty(self, request: web.Request) -> web.Response:
        return web.Response(status=204)

    async def _status(self, request: web.Request) -> web.Response:
        code = int(request.match_info["code"])
        headers = {}
        if "retry_after" in request.query:
            headers["Retry-After"] = request.query["retry_after"]
        return web.json_response({"error": {"code": code}}, status=code, headers=headers)

    async def _echo(self, request: web.Request) -> web.Response:
        body = await request.read()
        peer = request.transport.get_extra_info("peername") if request.transport else None
        info = {
            "method": request.method,
            "query": [[k, v] for k, v in request.query.items()],
            "headers": {k: v for k, v in request.headers.items()},
            "body": body.decode(errors="replace"),
            "content_type": request.content_type,
            "client_port": peer[1] if peer else None,
        }
        self.seen.append(info)
        return web.json_response(info)

    async def _big(self, request: web.Request) -> web.StreamResponse:
        char = request.query.get("char", "x").encode()
        body = char * (int(request.query.get("bytes", "1048576")) // len(char))
        status = int(request.query.get("status", "200"))
        ctype = request.query.get("type", "text/plain")
        if request.query.get("gzip") == "1":  # (Content-Length is the compressed size)
            headers = {"Content-Encoding": "gzip"}
            return web.Response(status=status, body=gzip.compress(body), content_type=ctype, headers=headers)
        if request.query.get("chunked") != "1":
            return web.Response(status=status, body=body, content_type=ctype, charset="utf-8")
        resp = web.StreamResponse(status=status)
        resp.content_type = ctype
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for start in range(0, len(body), 65536):
            await resp.write(body[start : start + 65536])
        await resp.write_eof()
        return resp

    async def _drip(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.content_type = "application/json"
        await resp.prepare(request)
        await resp.write(b'"')
        for _ in range(int(float(request.query.get("s", "5")) * 10)):
            await asyncio.sleep(0.1)
            await resp.write(b"x")
        await resp.write(b'"')
        await resp.write_eof()
        return resp

    async def _slow(self, request: web.Request) -> web.Response:
        await asyncio.sleep(float(request.query.get("s", "5")))
        return web.json_response({"slow": True})

    async def _flaky(self, request: web.Request) -> web.Response:
        key = request.match_info["key"]
        self.calls[key] += 1
        if self.calls[key] <= int(request.query.get("fail", "1")):
            return web.json_response(
                {"attempt": self.calls[key]},
                status=int(request.query.get("code", "503")),
                headers={"Retry-After": request.query.get("retry_after", "0")},
            )
        return web.json_response({"attempt": self.calls[key], "ok": True})

    async def _setcookie(self, request: web.Request) -> web.Response:
        resp = web.json_response({"cookie": "set"})
        resp.set_cookie("session", "cookie-secret-value")
        return resp

    async def _pages(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.calls[f"pages/{name}"] += 1
        if name not in self.pages:
            return web.json_response({"error": "not found"}, status=404)
        if name.startswith("flaky") and self.calls[f"pages/{name}"] <= 1:
            return web.json_response({"error": "busy"}, status=503)
        rows = self.pages[name]
        page, size = int(request.query.get("page", "1")), int(request.query.get("pageSize", "2"))
        chunk = rows[(page - 1) * size : page * size]
        return web.json_response(
            {"data": chunk, "paging": {"page": page, "hasMore": page * size < len(rows)}}
        )

    async def _redirect(self, request: web.Request) -> web.Response:
        raise web.HTTPFound(request.query["to"])

    async def _raw(self, request: web.Request) -> web.Response:
        resp = web.Response(body=request.query.get("body", "").encode())
        if "type" in request.query:
            resp.headers["Content-Type"] = request.query["type"]
        return resp
