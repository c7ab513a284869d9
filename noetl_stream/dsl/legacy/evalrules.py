"""002: a task's ``eval`` list (``expr``, flat ``do``), ``set_vars``/``set_shared``/``set_prev``.

``eval: [{expr: X, do: D, ...}, {else: {do: D}}]`` becomes ``spec.policy.rules: [{when: X, then:
{do: D, ...}}, {else: {then: {do: D}}}]``. ``set_vars`` (step scope) becomes ``set_iter``: 002 §6.5
lets an implementation map step-scoped writes to iteration scope, which is what keeps parallel loops
safe; ``set_shared`` becomes ``set_ctx``. ``set_prev: V`` (the next task's ``_prev``) becomes a jump
to a generated ``noop`` task that returns V and then does what the rule did.
"""

from __future__ import annotations

from typing import Any

from noetl_stream.dsl.diagnostics import Path
from noetl_stream.dsl.legacy.context import Translation, UntranslatableError
from noetl_stream.dsl.rewrite import template

THEN_FLAT = (
    "do",
    "attempts",
    "backoff",
    "delay",
    "to",
    "set_iter",
    "set_ctx",
    "set_vars",
    "set_shared",
    "set_prev",
)


def translate_rule_list(t: Translation, rules: list[Any], path: Path, who: str) -> list[Any]:
    """002 rule items (``eval`` entries, or ``rules`` entries using ``expr``) as canonical rules."""
    out: list[Any] = []
    for i, item in enumerate(rules):
        rp = (*path, i)
        if not isinstance(item, dict):
            out.append(item)
            continue
        rule = _rule(t, item, rp, who)
        out.append(rule)
    return out


def _rule(t: Translation, item: dict[str, Any], rp: Path, who: str) -> dict[str, Any]:
    if "else" in item:
        body = item["else"]
        if isinstance(body, dict) and "then" not in body and any(k in THEN_FLAT for k in body):
            then = _then(t, body, (*rp, "else"), who)
            new_else = t.mark({"then": then}, (*rp, "else"))
            t.origins.mark_key(new_else, "then", (*rp, "else"))
            t.warn((*rp, "else"), f"{who}: 002 'else' with a flat action translated to 'else: {{then: ...}}'")
            return t.mark({"else": new_else}, rp)
        if isinstance(body, dict) and isinstance(body.get("then"), dict):
            body["then"] = _then(t, body["then"], (*rp, "else", "then"), who)
        return item
    flat = [k for k in item if k in THEN_FLAT]
    if "expr" in item or flat:
        when = item.get("expr", item.get("when"))
        if "expr" in item:
            t.warn((*rp, "expr"), f"{who}: 002 'expr' translated to 'when'")
        if "expr" in item and "when" in item:
            t.error((*rp, "expr"), f"{who}: rule has both 'expr' and 'when'; keep one")
        if flat and "then" in item:
            t.error((*rp, flat[0]), f"{who}: '{flat[0]}' is given beside 'then'; put it under 'then'")
        then_src = item["then"] if "then" in item else {k: item[k] for k in flat}
        then_path = (*rp, "then") if "then" in item else rp
        if not isinstance(then_src, dict):
            return item
        if flat and "then" not in item:
            t.warn((*rp, flat[0]), f"{who}: 002 flat rule action translated to 'then: {{do: ...}}'")
        out: dict[str, Any] = t.mark({"when": when, "then": _then(t, dict(then_src), then_path, who)}, rp)
        t.origins.mark_key(out, "when", (*rp, "expr") if "expr" in item else (*rp, "when"))
        t.origins.mark_key(out, "then", then_path)
        for k in item:
            if k not in ("expr", "when", "then", *THEN_FLAT):
                out[k] = item[k]
        return out
    if isinstance(item.get("then"), dict):
        item["then"] = _then(t, item["then"], (*rp, "then"), who)
    return item


def _then(t: Translation, then: dict[str, Any], path: Path, who: str) -> dict[str, Any]:
    out = t.mark(dict(then), path)
    if out.get("backoff") == "fixed":
        out["backoff"] = "none"
        t.warn((*path, "backoff"), f"{who}: 002 'backoff: fixed' translated to 'backoff: none'")
    sequential = "set_vars" in out and t.loop_mode not in (None, "parallel")
    if sequential:  # reported; translated on as if it were not (so nothing else is reported for it)
        t.error(
            (*path, "set_vars"),
            f"{who}: 002 'set_vars' in a sequential loop has no canonical translation: 002 'vars' are "
            "the step run's, shared by every iteration (a running value), while canonical 'iter' is "
            "one iteration's and 'ctx' the whole execution's (002 §6.5 maps vars to iteration scope "
            "only in a parallel loop): write set_iter for a value of one iteration, set_shared "
            "(set_ctx) for a value kept across iterations",
        )
    if "set_vars" in out:
        sv = out.pop("set_vars")
        if isinstance(sv, dict):
            merged = _mapping(
                t, out.get("set_iter"), (*path, "set_iter"), f"{who}: 'set_iter' next to set_vars"
            )
            clash = sorted(set(merged) & set(sv))
            if clash:
                t.error((*path, "set_vars"), f"{who}: set_vars and set_iter both write {', '.join(clash)}")
            merged.update(sv)
            out["set_iter"] = t.mark(merged, (*path, "set_vars"))
            t.step_vars.update(str(k) for k in sv)
            if not sequential:
                t.warn(
                    (*path, "set_vars"),
                    f"{who}: 002 'set_vars' (step scope) translated to 'set_iter' (iteration scope, the "
                    "mapping 002 §6.5 allows); 'vars.<name>' reads become 'iter.<name>'",
                )
        else:
            out["set_vars"] = sv
    if "set_shared" in out:
        sh = out.pop("set_shared")
        if isinstance(sh, dict):
            merged = _mapping(
                t, out.get("set_ctx"), (*path, "set_ctx"), f"{who}: 'set_ctx' next to set_shared"
            )
            merged.update(sh)
            out["set_ctx"] = t.mark(merged, (*path, "set_shared"))
            t.warn((*path, "set_shared"), f"{who}: 002 'set_shared' translated to 'set_ctx'")
        else:
            out["set_shared"] = sh
    return out


def _mapping(t: Translation, value: Any, path: Path, what: str) -> dict[str, Any]:
    """A copy of ``value``, a mapping another one is merged into (absent: empty)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise t.error(path, f"{what} must be a mapping of names to values")
    return dict(value)


def expand_set_prev(t: Translation, tasks: list[Any], path: Path, who: str) -> list[Any]:
    """Replace ``set_prev`` in the rules of ``tasks`` (canonical dicts by now) with generated noops."""
    if not any(
        "set_prev" in (_then_of(r) or {}) for x in tasks if isinstance(x, dict) for r in _rules(x) or []
    ):
        return tasks
    for i, item in enumerate(tasks):  # inserted tasks shift indices: fix the labels they would have had
        if isinstance(item, dict) and "name" not in item:
            kind = next((k for k in ("choose", "while", "until") if k in item and "kind" not in item), None)
            item["name"] = f"{kind}_{i}" if kind else f"task_{i}"
    labels = {str(x.get("name")) for x in tasks if isinstance(x, dict)}
    out: list[Any] = []
    for k, task in enumerate(tasks):
        out.append(task)
        if not isinstance(task, dict):
            continue
        rules = _rules(task)
        if rules is None or not any("set_prev" in (_then_of(r) or {}) for r in rules):
            continue
        name = str(task.get("name"))
        following = next((str(x.get("name")) for x in tasks[k + 1 :] if isinstance(x, dict)), None)
        added: list[dict[str, Any]] = []
        has_else = False
        for i, rule in enumerate(rules):
            then = _then_of(rule)
            if then is None:
                continue
            has_else = has_else or "else" in rule
            # where the author wrote it (an 'eval' entry, a rule): the path it has now is not in the file
            rpath = t.origins.path_of(then) or _then_path(rule, (*path, k, "spec", "policy", "rules", i))
            do = then.get("do", "continue")
            if "set_prev" not in then:
                if do == "continue":
                    _leave(then, following)
                continue
            value = then.pop("set_prev")
            if do in ("retry", "fail"):
                t.error(
                    (*rpath, "set_prev"),
                    f"{who} task '{name}': 'set_prev' with 'do: {do}' has no canonical translation "
                    "(a retried or failed task does not hand a value to the next task)",
                )
                continue
            label = f"{name}_prev_{i}"
            while label in labels:
                label += "_"
            labels.add(label)
            key = f"prev_{name}"
            current = then.get("set_iter")
            if current is not None and not isinstance(current, dict):
                t.error(
                    (*rpath, "set_iter"),
                    f"{who} task '{name}': 'set_iter' next to set_prev must be a mapping of names to values",
                )
                del then["set_iter"]  # reported here, where the author wrote it: not again by the validator
                continue
            then["set_iter"] = {**(current or {}), key: value}
            after = {k2: then[k2] for k2 in ("to",) if k2 in then}
            then["do"], then["to"] = "jump", label
            noop_then: dict[str, Any] = {"do": do, **after}
            if do == "continue":
                _leave(noop_then, following)
            noop = t.mark(
                {
                    "name": label,
                    "kind": "noop",
                    "result": template(f"iter.{key}"),
                    "spec": {"policy": {"rules": [{"else": {"then": noop_then}}]}},
                },
                (*rpath, "set_prev"),
            )
            added.append(noop)
            t.warn(
                (*rpath, "set_prev"),
                f"{who} task '{name}': 002 'set_prev' translated to a jump to task '{label}', which "
                f"returns the value as the next task's _prev",
            )
        if not has_else:
            else_then: dict[str, Any] = {"do": "continue"}
            _leave(else_then, following)
            rules.append({"else": {"then": else_then}})
        out.extend(added)
    return out


def _leave(then: dict[str, Any], following: str | None) -> None:
    """A ``continue`` that must not fall into the generated tasks after its task."""
    if following is None:
        then["do"] = "break"
    else:
        then["do"], then["to"] = "jump", following


def _rules(task: dict[str, Any]) -> list[Any] | None:
    spec = task.get("spec")
    policy = spec.get("policy") if isinstance(spec, dict) else None
    rules = policy.get("rules") if isinstance(policy, dict) else None
    return rules if isinstance(rules, list) else None


def _then_of(rule: Any) -> dict[str, Any] | None:
    if not isinstance(rule, dict):
        return None
    if "else" in rule:
        body = rule["else"]
        then = body.get("then") if isinstance(body, dict) else None
    else:
        then = rule.get("then")
    return then if isinstance(then, dict) else None


def _then_path(rule: dict[str, Any], rp: Path) -> Path:
    return (*rp, "else", "then") if "else" in rule else (*rp, "then")


def check_no_task_legacy(t: Translation, task: dict[str, Any], path: Path, who: str) -> None:
    """Task keys 002 had that nothing translates: report why and drop them. (A task's ``retry:`` is not
    one: NoETL's playbooks give it and both engines ignore it, so the compiler accepts it with a
    warning, ``dsl/toolforms.py``.)"""
    for key in ("when", "sink", "vars"):
        if key in task:
            t.error(
                (*path, key),
                f"{who}: task-level '{key}' has no canonical translation (legacy '{key}' is a step "
                "key; task outcome control is spec.policy.rules)",
            )
            del task[key]


__all__ = ["UntranslatableError", "check_no_task_legacy", "expand_set_prev", "translate_rule_list"]
