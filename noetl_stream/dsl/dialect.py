"""Forms of the NoETL dialect as deployed (noetl.io/v2) that v10 does not show, accepted as canonical.

* Task ``set:`` with scoped keys (``ctx.total: ...``, ``iter.page: ...``, or ``ctx: {total: ...}``)
  is applied when the task completes: it becomes ``set_ctx``/``set_iter`` on every rule of the task's
  policy that does not retry or fail (and on an ``else`` that continues), so the worker needs nothing
  new. Its templates read the task's result as ``outcome.result`` (or by the task's name).
* Step ``set:`` is applied when the step completes: on the rules that end the pipeline (``break``
  anywhere; ``continue`` of the last task). Templates read the step's result by the step's name.
  A looped step completes after its last iteration, which a task policy cannot see: rejected.
* Task ``input:`` is the task's ``args``. Step ``input:`` stays on the step (``Step.input``).
"""

from __future__ import annotations

from typing import Any

from noetl_stream.dsl import vocabulary as V
from noetl_stream.dsl.diagnostics import Diagnostic, Path
from noetl_stream.dsl.origins import Origins
from noetl_stream.dsl.rewrite import Rewrite, rewrite_value
from noetl_stream.dsl.source import SourceMap

SCOPES = {"ctx": "set_ctx", "iter": "set_iter"}
ERROR = "{{ outcome.status == 'error' }}"


def _tasks(step: dict[str, Any]) -> list[tuple[int | None, dict[str, Any], Path]]:
    """(index, task body, path relative to the step) of the step's tasks, whatever their shape."""
    tool = step.get("tool")
    if isinstance(tool, dict):
        return [(None, tool, ("tool",))] if "kind" in tool else []
    out: list[tuple[int | None, dict[str, Any], Path]] = []
    for i, item in enumerate(tool if isinstance(tool, list) else []):
        if isinstance(item, dict) and "kind" not in item and len(item) == 1:
            label, body = next(iter(item.items()))
            if isinstance(body, dict):
                out.append((i, body, ("tool", i, label)))
                continue
        if isinstance(item, dict):
            out.append((i, item, ("tool", i)))
    return out


def has_dialect(data: Any) -> bool:
    workflow = data.get("workflow") if isinstance(data, dict) else None
    for step in workflow if isinstance(workflow, list) else []:
        if isinstance(step, dict):
            if "set" in step:
                return True
            if any("set" in body or "input" in body for _, body, _ in _tasks(step)):
                return True
    return False


class _Reject(Exception):
    pass


class Dialect:
    def __init__(self, origins: Origins, smap: SourceMap) -> None:
        self.origins = origins
        self.smap = smap
        self.diagnostics: list[Diagnostic] = []

    def error(self, path: Path, message: str) -> _Reject:
        self.diagnostics.append(self.smap.diagnostic(path, message, at_key=True, code="dialect"))
        return _Reject(message)

    def scoped(self, raw: Any, path: Path, who: str) -> dict[str, dict[str, Any]]:
        """``set:`` keys by scope: ``{"set_ctx": {...}, "set_iter": {...}}``."""
        if not isinstance(raw, dict) or not raw:
            raise self.error(path, f"{who}: 'set' must be a mapping like {{ctx.total: ..., iter.page: ...}}")
        out: dict[str, dict[str, Any]] = {}
        for key, value in raw.items():
            key = str(key)
            if key in SCOPES and isinstance(value, dict):
                for name, v in value.items():
                    self._name(str(name), (*path, key, name), who)
                    out.setdefault(SCOPES[key], {})[str(name)] = v
                continue
            scope, dot, name = key.partition(".")
            if not dot or scope not in SCOPES:
                raise self.error(
                    (*path, key),
                    f"{who}: 'set' key '{key}' needs a scope: 'ctx.{key}' (execution) or 'iter.{key}' (iteration)"
                    if not dot
                    else f"{who}: 'set' key '{key}': the scope must be 'ctx' or 'iter', not '{scope}'",
                )
            self._name(name, (*path, key), who)
            out.setdefault(SCOPES[scope], {})[name] = value
        return out

    def _name(self, name: str, path: Path, who: str) -> None:
        if not V.is_identifier(name):
            raise self.error(
                path, f"{who}: 'set' writes one level of ctx or iter; {name!r} is not a plain name"
            )

    def step(self, step: dict[str, Any], path: Path) -> None:
        who = f"step '{step.get('step')}'"
        for index, task, rel in _tasks(step):
            tpath = (*path, *rel)
            label = task.get("name") or (
                rel[-1]
                if len(rel) == 3
                else f"task_{index}"
                if index is not None
                else f"{step.get('step')}_task"
            )
            twho = f"{who} task '{label}'"
            if "input" in task:
                if "args" in task:
                    self.error(
                        (*tpath, "input"),
                        f"{twho}: 'input' and 'args' both given; they are the same: keep one",
                    )
                    del task["input"]
                else:
                    items = list(task.items())
                    task.clear()
                    for k, v in items:
                        task["args" if k == "input" else k] = v
                    self.origins.mark_key(task, "args", (*tpath, "input"))
            if "set" in task:
                raw = task.pop("set")
                try:
                    patches = self.scoped(raw, (*tpath, "set"), twho)
                except _Reject:
                    continue
                rw = Rewrite(names={str(label): "outcome.result"})
                patches = {k: rewrite_value(v, rw) for k, v in patches.items()}
                if not add_patches(task, patches, ("continue", "jump", "break")):
                    self.error(
                        (*tpath, "set"),
                        f"{twho}: 'set' cannot be added to this task's spec.policy (see its errors)",
                    )
        if "set" in step:
            raw = step.pop("set")
            try:
                self._step_set(step, raw, path, who)
            except _Reject:
                pass

    def _step_set(self, step: dict[str, Any], raw: Any, path: Path, who: str) -> None:
        patches = self.scoped(raw, (*path, "set"), who)
        if "loop" in step:
            raise self.error(
                (*path, "set"),
                f"{who}: step 'set' on a looped step is not supported: the step completes after its last "
                "iteration, which no task sees (write set_iter/set_ctx in the last task's policy, or set ctx "
                "in the next step)",
            )
        name = str(step.get("step"))
        patches = {k: rewrite_value(v, Rewrite(names={name: "outcome.result"})) for k, v in patches.items()}
        tasks = _tasks(step)
        if not tasks:
            if "tool" in step:
                return
            step["tool"] = [self.origins.mark({"name": f"{name}_set", "kind": "noop"}, (*path, "set"))]
            tasks = _tasks(step)
        for n, (_, task, _) in enumerate(tasks):
            last = n == len(tasks) - 1
            if not add_patches(task, patches, ("break", "continue") if last else ("break",), create=last):
                raise self.error(
                    (*path, "set"),
                    f"{who}: 'set' cannot be added to the policy of its tasks (see their errors)",
                )


def add_patches(
    task: dict[str, Any], patches: dict[str, dict[str, Any]], dos: tuple[str, ...], *, create: bool = True
) -> bool:
    """Add ``set_ctx``/``set_iter`` to the rules of ``task`` whose ``do`` is in ``dos`` (and an ``else``
    that continues when the policy has none and ``continue`` is in ``dos``). False when the policy
    is malformed (the validator reports it)."""
    spec = task.get("spec")
    if spec is None:
        if not create:
            return True
        spec = task["spec"] = {}
    if not isinstance(spec, dict):
        return False
    policy = spec.get("policy")
    if policy is None:
        if not create:
            return True
        spec["policy"] = {
            "rules": [
                {"when": ERROR, "then": {"do": "fail"}},
                {"else": {"then": {"do": "continue", **_copy(patches)}}},
            ]
        }
        return True
    rules = policy.get("rules") if isinstance(policy, dict) else None
    if not isinstance(rules, list):
        return False
    has_else = False
    for rule in rules:
        if not isinstance(rule, dict):
            return False
        has_else = has_else or "else" in rule
        then = rule["else"].get("then") if isinstance(rule.get("else"), dict) else rule.get("then")
        if not isinstance(then, dict):
            return False
        if then.get("do", "continue") in dos:
            for key, values in patches.items():
                merged = dict(then.get(key) or {}) if isinstance(then.get(key) or {}, dict) else None
                if merged is None:
                    return False
                merged.update(values)
                then[key] = merged
    if not has_else and "continue" in dos:
        rules.append({"else": {"then": {"do": "continue", **_copy(patches)}}})
    return True


def _copy(patches: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {k: dict(v) for k, v in patches.items()}


def normalize(data: Any, origins: Origins, smap: SourceMap) -> list[Diagnostic]:
    dialect = Dialect(origins, smap)
    workflow = data.get("workflow") if isinstance(data, dict) else None
    for i, step in enumerate(workflow if isinstance(workflow, list) else []):
        if isinstance(step, dict):
            dialect.step(step, ("workflow", i))
    return dialect.diagnostics


__all__ = ["add_patches", "has_dialect", "normalize"]
