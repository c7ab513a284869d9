"""The aiohttp application: bearer-token authentication, JSON errors, the routes of `ROUTES`.

Every route but ``/health`` and the viewer's static pages (``/ui...``) needs
``Authorization: Bearer <token>`` with one of the configured tokens (401 otherwise). A read-only token
(``--api-read-token``) may call the ``GET`` routes; any other method answers 403. Every refusal is a
4xx (503 when NATS or the keychain key is unavailable) with a ``{error, detail}`` body; an unexpected
failure is a 500 with the same shape, never a traceback.
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Any

import nats.errors
import nats.js.errors as jse
import structlog
from aiohttp import web

from noetl_stream.api.http import (
    CONTEXT,
    MAY,
    MAY_OPERATE,
    MAY_READ,
    ApiContext,
    ApiError,
    Handler,
    Route,
    body_types,
    error_response,
    reply,
    require_body_type,
)
from noetl_stream.api.routes import ROUTES
from noetl_stream.control.inspect import QueryError
from noetl_stream.errors import ConfigurationError

__all__ = ["MAX_BODY_BYTES", "READ_METHODS", "build_app", "check_token_kinds"]

log = structlog.get_logger(__name__)

MAX_BODY_BYTES = 4 * 1024 * 1024
_PUBLIC = frozenset(r.path for r in ROUTES if not r.auth)
_PUBLIC_OPERATIONS = frozenset(r.operation_id for r in ROUTES if not r.auth)
_REASONS = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    422: "unprocessable",
}
_STREAM_NOT_FOUND = 10059  # JetStream's err_code
_PROVISION = "run `noetl-stream provision` (a controller creates what it needs only at start)"
_UNAVAILABLE = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    TimeoutError,  # a publish whose acks did not come within its retries (the outbox's)
)


READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
"""What a read-only token may call: nothing it sends changes anything."""
READ_ONLY = "this token may only read: it may call the GET routes, not this one (an operator token may)"


def _clean(tokens: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(t.strip() for t in tokens if t and t.strip()))


def check_token_kinds(
    tokens: tuple[str, ...], read_tokens: tuple[str, ...] = ()
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The operator tokens and the read-only ones, stripped; at least one of either kind, and none of
    both (ConfigurationError)."""
    operate, read = _clean(tokens), _clean(read_tokens)
    if not operate and not read:
        raise ConfigurationError(
            "the HTTP API needs at least one bearer token: --api-token or NOETL_API_TOKENS (comma-separated), "
            "or a read-only one: --api-read-token or NOETL_API_READ_TOKENS"
        )
    both = set(operate) & set(read)
    if both:
        raise ConfigurationError(
            f"{len(both)} token(s) given both as an operator token (--api-token, NOETL_API_TOKENS) and as a "
            "read-only one (--api-read-token, NOETL_API_READ_TOKENS): give each token as one kind only"
        )
    return operate, read


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as err:
        return reply(err.reply, err.code)
    except QueryError as exc:
        return error_response(400, "bad_request", str(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.status, _REASONS.get(exc.status, "http_error"), exc.reason)
    except _UNAVAILABLE as exc:
        return error_response(503, "unavailable", f"NATS did not answer: {type(exc).__name__}")
    except jse.BucketNotFoundError:
        return error_response(503, "unavailable", f"a KV bucket of the installation is missing: {_PROVISION}")
    except jse.ServiceUnavailableError:
        return error_response(503, "unavailable", "JetStream is not available on the NATS server")
    except jse.NotFoundError as exc:
        if exc.err_code != _STREAM_NOT_FOUND:
            return _internal(request, exc)
        return error_response(503, "unavailable", f"a stream of the installation is missing: {_PROVISION}")
    except asyncio.CancelledError:
        raise
    except ConnectionError as exc:
        if not _client_gone(request):
            return _internal(request, exc)
        # A client that left while its answer was written (a closed tab, a stopped curl): nothing failed.
        log.debug(
            "api.client_left", path=request.path, method=request.method, error=str(exc) or type(exc).__name__
        )
        return error_response(499, "client_closed_request", "the client closed the connection")
    except Exception as exc:
        return _internal(request, exc)


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def _internal(request: web.Request, exc: BaseException) -> web.Response:
    log.error("api.internal_error", path=request.path, method=request.method, exc_info=exc)
    return error_response(500, "internal", f"{type(exc).__name__}: the server could not handle this request")


def _auth(tokens: tuple[str, ...], read_tokens: tuple[str, ...] = ()) -> Any:
    encoded = [t.encode() for t in (*tokens, *read_tokens)]
    operators = len(tokens)

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        route = request.match_info.route
        if request.path in _PUBLIC or (route.name is not None and route.name in _PUBLIC_OPERATIONS):
            return await handler(request)  # a public page, also one with a path parameter
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        candidate = given.strip().encode()
        # compare with every token, so the time taken does not tell which one nearly matched
        matched = [hmac.compare_digest(candidate, t) for t in encoded]
        if scheme.lower() != "bearer" or not candidate or not any(matched):
            return error_response(
                401, "unauthorized", "a valid 'Authorization: Bearer <token>' header is required"
            )
        may = MAY_OPERATE if any(matched[:operators]) else MAY_READ
        if may is MAY_READ and request.method not in READ_METHODS:
            return error_response(403, "forbidden", READ_ONLY)
        request[MAY] = may
        return await handler(request)

    return auth


def _strict(route: Route) -> Handler:
    """The route's handler, refusing query parameters it does not document (a typo is not ignored) and a
    body of another content type than it takes (415: `require_body_type`)."""
    allowed = frozenset(p.name for p in route.params if p.where == "query")
    accepted = body_types(route)
    handler = route.handler

    async def handle(request: web.Request) -> web.StreamResponse:
        unknown = sorted(set(request.query) - allowed)
        if unknown:
            known = ", ".join(sorted(allowed)) or "none"
            raise ApiError(400, "bad_request", f"unknown query parameter(s) {unknown} (known: {known})")
        require_body_type(request, accepted)
        return await handler(request)

    return handle


def build_app(context: ApiContext) -> web.Application:
    """The REST API of one controller process (``ROUTES``), with authentication and JSON errors."""
    tokens, read_tokens = check_token_kinds(context.tokens, context.read_tokens)
    app = web.Application(middlewares=[_errors, _auth(tokens, read_tokens)], client_max_size=MAX_BODY_BYTES)
    app[CONTEXT] = context
    for route in ROUTES:
        app.router.add_route(route.method, route.path, _strict(route), name=route.operation_id)
    return app
