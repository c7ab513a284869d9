"""The spec's legacy examples, migrated and run: same tables written and same final ctx as a canonical
translation written by hand (real NATS, PostgreSQL and an aiohttp server)."""

from __future__ import annotations

import textwrap
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from helpers import run
from httpserver import HttpServer
from legacy_support import EXAMPLES, wrap_002
from pgserver import PgServer

from noetl_stream.dsl import compile_playbook
from noetl_stream.embedded import EmbeddedNats
from noetl_stream.kv.keychain import Keychain, KeychainKey, generate_key
from noetl_stream.local import Runtime, local_runtime
from noetl_stream.migrate import migrate_text
from noetl_stream.subjects import Topology

USERS = [(7, "ada@example.com"), (8, "bob@example.com")]
ROWS = {"a": [1, 2, 3, 4, 5], "b": ["x", "y", "z"]}


@pytest.fixture
async def http() -> AsyncIterator[HttpServer]:
    server = await HttpServer().start()
    server.pages.update(ROWS)
    yield server
    await server.stop()


@pytest.fixture
async def rt(nats_server: EmbeddedNats, topology: Topology) -> AsyncIterator[tuple[Runtime, KeychainKey]]:
    key = KeychainKey([generate_key()])
    async with local_runtime(nats_server.url, topology=topology, keychain_key=key) as runtime:
        yield runtime, key


@pytest.fixture
async def database(pg: PgServer) -> dict[str, Any]:
    """A database with the tables the 000 example reads and writes; its credential fields."""
    name = "db_" + uuid.uuid4().hex[:10]
    admin = await asyncpg.connect(pg.dsn)
    try:
        await admin.execute(f"CREATE DATABASE {name}")
    finally:
        await admin.close()
    cred = {**pg.credential(), "database": name}
    conn = await asyncpg.connect(**cred)
    try:
        await conn.execute("CREATE TABLE users (user_id int, email text)")
        await conn.executemany("INSERT INTO users VALUES ($1, $2)", USERS)
        await conn.execute('CREATE TABLE raw_events ("user" int, pages jsonb)')
    finally:
        await conn.close()
    return cred


async def table(cred: dict[str, Any], sql: str) -> list[dict[str, Any]]:
    conn = await asyncpg.connect(**cred)
    try:
        return [dict(r) for r in await conn.fetch(sql)]
    finally:
        await conn.close()


# -- 000/004: case, retry, sink, vars, structural next ----------------------------------------------

HAND_000 = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: legacy_case_by_hand, path: tests/legacy_case_by_hand}
keychain:
  - {name: noetl_db, kind: postgres_credential}
  - {name: pg_creds, kind: postgres_credential}
workload:
  api_url: "http://127.0.0.1:8080"
  endpoints: [{path: "/a", page_size: 2}]
workflow:
  - step: start
    next: {arcs: [{step: fetch_user}]}
  - step: fetch_user
    tool:
      kind: postgres
      auth: noetl_db
      query: "SELECT user_id, email FROM users LIMIT 1"
      spec:
        policy:
          rules:
            - when: "{{ outcome.status == 'error' }}"
              then: {do: fail}
            - else:
                then:
                  do: continue
                  set_ctx:
                    user_id: "{{ outcome.result[0].user_id }}"
                    user_email: "{{ outcome.result[0].email }}"
    next: {arcs: [{step: fetch_all_endpoints, when: "{{ event.name == 'step.done' }}"}]}
  - step: fetch_all_endpoints
    loop: {in: "{{ workload.endpoints }}", iterator: endpoint}
    tool:
      - name: first_page
        kind: noop
        spec: {policy: {rules: [{else: {then: {do: continue, set_iter: {page: 1, pages: []}}}}]}}
      - name: fetch_page
        kind: http
        method: GET
        url: "{{ workload.api_url }}{{ iter.endpoint.path }}"
        params: {page: "{{ iter.page }}", pageSize: "{{ iter.endpoint.page_size }}"}
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' and outcome.http.status in [429, 500, 502, 503] }}"
                then: {do: retry, attempts: 5, backoff: exponential, delay: 1.0}
              - when: "{{ outcome.status == 'error' }}"
                then: {do: fail}
              # legacy collects a page when its policy matches: pages that have more
              - when: "{{ outcome.result.data.paging.hasMore }}"
                then:
                  do: jump
                  to: fetch_page
                  set_iter:
                    pages: "{{ iter.pages + [outcome.result.data.data] }}"
                    page: "{{ (outcome.result.data.paging.page | int) + 1 }}"
      - name: collected
        kind: noop
        result: "{{ iter.pages }}"
    next:
      arcs:
        - step: error_handler
          when: "{{ event.name == 'step.failed' }}"
        - step: store
          when: "{{ event.name == 'loop.done' }}"
  - step: store
    tool:
      kind: postgres
      auth: pg_creds
      command: 'INSERT INTO raw_events ("user", pages) VALUES ($1, $2)'
      params: ["{{ ctx.user_id }}", "{{ fetch_all_endpoints | sum(start=[]) }}"]
    next:
      arcs:
        - step: end
          when: "{{ event.name == 'step.done' }}"
          args: {count: "{{ fetch_all_endpoints | sum(start=[]) | length }}"}
  - step: error_handler
    tool: {kind: noop}
    next: {arcs: [{step: end, when: "{{ event.name == 'step.done' }}"}]}
  - step: end
    tool: {kind: noop}
"""


def with_legacy_extension(text: str) -> str:
    """The example as authored, asking for the legacy extension itself (translated by the controller)."""
    return text.replace("kind: Playbook\n", "kind: Playbook\nexecutor: {spec: {extensions: [legacy]}}\n", 1)


async def run_000(
    rt: Runtime, key: KeychainKey, cred: dict[str, Any], http: HttpServer, text: str
) -> dict[str, Any]:
    await table(cred, "DELETE FROM raw_events")
    keychain = Keychain(rt.nc.jetstream(), rt.topology, key)
    for name in ("noetl_db", "pg_creds"):
        await keychain.put(name, "postgres_credential", cred)
    payload = {
        "api_url": http.url,
        "endpoints": [{"path": "/pages/a", "page_size": 2}, {"path": "/pages/b", "page_size": 2}],
    }
    r = await run(rt, text, payload)
    assert r.status == "success", (r.summary.error, r.names())
    return {
        "ctx": r.summary.ctx,
        "raw_events": await table(cred, 'SELECT "user", pages FROM raw_events'),
        "end": r.summary.steps["end"].status,
        "count": [e.payload.get("args") for e in r.named("step.scheduled", step="end")],
    }


async def test_000_004_example_migrates_validates_and_runs_like_its_canonical_translation(
    rt: tuple[Runtime, KeychainKey], database: dict[str, Any], http: HttpServer
) -> None:
    runtime, key = rt
    authored = (EXAMPLES / "000_004_legacy_case.yaml").read_text()
    migration = migrate_text(authored, "000_004_legacy_case.yaml")
    assert migration.text is not None, [d.format() for d in migration.errors]
    check = compile_playbook(migration.text, "migrated.yaml")
    assert check.playbook is not None and not check.errors
    assert not [d for d in check.diagnostics if d.code == "legacy"]

    by_hand = await run_000(runtime, key, database, http, HAND_000)
    migrated = await run_000(runtime, key, database, http, migration.text)
    translated = await run_000(runtime, key, database, http, with_legacy_extension(authored))

    assert by_hand["ctx"] == {"user_id": 7, "user_email": "ada@example.com"}
    assert by_hand["raw_events"] == [{"user": 7, "pages": '[[1, 2], [3, 4], ["x", "y"]]'}]
    assert by_hand["end"] == "done"
    assert migrated == by_hand
    assert translated == by_hand


# -- 002: eval/expr, step when, next_mode, list next ----------------------------------------------

HAND_002 = """\
  - step: fetch_transform_store
    loop:
      in: "{{ workload.endpoints }}"
      iterator: endpoint
      spec: {mode: sequential}
    tool:
      - name: init
        kind: noop
        spec: {policy: {rules: [{else: {then: {do: continue, set_iter: {page: 1, has_more: true}}}}]}}
      - name: fetch_page
        kind: http
        method: GET
        url: "{{ workload.api_url }}{{ iter.endpoint.path }}"
        params: {page: "{{ iter.page }}"}
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' and outcome.http.status in [429,500,502,503,504] }}"
                then: {do: retry, attempts: 10, backoff: exponential, delay: 2}
              - when: "{{ outcome.status == 'error' }}"
                then: {do: fail}
              - else:
                  then:
                    do: continue
                    set_iter: {has_more: "{{ outcome.result.data.paging.hasMore | default(false) }}"}
      - name: paginate
        kind: noop
        spec:
          policy:
            rules:
              - when: "{{ iter.has_more == true }}"
                then: {do: jump, to: fetch_page, set_iter: {page: "{{ (iter.page | int) + 1 }}"}}
              - else:
                  then: {do: break}
    next:
      spec: {mode: exclusive}
      arcs:
        - step: validate_results
          when: "{{ event.name == 'loop.done' }}"
        - step: cleanup
          when: "{{ event.name == 'step.failed' }}"
"""


async def run_002(rt: Runtime, http: HttpServer, text: str) -> dict[str, Any]:
    payload = {"api_url": http.url, "endpoints": [{"path": "/pages/a"}, {"path": "/pages/b"}]}
    r = await run(rt, text, payload)
    assert r.status == "success", (r.summary.error, r.names())
    return {
        "ctx": r.summary.ctx,
        "loop": r.step_result("fetch_transform_store"),
        "ran": sorted(r.ran()),
        "calls": sum(1 for e in r.tasks("fetch_transform_store", "fetch_page")),
    }


async def test_002_example_migrates_validates_and_runs_like_its_canonical_translation(
    rt: tuple[Runtime, KeychainKey], http: HttpServer
) -> None:
    runtime, _ = rt
    fragment = textwrap.indent((EXAMPLES / "002_legacy_eval_step.yaml").read_text(), "  ")
    authored = wrap_002(fragment)
    migration = migrate_text(authored, "002_wrapped.yaml")
    assert migration.text is not None, [d.format() for d in migration.errors]
    check = compile_playbook(migration.text, "migrated.yaml")
    assert check.playbook is not None and not check.errors and not check.warnings

    by_hand = await run_002(runtime, http, wrap_002(HAND_002))
    migrated = await run_002(runtime, http, migration.text)
    translated = await run_002(runtime, http, wrap_002(fragment, legacy=True))

    assert by_hand["ctx"] == {"summary": {"last_pages": [3, 2]}}
    assert by_hand["ran"] == ["fetch_transform_store", "start", "validate_results"]
    assert by_hand["calls"] == 5  # a: pages 1-3, b: pages 1-2
    assert migrated == by_hand
    assert translated == by_hand


# -- sinks: per page (a retry policy's sink, 000 §6.1) and per iteration (the step's sink) --------------

SINKS = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: sinks, path: tests/sinks}
executor: {spec: {extensions: [legacy]}}
workload: {url: "http://x"}
workflow:
  - step: start
    loop: {in: ["a", "b"], iterator: name}
    tool:
      kind: http
      url: "{{ workload.url }}/pages/{{ name }}"
      params: {page: 1, pageSize: 2}
    retry:
      - when: "{{ response.data.paging.hasMore }}"
        then:
          max_attempts: 10
          next_call: {params: {page: "{{ response.data.paging.page + 1 }}"}}
          sink:
            tool: {kind: postgres, auth: pg_creds, table: pages}
            args: {name: "{{ name }}", page: "{{ _retry.index }}", rows: "{{ response.data.data }}"}
    sink:
      tool: {kind: postgres, auth: pg_creds, table: endpoints}
      args: {name: "{{ name }}", last: "{{ result.data.paging.page }}"}
"""


async def test_a_retry_policy_sink_writes_each_page_and_the_step_sink_each_iteration(
    rt: tuple[Runtime, KeychainKey], database: dict[str, Any], http: HttpServer
) -> None:
    runtime, key = rt
    conn = await asyncpg.connect(**database)
    try:
        await conn.execute("CREATE TABLE pages (name text, page int, rows jsonb)")
        await conn.execute("CREATE TABLE endpoints (name text, last int)")
    finally:
        await conn.close()
    await Keychain(runtime.nc.jetstream(), runtime.topology, key).put(
        "pg_creds", "postgres_credential", database
    )
    r = await run(runtime, SINKS, {"url": http.url})
    assert r.status == "success", (r.summary.error, r.names())
    assert await table(database, "SELECT name, page, rows FROM pages ORDER BY name, page") == [
        {"name": "a", "page": 1, "rows": "[1, 2]"},
        {"name": "a", "page": 2, "rows": "[3, 4]"},
        {"name": "b", "page": 1, "rows": '["x", "y"]'},
    ]
    assert await table(database, "SELECT name, last FROM endpoints ORDER BY name") == [
        {"name": "a", "last": 3},
        {"name": "b", "last": 2},
    ]
    # the step's result is each iteration's last call
    assert [p["data"]["paging"]["page"] for p in r.step_result("start")] == [3, 2]
