"""No route of the REST API or the micro service ever returns a keychain value."""

from __future__ import annotations

import json

from apiserver import serve, sse

from noetl_stream.client.tracking import follow
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.keychain import KeychainKey, generate_key
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import local_runtime

SECRET = "Zq9-very-secret-bearer-value"
PASSWORD = "pw-4711-hunter2"

USES_SECRET = """apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: leaky, path: tests/leaky}
keychain:
  - name: api_token
    kind: bearer
  - name: db
    kind: postgres_credential
workflow:
  - step: start
    tool:
      - name: use
        kind: python
        args: {token: "{{ keychain.api_token.token }}", password: "{{ keychain.db.password }}"}
        code: |
          result = {"token": token, "echo": "Bearer " + token, "password": password}
        spec:
          policy:
            rules:
              - else:
                  then: {do: continue, set_ctx: {seen: "{{ outcome.result.echo }}"}}
      - name: fail_loudly
        kind: python
        args: {token: "{{ keychain.api_token.token }}"}
        code: |
          raise RuntimeError("could not call with " + token)
"""


async def test_no_route_returns_a_keychain_value(nats_server: EmbeddedNats, topology: Topology) -> None:
    key = KeychainKey([generate_key()])
    async with (
        local_runtime(nats_server.url, topology=topology, keychain_key=key) as rt,
        serve(rt, key) as api,
    ):
        bodies: list[str] = []
        put = await api.json(
            "PUT", "/api/keychain/api_token", json={"kind": "bearer", "fields": {"token": SECRET}}
        )
        assert put == {"name": "api_token", "kind": "bearer"}
        await api.json(
            "PUT",
            "/api/keychain/db",
            json={
                "kind": "postgres_credential",
                "fields": {"host": "db.internal", "user": "app", "password": PASSWORD, "port": 5432},
            },
        )
        bodies.append(json.dumps(put))

        await api.json("POST", "/api/catalog", 201, json={"playbook": USES_SECRET})
        started = await api.json("POST", "/api/executions", 201, json={"path": "tests/leaky"})
        execution_id = started["execution_id"]
        summary = await follow(rt.nc, rt.topology, execution_id, timeout=30)
        assert summary.status == "failed"  # the second task raised, quoting the token
        got: dict[str, str] = {}

        for path in (
            "/api/keychain",
            "/api/keychain/api_token",
            "/api/keychain/db",
            "/api/executions",
            f"/api/executions/{execution_id}",
            f"/api/executions/{execution_id}/events?limit=1000",
            f"/api/executions/{execution_id}/ctx",
            f"/api/executions/{execution_id}/graph",
            f"/api/executions/{execution_id}/steps/start",  # the args the tasks ran with, masked
            "/api/catalog",
            "/api/catalog/playbook?path=tests/leaky",
            "/metrics",
            "/ready",
        ):
            async with api.request("GET", path) as resp:
                assert resp.status == 200, (path, resp.status)
                got[path] = await resp.text()
                bodies.append(got[path])
        async with api.request("GET", f"/api/executions/{execution_id}/events?follow=1") as resp:
            streamed = await sse(resp)
            bodies.append(json.dumps(streamed))
        for endpoint, body in (
            ("status", {"execution_id": execution_id}),
            ("events", {"execution_id": execution_id, "limit": 1000}),
            ("ctx", {"execution_id": execution_id}),
            ("executions", {}),
        ):
            msg = await rt.nc.request(
                rt.topology.api_subject(endpoint), json.dumps(body).encode(), timeout=10
            )
            bodies.append(msg.data.decode())
        async with api.request("DELETE", "/api/keychain/db") as resp:
            assert resp.status == 204 and await resp.read() == b""
        await api.json("GET", "/api/keychain/db", 404)
        assert await api.json("GET", "/api/keychain") == {"items": [{"name": "api_token", "kind": "bearer"}]}

    everything = "\n".join(bodies)
    assert SECRET not in everything and PASSWORD not in everything
    # and the run did use the values: masked where they would have appeared
    ctx = json.loads(got[f"/api/executions/{execution_id}/ctx"])
    assert ctx["ctx"] == {"seen": "Bearer ***"}
    assert "could not call with ***" in everything
    (run,) = json.loads(got[f"/api/executions/{execution_id}/steps/start"])["runs"]
    assert [t["args"] for t in run["tasks"]] == [{"token": "***", "password": "***"}, {"token": "***"}]
    assert len(streamed) > 5


def test_keychain_routes_are_write_only_by_design() -> None:
    """No reply type of the keychain routes has a field that could carry a value."""
    from noetl_stream.api.routes import ROUTES

    for route in ROUTES:
        if route.path.startswith("/api/keychain") and route.reply is not None:
            assert set(route.reply.__struct_fields__) <= {"name", "kind", "items"}, route.path
