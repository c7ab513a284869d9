"""The route table: what the app serves and what ``schemas/openapi.yaml`` documents, in one place."""

from __future__ import annotations

import msgspec

from noetl_stream.api import executions as ex
from noetl_stream.api import pages, probes
from noetl_stream.api import resources as res
from noetl_stream.api.graph import ExecutionGraph, execution_graph
from noetl_stream.api.http import Handler, Param, Route
from noetl_stream.api.steps import MAX_ITERATIONS_PAGE, StepDetail, step_detail
from noetl_stream.control.inspect import STATUSES
from noetl_stream.protocol.operations import (
    MAX_PAGE,
    CatalogDeleted,
    CatalogEntryInfo,
    CatalogList,
    CatalogPlaybook,
    CatalogRegister,
    ControlAccepted,
    CtxReply,
    EventsPage,
    ExecuteReply,
    ExecutionList,
    ExecutionSummary,
    HealthReply,
    KeychainItem,
    KeychainList,
    KeychainPut,
    ReadyReply,
)
from noetl_stream.protocol.wire import ExecutionRequest

__all__ = ["ROUTES"]

_ID = Param(
    "execution_id",
    "path",
    {"type": "string", "pattern": "^[A-Za-z0-9_-]+$"},
    "Execution id (letters, digits, '_' or '-')",
    required=True,
)
_NAME = Param("name", "path", {"type": "string"}, "Keychain entry name", required=True)
_PAGE = (
    Param("offset", schema={"type": "integer", "minimum": 0, "default": 0}),
    Param("limit", schema={"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": 50}),
)
_STATUSES = list(STATUSES)
_CATALOG_REF = (
    Param("path", schema={"type": "string", "minLength": 1}, description="Playbook path", required=True),
    Param("version", schema={"type": "string"}, description="A version or 'latest' (default)"),
)


def _execution_route(
    method: str,
    action: str,
    handler: Handler,
    operation_id: str,
    summary: str,
    reply: type[msgspec.Struct] | None,
    status: int = 200,
    *,
    params: tuple[Param, ...] = (),
    body: type[msgspec.Struct] | None = None,
    body_required: bool = True,
    stream: str | None = None,
    errors: tuple[int, ...] = (400, 404),
) -> Route:
    """A route on one execution, ``/api/executions/{execution_id}[/action]``: 400 for a malformed id,
    404 for an unknown one."""
    return Route(
        method,
        "/api/executions/{execution_id}" + (f"/{action}" if action else ""),
        handler,
        operation_id,
        summary,
        reply,
        status,
        (_ID, *params),
        body=body,
        body_required=body_required,
        errors=errors,
        stream=stream,
        tags=("executions",),
    )


def _control_route(action: str, summary: str) -> Route:
    return _execution_route(
        "POST",
        action,
        ex.control(action),
        f"{action}Execution",
        summary,
        ControlAccepted,
        202,
        body=ex.ControlBody,
        body_required=False,
        errors=(400, 404, 409),  # 409: the execution has finished
    )


def _viewer_route(
    path: str,
    handler: Handler,
    operation_id: str,
    summary: str,
    content_type: str,
    *,
    params: tuple[Param, ...] = (),
    errors: tuple[int, ...] = (),
) -> Route:
    """A static page or asset of the execution viewer, served without a token."""
    return Route(
        "GET",
        path,
        handler,
        operation_id,
        summary,
        params=params,
        errors=errors,
        auth=False,
        content_type=content_type,
        tags=("viewer",),
    )


ROUTES: tuple[Route, ...] = (
    Route(
        "POST",
        "/api/executions",
        ex.submit,
        "startExecution",
        "Start an execution from playbook text or a catalog path (+ version)",
        ExecuteReply,
        201,
        body=ExecutionRequest,
        errors=(400, 404, 422),
        tags=("executions",),
    ),
    Route(
        "GET",
        "/api/executions",
        ex.list_executions,
        "listExecutions",
        "List executions (newest update or start first), filtered by status, playbook, update time, id "
        "text or the execution retried; paged by offset or by cursor",
        ExecutionList,
        params=(
            Param("status", schema={"type": "string", "enum": _STATUSES}),
            Param("playbook", description="Playbook metadata.path or metadata.name"),
            Param(
                "since", schema={"type": "string", "format": "date-time"}, description="Updated at or after"
            ),
            Param(
                "until", schema={"type": "string", "format": "date-time"}, description="Updated at or before"
            ),
            Param("q", description="Only executions whose id contains this text (any case)"),
            Param("retry_of", schema=_ID.schema, description="Only the retries of this execution"),
            Param(
                "order",
                schema={"type": "string", "enum": ["updated", "started"], "default": "updated"},
                description="Newest update first, or newest start first (stable while executions run)",
            ),
            Param(
                "cursor",
                description="A page's next_cursor: the page after it (offset is then ignored)",
            ),
            *_PAGE,
        ),
        tags=("executions",),
    ),
    _execution_route(
        "GET", "", ex.show, "getExecution", "An execution's status, step by step", ExecutionSummary
    ),
    _execution_route(
        "GET",
        "events",
        ex.events,
        "listExecutionEvents",
        "An execution's events in stream order: a page, or with follow=1 a server-sent event stream "
        "that ends after playbook.processed (resume with Last-Event-ID)",
        EventsPage,
        params=(
            Param(
                "after", schema={"type": "integer", "minimum": 0, "default": 0}, description="Stream sequence"
            ),
            Param("limit", schema={"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": 100}),
            Param(
                "follow", schema={"type": "string", "enum": ["0", "1"]}, description="1: server-sent events"
            ),
        ),
        stream="text/event-stream",
    ),
    _execution_route(
        "GET",
        "graph",
        execution_graph,
        "getExecutionGraph",
        "An execution's step graph (steps, arcs, a layered layout) with each step's status, timings, "
        "loop progress and retries, folded from its events (the viewer's data)",
        ExecutionGraph,
    ),
    _execution_route(
        "GET", "ctx", ex.ctx, "getExecutionCtx", "An execution's ctx and its revision", CtxReply
    ),
    _execution_route(
        "GET",
        "steps/{step}",
        step_detail,
        "getExecutionStep",
        "One step in detail (the viewer's step panel): each run with its args, worker, timings, result "
        "(or its stored reference) and error, its task runs (attempts, the args each ran with, result, "
        "error with its traceback) and a page of a loop's iterations",
        StepDetail,
        params=(
            Param("step", "path", {"type": "string"}, "Step name", required=True),
            Param(
                "offset",
                schema={"type": "integer", "minimum": 0, "default": 0},
                description="First loop iteration of the page (by index order)",
            ),
            Param(
                "limit",
                schema={"type": "integer", "minimum": 1, "maximum": MAX_ITERATIONS_PAGE, "default": 100},
                description="Loop iterations per page",
            ),
        ),
    ),
    _execution_route(
        "GET",
        "result",
        ex.stored_result,
        "getStoredResult",
        "A value the runtime stored by reference for this execution (a reference's key, and its "
        "checksum to verify it)",
        ex.StoredResult,
        params=(
            Param(
                "key",
                schema={"type": "string", "minLength": 1},
                description="The reference's key (<execution_id>/...)",
                required=True,
            ),
            Param("checksum", description="The reference's checksum (sha256:...); 409 when it differs"),
        ),
        errors=(400, 404, 409),
    ),
    _execution_route(
        "POST",
        "retry",
        ex.retry,
        "retryExecution",
        "Retry an ended execution in a new one: from its failed or interrupted steps, or from the steps "
        "given, reusing the results and ctx of what succeeded (409 when it still runs or has nothing to "
        "retry)",
        ExecuteReply,
        201,
        body=ex.RetryBody,
        body_required=False,
        errors=(400, 404, 409, 422),
    ),
    _control_route("cancel", "Cancel an execution: nothing new is scheduled, running steps stop"),
    _control_route("pause", "Pause an execution: running steps finish, nothing new starts"),
    _control_route("resume", "Resume a paused execution"),
    Route(
        "GET",
        "/api/catalog",
        res.catalog_list,
        "listCatalog",
        "Registered playbooks (every version), optionally of one path",
        CatalogList,
        params=(Param("path", description="Only the versions of this path"),),
        tags=("catalog",),
    ),
    Route(
        "POST",
        "/api/catalog",
        res.catalog_register,
        "registerPlaybook",
        "Register a playbook under its metadata.path and version (201 new, 200 already registered)",
        CatalogEntryInfo,
        201,
        body=CatalogRegister,
        text_body="application/yaml",
        errors=(400, 409),
        tags=("catalog",),
    ),
    Route(
        "GET",
        "/api/catalog/playbook",
        res.catalog_show,
        "getPlaybook",
        "One registered version with its text",
        CatalogPlaybook,
        params=_CATALOG_REF,
        errors=(400, 404),
        tags=("catalog",),
    ),
    Route(
        "DELETE",
        "/api/catalog/playbook",
        res.catalog_delete,
        "deletePlaybook",
        "Delete one version, or every version when none is given",
        CatalogDeleted,
        params=_CATALOG_REF,
        errors=(400, 404),
        tags=("catalog",),
    ),
    Route(
        "GET",
        "/api/keychain",
        res.keychain_list,
        "listKeychain",
        "Credential names and kinds (never values)",
        KeychainList,
        errors=(503,),
        tags=("keychain",),
    ),
    Route(
        "GET",
        "/api/keychain/{name}",
        res.keychain_show,
        "getKeychainEntry",
        "A credential's name and kind (never values)",
        KeychainItem,
        params=(_NAME,),
        errors=(400, 404, 503),
        tags=("keychain",),
    ),
    Route(
        "PUT",
        "/api/keychain/{name}",
        res.keychain_put,
        "putKeychainEntry",
        "Create or replace a credential (write-only; 503 when this process has no keychain key)",
        KeychainItem,
        params=(_NAME,),
        body=KeychainPut,
        errors=(400, 503),
        tags=("keychain",),
    ),
    Route(
        "DELETE",
        "/api/keychain/{name}",
        res.keychain_delete,
        "deleteKeychainEntry",
        "Delete a credential",
        None,
        204,
        params=(_NAME,),
        errors=(400, 404, 503),
        tags=("keychain",),
    ),
    Route(
        "GET",
        "/api/session",
        probes.session,
        "getSession",
        "What the request's token may do: read (the GET routes) or also operate (every route); "
        "a read-only token's other calls answer 403",
        probes.SessionReply,
        errors=(),
        tags=("session",),
    ),
    Route(
        "GET",
        "/health",
        probes.health,
        "health",
        "The process is up (no authentication)",
        HealthReply,
        errors=(),
        auth=False,
        tags=("probes",),
    ),
    Route(
        "GET",
        "/ready",
        probes.ready,
        "ready",
        "NATS is reachable and the streams exist (503 if not)",
        ReadyReply,
        errors=(503,),
        tags=("probes",),
    ),
    Route(
        "GET",
        "/metrics",
        probes.metrics,
        "metrics",
        "Prometheus metrics (text exposition format)",
        None,
        errors=(404,),
        content_type="text/plain",
        tags=("probes",),
    ),
    _viewer_route(
        "/ui",
        pages.list_page,
        "viewerExecutions",
        "The execution viewer: the list of executions (a static page; its data calls need the token). "
        "Its filters are in the address, so a filtered list can be linked to",
        "text/html",
        params=(  # read by the page's script, which ignores a value it does not know
            Param("status", description="Execution status (as listExecutions takes it)"),
            Param("playbook", description="Playbook metadata.path or metadata.name"),
            Param("q", description="Execution id text"),
            Param("limit", description="Rows per page: 10, 25, 50, 100 or 200"),
        ),
        errors=(400,),  # another query parameter
    ),
    _viewer_route(
        "/ui/executions/{execution_id}",
        pages.execution_page,
        "viewerExecution",
        "The execution viewer: one execution's step graph, live, and its event timeline (a static page)",
        "text/html",
        params=(_ID,),
        errors=(400,),
    ),
    _viewer_route(
        "/ui/static/viewer.js", pages.script, "viewerScript", "The viewer's script", "text/javascript"
    ),
    _viewer_route(
        "/ui/static/viewer.css", pages.stylesheet, "viewerStylesheet", "The viewer's stylesheet", "text/css"
    ),
    _viewer_route(
        "/ui/static/vendor/dagre.min.js",
        pages.dagre,
        "viewerDagre",
        "The graph layout library the viewer uses (@dagrejs/dagre, vendored, MIT)",
        "text/javascript",
    ),
)
