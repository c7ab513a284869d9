"""JSON Schemas of the wire types and of the operator API's bodies, published in ``schemas/`` and
``schemas/api/`` (a test keeps them in sync).

python -m noetl_stream.protocol.schemas schemas/
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from noetl_stream.protocol import operations as ops
from noetl_stream.protocol.wire import Command, Event, ExecutionRequest

WIRE_SCHEMAS: dict[str, type[msgspec.Struct]] = {
    "request": ExecutionRequest,
    "command": Command,
    "event": Event,
}


# Request and reply bodies of the `noetl` micro service endpoints (and the REST routes), by name.
API_SCHEMAS: dict[str, type[msgspec.Struct]] = {
    t.__name__: t
    for t in (
        ops.ErrorReply,
        ops.ExecuteReply,
        ops.ControlRequest,
        ops.ControlAccepted,
        ops.ExecutionRef,
        ops.ExecutionSummary,
        ops.ListExecutions,
        ops.ExecutionList,
        ops.EventsRequest,
        ops.EventsPage,
        ops.CtxReply,
        ops.CatalogRegister,
        ops.CatalogEntryInfo,
        ops.CatalogListRequest,
        ops.CatalogList,
        ops.CatalogRef,
        ops.CatalogPlaybook,
        ops.CatalogDeleted,
    )
}


def wire_schema(name: str) -> dict[str, Any]:
    schema = msgspec.json.schema(WIRE_SCHEMAS[name])
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://noetl.io/schemas/noetl-stream/{name}.schema.json"
    return schema


def api_schema(name: str) -> dict[str, Any]:
    schema = msgspec.json.schema(API_SCHEMAS[name])
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://noetl.io/schemas/noetl-stream/api/{name}.schema.json"
    return schema


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write_all(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in WIRE_SCHEMAS:
        path = directory / f"{name}.schema.json"
        path.write_text(render(wire_schema(name)), encoding="utf-8")
        written.append(path)
    (directory / "api").mkdir(exist_ok=True)
    for name in API_SCHEMAS:
        path = directory / "api" / f"{name}.schema.json"
        path.write_text(render(api_schema(name)), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    for p in write_all(Path(sys.argv[1] if len(sys.argv) > 1 else "schemas")):
        print(p)
