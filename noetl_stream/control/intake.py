"""Execution requests in: the durable request subject and the ``execute`` micro endpoint.

Intake validates the request's shape, fixes the execution id (deterministic for a
message redelivered after a crash) and records ``playbook.execution.requested``;
the reducer does the rest when that event comes back through the controller's
consumer. A malformed request is answered with ``playbook.request.rejected`` and a
``playbook.processed`` for its id: nothing is left half-started. An execution id is
decided once, by its first record (its request or its rejection, whichever the server
stores first): a request for a decided execution (a client's retry, a redelivery, a
racing request with the same id) records nothing and is told the decision (`Intake.admit`).

A request naming a catalog ``path`` (and ``version``, default latest) is resolved here: the
requested event carries the resolved text in ``request.playbook`` and ``catalog: {path, version,
content_hash}``, so the execution (and any replay of it) runs exactly that content.

DSL extensions (``legacy``) are fixed here too: the request's own, the controller's default, those a
catalog entry was registered with, and a parent execution's (a child playbook is compiled like its
parent). The requested event records them in ``request.extensions``, which is all the reducer reads:
a replay or another controller compiles the playbook the same way whatever its own setting.
"""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError
from nats.micro import add_service
from nats.micro.request import Request
from nats.micro.service import EndpointConfig, Service, ServiceConfig

from noetl_stream import __version__
from noetl_stream.control.core.keychaincheck import CHECK_FLAG
from noetl_stream.control.core.plans import PlanCache, plan_key
from noetl_stream.control.core.reducer import invalid_playbook_error, rejection_events
from noetl_stream.control.core.state import ExecutionState
from noetl_stream.control.endpoints import (
    ApiError,
    QueryEndpoints,
    decode,
    internal_error,
    respond_error,
)
from noetl_stream.control.inspect import Inspector
from noetl_stream.control.planload import load_off_loop
from noetl_stream.dsl.vocabulary import EXTENSIONS
from noetl_stream.errors import NoetlError, StateConflictError
from noetl_stream.jetstream.fastpath import ack, stream_seq
from noetl_stream.jetstream.outbox import AlreadyStoredError, Outbox
from noetl_stream.jetstream.puller import ContinuousPuller
from noetl_stream.kv.catalog import Catalog, CatalogError, CatalogNotFoundError
from noetl_stream.kv.history import end_status, last_event
from noetl_stream.protocol import events as E
from noetl_stream.protocol.errorinfo import ErrorInfo
from noetl_stream.protocol.operations import ControlAccepted, ControlRequest, ErrorReply, ExecuteReply
from noetl_stream.protocol.subjects import (
    MAX_NEW_ID_LENGTH,
    SubjectError,
    Topology,
    check_new_id,
    check_token,
)
from noetl_stream.protocol.wire import (
    Event,
    ExecutionRequest,
    control_event,
    decode_json,
    decode_request,
    derived_execution_id,
    encode,
    make_event,
    new_execution_id,
)
from noetl_stream.settings import DEFAULT_MAX_CHILD_DEPTH, MAX_CHILD_DEPTH_ENV

log = structlog.get_logger(__name__)

EXECUTE_CONCURRENCY = 64
"""Requests on the micro ``execute`` endpoint admitted at once by one controller."""


class RequestError(NoetlError, ValueError):
    """A request that cannot become an execution."""


def _segments(path: str) -> list[str]:
    normal = posixpath.normpath(path) if path else "."
    return [] if normal == "." else normal.split("/")


def rebase_attachments(attachments: Mapping[str, str], file: str) -> dict[str, str]:
    """A parent's attachments (keyed relative to the parent's directory) keyed for its child ``file`` (the
    path as the parent wrote it): relative to the child's directory, which is how the child's worker looks
    its own references up. ``sub/mid.yaml``'s ``grand.yaml`` is the parent's ``sub/grand.yaml``, not the
    parent's ``grand.yaml``. Keys the child cannot name relatively are kept as they were (attachments of
    clients that keyed them by the raw reference), unless a re-keyed one takes their place."""
    base = posixpath.dirname(file)
    prefix = _segments(base)
    if not prefix:
        return dict(attachments)
    rebased: dict[str, str] = {}
    for key, text in attachments.items():
        if key.startswith("/") != base.startswith("/"):
            continue  # an absolute path from a relative directory (or the reverse): kept as it was, below
        normal_base = "/".join(prefix)
        if key.startswith(normal_base + "/") or key.startswith(base + "/"):
            cut = len(normal_base if key.startswith(normal_base + "/") else base) + 1
            rebased[key[cut:]] = text  # as written (``./grand.yaml`` stays so: the worker looks it up raw)
            continue
        parts = _segments(key)
        common = 0
        while common < min(len(parts), len(prefix)) and parts[common] == prefix[common]:
            common += 1
        if ".." in prefix[common:]:
            continue  # the child's directory is above the parent's: no relative name reaches this one
        rebased.setdefault("/".join([".."] * (len(prefix) - common) + parts[common:]), text)
    return {**{k: v for k, v in attachments.items() if k not in rebased}, **rebased}


class _Parent(msgspec.Struct):
    """What a child's intake reads of its parent execution."""

    extensions: list[str] = []
    depth: int = -1
    """The parent's recorded depth; -1 when its request is not stored (expired, or never was)."""
    ended: str | None = None
    """The parent's end (its status) when it has ended."""


HEADER_ROOM = 1024
"""Bytes of a message's limit kept for its headers (``Nats-Msg-Id``, ``Nats-Expected-Last-Subject-Sequence``):
the server's ``max_payload`` counts them, and it closes a connection that sends more."""

MAX_MESSAGE = 1000
"""The longest error message about a request (it may quote a field name or value of any length, and it
goes into two events and a log line)."""


def _short(message: str) -> str:
    if len(message) <= MAX_MESSAGE:
        return message
    return f"{message[:MAX_MESSAGE]}... ({len(message)} characters)"


def parse_request(raw: bytes) -> ExecutionRequest:
    """Decode and check a request; raise ``RequestError`` with a specific message."""
    try:
        return _parse_request(raw)
    except RequestError as exc:
        raise RequestError(_short(str(exc))) from None


def _parse_request(raw: bytes) -> ExecutionRequest:
    try:
        request = decode_request(raw)
    except msgspec.DecodeError as exc:  # not UTF-8, not JSON, nested too deeply, wrong shape (`decoding`)
        raise RequestError(f"bad request: {exc}") from None
    if request.playbook is None and request.path is None:
        raise RequestError("bad request: give 'playbook' (the YAML text) or 'path' (a catalog path)")
    if request.playbook is not None and (request.path is not None or request.version is not None):
        raise RequestError("bad request: give 'playbook' (the YAML text) or 'path' (+ 'version'), not both")
    for value, what, check in (
        (request.execution_id, "execution id", check_new_id),
        (request.parent_execution_id, "parent execution id", check_token),
        (request.pool, "pool", check_new_id),
    ):
        if value is not None:
            try:
                check(value, what)
            except SubjectError as exc:
                raise RequestError(f"bad request: {exc}") from None
    if request.trace_id is not None and len(request.trace_id) > MAX_NEW_ID_LENGTH:  # every event carries it
        raise RequestError(
            f"bad request: 'trace_id' of {len(request.trace_id)} characters: at most {MAX_NEW_ID_LENGTH}"
        )
    if request.deadline_s is not None and request.deadline_s <= 0:
        raise RequestError("bad request: 'deadline_s' must be a positive number of seconds")
    for ext in request.extensions:
        if ext not in EXTENSIONS:
            raise RequestError(f"bad request: unknown extension '{ext}' (known: {', '.join(EXTENSIONS)})")
    return request


CONTROL_ENDPOINTS = {
    "cancel": E.EXECUTION_CANCEL_REQUESTED,
    "pause": E.EXECUTION_PAUSE_REQUESTED,
    "resume": E.EXECUTION_RESUME_REQUESTED,
}
_VERBS = {event: action for action, event in CONTROL_ENDPOINTS.items()}


def _make(default_id: str | Callable[[], str]) -> str:
    """The default execution id, made now when it was given as a function."""
    return default_id if isinstance(default_id, str) else default_id()


class _Claim(msgspec.Struct):
    execution_id: Any = None


def _claimed_id(raw: bytes) -> str | None:
    """The ``execution_id`` a malformed request asked for, if it is a usable id (so its rejection is
    written where the client looks for it)."""
    try:  # only this field is decoded: another may be what is wrong (a number out of range, 1e999)
        value = decode_json(raw, _Claim).execution_id
    except msgspec.DecodeError:  # ValidationError included (not an object), and whatever is malformed
        return None
    if not isinstance(value, str):
        return None
    try:
        return check_new_id(value)
    except SubjectError:
        return None


def _requested_event(
    execution_id: str, request: ExecutionRequest, pinned: dict[str, Any], error: dict[str, Any] | None
) -> Event:
    """``playbook.execution.requested``: the request as it will run (its playbook's text, its depth and
    DSL extensions fixed), what it `pinned` of a catalog entry, and what this intake decided for it."""
    return make_event(
        execution_id,
        E.EXECUTION_REQUESTED,
        source="server",
        entity_type="playbook",
        entity_id=request.path or request.file or "<playbook>",
        status="in_progress",
        scope="execution",
        payload={
            "request": msgspec.to_builtins(request),
            **pinned,
            # Where steps naming no pool run (`ExecutionState.pool`). Recorded by this intake, not
            # read from the request: requests stored before the pool was honoured replay as they ran.
            **({"pool": request.pool} if request.pool else {}),
            # That this controller resolves a declared keychain before the workflow starts: requests
            # stored before it did replay as they ran (`control/core/keychaincheck.py`).
            **({"rejected": error} if error else {CHECK_FLAG: True}),
        },
        trace_id=request.trace_id,
    )


class Intake:
    def __init__(
        self,
        nc: NATS,
        topology: Topology,
        live: Mapping[str, ExecutionState] | None = None,
        changed: Mapping[str, float] | None = None,
        *,
        extensions: Iterable[str] = (),
        plans: PlanCache | None = None,
        max_child_depth: int | None = None,
    ) -> None:
        self.nc = nc
        self.max_child_depth = DEFAULT_MAX_CHILD_DEPTH if max_child_depth is None else max_child_depth
        """Deepest child playbook admitted (a root is 0): `Settings.max_child_depth`, passed down by the
        controller (``NOETL_MAX_CHILD_DEPTH``); a playbook that runs itself without a bound is refused
        there instead of spawning children for ever."""
        self.plans = plans if plans is not None else PlanCache()
        """Where the plans intake compiles go: the controller's reducer finds them compiled."""
        self.js = nc.jetstream()
        self.topology = topology
        self.extensions = tuple(sorted(set(extensions)))
        """DSL extensions every request is compiled with (the controller's ``--legacy``)."""
        self.catalog = Catalog(self.js, topology, extensions=self.extensions)
        self.inspector = Inspector(self.js, topology, live, changed)
        self._puller: ContinuousPuller | None = None
        self._service: Service | None = None
        self._checked: dict[str, tuple[dict[str, Any] | None, frozenset[str]]] = {}
        """By playbook content: its compile error (or None) and its step names."""
        self._executes = asyncio.Semaphore(EXECUTE_CONCURRENCY)
        self._execute_tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._puller = ContinuousPuller(
            self.nc,
            self.topology.requests_stream,
            self.topology.controller_requests_consumer,
            self._on_stream_request,
            max_concurrency=64,
        )
        await self._puller.start()
        self._service = await add_service(
            self.nc,
            ServiceConfig(
                name=self.topology.service_name,
                version=__version__,
                description="noetl-stream control plane",
                queue_group="noetl-controller",
            ),
        )
        await self._service.add_endpoint(
            EndpointConfig(
                name="execute",
                handler=self._on_execute,
                subject=self.topology.api_subject("execute"),
                metadata={
                    "request_schema": "schemas/request.schema.json",
                    "reply_schema": "schemas/api/ExecuteReply.schema.json",
                },
            )
        )
        for name, event_name in CONTROL_ENDPOINTS.items():
            await self._service.add_endpoint(
                EndpointConfig(
                    name=name,
                    handler=self._control_handler(event_name),
                    subject=self.topology.api_subject(name),
                    metadata={
                        "request_schema": "schemas/api/ControlRequest.schema.json",
                        "reply_schema": "schemas/api/ControlAccepted.schema.json",
                    },
                )
            )
        await QueryEndpoints(self.inspector, self.catalog, self.topology).add_to(self._service)

    async def stop(self, timeout: float = 30.0) -> None:
        """Stop taking requests; wait up to `timeout` in all for those in hand (the micro endpoint's up
        to 10 s of it; what is left after that is handed back and redelivered)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        if self._service is not None:
            await self._service.stop()
            self._service = None
        if self._execute_tasks:
            await asyncio.wait(set(self._execute_tasks), timeout=min(10.0, max(0.0, end - loop.time())))
        if self._puller is not None:
            await self._puller.stop(timeout=max(0.0, end - loop.time()))
            self._puller = None

    async def _on_stream_request(self, msg: Msg) -> None:
        # Sequence and delivery count come from the reply subject's tokens; the id of a request that
        # brings none is derived only then (the client always sets one): `msg.metadata` parses every
        # field into dataclasses and a datetime, and the id hashes.
        def default_id() -> str:
            return derived_execution_id(
                self.topology.requests_stream, stream_seq(msg), msg.metadata.timestamp
            )

        await self.submit(msg.data, default_id)
        await ack(msg)

    async def _on_execute(self, req: Request) -> None:
        """Answer in a task: nats-py runs one subscription's callbacks one after another, and an
        admission waits for a JetStream ack; at most `EXECUTE_CONCURRENCY` run at once."""
        await self._executes.acquire()
        task = asyncio.create_task(self._execute(req))
        self._execute_tasks.add(task)
        task.add_done_callback(self._execute_done)

    def _execute_done(self, task: asyncio.Task[None]) -> None:
        self._execute_tasks.discard(task)
        self._executes.release()
        if not task.cancelled() and task.exception() is not None:
            log.error("intake.execute_failed", error=repr(task.exception()))

    async def _execute(self, req: Request) -> None:
        try:
            execution_id, error = await self.admit(req.data, new_execution_id)
        except Exception as exc:  # the caller learns at once, not by a timeout
            await respond_error(req, internal_error(exc, "execute"))
            return
        if error is not None:
            detail = str(error.get("message"))
            reply = ErrorReply(
                error=str(error.get("kind") or "bad_request"),
                detail=detail,
                execution_id=execution_id,
                diagnostics=[str(d) for d in error.get("diagnostics") or []],
            )
            await req.respond_error("400", detail, msgspec.json.encode(reply))
        else:
            await req.respond(msgspec.json.encode(ExecuteReply(execution_id=execution_id)))

    def _control_handler(self, name: str) -> Any:
        async def handle(req: Request) -> None:
            try:
                ctl = decode(req.data, ControlRequest)
                reply = await self.control(ctl.execution_id, name, ctl.reason)
            except ApiError as err:
                await respond_error(req, err)
                return
            except Exception as exc:
                await respond_error(req, internal_error(exc, name))
                return
            await req.respond(msgspec.json.encode(reply))

        return handle

    async def control(self, execution_id: str, name: str, reason: str | None = None) -> ControlAccepted:
        """Record an operator action (``execution.cancel.requested``, ...) for an existing execution."""
        try:
            ev = control_event(check_token(execution_id, "execution id"), name, reason)
        except SubjectError as exc:
            raise ApiError(400, "bad_request", f"bad request: {exc}") from None
        if reason is not None and len(reason) > MAX_MESSAGE:  # the event carries it (and fits in a message)
            raise ApiError(
                400, "bad_request", f"bad request: 'reason' is longer than {MAX_MESSAGE} characters"
            )
        if not await self._exists(execution_id):
            raise ApiError(404, "not_found", f"no execution {execution_id}")
        processed = await self._last(execution_id, E.PLAYBOOK_PROCESSED)
        if processed is not None:  # nothing would read the request: say so rather than accept it
            status = processed.payload.get("status")
            raise ApiError(
                409,
                "conflict",
                f"execution {execution_id} has finished ({status}): nothing to {_VERBS[name]}",
            )
        outbox = Outbox(self.js, self.topology)
        outbox.event(ev)
        await outbox.flush()
        return ControlAccepted(execution_id=execution_id, accepted=name)

    async def _exists(self, execution_id: str) -> bool:
        subject = self.topology.stored_event_filter(execution_id, E.EXECUTION_REQUESTED)
        try:
            await self.js.get_last_msg(self.topology.events_stream, subject)
        except NotFoundError:
            return False
        return True

    async def _parent(self, execution_id: str) -> _Parent:
        """A parent execution as stored: the DSL extensions and depth recorded with its request (none and
        -1 when it is unknown), and its end if it has ended. The parent may be another controller's
        (another partition): its stored events are read, not a state in memory."""
        requested = await self._last(execution_id, E.EXECUTION_REQUESTED)
        request = requested.payload.get("request") if requested is not None else None
        exts = request.get("extensions") if isinstance(request, dict) else None
        depth = request.get("depth", 0) if isinstance(request, dict) else -1
        # Every execution that ran ends with workflow.finished (a rejected one never ran a task: no child).
        finished = await self._last(execution_id, E.WORKFLOW_FINISHED)
        ended = end_status(finished) if finished is not None else None
        return _Parent(
            extensions=[e for e in exts if e in EXTENSIONS] if isinstance(exts, list) else [],
            depth=depth if isinstance(depth, int) and not isinstance(depth, bool) and depth >= 0 else 0,
            ended=ended,
        )

    def _child_problem(self, request: ExecutionRequest, parent: _Parent, depth: int) -> dict[str, Any] | None:
        """Why a child request must not run, or None. Its parent task gave up on it (cancelled, failed,
        deadline): a child started now would run unwatched, and start children of its own (a playbook
        that runs itself would spawn them for ever)."""
        if parent.ended is not None:
            message = (
                f"parent execution {request.parent_execution_id} has already ended ({parent.ended}): "
                "no child of it is started"
            )
            return ErrorInfo(kind="parent_ended", message=message).to_dict()
        if depth > self.max_child_depth:
            message = (
                f"child playbook nested {depth} deep (parent execution {request.parent_execution_id}): at "
                f"most {self.max_child_depth} ({MAX_CHILD_DEPTH_ENV} on the controller); does a playbook "
                "run itself without a bound?"
            )
            return ErrorInfo(kind="child_depth_exceeded", message=message).to_dict()
        return None

    async def submit(self, raw: bytes, default_id: str | Callable[[], str]) -> tuple[str, str | None]:
        """Record the request (or its rejection). Returns ``(execution_id, error message or None)``."""
        execution_id, error = await self.admit(raw, default_id)
        return execution_id, None if error is None else str(error.get("message"))

    async def admit(
        self, raw: bytes, default_id: str | Callable[[], str]
    ) -> tuple[str, dict[str, Any] | None]:
        """Record the request (or its rejection). Returns ``(execution_id, error or None)``; the error's
        ``kind`` is ``bad_request``, ``unknown_playbook`` or ``invalid_playbook``. `default_id` is the id
        of a request that brings none (a function making it is called only then).

        An execution id is decided once, by the first record of it: its ``playbook.execution.requested``
        (accepted, or carrying ``rejected`` when the playbook does not compile) or, for a request that
        names no runnable playbook, its ``playbook.request.rejected``. Each is published on the condition
        that the execution has no ``playbook.*`` record yet (`Topology.execution_claim_filter`): the
        server refuses the second, however late it comes (JetStream's duplicate window alone would let
        it in), without a read first. A request whose execution is decided already (a client's retry, a
        redelivery after a crash, another request with the same id, even one racing this one) records
        nothing and is answered with what was decided (`_recorded`): ``(execution_id, None)`` for an
        accepted execution, its rejection for a rejected one. So an execution never gets both a request
        that runs and a rejection. A request that cannot be parsed is rejected under the id it asked for
        (or the default)."""
        try:
            request = parse_request(raw)
        except RequestError as exc:
            execution_id = _claimed_id(raw) or _make(default_id)
            return await self._reject_new(
                execution_id, ErrorInfo(kind="bad_request", message=str(exc)).to_dict()
            )
        execution_id = request.execution_id or _make(default_id)
        extensions = {*request.extensions, *self.extensions}
        if request.parent_execution_id is not None:
            child = await self._as_child(request)
            if isinstance(child, dict):  # why it must not run
                entity = _short(request.file or request.path or "<request>")
                return await self._reject_new(execution_id, child, entity, request.trace_id)
            request, parent_extensions = child
            extensions.update(parent_extensions)
        elif request.depth:
            request = msgspec.structs.replace(request, depth=0)  # a root, whatever it says
        pinned: dict[str, Any] = {}
        if request.playbook is None:
            assert request.path is not None
            found = await self._from_catalog(request)
            if isinstance(found, dict):  # no such entry, or one that cannot be read
                return await self._reject_new(execution_id, found, _short(request.path), request.trace_id)
            request, pinned, registered = found
            extensions.update(registered)
        if sorted(extensions) != request.extensions:
            request = msgspec.structs.replace(request, extensions=sorted(extensions))
        error = await self._check_playbook(request)
        return await self._publish_requested(
            execution_id, _requested_event(execution_id, request, pinned, error), error
        )

    async def _as_child(
        self, request: ExecutionRequest
    ) -> tuple[ExecutionRequest, list[str]] | dict[str, Any]:
        """A child playbook's request with its depth below its parent (and its attachments keyed for its own
        file, when it was shipped with the parent), and the parent's DSL extensions (a child is compiled
        like its parent); or why it must not run (`_child_problem`)."""
        assert request.parent_execution_id is not None
        parent = await self._parent(request.parent_execution_id)
        depth = parent.depth + 1 if parent.depth >= 0 else max(request.depth, 1)
        problem = self._child_problem(request, parent, depth)
        if problem is not None:
            return problem
        if request.playbook is not None and request.file:  # shipped with the parent: its references
            attachments = rebase_attachments(request.attachments, request.file)
            return msgspec.structs.replace(request, depth=depth, attachments=attachments), parent.extensions
        return msgspec.structs.replace(request, depth=depth), parent.extensions

    async def _from_catalog(
        self, request: ExecutionRequest
    ) -> tuple[ExecutionRequest, dict[str, Any], tuple[str, ...]] | dict[str, Any]:
        """A request naming a catalog ``path`` (and ``version``) with the entry's text and version, what
        the requested event pins of it (``catalog``: path, version, content hash) and the DSL extensions
        it was registered with; or the error when there is no such entry or it cannot be read."""
        assert request.path is not None
        try:
            entry, text, registered = await self.catalog.resolve_for_run(request.path, request.version)
        except (CatalogNotFoundError, CatalogError, msgspec.DecodeError) as exc:
            kind = "unknown_playbook" if isinstance(exc, CatalogNotFoundError) else "bad_request"
            message = str(exc)
            if isinstance(exc, msgspec.DecodeError):  # a key of the bucket written by something else
                message = f"the catalog entry of {request.path!r} cannot be read ({exc}): register it again"
            return ErrorInfo(kind=kind, message=_short(message)).to_dict()
        request = msgspec.structs.replace(request, playbook=text, version=entry.version)
        pin = {"path": entry.path, "version": entry.version, "content_hash": entry.content_hash}
        return request, {"catalog": pin}, registered

    async def _publish_requested(
        self, execution_id: str, requested: Event, error: dict[str, Any] | None
    ) -> tuple[str, dict[str, Any] | None]:
        """Publish the requested event on the condition that the execution is not decided yet; answer
        with what was decided if it is. A request too large to record is rejected instead."""
        data = encode(requested)
        if len(data) + HEADER_ROOM > self.nc.max_payload:
            # The server would refuse the event: reject the request (its rejection is small) instead.
            too_large = ErrorInfo(
                kind="bad_request",
                message=f"request too large: recorded, it is {len(data)} bytes and the server takes at "
                f"most {self.nc.max_payload - HEADER_ROOM} (register a large playbook in the catalog, pass large inputs "
                "by reference)",
            ).to_dict()
            return await self._reject_new(execution_id, too_large, trace_id=requested.trace_id)
        outbox = Outbox(self.js, self.topology)
        outbox.event(requested, data, new_on=self.topology.execution_claim_filter(execution_id))
        try:
            await outbox.flush()
        except AlreadyStoredError:
            # Decided already: by an earlier submission or delivery of this id, by a request racing this
            # one, or by an attempt of this flush whose ack was lost.
            return await self._recorded(execution_id)
        if error is not None:
            # The request event says so (`rejected`): the controller writes the rejection when it folds
            # that event, whatever happens to this process now.
            log.warning("intake.rejected", execution_id=execution_id, error=error.get("message"))
        return execution_id, error

    async def _reject_new(
        self,
        execution_id: str,
        error: dict[str, Any],
        entity_id: str = "<request>",
        trace_id: str | None = None,
    ) -> tuple[str, dict[str, Any] | None]:
        """Reject a request whose execution is not decided yet; answer with what was decided if it is."""
        rejected, processed = rejection_events(execution_id, entity_id, error, trace_id)
        outbox = Outbox(self.js, self.topology)
        outbox.event(rejected, new_on=self.topology.execution_claim_filter(execution_id))
        try:
            await outbox.flush()
        except AlreadyStoredError:
            return await self._recorded(execution_id)
        outbox.event(processed)
        await outbox.flush()
        log.warning("intake.rejected", execution_id=execution_id, error=error.get("message"))
        return execution_id, error

    async def _recorded(self, execution_id: str) -> tuple[str, dict[str, Any] | None]:
        """The answer for a request whose execution was decided before it: ``None`` if it was accepted,
        else its rejection. A rejection intake wrote without its ``playbook.processed`` (it stopped in
        between) is completed: the retry or redelivery of its request is what comes here then. (A
        request carrying ``rejected`` is completed by the controller, which folds it.)"""
        requested = await self._last(execution_id, E.EXECUTION_REQUESTED)
        if requested is not None:
            error = requested.payload.get("rejected")
            return execution_id, self._as_recorded(execution_id, error) if isinstance(error, dict) else None
        rejected = await self._last(execution_id, E.REQUEST_REJECTED)
        if rejected is not None and isinstance(error := rejected.payload.get("error"), dict):
            if await self._last(execution_id, E.PLAYBOOK_PROCESSED) is None:
                _, processed = rejection_events(execution_id, rejected.entity_id, error, rejected.trace_id)
                outbox = Outbox(self.js, self.topology)
                outbox.event(processed)
                await outbox.flush()
            return execution_id, self._as_recorded(execution_id, error)
        # Its first records expired (after the events stream's max_age) while later ones are kept.
        last = await self._last(execution_id, E.PLAYBOOK_PROCESSED)
        if last is not None:
            error = last.payload.get("error")
            if last.payload.get("status") == "rejected" and isinstance(error, dict):
                return execution_id, self._as_recorded(execution_id, error)
            return execution_id, None
        if await self._last(execution_id, E.REQUEST_EVALUATED) is not None:
            return execution_id, None
        if await self._claimed(execution_id):
            # Its record is not one intake reads (not an event, or none of these names): anyone who may
            # publish on the events subjects can store one. It holds the id for good and a retry would meet
            # it again (a request redelivered every second, for ever): refuse the id.
            message = (
                f"bad request: execution id {execution_id!r} is taken by a stored message that is not a "
                "noetl record of an execution (see the controller's log): give another id"
            )
            log.warning("intake.rejected", execution_id=execution_id, error=message)
            return execution_id, ErrorInfo(kind="bad_request", message=message).to_dict()
        # Nothing left (purged or expired between the refusal and these reads): its next attempt decides.
        raise StateConflictError(f"execution {execution_id}: its records changed while read; retry")

    async def _claimed(self, execution_id: str) -> bool:
        """Whether the execution has any ``playbook.*`` record stored."""
        try:
            await self.js.get_last_msg(
                self.topology.events_stream, self.topology.execution_claim_filter(execution_id)
            )
        except NotFoundError:
            return False
        return True

    @staticmethod
    def _as_recorded(execution_id: str, error: dict[str, Any]) -> dict[str, Any]:
        message = f"execution {execution_id!r} is recorded as rejected: {error.get('message')}"
        return {**error, "message": _short(message)}

    async def _last(self, execution_id: str, name: str) -> Event | None:
        """The execution's last stored event of one name, or None."""
        return await last_event(self.js, self.topology, execution_id, name)

    async def _check_playbook(self, request: ExecutionRequest) -> dict[str, Any] | None:
        """Compile the playbook (cached by content) so a caller learns at once that it is invalid. A large
        one is compiled in a thread: seconds of parsing would hold up the controller (its leases expire)."""
        assert request.playbook is not None
        digest = plan_key(request.playbook, request.extensions)
        if digest not in self._checked:
            self._remember(digest, await self._compile(request))
        error, steps = self._checked[digest]
        if error is None and request.return_step is not None and request.return_step not in steps:
            message = f"bad request: 'return_step' {request.return_step!r} is not a step of the playbook"
            return ErrorInfo(kind="bad_request", message=_short(message)).to_dict()
        return error

    async def _compile(self, request: ExecutionRequest) -> tuple[dict[str, Any] | None, frozenset[str]]:
        assert request.playbook is not None
        file = request.file or request.path or "<playbook>"
        # Into the reducer's cache: folding this request, it finds the plan compiled.
        plan, diagnostics = await load_off_loop(self.plans, request.playbook, file, request.extensions)
        if plan is None:
            return invalid_playbook_error(diagnostics), frozenset()
        return None, frozenset(step.name for step in plan.playbook.workflow)

    def _remember(self, digest: str, checked: tuple[dict[str, Any] | None, frozenset[str]]) -> None:
        if len(self._checked) >= 1024:
            self._checked.pop(next(iter(self._checked)))
        self._checked[digest] = checked
