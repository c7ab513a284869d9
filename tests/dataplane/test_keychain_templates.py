"""`{{ keychain.<name> }}` in templates: resolved by the worker (env, file, KV), never shown in events."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.history import read_events
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import local_runtime

SECRET = "s3cr3t-token-value"
FILE_SECRET = "file-password-42"


def _playbook(file_path: Path) -> str:
    return f"""apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: kc, path: tests/kc}}
keychain:
  - name: api_token
    kind: secret_manager
    env: NOETL_TEST_API_TOKEN
  - name: db
    kind: postgres_credential
    file: {file_path}
workflow:
  - step: start
    tool:
      - name: use
        kind: python
        args:
          token: "{{{{ keychain.api_token.value }}}}"
          password: "{{{{ keychain.db.password }}}}"
        code: |
          result = {{"token": token, "length": len(token), "password": password}}
    next:
      arcs: [{{step: after, when: "{{{{ event.name == 'step.done' }}}}"}}]
  - step: after
    tool:
      kind: python
      args: {{seen: "{{{{ start }}}}"}}
      code: |
        result = seen
"""


async def test_keychain_values_are_usable_and_never_in_events(
    nats_server: EmbeddedNats, topology: Topology, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOETL_TEST_API_TOKEN", SECRET)
    creds = tmp_path / "db.json"
    creds.write_text(json.dumps({"user": "app", "password": FILE_SECRET}))
    async with local_runtime(nats_server.url, topology=topology) as rt:
        summary = await rt.run_playbook(_playbook(creds), "kc.yaml", timeout=20)
        events = [ev async for _, ev in read_events(rt.nc.jetstream(), rt.topology, summary.execution_id)]
    assert summary.status == "success", summary.error
    assert summary.result == {"token": "***", "length": len(SECRET), "password": "***"}
    dump = b"".join(msgspec.json.encode(ev) for ev in events) + msgspec.json.encode(summary)
    assert SECRET.encode() not in dump and FILE_SECRET.encode() not in dump
    assert len(events) > 10


async def test_a_missing_credential_fails_the_step_naming_the_entry_not_a_value(
    nats_server: EmbeddedNats, topology: Topology, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NOETL_TEST_API_TOKEN", raising=False)
    async with local_runtime(nats_server.url, topology=topology) as rt:
        summary = await rt.run_playbook(_playbook(tmp_path / "missing.json"), "kc.yaml", timeout=20)
    assert summary.status == "failed"
    assert summary.error is not None and summary.error["kind"] == "credential_error"
    assert (
        "keychain entry 'api_token' is not available (environment variable NOETL_TEST_API_TOKEN)"
        in (summary.error["message"])
    )
