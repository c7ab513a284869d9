"""How NoETL's playbooks name credentials, on real runs: ``auth: "{{ pg_auth }}"`` rendering to a declared
entry, ``credential:`` as another spelling of ``auth:``, and a postgres credential's ``db_*`` fields."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest
from helpers import playbook, run
from httpserver import HttpServer
from pgserver import PgServer

from noetl_stream.dataplane.credentials import check_credential
from noetl_stream.dsl.compiler import compile_playbook
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.keychain import Keychain, KeychainKey, generate_key, secret_strings
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import local_runtime

TOKEN = "bearer-token-SECRET-0c4e2a"


@pytest.fixture
async def server() -> AsyncIterator[HttpServer]:
    srv = await HttpServer().start()
    yield srv
    await srv.stop()


def _noetl_fields(pg: PgServer, **extra: object) -> dict[str, object]:
    return {
        "db_host": pg.host,
        "db_port": pg.port,
        "db_user": pg.user,
        "db_password": pg.password,
        "db_name": pg.database,
        **extra,
    }


async def test_a_templated_auth_renders_to_a_declared_entry(
    nats_server: EmbeddedNats, topology: Topology, pg: PgServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry exists only as the playbook's declaration (an ``env:`` one, holding a DSN): found by the
    name the template renders to, not looked up in the store (where there is no such entry)."""
    monkeypatch.setenv("NOETL_TEST_PG_DSN", pg.dsn)
    workflow = """
    - step: start
      tool:
        kind: postgres
        auth: "{{ pg_auth }}"
        query: SELECT current_user AS u, 7 AS seven
    """
    text = playbook(workflow, workload={"pg_auth": "pg_local"}) + (
        "keychain:\n  - {name: pg_local, kind: postgres_credential, env: NOETL_TEST_PG_DSN}\n"
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "success", r.summary
    assert r.step_result("start")["rows"] == [{"u": pg.user, "seven": 7}]
    assert pg.password not in msgspec.json.encode(r.events).decode()


async def test_credential_is_auth_on_http(
    nats_server: EmbeddedNats,
    topology: Topology,
    server: HttpServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NOETL_TEST_BEARER", TOKEN)
    workflow = """
    - step: start
      tool:
        kind: http
        url: "{{ api }}/echo"
        credential: tok
    """
    text = playbook(workflow, workload={"api": server.url}) + (
        "keychain:\n  - {name: tok, kind: bearer, env: NOETL_TEST_BEARER}\n"
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "success", r.summary
    assert [s["headers"].get("Authorization") for s in server.seen] == [f"Bearer {TOKEN}"]
    assert TOKEN not in msgspec.json.encode(r.events).decode()
    (evaluated,) = r.named(E.REQUEST_EVALUATED)
    assert any("'credential:' is NoETL's spelling of 'auth:'" in w for w in evaluated.payload["warnings"])


async def test_credential_is_auth_on_postgres_with_noetl_field_names(
    nats_server: EmbeddedNats, topology: Topology, pg: PgServer
) -> None:
    """A store entry with NoETL's ``db_*`` field names connects; a canonical field given as well wins (a
    wrong ``db_host`` beside the right ``host``)."""
    key = KeychainKey([generate_key()])
    fields = _noetl_fields(pg)
    both = _noetl_fields(pg, db_host="nowhere.invalid", host=pg.host)
    for name, entry in (("pg_noetl", fields), ("pg_both", both)):
        check_credential(name, "postgres_credential", entry)  # what `keychain set` accepts
    workflow = """
    - step: start
      tool:
        - name: noetl
          kind: postgres
          credential: pg_noetl
          query: SELECT current_database() AS db, 1 AS one
        - name: both
          kind: postgres
          auth: pg_both
          query: SELECT 2 AS two
    """
    text = playbook(workflow) + (
        "keychain:\n  - {name: pg_noetl, kind: postgres_credential}\n"
        "  - {name: pg_both, kind: postgres_credential}\n"
    )
    async with local_runtime(nats_server.url, topology=topology, keychain_key=key) as rt:
        keychain = Keychain(rt.nc.jetstream(), topology, key)
        await keychain.put("pg_noetl", "postgres_credential", fields)
        await keychain.put("pg_both", "postgres_credential", both)
        r = await run(rt, text)
    assert r.status == "success", r.summary
    (noetl,) = r.tasks("start", "noetl")
    assert noetl.payload["result"]["rows"] == [{"db": pg.database, "one": 1}]
    assert r.step_result("start")["rows"] == [{"two": 2}]
    assert pg.password not in msgspec.json.encode(r.events).decode()


def test_a_postgres_credential_in_noetl_names_masks_its_password_only(pg: PgServer) -> None:
    masked = secret_strings({**_noetl_fields(pg), "kind": "postgres_credential"})
    assert pg.password in masked
    assert not {pg.host, str(pg.port), pg.user, pg.database} & masked


def test_credential_and_auth_together_is_an_error_at_the_key() -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: http
            url: http://localhost:1/x
            auth: tok
            credential: tok
        """
    )
    result = compile_playbook(text, "both.yaml")
    assert result.playbook is None
    errors = [d.format() for d in result.diagnostics if d.severity == "error"]
    assert errors == [
        "both.yaml:10:7: step 'start' task 'start_task': 'credential' is another spelling of 'auth': give one "
        "of them (at workflow[0].tool.credential)"
    ]


def test_credential_compiles_to_auth_and_only_where_a_tool_takes_auth() -> None:
    http = "{name: get, kind: http, url: http://localhost:1/x, credential: tok}"
    python = '{name: calc, kind: python, code: "result = 1", credential: tok}'

    result = compile_playbook(playbook(f"- step: start\n  tool:\n    - {http}\n"), "alias.yaml")

    # (and `tok` is not declared: that warning points at what the author wrote, too)
    assert [(d.severity, d.code, d.line, d.col) for d in result.diagnostics] == [
        ("warning", "dialect", 7, 60),
        ("warning", "warning", 7, 72),
    ]
    assert result.playbook is not None
    (task,) = result.playbook.step("start").tasks
    assert task.config.get("auth") == "tok" and "credential" not in task.config

    mixed = compile_playbook(
        playbook(f"- step: start\n  tool:\n    - {http}\n    - {python}\n"), "alias.yaml"
    )
    assert [(d.severity, d.code) for d in mixed.diagnostics] == [
        ("warning", "dialect"),
        ("warning", "warning"),
        ("error", "unknown-key"),
    ]
