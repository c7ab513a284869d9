"""``schemas/openapi.yaml``: in sync with the code, matching the served routes, and fuzzed with schemathesis."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import yaml
from apiserver import TOKEN, serve
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from noetl_stream.api.app import build_app
from noetl_stream.api.openapi import document, render
from noetl_stream.kv.keychain import KeychainKey, generate_key
from noetl_stream.runtime.local import Runtime

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = ROOT / "schemas" / "openapi.yaml"
EXAMPLES_PER_OPERATION = 12


def test_published_document_is_in_sync() -> None:
    published = yaml.safe_load(PUBLISHED.read_text(encoding="utf-8"))
    assert published == json.loads(json.dumps(document())), (
        "schemas/openapi.yaml is stale: run `python -m noetl_stream.api.openapi schemas/openapi.yaml`"
    )
    assert yaml.safe_load(render()) == published


def _documented(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}


async def test_every_served_route_is_documented_and_nothing_else(runtime: Runtime) -> None:
    async with serve(runtime) as api:
        app = api.server.app
        served = {
            (route.method, route.resource.canonical)
            for route in app.router.routes()
            if route.resource is not None and route.method != "HEAD"
        }
    published = yaml.safe_load(PUBLISHED.read_text(encoding="utf-8"))
    assert served == _documented(published)
    for path, ops in published["paths"].items():
        for method, op in ops.items():
            params = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert params == {seg[1:-1] for seg in path.split("/") if seg.startswith("{")}, (method, path)
            if op.get("security") != []:  # every route but /health and the viewer's static pages
                assert "401" in op["responses"], (method, path)
            for code in op["responses"]:
                assert code.isdigit() and int(code) < 600


def test_the_document_describes_the_app_built_from_the_same_table() -> None:
    # build_app without a running controller: only the route table matters here
    from noetl_stream.api.http import ApiContext

    ctx = ApiContext(nc=None, topology=None, intake=None, tokens=("t",))  # type: ignore[arg-type]
    app = build_app(ctx)
    names = {r.name for r in app.router.routes() if r.name}
    ops = {op["operationId"] for ops in document()["paths"].values() for op in ops.values()}
    assert names == ops


async def test_fuzz_every_operation_against_the_running_api(runtime: Runtime) -> None:
    """Schema-valid and schema-invalid requests for every route: never a 5xx, always a documented status,
    content type and body shape; every route but /health refuses a request without the token."""
    import schemathesis
    from schemathesis import GenerationMode
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        ignored_auth,
        negative_data_rejection,
        response_schema_conformance,
        status_code_conformance,
    )

    checks = [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
        negative_data_rejection,
        ignored_auth,
    ]
    raw = yaml.safe_load(PUBLISHED.read_text(encoding="utf-8"))
    schema = schemathesis.openapi.from_dict(raw)
    headers = {"Authorization": f"Bearer {TOKEN}"}

    async with serve(runtime, KeychainKey([generate_key()])) as api:
        base_url = api.url

        def fuzz() -> int:
            calls = 0
            for result in schema.get_all_operations():
                operation = result.ok()
                strategy = st.one_of(
                    operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
                    operation.as_strategy(generation_mode=GenerationMode.NEGATIVE),
                )

                @settings(
                    max_examples=EXAMPLES_PER_OPERATION,
                    deadline=None,
                    database=None,
                    derandomize=True,
                    phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=list(HealthCheck),
                )
                @given(case=strategy)
                def run(case: Any) -> None:
                    nonlocal calls
                    if case.path.endswith("/events"):
                        (case.query or {}).pop("follow", None)  # a live stream waits for its end
                    # a case whose negated part is the Authorization header goes out without the token
                    components = case.meta.components if case.meta is not None else {}
                    unauthenticated = any(
                        getattr(where, "value", where) == "header" and info.mode == GenerationMode.NEGATIVE
                        for where, info in components.items()
                    )
                    sent = {} if unauthenticated else headers
                    response = case.call(base_url=base_url, headers=sent, timeout=10)
                    case.validate_response(response, checks=checks, headers=sent)
                    calls += 1

                run()
            return calls

        calls = await asyncio.to_thread(fuzz)
    assert calls >= 10 * len(raw["paths"])
