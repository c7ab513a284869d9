"""Execution routes: submit, list, status, events (paged or live as server-sent events), ctx, controls."""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import Any, TypeVar

import msgspec
import structlog
from aiohttp import web
from nats.js import api
from nats.js.errors import NotFoundError

from noetl_stream.api.http import (
    ApiError,
    Handler,
    context,
    path_execution_id,
    query_flag,
    query_int,
    read_json,
    reply,
)
from noetl_stream.client.submit import RetryError, check_from_steps, retry_request
from noetl_stream.control.endpoints import MAX_SEQ
from noetl_stream.control.intake import CONTROL_ENDPOINTS, RequestError, parse_request
from noetl_stream.kv.results import ResultStore
from noetl_stream.protocol import events as E
from noetl_stream.protocol.carried import expand
from noetl_stream.protocol.operations import (
    MAX_PAGE,
    ControlRequest,
    ErrorReply,
    ExecuteReply,
    ListExecutions,
)
from noetl_stream.protocol.wire import decode_event, encode, new_execution_id

T = TypeVar("T")

log = structlog.get_logger(__name__)

KEEPALIVE_S = 15.0
_REJECTION_STATUS = {"bad_request": 400, "unknown_playbook": 404, "invalid_playbook": 422}


class ControlBody(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    reason: str | None = None


def _found(value: T | None, execution_id: str) -> T:
    """`value`, or a 404 when the inspector found no such execution."""
    if value is None:
        raise ApiError(404, "not_found", f"no execution {execution_id}")
    return value


async def submit(request: web.Request) -> web.StreamResponse:
    """Validate the body first (a malformed one writes nothing), then record it like any request."""
    raw = await request.read()
    try:
        parse_request(raw)
    except RequestError as exc:
        raise ApiError(400, "bad_request", str(exc)) from None
    execution_id, error = await context(request).intake.admit(raw, new_execution_id())
    if error is not None:
        kind = str(error.get("kind") or "bad_request")
        body = ErrorReply(
            error=kind,
            detail=str(error.get("message")),
            execution_id=execution_id,
            diagnostics=[str(d) for d in error.get("diagnostics") or []],
        )
        return reply(body, _REJECTION_STATUS.get(kind, 400))
    location = f"/api/executions/{execution_id}"
    return reply(ExecuteReply(execution_id=execution_id), 201, {"Location": location})


async def list_executions(request: web.Request) -> web.StreamResponse:
    q = request.query
    query = ListExecutions(
        status=q.get("status"),
        playbook=q.get("playbook"),
        since=q.get("since"),
        until=q.get("until"),
        offset=query_int(request, "offset", 0, 0),
        limit=query_int(request, "limit", 50, 1, MAX_PAGE),
        q=q.get("q") or None,
        retry_of=q.get("retry_of"),
        order="started" if q.get("order") == "started" else "updated",
        cursor=q.get("cursor") or None,
    )
    if q.get("order") not in (None, "updated", "started"):
        raise ApiError(400, "bad_request", f"'order' must be updated or started, not {q.get('order')!r}")
    return reply(await context(request).inspector.executions(query))


async def show(request: web.Request) -> web.StreamResponse:
    execution_id = path_execution_id(request)
    return reply(_found(await context(request).inspector.status(execution_id), execution_id))


async def ctx(request: web.Request) -> web.StreamResponse:
    execution_id = path_execution_id(request)
    return reply(_found(await context(request).inspector.ctx(execution_id), execution_id))


async def events(request: web.Request) -> web.StreamResponse:
    execution_id = path_execution_id(request)
    after = query_int(request, "after", 0, 0, MAX_SEQ)
    skip = (0, 0)
    last_id = _LAST_EVENT_ID.fullmatch(request.headers.get("Last-Event-ID", ""))
    if last_id is not None:  # a client's bogus one is ignored, as a non-number is
        seq, carried = min(int(last_id[1]), MAX_SEQ), last_id[2]
        if carried is None:
            after = max(after, seq)
        elif seq - 1 >= after:  # the client saw the first events of message `seq`: the rest of it
            after, skip = seq - 1, (seq, int(carried))
    limit = query_int(request, "limit", 100, 1, MAX_PAGE)
    if query_flag(request, "follow"):
        return await _follow(request, execution_id, after, skip)
    return reply(_found(await context(request).inspector.events(execution_id, after, limit), execution_id))


_LAST_EVENT_ID = re.compile(r"([0-9]{1,19})(?:-([0-9]{1,4}))?")


async def _follow(
    request: web.Request, execution_id: str, after: int, skip: tuple[int, int] = (0, 0)
) -> web.StreamResponse:
    """Server-sent events: every event after ``after`` (``id:`` is its stream sequence, so a client
    resumes with ``Last-Event-ID``), then the stream ends after ``playbook.processed``.

    The events a message carries (`carried.expand`) come before it, with ids ``<seq>-<k>`` (k = 1, 2, ...):
    a client that resumes after one of them gets the rest of that message (``skip``: the message and how
    many of its events the client has)."""
    ctx_ = context(request)
    if not await ctx_.inspector.exists(execution_id):
        raise ApiError(404, "not_found", f"no execution {execution_id}")
    topology = ctx_.topology
    js = ctx_.nc.jetstream()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    try:
        last = await js.get_last_msg(
            topology.events_stream, topology.stored_event_filter(execution_id, E.PLAYBOOK_PROCESSED)
        )
        if last.seq is not None and last.seq <= after:
            await response.write_eof()
            return response  # finished before the client's position: nothing more will come
    except NotFoundError:
        pass
    queue: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()
    ctx_.streams.add(queue)  # a stopping server ends the stream: the client reconnects with Last-Event-ID

    async def on_msg(msg: object) -> None:
        meta = msg.metadata  # type: ignore[attr-defined]
        await queue.put((meta.sequence.stream, msg.data))  # type: ignore[attr-defined]

    config = api.ConsumerConfig(
        deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE if after else api.DeliverPolicy.ALL,
        opt_start_seq=after + 1 if after else None,
    )
    sub = await js.subscribe(
        topology.events_filter(execution_id),
        stream=topology.events_stream,
        cb=on_msg,
        ordered_consumer=True,
        config=config,
    )
    try:
        while True:
            try:
                seq, data = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
            except TimeoutError:
                await response.write(b": keepalive\n\n")
                continue
            if seq < 0:  # END_OF_STREAM
                break
            try:
                event = decode_event(data)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            name = event.name
            if event.carried:  # each carried event on its own, before its carrier
                *carried, event = expand(event)
                done = skip[1] if seq == skip[0] else 0
                for k, one in enumerate(carried, 1):
                    if k > done:
                        await response.write(
                            b"id: %d-%d\nevent: %s\ndata: %s\n\n" % (seq, k, one.name.encode(), encode(one))
                        )
                data = encode(event)
            await response.write(b"id: %d\nevent: %s\ndata: %s\n\n" % (seq, name.encode(), data))
            if name == E.PLAYBOOK_PROCESSED:
                break
    except ConnectionError as exc:  # the client went away (a tab closed, curl stopped): not a failure
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        log.debug("api.stream.client_left", execution_id=execution_id, error=str(exc) or type(exc).__name__)
        return response  # (aiohttp finishes a response whose client has gone without a word)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        raise
    finally:
        ctx_.streams.discard(queue)
    await sub.unsubscribe()
    with contextlib.suppress(ConnectionError):  # it may leave just as its stream ends
        await response.write_eof()
    return response


class RetryBody(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    from_steps: list[str] = []
    """Re-run from these steps; none: from the failed steps and those its end interrupted."""


class StoredResult(msgspec.Struct):
    """A value the runtime stored by reference (``{"$ref": {"key": ...}}`` in a result or an event)."""

    execution_id: str
    key: str
    size: int
    value: Any


async def retry(request: web.Request) -> web.StreamResponse:
    """Start a new execution that re-runs an ended one from its failed or interrupted steps (or from
    ``from_steps``), reusing the results and ctx of what succeeded: `noetl-stream retry` over HTTP."""
    execution_id = path_execution_id(request)
    body = await read_json(request, RetryBody, optional=True)
    ctx_ = context(request)
    if not await ctx_.inspector.exists(execution_id):
        raise ApiError(404, "not_found", f"no execution {execution_id}")
    from_steps = tuple(body.from_steps)
    try:
        retried = await retry_request(ctx_.nc, ctx_.topology, execution_id, from_steps)
    except RetryError as exc:  # it still runs, or has nothing to retry
        raise ApiError(409, "conflict", str(exc)) from None
    try:
        check_from_steps(retried, execution_id, from_steps)
    except RetryError as exc:
        raise ApiError(400, "bad_request", str(exc)) from None
    new_id, error = await ctx_.intake.admit(encode(retried), new_execution_id())
    if error is not None:  # the playbook no longer compiles with this controller's extensions
        detail = str(error.get("message"))
        return reply(ErrorReply(error=str(error.get("kind")), detail=detail, execution_id=new_id), 422)
    return reply(ExecuteReply(execution_id=new_id), 201, {"Location": f"/api/executions/{new_id}"})


async def stored_result(request: web.Request) -> web.StreamResponse:
    """A value stored by reference under this execution (its reference's ``key``), checked against the
    reference's ``checksum`` when one is given."""
    execution_id = path_execution_id(request)
    key = request.query.get("key", "")
    if not key.startswith(execution_id + "/") or len(key) > 1024:
        raise ApiError(400, "bad_request", f"'key' must be a stored result's key under {execution_id}/")
    checksum = request.query.get("checksum", "")
    store = ResultStore(context(request).inspector.js, context(request).topology)
    try:
        data = await store.get_encoded(key, checksum)
    except NotFoundError:
        raise ApiError(404, "not_found", f"no stored result {key}") from None
    except ValueError as exc:  # a checksum that does not match
        raise ApiError(409, "conflict", str(exc)) from None
    try:
        value = msgspec.json.decode(data)
    except msgspec.DecodeError:
        raise ApiError(409, "conflict", f"stored result {key} is not JSON") from None
    return reply(StoredResult(execution_id=execution_id, key=key, size=len(data), value=value))


def control(action: str) -> Handler:
    event_name = CONTROL_ENDPOINTS[action]

    async def handle(request: web.Request) -> web.StreamResponse:
        execution_id = path_execution_id(request)
        body = await read_json(request, ControlBody, optional=True)
        accepted = await context(request).intake.control(execution_id, event_name, body.reason)
        return reply(accepted, 202)

    handle.__name__ = f"{action}_execution"
    return handle


__all__ = [
    "ControlBody",
    "ControlRequest",
    "RetryBody",
    "StoredResult",
    "control",
    "ctx",
    "events",
    "list_executions",
    "retry",
    "show",
    "stored_result",
    "submit",
]
