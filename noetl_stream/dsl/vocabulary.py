"""The keys the canonical DSL allows at each place, and what replaced the old ones.

Validator and JSON Schema generator both read these, so they cannot drift apart.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Mapping
from typing import Final, TypeGuard

API_VERSION: Final = "noetl.io/v2"
KIND: Final = "Playbook"

ROOT_KEYS: Final = (
    "apiVersion",
    "kind",
    "metadata",
    "keychain",
    "executor",
    "workload",
    "workflow",
    "workbook",
)
METADATA_KEYS: Final = ("name", "path", "version", "description", "labels")
EXECUTOR_KEYS: Final = ("kind", "spec")
IGNORED_KEYS: Final = {
    "root": ("tracing", "labels", "exposes_as_mcp"),
    "metadata": ("tags", "exposes_as_mcp"),
    "executor": ("profile", "version", "requires"),
}
"""Keys NoETL's playbooks give that nothing here reads: accepted with a warning (code ``ignored-key``)."""
KEYCHAIN_REQUIRED: Final = ("name", "kind")
STEP_KEYS: Final = ("step", "desc", "spec", "loop", "tool", "next", "input", "output")
DIALECT_KEYS: Final = ("set", "input")
FRAME_ROWS: Final = "__frame_max_rows"
"""The name a cursor loop's claim reads its frame size by (``loop.spec.frame.max_rows``)."""
"""Keys of the deployed NoETL dialect accepted on steps and tasks (``dsl/dialect.py`` normalizes them)."""
LOOP_KEYS: Final = ("in", "iterator", "spec", "cursor")
LOOP_SPEC_TYPED: Final = ("mode", "max_in_flight", "policy", "frame")
CURSOR_KEYS: Final = ("kind", "auth", "dsn", "claim")
FRAME_KEYS: Final = ("max_rows",)
DEFAULT_FRAME_MAX_ROWS: Final = 100
"""The rows a cursor loop's claim asks for when ``spec.frame.max_rows`` is not given."""
LOOP_POLICY_KEYS: Final = (
    "exec",
    "mode",
    "max_in_flight",
    "ordering",
    "reducers",
    "backpressure",
    "partitioning",
)
NEXT_KEYS: Final = ("spec", "arcs")
NEXT_SPEC_KEYS: Final = ("mode", "policy")
ARC_KEYS: Final = ("step", "when", "args", "spec")
STEP_POLICY_KEYS: Final = (
    "admit",
    "lifecycle",
    "failure",
    "emit",
    "tracing",
    "quotas",
    "compensation",
)
ADMIT_KEYS: Final = ("mode", "rules")
LIFECYCLE_KEYS: Final = ("timeout_s", "deadline_s")
FAILURE_KEYS: Final = ("mode",)
TASK_POLICY_HOOKS: Final = ("before", "after", "finally")
TASK_POLICY_KEYS: Final = ("rules", "mode", "on_unmatched", *TASK_POLICY_HOOKS)
RULE_KEYS: Final = ("when", "then", "else")
THEN_KEYS: Final = ("do", "attempts", "backoff", "delay", "to", "set_iter", "set_ctx")
ADMIT_THEN_KEYS: Final = ("allow",)
EXECUTOR_POLICY_KEYS: Final = ("defaults", "results", "limits", "placement")
NEXT_POLICY_KEYS: Final = ("priority", "dedupe", "partitioning")
"""next.spec.policy: placeholders only (003 §5.5, 001 §13.1); nothing reads them yet."""

# The keys of each ``spec`` (003 §3, 001 §8.1/§10/§13.1): what the code reads there. A key outside them
# is ignored, so the validator warns (``unknown-spec-key``); spec is the extension point, never an error.
# ``tests/dsl/test_dsl_spec_keys.py`` scans the package for the spec keys it reads and finds each one here.
TOOL_SPEC_KEYS: Final = {
    "http": ("timeout", "max_body_bytes"),  # dataplane/tools/http.py; kinds.py default timeout
    "postgres": ("timeout", "pool_size"),  # dataplane/tools/postgres.py; kinds.py default timeout
    "python": ("timeout",),  # dataplane/tools/python.py
    "script": ("timeout",),  # dataplane/tools/script.py
    "playbook": ("child_timeout_s",),  # dataplane/tools/playbook.py
    "duckdb": (),
    "noop": (),
    "secrets": (),
}
"""The knobs each built-in tool reads from its task's effective spec (003 §3.1 layering). A
``workbook`` task runs a template of any kind; kinds not listed here (plugins) read what they like."""
TOOL_KNOBS: Final = tuple(sorted({k for keys in TOOL_SPEC_KEYS.values() for k in keys}))
TASK_SPEC_KEYS: Final = ("policy", "timeout_s")
"""Every task's: its outcome policy (003 §5.4) and the bound of one run (``dataplane/pipeline.py``)."""
EXECUTOR_SPEC_KEYS: Final = ("policy", "extensions", "pool", "deadline_s", "max_task_runs")
"""The executor's own (``compiler.py``, ``control/core/plan.py``, ``control/core/reducer.py``,
``dataplane/pipeline.py``, ``kv/results.py``); its tool knobs layer into every task."""
STEP_SPEC_KEYS: Final = ("policy", "pool")
"""The step's own (``steps.py``, ``control/core/routing.py``, ``control/core/runcontext.py``); its tool knobs layer
into its tasks."""
LOOP_SPEC_KEYS: Final = LOOP_SPEC_TYPED
"""The loop's own (``steps.py``); its other keys (``Loop.raw_spec``) layer into the step's tasks."""
LAYERED_SPEC_KEYS: Final = (*TASK_SPEC_KEYS[1:], *TOOL_KNOBS)
"""Knobs the outer specs (executor, step, loop) hand down to the tasks they hold."""
SPEC_REJECTED: Final = ("next_mode",)
"""Spec keys read only to be rejected (``step.spec.next_mode``, 001 §16)."""

DO_VALUES: Final = ("continue", "retry", "jump", "break", "fail")
BACKOFF_VALUES: Final = ("none", "linear", "exponential")
ROUTE_MODES: Final = ("exclusive", "inclusive")
LOOP_MODES: Final = ("sequential", "parallel", "cursor")
LOOP_EXECS: Final = ("local", "distributed")
FAILURE_MODES: Final = ("fail_fast", "best_effort")
CONTROL_KEYS: Final = frozenset({"rules", "do", "retry", "jump", "break", "continue", "fail"})

# Names a template can read, besides step results, task results and bare workload keys.
SCOPE_NAMES: Final = frozenset(
    {
        "workload",
        "keychain",
        "ctx",
        "args",
        "execution_id",
        "iter",
        "_prev",
        "_task",
        "_attempt",
        "outcome",
        "event",
        "result",
        "loop_result",
    }
)
JINJA_GLOBALS: Final = frozenset(
    {"range", "dict", "lipsum", "cycler", "joiner", "namespace", "true", "false", "none"}
)
RESERVED_NAMES: Final = SCOPE_NAMES | frozenset({"loop", "self", "env"})
ITER_RESERVED: Final = frozenset({"index", "parent", "item_id"})

EXTENSIONS: Final = ("legacy", "custom_kinds")

LEGACY_HINT: Final = " (enable legacy extensions to translate it)"
"""After a legacy construct the extension translates (``control/core/effects.py`` looks for it)."""
LEGACY_HOW: Final = ": validate or run with --legacy, or declare executor.spec.extensions: [legacy]"
LEGACY_UNTRANSLATED: Final = " (the legacy extension has no translation for this form)"
LEGACY_NOT_A_PLAYBOOK: Final = (
    " (the legacy extension translates it only in a playbook, not in a list of steps)"
)
NOT_V10: Final = "is not part of noetl.io/v2 (v10)"

# Deprecated keys -> the canonical replacement, per place.
DEPRECATED_ROOT: Final = {
    "vars": "use ctx (set_ctx in task policies) for mutable state and workload for inputs",
    "name": "use metadata.name",
    "path": "use metadata.path",
    "version": "use metadata.version",
    "description": "use metadata.description",
}
DEPRECATED_STEP: Final = {
    "when": "use spec.policy.admit.rules",
    "case": "use task spec.policy.rules and next.arcs",
    "retry": "use task spec.policy.rules with 'do: retry'",
    "sink": "store results with a task of a storage kind (e.g. postgres) in the pipeline",
    "vars": "use set_ctx or set_iter in task spec.policy.rules",
    "eval": "use task spec.policy.rules",
    "pipe": "a step's tool list is the pipeline",
}
DEPRECATED_TASK: Final = {
    "eval": "use spec.policy.rules",
    "expr": "use 'when' inside spec.policy.rules",
    "sink": "store results with a following task of a storage kind",
    "vars": "use set_iter or set_ctx in spec.policy.rules",
    "when": "use spec.policy.rules (outcome control) or the step's spec.policy.admit (admission)",
}
# The deprecated keys above that the legacy extension translates (in workflow steps); the others have
# no translation, so their messages do not suggest it.
LEGACY_ROOT: Final = frozenset({"name", "path", "version", "description"})
LEGACY_STEP: Final = frozenset({"when", "case", "retry", "sink", "vars"})
LEGACY_TASK: Final = frozenset({"eval"})

DEPRECATED_THEN: Final = {
    "set_vars": "use set_iter (iteration scope) or set_ctx (execution scope)",
    "set_shared": "use set_ctx",
    "set_prev": "the next task's _prev is the outcome result",
}

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_identifier(value: object) -> bool:
    return isinstance(value, str) and bool(_IDENT.match(value))


def is_seconds(value: object, *, positive: bool = False) -> TypeGuard[int | float]:
    """A finite number of seconds, >= 0 (> 0 when ``positive``); not a boolean, NaN or infinity."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return value > 0 if positive else value >= 0


def suggest(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` or the empty string."""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.7)
    return f"; did you mean '{match[0]}'?" if match else ""


def close_key(word: str, allowed: Iterable[str], deprecated: Mapping[str, str] | None = None) -> str:
    """A close allowed key (``"; did you mean 'x'?"``), else a close deprecated one, else ``""``."""
    close = suggest(word, allowed)
    if close:
        return close
    if deprecated:
        match = difflib.get_close_matches(word, list(deprecated), n=1, cutoff=0.6)
        if match:
            return f"; '{match[0]}' {NOT_V10} either: {deprecated[match[0]]}"
    return ""


def key_hint(word: str, allowed: Iterable[str], deprecated: Mapping[str, str] | None = None) -> str:
    """What to say after "unknown key 'x'": a close allowed key, a close deprecated one, or the list."""
    allowed = tuple(allowed)
    return close_key(word, allowed, deprecated) or f" (allowed: {', '.join(sorted(allowed))})"


def type_name(value: object) -> str:
    """How a message names the YAML type of ``value``."""
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "mapping"
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return type(value).__name__


def one_of(values: Iterable[str]) -> str:
    return ", ".join(f"'{v}'" for v in values)
