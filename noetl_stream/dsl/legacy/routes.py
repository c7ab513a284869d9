"""How a translated 000/004 step routes: arcs for ``case`` transitions (first matching rule per
event; the step routes once; the structural ``next`` when no rule transitions) and the ``<step>_exit``
step for work at ``step.exit``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from noetl_stream.dsl.legacy.case import LegacyRule, guard
from noetl_stream.dsl.legacy.scopes import ERR, OK
from noetl_stream.dsl.legacy.shapes import (
    FAILED,
    SUCCEEDED,
    conj,
    else_rule,
    fail_on_error,
    fans_out,
    make_arc,
    negate,
    policy,
)
from noetl_stream.dsl.rewrite import Rewrite, reads, rewrite_value, template

if TYPE_CHECKING:
    from noetl_stream.dsl.diagnostics import Path
    from noetl_stream.dsl.legacy.build import LegacyStep


def routes(
    ls: LegacyStep, per_call: list[LegacyRule], exits: list[LegacyRule], loop_vars: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """Set the step's ``next``; return the steps to add after it (its ``<step>_exit``)."""
    can_fail = bool(ls.step.get("tool"))
    done = [r for r in per_call if r.event == "call.done"]
    errors = [r for r in per_call if r.event == "call.error"]
    success = [[r for r in done if guard(r) != ERR], exits]
    failure = [[r for r in done if guard(r) != OK], errors]
    arcs = chain(ls, failure, FAILED, failed=True)
    new_steps: list[dict[str, Any]] = []
    if any(r.sink is not None or r.fail for r in exits) or loop_vars:
        exit_step, reads_args = build_exit_step(ls, exits, loop_vars, success)
        arc: dict[str, Any] = {"step": ls.exit_name}
        if can_fail:
            arc["when"] = template(SUCCEEDED)
        if reads_args:
            arc["args"] = {"source_args": template("args")}
        arcs.append(arc)
        new_steps.append(exit_step)
    else:
        arcs += chain(ls, success, SUCCEEDED if can_fail else None, fallback=ls.structural)
    if arcs:
        nxt: dict[str, Any] = {"arcs": arcs}
        if fans_out(arcs):
            nxt["spec"] = {"mode": "inclusive"}
        ls.step["next"] = nxt
    else:
        ls.step.pop("next", None)
    return new_steps


def chain(
    ls: LegacyStep,
    groups: list[list[LegacyRule]],
    event_guard: str | None,
    *,
    fallback: list[dict[str, Any]] | None = None,
    failed: bool = False,
) -> list[dict[str, Any]]:
    """Arcs for groups of rules (one group per event, in the order the events happen): in a
    group the first matching rule wins; the step routes once, so a later group transitions only
    when no earlier one did; ``fallback`` (the structural next) when no rule transitioned."""
    arcs: list[dict[str, Any]] = []
    fired: list[str | None] = []
    for rules in groups:
        last = max((i for i, r in enumerate(rules) if r.next), default=-1)
        before = list(fired)
        if None in before:
            break
        earlier: list[str] = []
        for r in rules[: last + 1]:
            if id(r) in ls.route_ids and not failed:
                if r.next:
                    match: str | None = conj(
                        f"ctx.{ls.route_key} == {ls.route_ids[id(r)]}",
                        *(negate(f) for f in before if f),
                    )
                    fired.append(match)
                    for target in r.next:
                        arc = make_arc(target, conj(event_guard, match))
                        if "args" in arc:
                            arc["args"] = ls.rw(arc["args"], r.next_path, "route")
                        arcs.append(ls.t.mark(arc, r.next_path))
                    ls.t.warn(
                        r.next_path,
                        f"{ls.who}: case 'next' on {r.event} translated to next.arcs on "
                        f"ctx.{ls.route_key} (the call's policy records the rule that ended the step)",
                    )
                continue
            cond = ls.cond(r.cond, r.path, "route", failed=failed)
            match = conj(cond, *(negate(e) for e in earlier), *(negate(f) for f in before if f))
            if r.next:
                fired.append(match)
                for target in r.next:
                    arc = make_arc(target, conj(event_guard, match))
                    if "args" in arc:
                        arc["args"] = ls.rw(arc["args"], r.next_path, "route", failed=failed)
                    arcs.append(ls.t.mark(arc, r.next_path))
                ls.t.warn(r.next_path, f"{ls.who}: case 'next' on {r.event} translated to next.arcs")
            if cond is None:
                break
            earlier.append(cond)
    if fallback and None not in fired:
        none_fired = conj(event_guard, *(negate(f) for f in fired if f))
        for target in fallback:
            arc = make_arc(target, none_fired)
            authored = ls.t.origins.path_of(target) or (*ls.path, "next")
            if "args" in arc:
                arc["args"] = ls.rw(arc["args"], authored, "route", failed=failed)
            arcs.append(ls.t.mark(arc, authored))  # its diagnostics point at the 'next' the author wrote
            if id(target) in ls.t.bare:
                ls.t.origins.mark_key(arc, "step", authored)
    return arcs


def build_exit_step(
    ls: LegacyStep, exits: list[LegacyRule], loop_vars: dict[str, Any] | None, success: list[list[LegacyRule]]
) -> tuple[dict[str, Any], bool]:
    t, who, name = ls.t, ls.who, ls.exit_name
    where: Path = (*ls.path, "case") if exits else (*ls.path, "vars")
    tasks: list[dict[str, Any]] = []
    if loop_vars is not None:
        values = {k: ls.rw(v, (*ls.path, "vars", k), "route") for k, v in loop_vars.items()}
        tasks.append(
            {
                "name": f"{name}_vars",
                "kind": "noop",
                "spec": policy(else_rule({"do": "continue", "set_ctx": values})),
            }
        )
        t.ctx_vars.update(str(k) for k in loop_vars)
        t.warn(
            (*ls.path, "vars"),
            f"{who}: 000 'vars' of a looped step translated to set_ctx in step '{name}', after the "
            "loop (vars.<name> reads become ctx.<name>)",
        )
    conds = [ls.cond(r.cond, r.path, "route") for r in exits]
    simple = (len(exits) == 1 and conds[0] is None) or not any(r.sink is not None or r.fail for r in exits)
    route: list[dict[str, Any]] = []
    blocks: list[dict[str, Any]] = []
    for i, (r, cond) in enumerate(zip(exits, conds, strict=True)):
        block: list[dict[str, Any]] = []
        if r.sink is not None:
            label = f"{name}_sink" if simple else f"{name}_sink_{i}"
            block.append(ls.make_sink(r.sink, (*r.then_path, "sink"), label, "route"))
        if r.fail:
            block.append(
                {"name": f"{name}_fail_{i}", "kind": "noop", "spec": policy(else_rule({"do": "fail"}))}
            )
        if not simple:
            route.append(
                ls.rule(cond, {"do": "jump", "to": block[0]["name"]} if block else {"do": "break"}, r)
            )
            if block and not r.fail:
                block[-1]["spec"] = fail_on_error({"do": "break"})
        blocks.extend(block)
        if cond is None:
            break
    if route:
        if "else" not in route[-1]:
            route.append(else_rule({"do": "break"}))
        tasks.append({"name": f"{name}_route", "kind": "noop", "spec": policy(*route)})
    tasks.extend(blocks)
    exit_step: dict[str, Any] = {"step": name, "tool": tasks}
    arcs = chain(ls, success, SUCCEEDED, fallback=ls.structural)
    if arcs:
        exit_step["next"] = {"arcs": arcs, **({"spec": {"mode": "inclusive"}} if fans_out(arcs) else {})}
    reads_args = "args" in reads(exit_step)
    if reads_args:
        rewrite_value(exit_step, Rewrite(names={"args": "args.source_args"}))
    t.warn(where, f"{who}: work at step.exit translated to a step '{name}' that follows it")
    return t.mark(exit_step, where), reads_args
