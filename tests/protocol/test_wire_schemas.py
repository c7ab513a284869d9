"""The published wire schemas match the code, and real messages validate against them."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import msgspec
import pytest

from noetl_stream.dsl import load_playbook
from noetl_stream.protocol.schemas import WIRE_SCHEMAS, render, wire_schema
from noetl_stream.protocol.wire import Command, Event, ExecutionRequest, decode_request

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


@pytest.mark.parametrize("name", sorted(WIRE_SCHEMAS))
def test_published_schema_is_in_sync(name: str) -> None:
    published = (SCHEMAS / f"{name}.schema.json").read_text(encoding="utf-8")
    assert published == render(wire_schema(name)), (
        f"schemas/{name}.schema.json is stale: run `python -m noetl_stream.protocol.schemas schemas`"
    )


def _validate(name: str, value: object) -> None:
    jsonschema.validate(json.loads(msgspec.json.encode(value)), wire_schema(name))


def test_messages_validate_against_their_schemas() -> None:
    playbook = load_playbook(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: x, path: x}\n"
        "workflow:\n  - step: start\n    tool: {kind: noop, result: 1}\n"
    )
    _validate("request", ExecutionRequest(playbook="...", payload={"a": 1}, execution_id="abc"))
    _validate(
        "command",
        Command(
            command_id="e:start-1",
            execution_id="e",
            step="start",
            step_run_id="start-1",
            pool="default",
            step_def=playbook.workflow[0],
        ),
    )
    _validate(
        "event",
        Event(
            event_id="e:start-1:step.done",
            execution_id="e",
            name="step.done",
            source="worker",
            entity_type="step",
            entity_id="start-1",
            status="success",
            timestamp="2026-01-01T00:00:00Z",
            payload={"result": 1},
        ),
    )


def test_request_schema_rejects_what_the_decoder_rejects() -> None:
    bad = {"playbook": 3}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, wire_schema("request"))
    with pytest.raises(msgspec.ValidationError):
        decode_request(json.dumps(bad).encode())
    unknown = {"playbook": "x", "surprise": True}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(unknown, wire_schema("request"))
    with pytest.raises(msgspec.ValidationError):
        decode_request(json.dumps(unknown).encode())
