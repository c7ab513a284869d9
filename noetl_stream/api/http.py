"""What every route shares: the request context, JSON replies, parameter parsing, the route table type."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
from aiohttp import web
from nats.aio.client import Client as NATS

from noetl_stream.control.endpoints import ApiError
from noetl_stream.control.inspect import Inspector
from noetl_stream.control.intake import Intake
from noetl_stream.control.metrics import Metrics
from noetl_stream.kv.catalog import Catalog
from noetl_stream.kv.keychain import Keychain
from noetl_stream.protocol.operations import ErrorReply
from noetl_stream.protocol.subjects import SubjectError, Topology, check_token
from noetl_stream.protocol.wire import decode_json

__all__ = [
    "CONTEXT",
    "MAY",
    "MAY_OPERATE",
    "MAY_READ",
    "YAML_TYPES",
    "ApiContext",
    "ApiError",
    "Param",
    "Route",
    "body_types",
    "path_execution_id",
    "query_int",
    "read_json",
    "reply",
    "require_body_type",
]

S = TypeVar("S", bound=msgspec.Struct)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
JSON = "application/json"
YAML = "application/yaml"
YAML_TYPES = (YAML, "application/x-yaml", "text/yaml")
"""What a playbook's text may be sent as (``POST /api/catalog``). Not ``text/plain``: a web page may send
that, like a form's types, to any site without the browser asking it first (no CORS preflight)."""


@dataclass
class ApiContext:
    """The controller-process components the routes use."""

    nc: NATS
    topology: Topology
    intake: Intake
    tokens: tuple[str, ...]
    metrics: Metrics | None = None
    read_tokens: tuple[str, ...] = ()
    """Tokens that may only read: the ``GET`` routes (403 for any other method)."""
    keychain: Keychain | None = None
    streams: set[asyncio.Queue[tuple[int, bytes]]] = field(default_factory=set)
    """The queues of the handlers streaming server-sent events (``?follow=1``): when the server stops it
    puts `END_OF_STREAM` in each, and they end their streams, instead of the server waiting for their
    clients to go away."""

    @property
    def inspector(self) -> Inspector:
        return self.intake.inspector

    @property
    def catalog(self) -> Catalog:
        return self.intake.catalog


END_OF_STREAM = (-1, b"")
"""What a stopping server puts in an event stream's queue (`ApiContext.streams`)."""

CONTEXT = web.AppKey("noetl_api_context", ApiContext)

MAY_READ = ("read",)
MAY_OPERATE = ("read", "operate")
MAY = web.RequestKey[tuple[str, ...]]("noetl_api_may")
"""What the request's token may do (`MAY_READ` or `MAY_OPERATE`), set by the authentication."""


def context(request: web.Request) -> ApiContext:
    return request.app[CONTEXT]


def path_execution_id(request: web.Request) -> str:
    """The ``{execution_id}`` of the route's path, checked (400 for a malformed or too long one)."""
    try:
        return check_token(request.match_info["execution_id"], "execution id")
    except SubjectError as exc:
        raise ApiError(400, "bad_request", str(exc)) from None


def reply(
    body: msgspec.Struct | None, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    if body is None:
        return web.Response(status=status, headers=headers)
    return web.Response(body=msgspec.json.encode(body), status=status, content_type=JSON, headers=headers)


def error_response(status: int, error: str, detail: str, **extra: Any) -> web.Response:
    body = ErrorReply(error=error, detail=detail, **extra)
    headers = {"WWW-Authenticate": 'Bearer realm="noetl"'} if status == 401 else None
    return reply(body, status, headers)


def query_int(request: web.Request, name: str, default: int, low: int, high: int | None = None) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    digits = raw[1:] if raw.startswith("-") else raw
    try:
        if not (digits.isascii() and digits.isdigit()):  # int() would take " 5", "1_0", "٣"
            raise ValueError(raw)
        value = int(raw)
    except ValueError:
        raise ApiError(
            400, "bad_request", f"query parameter '{name}' must be an integer, got {raw!r}"
        ) from None
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise ApiError(400, "bad_request", f"query parameter '{name}' must be {bound}")
    return value


def query_flag(request: web.Request, name: str) -> bool:
    raw = request.query.get(name, "0")
    if raw in ("0", "1"):
        return raw == "1"
    raise ApiError(400, "bad_request", f"query parameter '{name}' must be 1 or 0, got {raw!r}")


async def read_json(request: web.Request, type_: type[S], *, optional: bool = False) -> S:
    raw = await request.read()
    if not raw.strip() and optional:
        raw = b"{}"
    try:
        return decode_json(raw, type_)
    except msgspec.DecodeError as exc:  # ValidationError, invalid UTF-8, JSON nested too deeply included
        raise ApiError(400, "bad_request", f"bad request body: {exc}") from None


@dataclass(frozen=True)
class Param:
    """A path or query parameter (for the OpenAPI document)."""

    name: str
    where: str = "query"
    schema: dict[str, Any] = field(default_factory=lambda: {"type": "string"})
    description: str = ""
    required: bool = False


@dataclass(frozen=True)
class Route:
    """One route: its handler and what the OpenAPI document says about it."""

    method: str
    path: str
    handler: Handler
    operation_id: str
    summary: str
    reply: type[msgspec.Struct] | None = None
    status: int = 200
    params: tuple[Param, ...] = ()
    body: type[msgspec.Struct] | None = None
    body_required: bool = True
    text_body: str | None = None
    """A second request content type whose body is plain text (``application/yaml``)."""
    errors: tuple[int, ...] = (400,)
    auth: bool = True
    content_type: str = JSON
    stream: str | None = None
    """An alternative 200 content type (``text/event-stream``)."""
    tags: tuple[str, ...] = ()


def body_types(route: Route) -> tuple[str, ...]:
    """The content types `route`'s request body may be sent as (none if it takes no body)."""
    if route.body is None:
        return ()
    text = YAML_TYPES if route.text_body == YAML else (route.text_body,) if route.text_body else ()
    return (JSON, *text)


def require_body_type(request: web.Request, accepted: tuple[str, ...]) -> None:
    """Refuse (415) a body sent as anything but `accepted` (JSON: ``application/json``, with at most a
    UTF-8 ``charset``). A web page may send ``text/plain`` or a form (``application/x-www-form-urlencoded``,
    ``multipart/form-data``) to any site without the browser asking it first (no CORS preflight);
    ``application/json`` it may not. A request without a body is not checked (nothing is read from it)."""
    if not accepted or not request.body_exists:
        return
    charset = (request.charset or "utf-8").lower()
    if request.content_type in accepted and charset in ("utf-8", "utf8"):
        return
    given = request.headers.get("Content-Type")
    shown = "no content type" if given is None else f"content type {given[:100]!r}"
    wanted = " or ".join(f"'Content-Type: {t}'" for t in accepted[:2])
    raise ApiError(415, "unsupported_media_type", f"{shown} refused: send the body with {wanted} (UTF-8)")
