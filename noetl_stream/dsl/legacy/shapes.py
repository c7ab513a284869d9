"""Small builders of canonical data shared by the legacy translation (rules, arcs, key edits)."""

from __future__ import annotations

from typing import Any

from noetl_stream.dsl.diagnostics import Path
from noetl_stream.dsl.legacy.context import Translation
from noetl_stream.dsl.legacy.scopes import ERR
from noetl_stream.dsl.rewrite import template

FAILED = "event.name == 'step.failed'"
SUCCEEDED = "event.name != 'step.failed'"


def conj(*parts: str | None) -> str | None:
    items = [p for p in parts if p]
    if not items:
        return None
    if len(items) == 1:
        return items[0]
    return " and ".join(f"({p})" if (" or " in p or " if " in p) else p for p in items)


def negate(expr: str) -> str:
    return f"not ({expr})"


def else_rule(then: dict[str, Any]) -> dict[str, Any]:
    return {"else": {"then": then}}


def policy(*rules: dict[str, Any]) -> dict[str, Any]:
    return {"policy": {"rules": list(rules)}}


def fail_on_error(then: dict[str, Any]) -> dict[str, Any]:
    return policy({"when": template(ERR), "then": {"do": "fail"}}, else_rule(then))


def access(base: str, keys: tuple[Any, ...]) -> str:
    out = base
    for k in keys:
        out += f".{k}" if isinstance(k, str) and k.isidentifier() else f"[{k!r}]"
    return out


def leaf_paths(value: dict[str, Any], prefix: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    out: list[tuple[tuple[Any, ...], Any]] = []
    for k, v in value.items():
        if isinstance(v, dict) and v:
            out.extend(leaf_paths(v, (*prefix, k)))
        else:
            out.append(((*prefix, k), v))
    return out


def nest(pairs: list[tuple[tuple[Any, ...], Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for keys, value in pairs:
        node = out
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return out


def make_arc(target: dict[str, Any], when: str | None) -> dict[str, Any]:
    arc: dict[str, Any] = {"step": target["step"]}
    if when:
        arc["when"] = template(when)
    arc.update((k, v) for k, v in target.items() if k != "step")
    return arc


def with_iter(then: dict[str, Any], **values: Any) -> dict[str, Any]:
    extra = {k: v for k, v in values.items() if v is not None}
    if not extra:
        return dict(then)
    return {**then, "set_iter": {**then.get("set_iter", {}), **extra}}


def goto(label: str | None) -> dict[str, Any]:
    return {"do": "jump", "to": label} if label else {"do": "continue"}


def fans_out(arcs: list[dict[str, Any]]) -> bool:
    seen: dict[Any, int] = {}
    for arc in arcs:
        seen[arc.get("when")] = seen.get(arc.get("when"), 0) + 1
    return any(n > 1 for n in seen.values())


def breaks_to(tasks: list[dict[str, Any]], label: str) -> None:
    """A pipeline that gets tasks appended: its ``break`` rules must reach them."""
    for task in tasks:
        spec = task.get("spec")
        policy = spec.get("policy") if isinstance(spec, dict) else None
        rules = policy.get("rules") if isinstance(policy, dict) else None
        for rule in rules if isinstance(rules, list) else []:
            if not isinstance(rule, dict):
                continue
            then = rule["else"].get("then") if isinstance(rule.get("else"), dict) else rule.get("then")
            if isinstance(then, dict) and then.get("do") == "break":
                then["do"], then["to"] = "jump", label


def legacy_tool_keys(t: Translation, call: dict[str, Any], path: Path, who: str) -> None:
    if call.get("kind") == "http" and "endpoint" in call and "url" not in call:
        rename_key(call, "endpoint", "url")
        t.origins.mark_key(call, "url", (*path, "endpoint"))
        t.warn((*path, "endpoint"), f"{who}: legacy http 'endpoint' translated to 'url'")
    if "with" in call and "args" not in call:
        rename_key(call, "with", "args")
        t.origins.mark_key(call, "args", (*path, "with"))
        t.warn((*path, "with"), f"{who}: legacy tool 'with' translated to 'args'")


def rename_key(d: dict[str, Any], old: str, new: str) -> None:
    """Rename a key where it stands (the rewritten playbook keeps the author's key order)."""
    items = list(d.items())
    d.clear()
    for k, v in items:
        d[new if k == old else k] = v


def put_spec(step: dict[str, Any]) -> dict[str, Any]:
    """The step's ``spec`` mapping, created right after ``step``/``desc`` when missing."""
    if "spec" not in step:
        items = list(step.items())
        after = "desc" if "desc" in step else "step"
        step.clear()
        for k, v in items:
            step[k] = v
            if k == after:
                step["spec"] = {}
        step.setdefault("spec", {})
    spec: dict[str, Any] = step["spec"]
    return spec
