"""Liveness, readiness, metrics, and what the request's token may do."""

from __future__ import annotations

import msgspec
from aiohttp import web
from nats.js.errors import NotFoundError

from noetl_stream.api.http import MAY, MAY_READ, ApiError, context, reply
from noetl_stream.kv.provision import stream_names
from noetl_stream.prometheus import CONTENT_TYPE
from noetl_stream.protocol.operations import HealthReply, ReadyReply


async def health(request: web.Request) -> web.StreamResponse:
    """The process serves HTTP (no authentication, no NATS round trip)."""
    return reply(HealthReply(status="ok"))


async def ready(request: web.Request) -> web.StreamResponse:
    """NATS is reachable and every stream, bucket and object store of the installation exists."""
    ctx = context(request)
    if not ctx.nc.is_connected:
        return reply(ReadyReply(status="not_ready", nats=False, detail="not connected to NATS"), 503)
    js = ctx.nc.jetstream(timeout=2.0)
    streams: dict[str, bool] = {}
    for name in stream_names(ctx.topology):
        try:
            await js.stream_info(name)
            streams[name] = True
        except NotFoundError:
            streams[name] = False
        except Exception as exc:  # a timeout: NATS is not answering
            return reply(
                ReadyReply(status="not_ready", nats=False, streams=streams, detail=str(exc) or "timeout"), 503
            )
    ok = all(streams.values())
    return reply(
        ReadyReply(status="ready" if ok else "not_ready", nats=True, streams=streams), 200 if ok else 503
    )


async def metrics(request: web.Request) -> web.StreamResponse:
    ctx = context(request)
    if ctx.metrics is None:
        raise ApiError(404, "not_found", "metrics are not collected by this process")
    await ctx.metrics.refresh(ctx.nc)
    return web.Response(body=ctx.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})


class SessionReply(msgspec.Struct):
    """What the request's bearer token may do: ``["read"]`` (a read-only token: the GET routes) or
    ``["read", "operate"]`` (every route: start, cancel, pause, resume, retry, catalog and keychain
    writes)."""

    may: list[str]


async def session(request: web.Request) -> web.StreamResponse:
    """What the token of this request may do (the viewer disables the actions a read-only token may not
    take)."""
    return reply(SessionReply(may=list(request.get(MAY, MAY_READ))))
