"""The ``secrets`` tool: reads a keychain entry for later tasks; the value never reaches an event."""

from __future__ import annotations

import msgspec
from helpers import credentials, playbook, run

from noetl_stream.dataplane.tools import TOOLS
from noetl_stream.dataplane.tools.base import ToolContext, WorkerServices
from noetl_stream.dataplane.tools.secrets import run_secrets
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.keychain import Keychain, KeychainKey, generate_key
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import local_runtime

VALUE = "sk-SECRET-0a1b2c3d4e"


resolve = credentials({"openai": {"kind": "secret_manager", "value": VALUE, "org": "acme"}})


def context(services: WorkerServices | None) -> ToolContext:
    return ToolContext(execution_id="e", step="s", task="t", spec={}, services=services)


async def test_reads_an_entry_or_one_field_marked_secret() -> None:
    assert TOOLS["secrets"] is run_secrets
    svc = WorkerServices(credentials=resolve)
    whole = await run_secrets({"auth": "openai"}, context(svc))
    assert whole.status == "ok" and whole.secret is True
    assert whole.result == {"value": VALUE, "org": "acme"}
    one = await run_secrets({"auth": "openai", "field": "value"}, context(svc))
    assert one.result == VALUE and one.secret is True
    assert one.helpers["secrets"] == {"name": "openai", "kind": "secret_manager", "field": "value"}
    assert (await run_secrets({"secret": "openai", "key": "org"}, context(svc))).result == "acme"


async def test_errors_never_carry_the_value() -> None:
    svc = WorkerServices(credentials=resolve)
    missing = await run_secrets({"auth": "nope"}, context(svc))
    assert missing.error is not None and missing.error["kind"] == "credential_error"
    no_field = await run_secrets({"auth": "openai", "field": "token"}, context(svc))
    assert no_field.error is not None and "no field 'token'" in no_field.error["message"]
    assert VALUE not in msgspec.json.encode(no_field).decode()
    no_name = await run_secrets({}, context(svc))
    assert no_name.error is not None and no_name.error["kind"] == "config_error"
    no_keychain = await run_secrets({"auth": "openai"}, context(None))
    assert no_keychain.error is not None and no_keychain.error["kind"] == "credential_error"


async def test_playbook_uses_a_secret_that_no_event_shows(
    nats_server: EmbeddedNats, topology: Topology
) -> None:
    key = KeychainKey([generate_key()])
    text = playbook(
        """
        - step: start
          tool:
            - name: api_key
              kind: secrets
              auth: openai
              field: value
            - name: use
              kind: python
              args: {k: "{{ api_key }}"}
              code: |
                result = {"length": len(k), "prefix": k[:3], "echo": k}
        """
    )
    async with local_runtime(nats_server.url, topology=topology, keychain_key=key) as rt:
        await Keychain(rt.nc.jetstream(), topology, key).put("openai", "secret_manager", {"value": VALUE})
        r = await run(rt, text)
    assert r.status == "success", r.summary
    result = r.step_result("start")
    assert result["length"] == len(VALUE) and result["prefix"] == "sk-"  # later tasks read the value
    assert result["echo"] == "***"
    assert VALUE not in msgspec.json.encode(r.events).decode()
