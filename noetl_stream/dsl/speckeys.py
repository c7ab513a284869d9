"""Unknown keys in a ``spec``: warnings (code ``unknown-spec-key``), never errors.

All knobs live under ``spec`` (003 §3), and nothing reads a key outside the vocabulary of its scope
(``vocabulary.py``), so a misspelt knob (``timout``) or one in the wrong place (``distributed: true``
beside a loop's ``mode``) would otherwise be ignored without a word. Spec is the extension point:
the validator warns and the playbook still runs.

A scope knows its own keys and, layered into its tasks (003 §3.1), the knobs of the tools: a task's
spec those of its kind; executor, step and loop those of every built-in kind. A kind the vocabulary
does not know (a plugin's, or any with the ``custom_kinds`` extension) reads what it likes, so its
task spec, and the outer specs above it, are not checked.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from noetl_stream.dsl import vocabulary as V
from noetl_stream.dsl.diagnostics import Path
from noetl_stream.dsl.model import Playbook, Task

if TYPE_CHECKING:
    from noetl_stream.dsl.compiler import Compiler

CODE = "unknown-spec-key"

_OWN: dict[str, tuple[str, ...]] = {
    "executor.spec": (*V.EXECUTOR_SPEC_KEYS, *V.LAYERED_SPEC_KEYS),
    "step.spec": (*V.STEP_SPEC_KEYS, *V.LAYERED_SPEC_KEYS),
    "loop.spec": (*V.LOOP_SPEC_KEYS, *V.LAYERED_SPEC_KEYS),
    "next.spec": V.NEXT_SPEC_KEYS,
    "executor.spec.policy": V.EXECUTOR_POLICY_KEYS,
    "step.spec.policy": V.STEP_POLICY_KEYS,
    "loop.spec.policy": V.LOOP_POLICY_KEYS,
    "next.spec.policy": V.NEXT_POLICY_KEYS,
    "task.spec.policy": V.TASK_POLICY_KEYS,
}
_RETRY_WORDS = ("retry", "retries", "attempts", "backoff")


def task_spec_keys(kind: str) -> tuple[str, ...] | None:
    """The spec keys a task of ``kind`` reads; None when the vocabulary does not know the kind."""
    if kind == "workbook":  # the template's kind reads them (its spec under the caller's)
        return (*V.TASK_SPEC_KEYS, *V.TOOL_KNOBS)
    knobs = V.TOOL_SPEC_KEYS.get(kind)
    return None if knobs is None else (*V.TASK_SPEC_KEYS, *knobs)


def _elsewhere(key: str, where: str, kind: str | None) -> str:
    """Where ``key`` belongs when not here: a loop's exec or mode written as a key, another scope's key,
    another kind's knob, or task control."""
    if where == "loop.spec" and key in V.LOOP_EXECS:
        return f"; did you mean 'policy: {{exec: {key}}}'?"
    if where == "loop.spec" and key in V.LOOP_MODES:
        return f"; did you mean 'mode: {key}'?"
    if kind is not None:
        readers = [k for k, knobs in V.TOOL_SPEC_KEYS.items() if key in knobs]
        if readers:
            return f"; kind '{kind}' does not read it (kinds that do: {', '.join(readers)})"
    scopes = [s for s, keys in _OWN.items() if s != where and key in keys and not s.startswith("task")]
    if scopes:
        return f"; '{key}' is a key of {', '.join(scopes)}"
    if difflib.get_close_matches(key, _RETRY_WORDS, n=1, cutoff=0.75):
        return "; retrying is task policy: spec.policy.rules with 'then: {do: retry, attempts: N}'"
    return ""


def warn_unknown(
    c: Compiler,
    key: Any,
    path: Path,
    who: str,
    where: str,
    known: Iterable[str],
    kind: str | None = None,
) -> None:
    """Warn that ``key`` of the spec (or policy) at ``where`` is ignored, with the keys known there."""
    known = tuple(dict.fromkeys(known))
    word = str(key)
    hint = V.close_key(word, known) or _elsewhere(word, where, kind)
    what = f"{where} key '{word}'" + (f" for kind '{kind}'" if kind is not None else "")
    c.warn(
        path,
        f"{who}: unknown {what}, ignored{hint} (known: {', '.join(sorted(known))})",
        at_key=True,
        code=CODE,
    )


def check_keys(
    c: Compiler,
    raw: dict[str, Any],
    path: Path,
    who: str,
    where: str,
    skip: Iterable[str] = (),
) -> None:
    """Warn about each key of the mapping ``raw`` (the spec or policy at ``where``) unknown there;
    ``skip``: keys reported otherwise (control actions, rejected keys)."""
    known = _OWN[where]
    skipped = set(skip)
    for k in raw:
        if k not in known and k not in skipped:
            warn_unknown(c, k, (*path, k), who, where, known)


def check_task_spec(
    c: Compiler, spec: dict[str, Any], path: Path, who: str, kind: str, skip: Iterable[str] = ()
) -> None:
    """A task's spec: ``policy``, ``timeout_s`` and the knobs of its own kind; ``skip``: keys reported
    otherwise (tool fields written under spec)."""
    known = task_spec_keys(kind)
    if known is None:
        return
    skipped = set(skip)
    for k in spec:
        if k not in known and k not in skipped:
            warn_unknown(c, k, (*path, k), who, "task.spec", known, kind)


def _kind(task: Task, playbook: Playbook) -> str:
    if task.kind != "workbook":
        return task.kind
    template = playbook.workbook.get(str(task.config.get("task", task.name)))
    return template.kind if template is not None else task.kind


def _open(tasks: Iterable[Task], playbook: Playbook) -> bool:
    """Whether one of ``tasks`` is of a kind whose spec keys the vocabulary does not know."""
    return any(task_spec_keys(_kind(t, playbook)) is None for t in tasks)


def check_spec_keys(c: Compiler, playbook: Playbook, data: dict[str, Any]) -> None:
    """Executor, step and loop specs (task specs are checked as tasks are parsed)."""
    raw_steps = data.get("workflow") or []
    index = {
        name: i
        for i, item in enumerate(raw_steps)
        if isinstance(item, dict) and isinstance(name := item.get("step"), str)
    }
    every = [t for s in playbook.workflow for t in s.tasks] + list(playbook.workbook.values())
    executor = data.get("executor")
    spec = executor.get("spec") if isinstance(executor, dict) else None
    if isinstance(spec, dict) and not _open(every, playbook):
        check_keys(c, spec, ("executor", "spec"), "executor", "executor.spec")
    for step in playbook.workflow:
        i = index.get(step.name)
        if i is None or _open(step.tasks, playbook):
            continue
        raw = raw_steps[i]
        who = f"step '{step.name}'"
        if isinstance(raw.get("spec"), dict):
            check_keys(c, raw["spec"], ("workflow", i, "spec"), who, "step.spec", V.SPEC_REJECTED)
        loop = raw.get("loop")
        if isinstance(loop, dict) and isinstance(loop.get("spec"), dict):
            check_keys(c, loop["spec"], ("workflow", i, "loop", "spec"), who, "loop.spec")
