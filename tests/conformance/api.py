"""The HTTP API the conformance playbooks call: a real aiohttp server on 127.0.0.1 and a free port.

Its data is fixed (`DATASETS`, `USERS`), so a playbook's check step can assert exact values. Stateful
endpoints are keyed by a path segment the playbook builds from its ``run_key`` workload value, so two
runs (or a run and its migrated form) never share a counter.

``GET /pages/{dataset}?page=P&pageSize=Z&<field>=<value>``
    ``{data: [...], paging: {page, pageSize, hasMore, total}}``; other query parameters filter rows
    by a field's text (``region=west``).
``GET /cursor/{dataset}?cursor=C&limit=N``
    ``{items: [...], next_cursor: "<token>" | null}`` (the first page without ``cursor``).
``GET /users/{id}``
    one user, 404 ``{error}`` for an unknown id.
``* /flaky/{key}?fail=N&code=C``
    answers ``C`` (503) the first ``N`` (1) calls of ``key``, then 200 ``{ok, attempt, key}``.
``GET /calls/{key}``
    ``{key, calls}``: how many times ``/flaky/{key}`` and ``/jobs/{key}`` were called.
``GET /jobs/{key}?after=N``
    ``{key, state: RUNNING}`` for the first ``N`` (2) polls, then ``{key, state: DONE, rows: 42}``.
``* /status/{code}``
    that status with ``{error: {code, reason}}`` (401, 404, 422, 429, ...).
``* /echo``
    ``{method, path, query, headers, json, form, text, content_type}`` of the request.
``POST /records/{key}``
    stores the JSON (or form) body, 201 ``{stored, received}``; ``GET /records/{key}``
    ``{key, count, items}``.
``GET /secure/profile``
    200 ``{user, scopes}`` with ``Authorization: Bearer <BEARER_TOKEN>``, else 401.
``GET /redirect?to=PATH``
    302 to ``PATH``.
"""

from __future__ import annotations

import collections
import socket
from typing import Any

from aiohttp import web

BEARER_TOKEN = "conformance-bearer-7f3a9c2e41d8"

DATASETS: dict[str, list[dict[str, Any]]] = {
    "stations": [
        {"id": "st-01", "city": "Bergen", "region": "west", "temp_c": 9},
        {"id": "st-02", "city": "Oslo", "region": "east", "temp_c": 14},
        {"id": "st-03", "city": "Tromso", "region": "north", "temp_c": 4},
        {"id": "st-04", "city": "Stavanger", "region": "west", "temp_c": 11},
        {"id": "st-05", "city": "Hamar", "region": "east", "temp_c": 12},
        {"id": "st-06", "city": "Bodo", "region": "north", "temp_c": 6},
        {"id": "st-07", "city": "Drammen", "region": "east", "temp_c": 15},
    ],
    "orders": [
        {"id": 1001, "customer": "acme", "amount_cents": 12050, "status": "paid"},
        {"id": 1002, "customer": "globex", "amount_cents": 7500, "status": "paid"},
        {"id": 1003, "customer": "acme", "amount_cents": 3025, "status": "refunded"},
        {"id": 1004, "customer": "initech", "amount_cents": 41000, "status": "paid"},
        {"id": 1005, "customer": "globex", "amount_cents": 1575, "status": "pending"},
        {"id": 1006, "customer": "umbrella", "amount_cents": 22000, "status": "paid"},
        {"id": 1007, "customer": "acme", "amount_cents": 9999, "status": "paid"},
        {"id": 1008, "customer": "initech", "amount_cents": 500, "status": "pending"},
        {"id": 1009, "customer": "umbrella", "amount_cents": 6000, "status": "refunded"},
        {"id": 1010, "customer": "globex", "amount_cents": 30000, "status": "paid"},
    ],
    "tickets": [
        {"id": "T-1", "priority": "high", "minutes": 45},
        {"id": "T-2", "priority": "low", "minutes": 10},
        {"id": "T-3", "priority": "medium", "minutes": 25},
        {"id": "T-4", "priority": "high", "minutes": 90},
        {"id": "T-5", "priority": "low", "minutes": 5},
    ],
    "repos": [
        {"name": "nats-server", "lang": "go", "stars": 15000},
        {"name": "noetl", "lang": "python", "stars": 120},
        {"name": "duckdb", "lang": "cpp", "stars": 22000},
        {"name": "polars", "lang": "rust", "stars": 28000},
        {"name": "aiohttp", "lang": "python", "stars": 14500},
        {"name": "ripgrep", "lang": "rust", "stars": 45000},
        {"name": "jinja", "lang": "python", "stars": 10000},
        {"name": "caddy", "lang": "go", "stars": 55000},
    ],
    "shipments": [
        {"tracking": "SH-100", "carrier": "dhl", "kg": 2.5, "delivered": True},
        {"tracking": "SH-101", "carrier": "ups", "kg": 10.0, "delivered": False},
        {"tracking": "SH-102", "carrier": "dhl", "kg": 0.5, "delivered": True},
        {"tracking": "SH-103", "carrier": "fedex", "kg": 7.0, "delivered": True},
    ],
}

USERS: dict[str, dict[str, Any]] = {
    "u1": {"id": "u1", "name": "ada", "plan": "pro", "seats": 5},
    "u2": {"id": "u2", "name": "grace", "plan": "team", "seats": 12},
    "u3": {"id": "u3", "name": "linus", "plan": "free", "seats": 1},
    "u4": {"id": "u4", "name": "margaret", "plan": "pro", "seats": 3},
}

REASONS = {401: "unauthorized", 403: "forbidden", 404: "not found", 422: "unprocessable", 429: "slow down"}


class ConformanceApi:
    """The server; `url` is its base URL once `start()` returned."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.records: dict[str, list[Any]] = collections.defaultdict(list)
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> ConformanceApi:
        app = web.Application()
        app.router.add_get("/pages/{dataset}", self._pages)
        app.router.add_get("/cursor/{dataset}", self._cursor)
        app.router.add_get("/users/{id}", self._user)
        app.router.add_route("*", "/flaky/{key}", self._flaky)
        app.router.add_get("/calls/{key}", self._calls)
        app.router.add_get("/jobs/{key}", self._jobs)
        app.router.add_route("*", "/status/{code}", self._status)
        app.router.add_route("*", "/echo", self._echo)
        app.router.add_post("/records/{key}", self._record)
        app.router.add_get("/records/{key}", self._records)
        app.router.add_get("/secure/profile", self._secure)
        app.router.add_get("/redirect", self._redirect)
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

    async def _pages(self, request: web.Request) -> web.Response:
        rows = DATASETS.get(request.match_info["dataset"])
        if rows is None:
            return _error(404)
        query = request.query
        filters = {k: v for k, v in query.items() if k not in ("page", "pageSize")}
        rows = [r for r in rows if all(str(r.get(k)) == v for k, v in filters.items())]
        page, size = int(query.get("page", "1")), int(query.get("pageSize", "2"))
        chunk = rows[(page - 1) * size : page * size]
        paging = {"page": page, "pageSize": size, "hasMore": page * size < len(rows), "total": len(rows)}
        return web.json_response({"data": chunk, "paging": paging})

    async def _cursor(self, request: web.Request) -> web.Response:
        rows = DATASETS.get(request.match_info["dataset"])
        if rows is None:
            return _error(404)
        cursor = request.query.get("cursor") or ""
        start = int(cursor.removeprefix("c")) if cursor else 0
        limit = int(request.query.get("limit", "3"))
        end = start + limit
        token = f"c{end}" if end < len(rows) else None
        return web.json_response({"items": rows[start:end], "next_cursor": token})

    async def _user(self, request: web.Request) -> web.Response:
        user = USERS.get(request.match_info["id"])
        return web.json_response(user) if user is not None else _error(404)

    async def _flaky(self, request: web.Request) -> web.Response:
        key = request.match_info["key"]
        self.calls[key] += 1
        n = self.calls[key]
        if n <= int(request.query.get("fail", "1")):
            code = int(request.query.get("code", "503"))
            return web.json_response({"error": {"code": code, "attempt": n}}, status=code)
        return web.json_response({"ok": True, "attempt": n, "key": key})

    async def _calls(self, request: web.Request) -> web.Response:
        key = request.match_info["key"]
        return web.json_response({"key": key, "calls": self.calls[key]})

    async def _jobs(self, request: web.Request) -> web.Response:
        key = request.match_info["key"]
        self.calls[key] += 1
        if self.calls[key] <= int(request.query.get("after", "2")):
            return web.json_response({"key": key, "state": "RUNNING"})
        return web.json_response({"key": key, "state": "DONE", "rows": 42})

    async def _status(self, request: web.Request) -> web.Response:
        return _error(int(request.match_info["code"]))

    async def _echo(self, request: web.Request) -> web.Response:
        raw = await request.read()
        text = raw.decode(errors="replace")
        body: dict[str, Any] = {"json": None, "form": None}
        if request.content_type == "application/json" and raw:
            body["json"] = await request.json()
        elif request.content_type == "application/x-www-form-urlencoded":
            body["form"] = dict((await request.post()).items())
        return web.json_response(
            {
                "method": request.method,
                "path": request.path,
                "query": dict(request.query.items()),
                "headers": {k.lower(): v for k, v in request.headers.items()},
                "text": text,
                "content_type": request.content_type,
                **body,
            }
        )

    async def _record(self, request: web.Request) -> web.Response:
        key = request.match_info["key"]
        if request.content_type == "application/json":
            item: Any = await request.json()
        else:
            item = dict((await request.post()).items())
        self.records[key].append(item)
        return web.json_response({"stored": len(self.records[key]), "received": item}, status=201)

    async def _records(self, request: web.Request) -> web.Response:
        key = request.match_info["key"]
        items = self.records.get(key, [])
        return web.json_response({"key": key, "count": len(items), "items": items})

    async def _secure(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {BEARER_TOKEN}":
            return _error(401)
        return web.json_response({"user": "etl-bot", "scopes": ["read:reports", "write:exports"]})

    async def _redirect(self, request: web.Request) -> web.Response:
        raise web.HTTPFound(request.query["to"])


def _error(code: int) -> web.Response:
    return web.json_response({"error": {"code": code, "reason": REASONS.get(code, "error")}}, status=code)
