"""Forms of the NoETL dialect as deployed (noetl.io/v2) that v10 does not show, accepted as canonical.

* Task ``set:`` with scoped keys (``ctx.total: ...``, ``iter.page: ...``, or ``ctx: {total: ...}``)
  is applied when the task completes: it becomes ``set_ctx``/``set_iter`` on every rule of the task's
  policy that does not retry or fail (and on an ``else`` that continues), so the worker needs nothing
  new. Its templates read the task's result as ``outcome.result`` (or by the task's name).
* Step ``set:`` is applied when the step completes: on the rules that end the pipeline (``break``
  anywhere; ``continue`` of the last task). Templates read the step's result by the step's name.
* Step ``set:`` on a looped step is applied once, after the last iteration, with the loop's result
  (the list of iteration results) as the step's name; it writes ``ctx`` only (there is no iteration
  scope then). No task sees the end of a loop, so it runs in a step ``<step>_set`` that the loop's
  success leads to; the step's arcs move there, so they route after the patch, as on any step with
  a ``set:``, and see the loop's boundary as before (``event.name``, ``event.total``, ``event.failed``,
  ... handed on as ``args.loop_event``, and ``args``); failures, and arcs testing a boundary a loop never
  has, still route from the loop step itself.
* Task ``input:`` is the task's ``args``; given beside ``args:``, the two mappings are merged and
  ``input``'s keys win. Step ``input:`` stays on the step (``Step.input``).
"""

from __future__ import annotations

import copy
from typing import Any

from noetl_stream.dsl import vocabulary as V
from noetl_stream.dsl.diagnostics import Diagnostic, Path
from noetl_stream.dsl.origins import Origins
from noetl_stream.dsl.rewrite import (
    Rewrite,
    SplitError,
    as_expression,
    inner,
    reads,
    reads_attr,
    rewrite_value,
    split_event,
    template,
)
from noetl_stream.dsl.source import SourceMap

SCOPES = {"ctx": "set_ctx", "iter": "set_iter"}
ERROR = "{{ outcome.status == 'error' }}"
FAILED = "event.name == 'step.failed'"
SUCCEEDED = "event.name != 'step.failed'"
SOURCE_ARGS = "source_args"
"""Where the ``<step>_set`` step of a looped step finds the loop step's ``args``."""
BOUNDARY = "loop_event"
"""... and the fields of the loop's boundary event its arcs read."""
BOUNDARY_FIELDS = ("name", "status", "total", "done", "failed")
ITERATION_ONLY = ("iter", "input", "_prev", "_task", "_attempt")


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

    def scoped(
        self, raw: Any, path: Path, who: str, where: dict[tuple[str, str], Path] | None = None
    ) -> dict[str, dict[str, Any]]:
        """``set:`` keys by scope: ``{"set_ctx": {...}, "set_iter": {...}}``; `where` gets the authored
        path of each ``(scope, name)``."""
        if where is None:
            where = {}
        if not isinstance(raw, dict) or not raw:
            raise self.error(path, f"{who}: 'set' must be a mapping like {{ctx.total: ..., iter.page: ...}}")
        out: dict[str, dict[str, Any]] = {}
        for key, value in raw.items():
            key = str(key)
            if key in SCOPES and isinstance(value, dict):
                for name, v in value.items():
                    self._name(str(name), (*path, key, name), who)
                    out.setdefault(SCOPES[key], {})[str(name)] = v
                    where[(SCOPES[key], str(name))] = (*path, key, name)
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
            where[(SCOPES[scope], name)] = (*path, key)
        return out

    def mark_patches(self, task: dict[str, Any], where: dict[tuple[str, str], Path]) -> None:
        """Point the ``set_ctx``/``set_iter`` entries the rules of `task` got from a ``set:`` at the key
        the author wrote (so a diagnostic in one shows that key's path and line)."""
        for then in _thens(task):
            for scope in SCOPES.values():
                values = then.get(scope)
                if isinstance(values, dict):
                    for name in values:
                        authored = where.get((scope, str(name)))
                        if authored is not None:
                            self.origins.mark_key(values, name, authored)

    def _merge_input(self, task: dict[str, Any], tpath: Path, twho: str) -> None:
        """Task ``input:`` beside ``args:``: one mapping, ``input``'s keys winning (as a non-empty
        ``input`` wins over a child playbook's ``payload``). A template standing for either cannot be
        merged before it renders: an error."""
        args, given = task["args"], task.pop("input")
        if not isinstance(args, dict) or not isinstance(given, dict):
            which = "input" if not isinstance(given, dict) else "args"
            self.error(
                (*tpath, which),
                f"{twho}: 'input' and 'args' are merged (input's keys win), so both must be mappings; "
                f"'{which}' is not: keep one",
            )
            return
        for key, value in given.items():
            args[key] = value
            self.origins.mark_key(args, key, (*tpath, "input", key))

    def _name(self, name: str, path: Path, who: str) -> None:
        if not V.is_identifier(name):
            raise self.error(
                path, f"{who}: 'set' writes one level of ctx or iter; {name!r} is not a plain name"
            )

    def step(self, step: dict[str, Any], path: Path, names: set[str]) -> dict[str, Any] | None:
        """Normalize ``step`` in place; return the step to add after it (``<step>_set``), if any."""
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
                    self._merge_input(task, tpath, twho)
                else:
                    items = list(task.items())
                    task.clear()
                    for k, v in items:
                        task["args" if k == "input" else k] = v
                    self.origins.mark_key(task, "args", (*tpath, "input"))
            if "set" in task:
                raw = task.pop("set")
                where: dict[tuple[str, str], Path] = {}
                try:
                    patches = self.scoped(raw, (*tpath, "set"), twho, where)
                except _Reject:
                    continue
                rw = Rewrite(names={str(label): "outcome.result"})
                patches = {k: rewrite_value(v, rw) for k, v in patches.items()}
                if not add_patches(task, patches, ("continue", "jump", "break")):
                    self.error(
                        (*tpath, "set"),
                        f"{twho}: 'set' cannot be added to this task's spec.policy (see its errors)",
                    )
                self.mark_patches(task, where)
        if "set" in step:
            raw = step.pop("set")
            try:
                if "loop" in step:
                    return self._loop_set(step, raw, path, who, names)
                self._step_set(step, raw, path, who)
            except _Reject:
                pass
        return None

    def _loop_set(
        self, step: dict[str, Any], raw: Any, path: Path, who: str, names: set[str]
    ) -> dict[str, Any] | None:
        """Step ``set:`` of a looped step: a step ``<step>_set`` after the loop applies it and routes."""
        spath: Path = (*path, "set")
        where: dict[tuple[str, str], Path] = {}
        patches = self.scoped(raw, spath, who, where)
        if "set_iter" in patches:
            key = next(iter(patches["set_iter"]))
            raise self.error(
                spath,
                f"{who}: step 'set' on a looped step applies once, after the last iteration, where there is "
                f"no iteration scope: 'iter.{key}' cannot be written (use 'set' on a task to write iter "
                "in each iteration)",
            )
        values = patches["set_ctx"]
        late = sorted(reads(values) & set(ITERATION_ONLY))
        if late:
            raise self.error(
                spath,
                f"{who}: step 'set' on a looped step applies after the last iteration, where '{late[0]}' "
                f"does not exist (it reads the loop's result, the list of iteration results, as "
                f"'{{{{ {step.get('step')} }}}}')",
            )
        nxt = step.get("next")
        arcs = nxt.get("arcs") if isinstance(nxt, dict) else None
        if "next" in step and not (
            isinstance(arcs, list)
            and arcs
            and all(isinstance(a, dict) and "step" in a and _condition(a.get("when", True)) for a in arcs)
        ):
            return None  # the router's own errors are reported by the validator
        name = str(step.get("step"))
        set_name = f"{name}_set"
        while set_name in names:
            set_name += "_"
        names.add(set_name)
        rw = Rewrite(
            names={"args": f"args.{SOURCE_ARGS}", "event": f"args.{BOUNDARY}"},
            attrs={("event", "result"): name},  # event.name too is the loop's: args.loop_event.name
        )
        stay: list[dict[str, Any]] = []
        moved: list[dict[str, Any]] = []
        for i, arc in enumerate(arcs or []):
            when = as_expression(arc["when"]) if "when" in arc else None
            if "when" in arc and when is None:
                raise self.error(
                    (*path, "next", "arcs", i, "when"),
                    f"{who}: with a step 'set' on a looped step, arc conditions must be expressions "
                    "('{{ ... }}' without '{% %}')",
                )
            apath: Path = (*path, "next", "arcs", i)
            tested = _tested_events(arc.get("when"))
            if tested is not None and not tested & (FAILURE_NAMES | SUCCESS_NAMES | EITHER_NAMES):
                stay.append(arc)  # a boundary a loop never has (step.done): never fires, as without 'set'
                continue
            # An arc without 'when' is taken on success boundaries only: no copy of it stays for failures.
            if tested & (FAILURE_NAMES | EITHER_NAMES) if tested is not None else "when" in arc:
                guard = None if tested is not None and tested <= FAILURE_NAMES else FAILED
                stay.append(self.origins.mark({**arc, "when": template(_and(guard, when))}, apath))
            if tested is None or tested & (SUCCESS_NAMES | EITHER_NAMES):
                guard = None if tested is not None and tested <= SUCCESS_NAMES else SUCCEEDED
                out = rewrite_value(copy.deepcopy(arc), rw)
                out["when"] = template(_and(guard, as_expression(out["when"]) if "when" in out else None))
                moved.append(self.origins.mark_tree(out, apath))
        values = rewrite_value(values, Rewrite(names={"args": f"args.{SOURCE_ARGS}"}))
        hand_on: dict[str, Any] = {}
        if reads_attr([moved, values], "args", SOURCE_ARGS):
            hand_on[SOURCE_ARGS] = template("args")
        if reads_attr(moved, "args", BOUNDARY):
            hand_on[BOUNDARY] = {f: template(f"event.{f} | default(none)") for f in BOUNDARY_FIELDS}
        to_set: dict[str, Any] = {"step": set_name, "when": template(SUCCEEDED)}
        if hand_on:
            to_set["args"] = hand_on
        router = {k: v for k, v in (nxt or {}).items() if k != "arcs"}  # the mode applies on both steps
        step["next"] = self.origins.mark({**router, "arcs": [*stay, to_set]}, spath)
        task: dict[str, Any] = {"kind": "noop", "result": template(name)}
        add_patches(task, {"set_ctx": values}, ("continue",))
        self.mark_patches(task, where)
        added: dict[str, Any] = {"step": set_name, "tool": task}
        if moved:
            added["next"] = {**copy.deepcopy(router), "arcs": moved}
        return self.origins.mark(added, spath)

    def _step_set(self, step: dict[str, Any], raw: Any, path: Path, who: str) -> None:
        where: dict[tuple[str, str], Path] = {}
        patches = self.scoped(raw, (*path, "set"), who, where)
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
            self.mark_patches(task, where)


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


def _thens(task: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``then`` mappings of the rules of a task's policy (an ``else``'s too)."""
    spec = task.get("spec")
    policy = spec.get("policy") if isinstance(spec, dict) else None
    rules = policy.get("rules") if isinstance(policy, dict) else None
    out: list[dict[str, Any]] = []
    for rule in rules if isinstance(rules, list) else ():
        if isinstance(rule, dict):
            then = rule["else"].get("then") if isinstance(rule.get("else"), dict) else rule.get("then")
            if isinstance(then, dict):
                out.append(then)
    return out


def _copy(patches: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {k: dict(v) for k, v in patches.items()}


def _condition(when: Any) -> bool:
    """What the validator accepts as an arc's ``when``: a boolean or one template expression."""
    return isinstance(when, bool) or inner(when) is not None


def _and(*parts: str | None) -> str:
    items = [p for p in parts if p]
    return " and ".join(f"({p})" if len(items) > 1 and (" or " in p or " if " in p) else p for p in items)


FAILURE_NAMES = frozenset({"step.failed", "call.error"})
SUCCESS_NAMES = frozenset({"loop.done", "call.done"})
EITHER_NAMES = frozenset({"step.exit"})


def _tested_events(when: Any) -> frozenset[str] | None:
    """The boundary names an arc condition requires (``event.name == ...``); None: it does not say."""
    try:
        return split_event(when).events
    except SplitError:
        return None


def normalize(data: Any, origins: Origins, smap: SourceMap) -> list[Diagnostic]:
    dialect = Dialect(origins, smap)
    workflow = data.get("workflow") if isinstance(data, dict) else None
    if not isinstance(workflow, list):
        return dialect.diagnostics
    names = {str(s.get("step")) for s in workflow if isinstance(s, dict)}
    out: list[Any] = []
    for i, step in enumerate(workflow):
        out.append(step)
        if isinstance(step, dict):
            added = dialect.step(step, ("workflow", i), names)
            if added is not None:
                out.append(added)
    if len(out) != len(workflow):
        workflow[:] = out
    return dialect.diagnostics


__all__ = ["add_patches", "has_dialect", "normalize"]
