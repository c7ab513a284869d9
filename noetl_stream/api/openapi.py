"""The OpenAPI 3.1 document of the REST API, generated from `ROUTES` and the operation Structs.

python -m noetl_stream.api.openapi schemas/openapi.yaml
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import msgspec
from ruamel.yaml import YAML

from noetl_stream import __version__
from noetl_stream.api.app import READ_METHODS
from noetl_stream.api.http import JSON, Route
from noetl_stream.api.routes import ROUTES
from noetl_stream.protocol.operations import ErrorReply

__all__ = ["document", "render"]

_REF = "#/components/schemas/{name}"
_DESCRIPTIONS = {
    400: "Malformed request",
    401: "Missing or wrong bearer token",
    403: "The token may only read (a read-only token: GET routes only)",
    404: "No such execution, playbook or entry",
    409: "Conflicts with what is stored: a version registered with other content, an execution that has finished",
    415: "The body is not sent as a content type the route takes (application/json; a form or text/plain is refused)",
    422: "The playbook does not compile (the rejection is recorded under execution_id)",
    503: "NATS, a stream or the keychain key is unavailable",
}


def _types() -> list[type[msgspec.Struct]]:
    out: list[type[msgspec.Struct]] = [ErrorReply]
    for route in ROUTES:
        for t in (route.reply, route.body):
            if t is not None and t not in out:
                out.append(t)
    return out


def _ref(t: type[msgspec.Struct]) -> dict[str, Any]:
    return {"$ref": _REF.format(name=t.__name__)}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": _ref(ErrorReply)}}}


def _operation(route: Route) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": route.operation_id,
        "summary": route.summary,
        "tags": list(route.tags),
    }
    if route.params:
        op["parameters"] = [
            {
                "name": p.name,
                "in": p.where,
                "required": p.required or p.where == "path",
                "schema": p.schema,
                **({"description": p.description} if p.description else {}),
            }
            for p in route.params
        ]
    if route.body is not None:
        content: dict[str, Any] = {JSON: {"schema": _ref(route.body)}}
        if route.text_body:
            content[route.text_body] = {"schema": {"type": "string"}}
        op["requestBody"] = {"required": route.body_required, "content": content}
    responses: dict[str, Any] = {}
    if route.reply is None and route.content_type == JSON:
        responses[str(route.status)] = {"description": "Done (no content)"}
    elif route.reply is None:
        responses[str(route.status)] = {
            "description": "OK",
            "content": {route.content_type: {"schema": {"type": "string"}}},
        }
    else:
        content = {JSON: {"schema": _ref(route.reply)}}
        if route.stream:
            content[route.stream] = {"schema": {"type": "string"}}
        responses[str(route.status)] = {"description": "OK", "content": content}
        if route.operation_id == "registerPlaybook":
            responses["200"] = {
                "description": "Already registered",
                "content": {JSON: {"schema": _ref(route.reply)}},
            }
        if route.operation_id == "ready":
            responses["503"] = {"description": "Not ready", "content": {JSON: {"schema": _ref(route.reply)}}}
    for code in (*route.errors, *((415,) if route.body is not None else ())):
        responses.setdefault(str(code), _error(_DESCRIPTIONS.get(code, "Refused")))
    if route.auth:
        responses["401"] = _error(_DESCRIPTIONS[401])
        if route.method not in READ_METHODS:
            responses["403"] = _error(_DESCRIPTIONS[403])
    else:
        op["security"] = []
    op["responses"] = dict(sorted(responses.items()))
    return op


def document() -> dict[str, Any]:
    _, components = msgspec.json.schema_components(_types(), ref_template=_REF)
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "noetl-stream",
            "version": __version__,
            "description": "Operator REST API of the noetl-stream controller (`noetl-stream controller --http`). "
            "Every route but /health and the viewer's static pages (/ui...) needs "
            "`Authorization: Bearer <token>`; a read-only token may call the GET routes only (403 for the "
            "others; GET /api/session says what a token may do); every refusal is a 4xx "
            "(503 when a dependency is unavailable) with an `{error, detail}` body.",
        },
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": dict(sorted(components.items())),
        },
    }


def render(doc: dict[str, Any] | None = None) -> str:
    yaml = YAML()
    yaml.default_flow_style = False
    yaml.width = 4096
    out = io.StringIO()
    out.write("# Generated by `python -m noetl_stream.api.openapi schemas/openapi.yaml`; do not edit.\n")
    yaml.dump(doc if doc is not None else document(), out)
    return out.getvalue()


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "schemas/openapi.yaml")
    target.write_text(render(), encoding="utf-8")
    print(target)
