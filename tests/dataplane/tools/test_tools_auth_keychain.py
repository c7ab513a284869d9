"""Probe 67: ``auth: <name>`` (http, postgres) uses the playbook's own ``keychain`` declarations
(``env:``, ``file:``) before the encrypted store, as ``{{ keychain.<name> }}`` does.

The controller ships a step its declarations only when the step's templates read ``keychain``
(``control/core/plan.py`` ``keychain_readers``): these steps do (a header, a parameter), and the case of a
step that names the entry in ``auth`` only gets the declarations too (the plan counts ``auth``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from helpers import playbook, run
from httpserver import HttpServer
from pgserver import PgServer

from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.keychain import Keychain, KeychainKey, generate_key
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import local_runtime

ENV_TOKEN = "env-token-SECRET-5b2e9c"
STORE_TOKEN = "store-token-OTHER-81d4a7"


@pytest.fixture
async def server() -> AsyncIterator[HttpServer]:
    srv = await HttpServer().start()
    yield srv
    await srv.stop()


def _with_keychain(workflow: str, keychain: str, **workload: str) -> str:
    return playbook(workflow, workload=workload) + "keychain:\n" + keychain


HTTP_WORKFLOW = """
- step: start
  tool:
    kind: http
    url: "{{ api }}/echo"
    auth: tok
    headers: {X-Entry-Kind: "{{ keychain.tok.kind }}"}
"""


@pytest.mark.parametrize("in_store", [True, False])
async def test_http_auth_uses_the_declared_env_entry_not_the_store(
    nats_server: EmbeddedNats,
    topology: Topology,
    server: HttpServer,
    monkeypatch: pytest.MonkeyPatch,
    in_store: bool,
) -> None:
    monkeypatch.setenv("NOETL_PROBE67_TOKEN", ENV_TOKEN)
    key = KeychainKey([generate_key()])
    text = _with_keychain(
        HTTP_WORKFLOW, "  - {name: tok, kind: bearer, env: NOETL_PROBE67_TOKEN}\n", api=server.url
    )
    async with local_runtime(nats_server.url, topology=topology, keychain_key=key) as rt:
        if in_store:  # a different credential of the same name in the store
            await Keychain(rt.nc.jetstream(), topology, key).put("tok", "bearer", {"token": STORE_TOKEN})
        r = await run(rt, text)
    assert r.status == "success", r.summary
    assert [s["headers"].get("Authorization") for s in server.seen] == [f"Bearer {ENV_TOKEN}"]
    assert r.step_result("start")["data"]["headers"]["Authorization"] == "Bearer ***"
    assert ENV_TOKEN not in msgspec.json.encode(r.events).decode()


async def test_postgres_auth_uses_the_declared_file_entry(
    nats_server: EmbeddedNats, topology: Topology, pg: PgServer, tmp_path: Path
) -> None:
    creds = tmp_path / "pg.json"
    creds.write_text(json.dumps(pg.credential()))
    text = _with_keychain(
        """
        - step: start
          tool:
            kind: postgres
            auth: db
            query: SELECT current_user AS u, 1 AS one, $1::text AS entry
            params: ["{{ keychain.db.kind }}"]
        """,
        f"  - {{name: db, kind: postgres_credential, file: {creds}}}\n",
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "success", r.summary
    assert r.step_result("start")["rows"][0]["one"] == 1
    password = str(pg.credential()["password"])
    assert password not in msgspec.json.encode(r.events).decode()


async def test_http_auth_alone_uses_the_declared_env_entry(
    nats_server: EmbeddedNats, topology: Topology, server: HttpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOETL_PROBE67_TOKEN", ENV_TOKEN)
    workflow = HTTP_WORKFLOW.replace('    headers: {X-Entry-Kind: "{{ keychain.tok.kind }}"}\n', "")
    text = _with_keychain(
        workflow, "  - {name: tok, kind: bearer, env: NOETL_PROBE67_TOKEN}\n", api=server.url
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "success", r.summary
    assert [s["headers"].get("Authorization") for s in server.seen] == [f"Bearer {ENV_TOKEN}"]
