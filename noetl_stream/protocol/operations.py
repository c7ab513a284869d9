"""Request and reply bodies of the operator API: the ``noetl`` micro service and the REST edge.

Both speak these msgspec Structs as JSON; ``schemas/api/*.schema.json`` and the components of
``schemas/openapi.yaml`` are generated from them (``python -m noetl_stream.protocol.schemas schemas/``).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from noetl_stream.protocol.wire import Event

__all__ = [
    "CatalogDeleted",
    "CatalogEntryInfo",
    "CatalogList",
    "CatalogListRequest",
    "CatalogPlaybook",
    "CatalogRef",
    "CatalogRegister",
    "ControlAccepted",
    "ControlRequest",
    "CtxReply",
    "ErrorReply",
    "EventRecord",
    "EventsPage",
    "EventsRequest",
    "ExecuteReply",
    "ExecutionList",
    "ExecutionRef",
    "ExecutionSummary",
    "HealthReply",
    "KeychainItem",
    "KeychainList",
    "KeychainPut",
    "ListExecutions",
    "ReadyReply",
]

MAX_PAGE = 1000


class ErrorReply(msgspec.Struct, omit_defaults=True):
    """Every refusal: a short machine-readable ``error`` and a human ``detail``."""

    error: str
    detail: str
    execution_id: str | None = None
    diagnostics: list[str] = []


class ExecuteReply(msgspec.Struct, omit_defaults=True):
    execution_id: str


class ExecutionRef(msgspec.Struct, forbid_unknown_fields=True):
    execution_id: str


class ControlRequest(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Cancel, pause or resume one execution (``reason`` is recorded with a cancellation)."""

    execution_id: str
    reason: str | None = None


class ControlAccepted(msgspec.Struct):
    execution_id: str
    accepted: str
    """The event recorded for the controller: ``execution.cancel.requested``, ..."""


class ExecutionSummary(msgspec.Struct, omit_defaults=True):
    """What an operator sees of one execution (the controller's projection, without results)."""

    execution_id: str
    status: str
    """``pending`` (requested, not folded yet), ``running``, ``success``, ``failed``, ``cancelled``,
    ``rejected``."""
    source: Literal["live", "snapshot", "stream"]
    """Where this view comes from: the controller's memory, its KV snapshot, or the events stream."""
    name: str = ""
    path: str = ""
    file: str = ""
    content_hash: str = ""
    paused: bool = False
    steps: dict[str, str] = {}
    error: dict[str, Any] | None = None
    parent_execution_id: str | None = None
    last_seq: int = 0
    events_applied: int = 0
    updated_at: str | None = None
    """When this projection was last written (the snapshot's time; now for a live state)."""
    started_at: str | None = None
    """When it was requested (its ``playbook.execution.requested``)."""
    finished_at: str | None = None
    """When it ended (absent while it runs)."""
    duration_s: float | None = None
    """From ``started_at`` to ``finished_at`` (absent while it runs)."""
    retry_of: str | None = None
    """The execution this one retries."""
    retried_by: list[str] = []
    """The executions that retry this one, newest start first (set by the list, which reads them all)."""


class ListExecutions(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Filters and page of the executions list (newest update first, or newest start first)."""

    status: str | None = None
    playbook: str | None = None
    """Matches the playbook's ``metadata.path`` or ``metadata.name``."""
    since: str | None = None
    """ISO-8601: only executions updated at or after this time."""
    until: str | None = None
    offset: int = 0
    limit: int = 50
    q: str | None = None
    """Only executions whose id contains this text (any case)."""
    retry_of: str | None = None
    """Only the retries of this execution."""
    order: Literal["updated", "started"] = "updated"
    """``updated``: newest update first; ``started``: newest start first (a running execution keeps its
    place, so a cursor pages through a list that changes without skipping or repeating a row)."""
    cursor: str | None = None
    """The previous page's ``next_cursor``: the page after its last row (``offset`` is then ignored)."""


class ExecutionList(msgspec.Struct, omit_defaults=True):
    items: list[ExecutionSummary]
    total: int
    """How many executions match the filters."""
    offset: int
    limit: int
    next_cursor: str | None = None
    """Pass as ``cursor`` for the next page; absent on the last page."""


class EventsRequest(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    execution_id: str
    after: int = 0
    """Stream sequence to read after (the previous page's ``next_after``)."""
    limit: int = 100


class EventRecord(msgspec.Struct):
    seq: int
    event: Event


class EventsPage(msgspec.Struct, omit_defaults=True):
    execution_id: str
    events: list[EventRecord]
    next_after: int | None = None
    """Pass as ``after`` for the next page; absent when this page reached the end."""


class CtxReply(msgspec.Struct):
    execution_id: str
    ctx: dict[str, Any]
    revision: int


class CatalogRegister(msgspec.Struct, forbid_unknown_fields=True):
    playbook: str
    """The playbook's YAML text; path and version come from its ``metadata``."""


class CatalogRef(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    path: str
    version: str | None = None
    """A version, or ``latest`` (the default)."""


class CatalogEntryInfo(msgspec.Struct, omit_defaults=True):
    path: str
    version: str
    content_hash: str
    name: str
    size: int
    registered_at: str
    storage: Literal["kv", "object_store"] = "kv"
    latest: bool = False
    description: str | None = None


class CatalogPlaybook(msgspec.Struct, omit_defaults=True):
    entry: CatalogEntryInfo
    playbook: str


class CatalogList(msgspec.Struct):
    items: list[CatalogEntryInfo]


class CatalogListRequest(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    path: str | None = None


class CatalogDeleted(msgspec.Struct):
    path: str
    versions: list[str]


class KeychainItem(msgspec.Struct):
    """A credential's name and kind: never its fields' values."""

    name: str
    kind: str


class KeychainList(msgspec.Struct):
    items: list[KeychainItem]


class KeychainPut(msgspec.Struct, forbid_unknown_fields=True):
    kind: str
    fields: dict[str, str | int | float | bool]


class HealthReply(msgspec.Struct):
    status: str


class ReadyReply(msgspec.Struct, omit_defaults=True):
    status: Literal["ready", "not_ready"]
    nats: bool
    streams: dict[str, bool] = {}
    detail: str | None = None
