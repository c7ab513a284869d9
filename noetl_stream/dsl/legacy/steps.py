"""One legacy step: 002 step forms (``when``, ``spec.next_mode``, list ``next``, task ``eval``) and
000/004 ones (structural ``next``, ``loop.mode``; ``case``/``retry``/``sink``/``vars`` in ``build``)."""

from __future__ import annotations

from typing import Any

from noetl_stream.dsl.diagnostics import Path
from noetl_stream.dsl.legacy.build import LegacyStep
from noetl_stream.dsl.legacy.case import target_problem
from noetl_stream.dsl.legacy.context import Translation
from noetl_stream.dsl.legacy.evalrules import check_no_task_legacy, expand_set_prev, translate_rule_list
from noetl_stream.dsl.legacy.scopes import ScopeError, Scopes
from noetl_stream.dsl.legacy.shapes import SUCCEEDED, legacy_tool_keys, put_spec, rename_key
from noetl_stream.dsl.legacy.sinks import default_auth
from noetl_stream.dsl.rewrite import Rewrite, rewrite_value, template

STEP_000 = ("case", "retry", "sink", "vars")


def translate_step(
    t: Translation, step: dict[str, Any], path: Path, names: set[str], plain: set[str]
) -> list[dict[str, Any]]:
    """Rewrite ``step`` in place; return steps the translation adds after it."""
    name = str(step["step"])
    who = f"step '{name}'"
    t.step_vars = set()
    _admission(t, step, path, who)
    _step_args(t, step, path, who)
    mode = _next_mode(t, step, path, who)
    _loop(t, step, path, who)
    t.loop_mode = _loop_mode(step)
    _tool(t, step, path, who)
    raw_next = step.get("next")
    parsed = _parse_next(t, raw_next, (*path, "next"), who)
    added: list[dict[str, Any]] = []
    loop = step.get("loop")
    it = loop.get("iterator") if isinstance(loop, dict) else None
    if isinstance(it, str) and it not in plain and "tool" in step and not any(k in step for k in STEP_000):
        step["tool"] = rewrite_value(step["tool"], Rewrite(names={it: f"iter.{it}"}))
    if any(k in step for k in STEP_000):
        if parsed is not None and parsed[1]:
            raise t.error(
                (*path, "next"),
                f"{who}: a conditional 'next' list (002) next to 000 'case'/'retry'/'sink'/'vars' has no "
                "single translation: route with case rules on step.exit",
            )
        targets = parsed[0] if parsed is not None else []
        if parsed is None and raw_next is not None:
            raise t.error(
                (*path, "next"), f"{who}: a 'next' router next to 000 'case' rules: route with one of them"
            )
        for i, target in enumerate(targets):  # they become arcs here, not in the validator
            problem = target_problem(target)
            if problem is not None:
                raise t.error(
                    (*path, "next", i) if isinstance(raw_next, list) else (*path, "next"),
                    f"{who}: a 'next' target is a step name or {{step, args}}, got {problem}",
                )
        step.pop("next", None)
        if targets:
            t.warn(
                (*path, "next"),
                f"{who}: structural 'next' translated to next.arcs (taken when no case rule transitions)",
            )
        added = LegacyStep(t, step, path, targets, names, plain).translate()
    elif parsed is not None:
        targets, conditional = parsed
        bare = isinstance(raw_next, str) or any(isinstance(x, str) for x in raw_next or [])
        structural = not conditional and (bare or t.structural_next)
        iterator = it if isinstance(it, str) and it not in plain else None
        scopes = Scopes(step=name, call=f"{name}_task", loop=isinstance(loop, dict), iterator=iterator)
        _arc_reads(t, targets, path, name, scopes if structural else None, plain)
        step["next"] = _router(t, step, path, who, targets, structural, conditional, mode)
    elif mode is not None and isinstance(raw_next, dict):
        spec = raw_next.setdefault("spec", {})
        if isinstance(spec, dict) and spec.get("mode", mode) != mode:
            raise t.error((*path, "spec", "next_mode"), f"{who}: spec.next_mode and next.spec.mode disagree")
        if isinstance(spec, dict):
            spec["mode"] = mode
    t.vars_by_step[name] = set(t.step_vars)
    for new in added:
        t.vars_by_step[str(new["step"])] = set(t.step_vars)
        t.after_steps.add(str(new["step"]))
    return added


def _admission(t: Translation, step: dict[str, Any], path: Path, who: str) -> None:
    if "when" not in step:
        return
    when = step.pop("when")
    if not isinstance(step.get("spec", {}), dict):
        return
    spec = put_spec(step)
    policy = spec.setdefault("policy", {})
    if not isinstance(policy, dict) or "admit" in policy:
        raise t.error((*path, "when"), f"{who}: step 'when' and spec.policy.admit both given; keep one")
    rule = t.mark({"when": when, "then": {"allow": True}}, (*path, "when"))
    t.origins.mark_key(rule, "when", (*path, "when"))
    policy["admit"] = {"rules": [rule, {"else": {"then": {"allow": False}}}]}
    t.warn((*path, "when"), f"{who}: 002 step 'when' translated to spec.policy.admit")


def _step_args(t: Translation, step: dict[str, Any], path: Path, who: str) -> None:
    """000 §2.2: a step's own ``args`` (a templated mapping) are its inputs: ``input:``."""
    if "args" not in step:
        return
    if "input" in step:
        raise t.error((*path, "args"), f"{who}: step 'args' and 'input' both given; keep one")
    rename_key(step, "args", "input")
    t.origins.mark_key(step, "input", (*path, "args"))
    t.warn((*path, "args"), f"{who}: 000 step 'args' translated to step 'input' (merged over the arcs' args)")


def _next_mode(t: Translation, step: dict[str, Any], path: Path, who: str) -> str | None:
    spec = step.get("spec")
    if not isinstance(spec, dict) or "next_mode" not in spec:
        return None
    mode = spec.pop("next_mode")
    if not spec:
        step.pop("spec")
    t.warn((*path, "spec", "next_mode"), f"{who}: 002 'spec.next_mode' translated to next.spec.mode")
    return str(mode)


def _loop(t: Translation, step: dict[str, Any], path: Path, who: str) -> None:
    loop = step.get("loop")
    if not isinstance(loop, dict) or "mode" not in loop:
        return
    spec = loop.setdefault("spec", {})
    if isinstance(spec, dict) and "mode" not in spec:
        spec["mode"] = loop.pop("mode")
        t.warn((*path, "loop", "mode"), f"{who}: 000 'loop.mode' translated to loop.spec.mode")


def _loop_mode(step: dict[str, Any]) -> str | None:
    """The step's loop mode once ``loop.mode`` moved under ``spec`` (sequential unless given)."""
    loop = step.get("loop")
    if not isinstance(loop, dict):
        return None
    spec = loop.get("spec")
    mode = spec.get("mode", "sequential") if isinstance(spec, dict) else "sequential"
    return mode if isinstance(mode, str) else "sequential"


def _tool(t: Translation, step: dict[str, Any], path: Path, who: str) -> None:
    raw = step.get("tool")
    tpath: Path = (*path, "tool")
    if isinstance(raw, dict) and "kind" in raw:
        _task(t, raw, tpath, f"{who} task '{step['step']}_task'")
        return
    if not isinstance(raw, list):
        return
    tasks: list[Any] = []
    for i, item in enumerate(raw):
        ipath: Path = (*tpath, i)
        if isinstance(item, dict) and "kind" not in item and len(item) == 1:
            label, body = next(iter(item.items()))
            if isinstance(body, dict) and "name" not in body:
                new = t.mark({"name": label, **body}, (*ipath, label))
                t.origins.mark_key(new, "name", (*ipath, label))
                t.warn(
                    (*ipath, label), f"{who}: task '{label}' (label-as-key) rewritten as '- name: {label}'"
                )
                _task(t, new, (*ipath, label), f"{who} task '{label}'")
                tasks.append(new)
                continue
        if isinstance(item, dict):
            _task(t, item, ipath, f"{who} task '{item.get('name', f'task_{i}')}'")
        tasks.append(item)
    step["tool"] = expand_set_prev(t, tasks, tpath, who)


def _task(t: Translation, task: dict[str, Any], path: Path, who: str) -> None:
    check_no_task_legacy(t, task, path, who)
    legacy_tool_keys(t, task, path, who)
    default_auth(t, task, path, who)
    if "eval" in task:
        rules = task.pop("eval")
        spec = task.setdefault("spec", {})
        if not isinstance(spec, dict) or "policy" in spec:
            raise t.error((*path, "eval"), f"{who}: 'eval' and spec.policy both given; keep one")
        if not isinstance(rules, list):
            raise t.error((*path, "eval"), f"{who}: 'eval' must be a list of rules")
        new_rules = t.mark(translate_rule_list(t, rules, (*path, "eval"), who), (*path, "eval"))
        policy = {"rules": new_rules}
        spec["policy"] = policy
        t.origins.mark_key(policy, "rules", (*path, "eval"))
        t.warn((*path, "eval"), f"{who}: 002 'eval' translated to spec.policy.rules")
        return
    spec = task.get("spec")
    current = spec.get("policy") if isinstance(spec, dict) else None
    rules = current.get("rules") if isinstance(current, dict) else None
    if isinstance(current, dict) and isinstance(rules, list):
        current["rules"] = translate_rule_list(t, rules, (*path, "spec", "policy", "rules"), who)


def _parse_next(t: Translation, raw: Any, path: Path, who: str) -> tuple[list[dict[str, Any]], bool] | None:
    """``next`` as a string or a list: its arcs and whether any is conditional (002). None: not legacy."""
    if isinstance(raw, str):
        return [_bare(t, raw, path)], False
    if not isinstance(raw, list):
        return None
    arcs: list[dict[str, Any]] = []
    conditional = False
    for i, item in enumerate(raw):
        ip: Path = (*path, i)
        if isinstance(item, str):
            arcs.append(_bare(t, item, ip))
        elif isinstance(item, dict):
            arc = t.mark(dict(item), ip)
            if "expr" in arc:
                if "when" in arc:
                    raise t.error((*ip, "expr"), f"{who}: arc has both 'expr' and 'when'; keep one")
                rename_key(arc, "expr", "when")
                t.origins.mark_key(arc, "when", (*ip, "expr"))
                t.warn((*ip, "expr"), f"{who}: 002 arc 'expr' translated to 'when'")
            if "with" in arc and "args" not in arc:
                rename_key(arc, "with", "args")
                t.origins.mark_key(arc, "args", (*ip, "with"))
                t.warn((*ip, "with"), f"{who}: legacy arc 'with' translated to 'args'")
            conditional = conditional or "when" in arc
            arcs.append(arc)
        else:
            arcs.append(item)
    return arcs, conditional


def _arc_reads(
    t: Translation,
    arcs: list[Any],
    path: Path,
    name: str,
    scopes: Scopes | None,
    plain: set[str],
) -> None:
    """``result``/``response`` in arcs read the step's result (000 §3.3), as they do on a step with
    ``case`` rules. A structural next (``scopes``) is checked like one: nothing of the step's run but
    its result exists after it."""
    own = Rewrite(names={n: name for n in ("result", "response") if n not in plain})
    told = False
    for i, arc in enumerate(arcs):
        if not isinstance(arc, dict):
            continue
        where: Path = t.origins.path_of(arc) or (*path, "next", i)
        for key in [k for k in arc if k != "step"]:
            before = arc[key]
            if scopes is not None:
                try:
                    arc[key] = scopes.rewrite(before, "route")
                except ScopeError as exc:
                    raise t.error((*where, key), f"step '{name}': no faithful translation: {exc}") from None
            else:
                arc[key] = rewrite_value(before, own)
            if arc[key] != before and not told:
                told = True
                t.warn(
                    (*where, key),
                    f"step '{name}': 'result'/'response' in 'next' read as the step's result "
                    f"('{{{{ {name} }}}}')",
                )


def _bare(t: Translation, name: str, path: Path) -> dict[str, Any]:
    """The arc of a target written as a step name (its ``step`` is the name the author wrote)."""
    arc = t.mark({"step": name}, path)
    t.bare.add(id(arc))
    return arc


def _router(
    t: Translation,
    step: dict[str, Any],
    path: Path,
    who: str,
    arcs: list[dict[str, Any]],
    structural: bool,
    conditional: bool,
    mode: str | None,
) -> dict[str, Any]:
    """A 002 list (``when`` defaults to true, arcs are evaluated on ``step.failed`` too, exclusive
    unless ``next_mode`` says otherwise) or a 000 structural next (every target, on success)."""
    out: dict[str, Any] = {}
    if not structural:
        if mode is not None:
            out["spec"] = {"mode": mode}
        how = (
            ""
            if conditional
            else " (an arc without 'when' is always taken, on step.failed too; the first one wins "
            "unless next_mode is inclusive)"
        )
        t.warn((*path, "next"), f"{who}: 002 'next' list translated to next.arcs{how}")
    else:
        if step.get("tool"):  # a structural next is the way on: a failure is not routed by it
            for arc in arcs:
                if isinstance(arc, dict):
                    arc.setdefault("when", template(SUCCEEDED))
        chosen = mode or ("inclusive" if len(arcs) > 1 else None)
        if chosen:
            out["spec"] = {"mode": chosen}
        fan = " (every target is taken)" if chosen == "inclusive" and mode is None else ""
        t.warn((*path, "next"), f"{who}: structural 'next' translated to next.arcs{fan}")
    out["arcs"] = arcs
    return t.mark(out, (*path, "next"))
