"""The legacy fixtures (tests/data/legacy), migrated and run: same tables written and same final ctx as
a canonical translation written by hand (real NATS, PostgreSQL and an aiohttp server)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from helpers import run
from httpserver import HttpServer
from legacy_support import CASE_FILE, fragment_002, wrap_002
from pgserver import PgServer

from noetl_stream.dsl import compile_playbook
from noetl_stream.dsl.migrate import migrate_text
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.keychain import Keychain, KeychainKey, generate_key
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import Runtime, local_runtime

OWNERS = [(31, "ops@archive.test"), (44, "night@archive.test")]
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
    """A database with the tables the 000/004 fixture reads and writes; its credential fields."""
    name = "db_" + uuid.uuid4().hex[:10]
    admin = await asyncpg.connect(pg.dsn)
    try:
        await admin.execute(f"CREATE DATABASE {name}")
    finally:
        await admin.close()
    cred = {**pg.credential(), "database": name}
    conn = await asyncpg.connect(**cred)
    try:
        await conn.execute("CREATE TABLE owners (owner_id int, contact text)")
        await conn.executemany("INSERT INTO owners VALUES ($1, $2)", OWNERS)
        await conn.execute("CREATE TABLE feed_archive (owner int, batches jsonb)")
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
metadata: {name: feed_archive_by_hand, path: tests/feed_archive_by_hand}
keychain:
  - {name: noetl_db, kind: postgres_credential}
  - {name: archive_db, kind: postgres_credential}
workload:
  feed_host: "http://127.0.0.1:9000"
  feeds: [{path: "/feeds/primary", batch: 4}]
workflow:
  - step: start
    next: {arcs: [{step: load_owner}]}
  - step: load_owner
    tool:
      kind: postgres
      auth: noetl_db
      query: "SELECT owner_id, contact FROM owners ORDER BY owner_id LIMIT 1"
      spec:
        policy:
          rules:
            - when: "{{ outcome.status == 'error' }}"
              then: {do: fail}
            - else:
                then:
                  do: continue
                  set_ctx:
                    owner_id: "{{ outcome.result.rows[0].owner_id }}"
                    owner_contact: "{{ outcome.result.rows[0].contact }}"
    next: {arcs: [{step: walk_feeds, when: "{{ event.name == 'step.done' }}"}]}
  - step: walk_feeds
    loop: {in: "{{ workload.feeds }}", iterator: feed}
    tool:
      - name: first_call
        kind: noop
        spec: {policy: {rules: [{else: {then: {do: continue, set_iter: {page: 1, batches: []}}}}]}}
      - name: call_feed
        kind: http
        method: GET
        url: "{{ workload.feed_host }}{{ iter.feed.path }}"
        params: {page: "{{ iter.page }}", pageSize: "{{ iter.feed.batch }}"}
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' and outcome.http.status in [500, 502, 503, 504] }}"
                then: {do: retry, attempts: 4, backoff: exponential, delay: 0.5}
              - when: "{{ outcome.status == 'error' }}"
                then: {do: fail}
              # legacy collects a page when its retry rule matches: the pages that have more
              - when: "{{ outcome.result.data.paging.hasMore }}"
                then:
                  do: jump
                  to: call_feed
                  set_iter:
                    batches: "{{ iter.batches + [outcome.result.data.data] }}"
                    page: "{{ (outcome.result.data.paging.page | int) + 1 }}"
      - name: gathered
        kind: noop
        result: "{{ iter.batches }}"
    next:
      arcs:
        - step: report_failure
          when: "{{ event.name == 'step.failed' }}"
        - step: archive
          when: "{{ event.name == 'loop.done' }}"
  - step: archive
    tool:
      kind: postgres
      auth: archive_db
      command: "INSERT INTO feed_archive (owner, batches) VALUES ($1, $2)"
      params: ["{{ ctx.owner_id }}", "{{ walk_feeds | sum(start=[]) }}"]
    next:
      arcs:
        - step: finish
          when: "{{ event.name == 'step.done' }}"
          args: {total: "{{ walk_feeds | sum(start=[]) | length }}"}
  - step: report_failure
    tool: {kind: noop}
    next: {arcs: [{step: finish, when: "{{ event.name == 'step.done' }}"}]}
  - step: finish
    tool: {kind: noop}
"""


def with_legacy_extension(text: str) -> str:
    """The fixture as authored, asking for the legacy extension itself (translated by the controller)."""
    return text.replace("kind: Playbook\n", "kind: Playbook\nexecutor: {spec: {extensions: [legacy]}}\n", 1)


async def run_000(
    rt: Runtime, key: KeychainKey, cred: dict[str, Any], http: HttpServer, text: str
) -> dict[str, Any]:
    await table(cred, "DELETE FROM feed_archive")
    keychain = Keychain(rt.nc.jetstream(), rt.topology, key)
    for name in ("noetl_db", "archive_db"):
        await keychain.put(name, "postgres_credential", cred)
    payload = {
        "feed_host": http.url,
        "feeds": [{"path": "/pages/a", "batch": 2}, {"path": "/pages/b", "batch": 2}],
    }
    r = await run(rt, text, payload)
    assert r.status == "success", (r.summary.error, r.names())
    return {
        "ctx": r.summary.ctx,
        "feed_archive": await table(cred, "SELECT owner, batches FROM feed_archive"),
        "finish": r.summary.steps["finish"].status,
        "total": [e.payload.get("args") for e in r.named("step.scheduled", step="finish")],
    }


async def test_000_004_fixture_migrates_validates_and_runs_like_its_canonical_translation(
    rt: tuple[Runtime, KeychainKey], database: dict[str, Any], http: HttpServer
) -> None:
    runtime, key = rt
    authored = CASE_FILE.read_text()
    migration = migrate_text(authored, CASE_FILE.name)
    assert migration.text is not None, [d.format() for d in migration.errors]
    check = compile_playbook(migration.text, "migrated.yaml")
    assert check.playbook is not None and not check.errors
    assert not [d for d in check.diagnostics if d.code == "legacy"]

    by_hand = await run_000(runtime, key, database, http, HAND_000)
    migrated = await run_000(runtime, key, database, http, migration.text)
    translated = await run_000(runtime, key, database, http, with_legacy_extension(authored))

    assert by_hand["ctx"] == {"owner_id": 31, "owner_contact": "ops@archive.test"}
    assert by_hand["feed_archive"] == [{"owner": 31, "batches": '[[1, 2], [3, 4], ["x", "y"]]'}]
    assert by_hand["finish"] == "done"
    assert by_hand["total"] == [{"total": 3}]
    assert migrated == by_hand
    assert translated == by_hand


# -- 002: eval/expr, step when, next_mode, list next ----------------------------------------------

HAND_002 = """\
  - step: crawl_sources
    loop:
      in: "{{ workload.sources }}"
      iterator: source
      spec: {mode: sequential}
    spec:
      policy:
        admit:
          rules:
            - when: "{{ workload.sources | length > 0 }}"
              then: {allow: true}
            - else:
                then: {allow: false}
    tool:
      - name: reset
        kind: noop
        spec: {policy: {rules: [{else: {then: {do: continue, set_iter: {cursor: 1, more: true}}}}]}}
      - name: get_page
        kind: http
        method: GET
        url: "{{ workload.base_url }}{{ iter.source.path }}"
        params: {page: "{{ iter.cursor }}", pageSize: 2}
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' and outcome.http.status in [429, 502, 503] }}"
                then: {do: retry, attempts: 6, backoff: exponential, delay: 0.5}
              - when: "{{ outcome.status == 'error' }}"
                then: {do: fail}
              - else:
                  then:
                    do: continue
                    set_iter: {more: "{{ outcome.result.data.paging.hasMore | default(false) }}"}
      - name: advance
        kind: noop
        spec:
          policy:
            rules:
              - when: "{{ iter.more }}"
                then: {do: jump, to: get_page, set_iter: {cursor: "{{ iter.cursor + 1 }}"}}
              - else:
                  then: {do: break}
    next:
      spec: {mode: exclusive}
      arcs:
        - step: summarize
          when: "{{ event.name == 'loop.done' }}"
        - step: tidy_up
          when: "{{ event.name == 'step.failed' }}"
"""


async def run_002(rt: Runtime, http: HttpServer, text: str) -> dict[str, Any]:
    payload = {"base_url": http.url, "sources": [{"path": "/pages/a"}, {"path": "/pages/b"}]}
    r = await run(rt, text, payload)
    assert r.status == "success", (r.summary.error, r.names())
    return {
        "ctx": r.summary.ctx,
        "loop": [page["data"] for page in r.step_result("crawl_sources")],  # (not the times and dates)
        "ran": sorted(r.ran()),
        "calls": sum(1 for e in r.tasks("crawl_sources", "get_page")),
    }


async def test_002_fixture_migrates_validates_and_runs_like_its_canonical_translation(
    rt: tuple[Runtime, KeychainKey], http: HttpServer
) -> None:
    runtime, _ = rt
    fragment = fragment_002()
    authored = wrap_002(fragment)
    migration = migrate_text(authored, "002_wrapped.yaml")
    assert migration.text is not None, [d.format() for d in migration.errors]
    check = compile_playbook(migration.text, "migrated.yaml")
    assert check.playbook is not None and not check.errors and not check.warnings

    by_hand = await run_002(runtime, http, wrap_002(HAND_002))
    migrated = await run_002(runtime, http, migration.text)
    translated = await run_002(runtime, http, wrap_002(fragment, legacy=True))

    assert by_hand["ctx"] == {"summary": {"last_pages": [3, 2]}}
    assert by_hand["ran"] == ["crawl_sources", "start", "summarize"]
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
