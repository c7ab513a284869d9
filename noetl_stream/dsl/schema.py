"""JSON Schema (draft 2020-12) of the canonical authoring form of a playbook.

Built from the constants the validator checks against (``vocabulary``) and the registry of tool
kinds, so the two cannot drift apart. The schema describes what an author should write: the
canonical shapes only (no label-as-key tasks, no deprecated keys). The compiler stays the
authority; it also checks what a schema cannot (arc targets exist, jump targets are tasks of the
same pipeline, unique names, templates parse).

``python -m noetl_stream.dsl.schema > schemas/playbook.schema.json`` writes the shipped file.
"""

from __future__ import annotations

import json
import sys
from itertools import combinations
from typing import Any

from noetl_stream.dsl import vocabulary as V
from noetl_stream.dsl.kinds import COMMON_TASK_KEYS, kind_info, known_kinds

SCHEMA_ID = "https://noetl.io/schemas/noetl-stream/playbook.schema.json"
IDENTIFIER = "^[A-Za-z_][A-Za-z0-9_]*$"
TEMPLATE = r"\{\{|\{%"

Schema = dict[str, Any]


def _ref(name: str) -> Schema:
    return {"$ref": f"#/$defs/{name}"}


def _obj(
    properties: dict[str, Any],
    *,
    required: tuple[str, ...] = (),
    closed: bool = True,
    description: str = "",
) -> Schema:
    out: Schema = {"type": "object"}
    if description:
        out["description"] = description
    out["properties"] = properties
    if required:
        out["required"] = list(required)
    if closed:
        out["additionalProperties"] = False
    return out


def _enum(values: tuple[str, ...], description: str = "") -> Schema:
    out: Schema = {"enum": list(values)}
    if description:
        out["description"] = description
    return out


def _name(reserved: frozenset[str], what: str) -> Schema:
    return {
        "type": "string",
        "pattern": IDENTIFIER,
        "not": {"enum": sorted(reserved)},
        "description": f"{what}: an identifier, not the name of a template scope",
    }


def _rule(then: str) -> Schema:
    return {
        "oneOf": [
            _obj({"when": _ref("condition"), "then": _ref(then)}, required=("when", "then")),
            _obj({"else": _obj({"then": _ref(then)}, required=("then",))}, required=("else",)),
        ]
    }


def _task(kinds: tuple[str, ...]) -> Schema:
    """A task: the common keys plus, per kind, that kind's own keys (and the ones it requires)."""
    common: dict[str, Schema] = {
        "name": _name(V.RESERVED_NAMES, "task label"),
        "kind": _enum(kinds, "tool kind"),
        "desc": {"type": "string"},
        "spec": _ref("taskSpec"),
        "args": {"type": ["object", "string"], "description": "values bound for the tool (rendered)"},
        "input": {"type": "object", "description": "the task's inputs: another name for 'args' (dialect)"},
        "set": _ref("scopedSet"),
    }
    per_kind: list[Schema] = []
    for kind in kinds:
        info = kind_info(kind)
        if info is None:
            continue
        then: Schema = {}
        if info.keys is None:
            then["additionalProperties"] = True  # a kind that takes any key
        else:
            then["properties"] = {k: True for k in sorted(info.keys - COMMON_TASK_KEYS)}
        rules: list[Schema] = [{"anyOf": [{"required": [k]} for k in group]} for group in info.required_any]
        rules += [
            {"not": {"required": list(pair)}} for group in info.exclusive for pair in combinations(group, 2)
        ]
        if rules:
            then["allOf"] = rules
        if info.description:
            then["description"] = info.description
        per_kind.append({"if": {"properties": {"kind": {"const": kind}}}, "then": then})
    return {
        "type": "object",
        "properties": common,
        "required": ["kind"],
        "allOf": per_kind,
        "unevaluatedProperties": False,
    }


def _then() -> Schema:
    return {
        **_obj(
            {
                "do": _enum(V.DO_VALUES),
                "attempts": {"type": "integer", "minimum": 1},
                "backoff": _enum(V.BACKOFF_VALUES),
                "delay": {"oneOf": [{"type": "number", "minimum": 0}, _ref("template")]},
                "to": {"type": "string", "pattern": IDENTIFIER, "description": "task label (with do: jump)"},
                "set_iter": {"type": "object"},
                "set_ctx": {"type": "object"},
            },
            required=("do",),
        ),
        "allOf": [
            {
                "if": {"properties": {"do": {"const": "jump"}}},
                "then": {"required": ["to"]},
                "else": {"not": {"required": ["to"]}},
            },
            {
                "if": {"not": {"properties": {"do": {"const": "retry"}}}},
                "then": {"not": {"required": ["attempts"]}},
            },
        ],
    }


def _defs(kinds: tuple[str, ...]) -> Schema:
    control = sorted(V.CONTROL_KEYS)
    no_control = {"propertyNames": {"not": {"enum": control}}}
    return {
        "template": {"type": "string", "pattern": TEMPLATE, "description": "a Jinja2 template"},
        "condition": {
            "oneOf": [{"type": "boolean"}, _ref("template")],
            "description": "a boolean or a template that renders to one",
        },
        "metadata": _obj(
            {
                "name": {"type": "string", "minLength": 1},
                "path": {"type": "string", "minLength": 1},
                "version": {"type": ["string", "number"]},
                "description": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
            required=("name", "path"),
        ),
        "keychainEntry": _obj(
            {"name": {"type": "string", "pattern": IDENTIFIER}, "kind": {"type": "string", "minLength": 1}},
            required=V.KEYCHAIN_REQUIRED,
            closed=False,
        ),
        "executor": _obj(
            {
                "kind": {"type": "string"},
                "spec": {
                    **_obj(
                        {
                            "policy": {
                                **_obj(
                                    {
                                        **{k: {"type": "object"} for k in V.EXECUTOR_POLICY_KEYS},
                                        "limits": _obj(
                                            {"max_payload_bytes": {"type": "integer", "minimum": 1}},
                                            closed=False,
                                        ),
                                    },
                                    closed=False,
                                ),
                                **no_control,
                            },
                            "extensions": {"type": "array", "items": _enum(V.EXTENSIONS)},
                            "pool": {"type": "string", "pattern": "^[A-Za-z0-9_-]+$"},
                        },
                        closed=False,
                    ),
                },
            },
        ),
        "step": _obj(
            {
                "step": _name(V.RESERVED_NAMES, "step name"),
                "desc": {"type": "string"},
                "spec": _ref("stepSpec"),
                "loop": _ref("loop"),
                "tool": _ref("pipeline"),
                "next": _ref("router"),
                "input": {
                    "type": "object",
                    "description": "the step's own inputs, rendered before its tasks (dialect)",
                },
                "set": _ref("scopedSet"),
                "output": _obj(
                    {"store": True, "output_select": True},
                    description="NoETL's storage hint: accepted and ignored (the result stays inline)",
                ),
            },
            required=("step",),
            description="a workflow step: admission (spec.policy.admit), loop, pipeline, router; "
            "with neither tool nor next, a terminal step (it ends the branch that reaches it)",
        ),
        "stepSpec": {
            **_obj({"policy": _ref("stepPolicy")}, closed=False),
            "propertyNames": {"not": {"const": "next_mode"}},
        },
        "stepPolicy": _obj(
            {
                "admit": _obj(
                    {"mode": _enum(V.ROUTE_MODES), "rules": {"type": "array", "items": _ref("admitRule")}},
                    required=("rules",),
                ),
                "lifecycle": _obj({k: {"type": "number", "exclusiveMinimum": 0} for k in V.LIFECYCLE_KEYS}),
                "failure": _obj({"mode": _enum(V.FAILURE_MODES)}),
                **{k: True for k in V.STEP_POLICY_KEYS if k not in ("admit", "lifecycle", "failure")},
            },
            description="step scope: admission and lifecycle, no task control",
        ),
        "admitRule": _rule("admitThen"),
        "admitThen": _obj({"allow": {"type": "boolean"}}, required=("allow",)),
        "loop": _obj(
            {
                "in": {"oneOf": [{"type": "array"}, _ref("template")]},
                "iterator": {
                    "type": "string",
                    "pattern": IDENTIFIER,
                    "not": {"enum": sorted(V.ITER_RESERVED)},
                },
                "spec": _ref("loopSpec"),
                "cursor": _obj(
                    {
                        "kind": {"const": "postgres"},
                        "auth": {"type": "string"},
                        "dsn": {"type": "string"},
                        "claim": {"type": "string"},
                    },
                    required=("kind", "claim"),
                    description="a cursor loop's claim (spec.mode: cursor): each returned row is an iteration",
                ),
            },
            required=("iterator",),
        ),
        "loopSpec": _obj(
            {
                "mode": _enum(V.LOOP_MODES),
                "max_in_flight": _ref("maxInFlight"),
                "frame": _obj({"max_rows": {"type": "integer", "minimum": 1}}),
                "policy": _obj(
                    {
                        "exec": _enum(V.LOOP_EXECS),
                        "mode": _enum(V.LOOP_MODES),
                        "max_in_flight": _ref("maxInFlight"),
                        **{k: True for k in V.LOOP_POLICY_KEYS if k not in ("exec", "mode", "max_in_flight")},
                    }
                ),
            },
            closed=False,
        ),
        "maxInFlight": {"oneOf": [{"type": "integer", "minimum": 1}, _ref("template")]},
        "pipeline": {
            "oneOf": [_ref("pipelineItem"), {"type": "array", "minItems": 1, "items": _ref("pipelineItem")}],
            "description": "one task, or the ordered list of tasks (003 §7)",
        },
        "pipelineItem": {"oneOf": [_ref("task"), _ref("choose"), _ref("while"), _ref("until")]},
        "body": {"oneOf": [_ref("pipelineItem"), {"type": "array", "items": _ref("pipelineItem")}]},
        "choose": _obj(
            {
                "name": {"type": "string", "pattern": IDENTIFIER},
                "choose": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "oneOf": [
                            _obj(
                                {"when": _ref("condition"), "then": _ref("body")}, required=("when", "then")
                            ),
                            _obj({"else": _ref("body")}, required=("else",)),
                        ]
                    },
                },
            },
            required=("choose",),
            description="authoring sugar (003 §14): a when/then/else ladder, compiled to jumps",
        ),
        "while": _obj(
            {
                "name": {"type": "string", "pattern": IDENTIFIER},
                "while": _ref("condition"),
                "do": _ref("body"),
            },
            required=("while", "do"),
            description="authoring sugar (003 §14): a loop that checks before each run of its body",
        ),
        "until": _obj(
            {
                "name": {"type": "string", "pattern": IDENTIFIER},
                "until": _ref("condition"),
                "do": _ref("body"),
            },
            required=("until", "do"),
            description="authoring sugar (003 §14): a loop that checks after each run of its body",
        ),
        "scopedSet": {
            "type": "object",
            "minProperties": 1,
            "propertyNames": {"pattern": r"^(ctx|iter)(\.[A-Za-z_][A-Za-z0-9_]*)?$"},
            "description": "patches applied when the task/step completes: ctx.<name> or iter.<name> (dialect)",
        },
        "task": _task(kinds),
        "workbook": {
            "description": "reusable task templates by name (or under 'tasks', or a list of {name, tool})",
            "oneOf": [
                _obj(
                    {"tasks": {"type": "object", "additionalProperties": _ref("task")}}, required=("tasks",)
                ),
                {
                    "type": "object",
                    "not": {"required": ["tasks"]},
                    "propertyNames": {"pattern": IDENTIFIER},
                    "additionalProperties": _ref("task"),
                },
                {
                    "type": "array",
                    "items": _obj(
                        {"name": {"type": "string", "pattern": IDENTIFIER}, "tool": _ref("task")},
                        required=("name", "tool"),
                    ),
                },
            ],
        },
        "taskSpec": _obj({"policy": _ref("taskPolicy")}, closed=False),
        "taskPolicy": _obj(
            {
                "rules": {"type": "array", "items": _ref("taskRule")},
                "mode": _enum(V.ROUTE_MODES),
                "on_unmatched": _enum(("continue",)),
                "before": {"type": "array"},
                "after": {"type": "array"},
                "finally": {"type": "array"},
            },
            required=("rules",),
            description="task outcome policy: the only place for do: continue|retry|jump|break|fail",
        ),
        "taskRule": _rule("then"),
        "then": _then(),
        "router": _obj(
            {
                "spec": _obj(
                    {"mode": _enum(V.ROUTE_MODES), "policy": {"type": "object", **no_control}},
                ),
                "arcs": {"type": "array", "minItems": 1, "items": _ref("arc")},
            },
            required=("arcs",),
        ),
        "arc": _obj(
            {
                "step": {"type": "string", "pattern": IDENTIFIER},
                "when": _ref("condition"),
                "args": {"type": "object"},
                "spec": {"type": "object"},
            },
            required=("step",),
        ),
    }


def playbook_schema() -> Schema:
    """The schema, as a JSON-ready dict (deterministic: same registry, same output)."""
    kinds = known_kinds()
    root = _obj(
        {
            "apiVersion": {"const": V.API_VERSION},
            "kind": {"const": V.KIND},
            "metadata": _ref("metadata"),
            "keychain": {"type": "array", "items": _ref("keychainEntry")},
            "executor": _ref("executor"),
            "workload": {"type": "object", "description": "input defaults, merged with the request"},
            "workflow": {
                "type": "array",
                "minItems": 1,
                "items": _ref("step"),
                "contains": {
                    "type": "object",
                    "properties": {"step": {"const": "start"}},
                    "required": ["step"],
                },
                "description": "the steps; execution begins at the step named 'start'",
            },
            "workbook": _ref("workbook"),
        },
        required=("apiVersion", "kind", "metadata", "workflow"),
    )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": f"NoETL playbook ({V.API_VERSION}, canonical v10 authoring form)",
        **root,
        "$defs": _defs(kinds),
    }


def render() -> str:
    """The schema file's text."""
    return json.dumps(playbook_schema(), indent=2, ensure_ascii=False) + "\n"


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
