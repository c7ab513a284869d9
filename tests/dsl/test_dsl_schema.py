"""The playbook JSON Schema: in sync with the validator's vocabulary, accepts what we ship, rejects the rest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from ruamel.yaml import YAML

from noetl_stream.dsl import compile_playbook, known_kinds
from noetl_stream.dsl import vocabulary as V
from noetl_stream.dsl.kinds import COMMON_TASK_KEYS
from noetl_stream.dsl.schema import playbook_schema, render

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILE = ROOT / "schemas" / "playbook.schema.json"
PLAYBOOKS = sorted((ROOT / "playbooks").glob("*.yaml"))
VALIDATOR = jsonschema.Draft202012Validator(playbook_schema(), format_checker=None)


def load(text: str) -> Any:
    return YAML(typ="safe", pure=True).load(text)


def schema_errors(text: str) -> list[str]:
    """Where the schema refuses `text` and by which JSON Schema keyword (jsonschema's messages are its
    own: not asserted); for ``additionalProperties``, the keys it did not expect."""
    errors = sorted(VALIDATOR.iter_errors(load(text)), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.validator}{_unexpected(e)}" for e in errors]


def _unexpected(error: jsonschema.ValidationError) -> str:
    if error.validator != "additionalProperties" or not isinstance(error.instance, dict):
        return ""
    known = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
    return f" {sorted(set(error.instance) - set(known))}"


def test_the_shipped_schema_is_the_generated_one() -> None:
    assert SCHEMA_FILE.read_text(encoding="utf-8") == render(), (
        "schemas/playbook.schema.json is stale: run "
        "`python -m noetl_stream.dsl.schema > schemas/playbook.schema.json`"
    )


def test_the_schema_is_a_valid_draft_2020_12_schema() -> None:
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


def test_the_schema_uses_the_validators_vocabulary() -> None:
    schema = playbook_schema()
    defs = schema["$defs"]
    assert list(schema["properties"]) == list(V.ROOT_KEYS)
    assert set(defs["step"]["properties"]) == set(V.STEP_KEYS) | set(V.DIALECT_KEYS)
    assert set(defs["loop"]["properties"]) == set(V.LOOP_KEYS)
    assert set(defs["router"]["properties"]) == set(V.NEXT_KEYS)
    assert set(defs["arc"]["properties"]) == set(V.ARC_KEYS)
    assert set(defs["then"]["properties"]) == set(V.THEN_KEYS)
    assert set(defs["taskPolicy"]["properties"]) == set(V.TASK_POLICY_KEYS)
    assert set(defs["stepPolicy"]["properties"]) == set(V.STEP_POLICY_KEYS)
    assert defs["then"]["properties"]["do"]["enum"] == list(V.DO_VALUES)
    assert defs["task"]["properties"]["kind"]["enum"] == list(known_kinds())
    assert set(defs["task"]["properties"]) == set(COMMON_TASK_KEYS) | set(V.DIALECT_KEYS)


@pytest.mark.parametrize("path", PLAYBOOKS, ids=[p.name for p in PLAYBOOKS])
def test_every_shipped_playbook_is_valid_for_the_compiler_and_the_schema(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    result = compile_playbook(text, str(path))
    assert [d.format() for d in result.diagnostics] == []
    assert schema_errors(text) == []


def test_at_least_seven_playbooks_ship() -> None:
    assert len(PLAYBOOKS) >= 7
    assert ROOT / "playbooks" / "hello.yaml" in PLAYBOOKS


HEADER = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: t, path: t}\nworkflow:\n"


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param(
            "  - step: start\n    when: '{{ true }}'\n    tool: {kind: noop}\n",
            "workflow/0: additionalProperties ['when']",
            id="step-when",
        ),
        pytest.param(
            "  - step: start\n    tool:\n      - fetch: {kind: noop}\n",
            "workflow/0/tool: oneOf",
            id="label-as-key",
        ),
        pytest.param(
            "  - step: start\n    tool: {kind: noop}\n    next: [{step: start}]\n",
            "workflow/0/next: type",
            id="next-as-list",
        ),
        pytest.param(
            "  - step: begin\n    tool: {kind: noop}\n",
            "workflow: contains",
            id="no-start",
        ),
        pytest.param(
            "  - step: start\n    tool: {kind: noop, eval: []}\n",
            "workflow/0/tool: oneOf",
            id="task-eval",
        ),
        pytest.param(
            "  - step: start\n    loop: {in: [1], iterator: x, spec: {max_in_flight: 0}}\n"
            "    tool: {kind: noop}\n",
            "workflow/0/loop/spec/max_in_flight: oneOf",
            id="max-in-flight-zero",
        ),
        pytest.param(
            "  - step: start\n    spec: {policy: {admit: {rules: [{else: {then: {allow: true, do: fail}}}]}}}\n"
            "    tool: {kind: noop}\n",
            "workflow/0/spec/policy/admit/rules/0: oneOf",
            id="admission-with-control",
        ),
        pytest.param(
            "  - step: start\n    tool:\n      kind: noop\n      spec: {policy: {rules: "
            "[{else: {then: {do: continue, to: start}}}]}}\n",
            "workflow/0/tool: oneOf",
            id="to-without-jump",
        ),
    ],
)
def test_non_canonical_playbooks_fail_the_schema(steps: str, expected: str) -> None:
    assert schema_errors(HEADER + steps) == [expected]
    assert compile_playbook(HEADER + steps).diagnostics  # and the compiler says why, with a position


@pytest.mark.parametrize(
    "end",
    [
        pytest.param("  - step: end\n", id="bare"),
        pytest.param("  - step: end\n    desc: the end\n", id="with-desc"),
    ],
)
def test_a_step_with_neither_tool_nor_next_is_a_terminal_step(end: str) -> None:
    """NoETL's ``- step: end``: accepted without a diagnostic by the compiler and the schema; it is
    routed by the controller alone (a router without arcs), so it ends the branch that reaches it."""
    text = HEADER + "  - step: start\n    tool: {kind: noop}\n    next: {arcs: [{step: end}]}\n" + end
    result = compile_playbook(text)
    assert [d.format() for d in result.diagnostics] == []
    assert result.playbook is not None
    step = result.playbook.workflow[1]
    assert (step.name, step.tasks, step.next, step.is_router) == ("end", (), None, True)
    assert schema_errors(text) == []
