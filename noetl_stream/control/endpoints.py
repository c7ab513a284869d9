"""Query and catalog endpoints of the ``noetl`` micro service (execute/cancel/pause/resume are intake's).

Every endpoint takes and answers JSON (``schemas/api/<endpoint>.request|reply.schema.json``); a
refusal is a service error (``Nats-Service-Error-Code`` 400 or 404) whose body is ``{error, detail}``::

    nats req noetl.api.status '{"execution_id": "..."}'
    nats req noetl.api.events '{"execution_id": "...", "after": 0, "limit": 100}'
    nats req noetl.api.ctx '{"execution_id": "..."}'
    nats req noetl.api.executions '{"status": "failed", "limit": 20}'
    nats req noetl.api.catalog.register '{"playbook": "<yaml text>"}'
    nats req noetl.api.catalog.list '{}'
    nats req noetl.api.catalog.show '{"path": "examples/hello", "version": "2"}'
    nats req noetl.api.catalog.delete '{"path": "examples/hello", "version": "2"}'
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
import structlog
from nats.micro.request import Request
from nats.micro.service import EndpointConfig, Service

from noetl_stream.control.inspect import Inspector, QueryError
from noetl_stream.errors import NoetlError
from noetl_stream.kv.catalog import Catalog, CatalogConflictError, CatalogError, CatalogNotFoundError
from noetl_stream.protocol.operations import (
    CatalogDeleted,
    CatalogList,
    CatalogListRequest,
    CatalogPlaybook,
    CatalogRef,
    CatalogRegister,
    ErrorReply,
    EventsRequest,
    ExecutionRef,
    ListExecutions,
)
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import decode_json

__all__ = [
    "ENDPOINTS",
    "MAX_SEQ",
    "ApiError",
    "QueryEndpoints",
    "internal_error",
    "respond_error",
]

log = structlog.get_logger(__name__)

Req = TypeVar("Req", bound=msgspec.Struct)


class ApiError(NoetlError):
    """A refusal with a status code (``400``, ``404``, ``409``) and an ``{error, detail}`` body."""

    def __init__(self, code: int, error: str, detail: str, diagnostics: list[str] | None = None) -> None:
        super().__init__(detail)
        self.code = code
        self.reply = ErrorReply(error=error, detail=detail, diagnostics=diagnostics or [])


async def respond_error(req: Request, err: ApiError) -> None:
    await req.respond_error(str(err.code), err.reply.detail, msgspec.json.encode(err.reply))


MAX_SEQ = 2**63 - 2
"""The largest stream sequence a caller may give as ``after`` (the server's sequences are 64-bit)."""


def decode(raw: bytes, type_: type[Req]) -> Req:
    try:
        return decode_json(raw or b"{}", type_)
    except msgspec.DecodeError as exc:  # ValidationError, invalid UTF-8, JSON nested too deeply included
        raise ApiError(400, "bad_request", f"bad request: {exc}") from None


def internal_error(exc: Exception, endpoint: str) -> ApiError:
    """A failure of the controller, not of the request (a bucket missing, NATS not answering): logged, and
    answered as a 500 with the error's type (its message may say more than a caller should see)."""
    log.error("api.endpoint_failed", endpoint=endpoint, error=type(exc).__name__, exc_info=exc)
    return ApiError(500, "internal", f"{type(exc).__name__}: the controller could not handle this request")


def catalog_error(exc: Exception, invalid: str = "invalid_playbook") -> ApiError:
    """The refusal of a catalog error; `invalid` is the kind of a `CatalogError`: the playbook's (register)
    or the caller's path or version (``bad_request``)."""
    if isinstance(exc, CatalogNotFoundError):
        return ApiError(404, "not_found", str(exc))
    if isinstance(exc, CatalogConflictError):
        return ApiError(409, "conflict", str(exc))
    if isinstance(exc, CatalogError):
        return ApiError(400, invalid, str(exc), exc.diagnostics)
    raise exc


ENDPOINTS: dict[str, tuple[str, type[msgspec.Struct], str]] = {
    # micro endpoint name -> (subject suffix after <prefix>.api., request type, reply type name)
    "status": ("status", ExecutionRef, "ExecutionSummary"),
    "events": ("events", EventsRequest, "EventsPage"),
    "ctx": ("ctx", ExecutionRef, "CtxReply"),
    "executions": ("executions", ListExecutions, "ExecutionList"),
    "catalog-register": ("catalog.register", CatalogRegister, "CatalogEntryInfo"),
    "catalog-list": ("catalog.list", CatalogListRequest, "CatalogList"),
    "catalog-show": ("catalog.show", CatalogRef, "CatalogPlaybook"),
    "catalog-delete": ("catalog.delete", CatalogRef, "CatalogDeleted"),
}


class QueryEndpoints:
    def __init__(self, inspector: Inspector, catalog: Catalog, topology: Topology) -> None:
        self.inspector = inspector
        self.catalog = catalog
        self.topology = topology

    async def add_to(self, service: Service) -> None:
        handlers: dict[str, Callable[[bytes], Awaitable[msgspec.Struct]]] = {
            "status": self.status,
            "events": self.events,
            "ctx": self.ctx,
            "executions": self.executions,
            "catalog-register": self.catalog_register,
            "catalog-list": self.catalog_list,
            "catalog-show": self.catalog_show,
            "catalog-delete": self.catalog_delete,
        }
        for name, (suffix, request_type, reply_type) in ENDPOINTS.items():
            await service.add_endpoint(
                EndpointConfig(
                    name=name,
                    subject=self.topology.api_subject(suffix),
                    handler=self._wrap(name, handlers[name]),
                    metadata={
                        "request_schema": f"schemas/api/{request_type.__name__}.schema.json",
                        "reply_schema": f"schemas/api/{reply_type}.schema.json",
                    },
                )
            )

    @staticmethod
    def _wrap(name: str, handler: Callable[[bytes], Awaitable[msgspec.Struct]]) -> Any:
        async def handle(req: Request) -> None:
            try:
                reply = await handler(req.data)
            except ApiError as err:
                await respond_error(req, err)
                return
            except QueryError as exc:
                await respond_error(req, ApiError(400, "bad_request", f"bad request: {exc}"))
                return
            except Exception as exc:
                await respond_error(req, internal_error(exc, name))
                return
            await req.respond(msgspec.json.encode(reply))

        return handle

    # -- executions -----------------------------------------------------------------------------
    async def status(self, raw: bytes) -> msgspec.Struct:
        ref = decode(raw, ExecutionRef)
        summary = await self.inspector.status(ref.execution_id)
        if summary is None:
            raise ApiError(404, "not_found", f"no execution {ref.execution_id}")
        return summary

    async def events(self, raw: bytes) -> msgspec.Struct:
        query = decode(raw, EventsRequest)
        if not 0 <= query.after <= MAX_SEQ:
            raise ApiError(400, "bad_request", f"bad request: 'after' must be between 0 and {MAX_SEQ}")
        page = await self.inspector.events(query.execution_id, query.after, query.limit)
        if page is None:
            raise ApiError(404, "not_found", f"no execution {query.execution_id}")
        return page

    async def ctx(self, raw: bytes) -> msgspec.Struct:
        ref = decode(raw, ExecutionRef)
        reply = await self.inspector.ctx(ref.execution_id)
        if reply is None:
            raise ApiError(404, "not_found", f"no execution {ref.execution_id}")
        return reply

    async def executions(self, raw: bytes) -> msgspec.Struct:
        return await self.inspector.executions(decode(raw, ListExecutions))

    # -- catalog --------------------------------------------------------------------------------
    async def catalog_register(self, raw: bytes) -> msgspec.Struct:
        body = decode(raw, CatalogRegister)
        try:
            entry, _ = await self.catalog.register(body.playbook)
        except (CatalogError, CatalogConflictError) as exc:
            raise catalog_error(exc) from None
        return entry

    async def catalog_list(self, raw: bytes) -> msgspec.Struct:
        query = decode(raw, CatalogListRequest)
        try:
            return CatalogList(items=await self.catalog.list(query.path))
        except CatalogError as exc:
            raise catalog_error(exc, "bad_request") from None

    async def catalog_show(self, raw: bytes) -> msgspec.Struct:
        ref = decode(raw, CatalogRef)
        try:
            entry, text = await self.catalog.resolve(ref.path, ref.version)
        except (CatalogError, CatalogNotFoundError) as exc:
            raise catalog_error(exc, "bad_request") from None
        return CatalogPlaybook(entry=entry, playbook=text)

    async def catalog_delete(self, raw: bytes) -> msgspec.Struct:
        ref = decode(raw, CatalogRef)
        try:
            versions = await self.catalog.delete(ref.path, ref.version)
        except (CatalogError, CatalogNotFoundError) as exc:
            raise catalog_error(exc, "bad_request") from None
        return CatalogDeleted(path=ref.path, versions=versions)
