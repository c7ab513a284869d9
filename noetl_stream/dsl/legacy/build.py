"""000/004 step semantics as canonical tasks, arcs and (for work after the step) one more step.

The model (``docs/legacy.md`` says it for users):

* The step's own context (``set``, ``collect ... into``) is ``iter``: one per step run, one per
  iteration in a loop (the mapping 002 §6.5 allows). 000 ``vars`` are execution scope: ``ctx``.
* Per-call rules (``retry`` policies, ``case`` on ``call.done``/``call.error``) become the call
  task's ``spec.policy.rules``; first match wins and an error no rule handles fails the step. A
  policy that calls again (``next_call``/``call``) jumps back to the call; the overridden inputs
  live in ``iter.next_call`` and the number of the current call in ``iter.retry_index``.
* The step's result is what a ``result`` action set, else what ``collect`` gathered, else the last
  call's result.
* ``step.exit`` is the step's successful end, ``call.error`` its failure. Transitions become arcs
  (the first matching rule wins, as in ``case``; the structural ``next`` when no rule transitions).
  Work at ``step.exit`` (sinks; ``vars`` of a looped step) runs in a step ``<name>_exit`` that the
  step's success arc leads to.
"""

from __future__ import annotations

from typing import Any

from noetl_stream.dsl.diagnostics import Path
from noetl_stream.dsl.legacy.case import LegacyRule, guard, guard_expr, parse_case, parse_retry
from noetl_stream.dsl.legacy.context import Translation, UntranslatableError
from noetl_stream.dsl.legacy.routes import routes
from noetl_stream.dsl.legacy.scopes import ERR, OK, RETRY_INDEX, ScopeError, Scopes
from noetl_stream.dsl.legacy.shapes import (
    access,
    breaks_to,
    conj,
    else_rule,
    fail_on_error,
    goto,
    leaf_paths,
    legacy_tool_keys,
    negate,
    nest,
    policy,
    put_spec,
    with_iter,
)
from noetl_stream.dsl.legacy.sinks import default_auth, sink_task
from noetl_stream.dsl.rewrite import Rewrite, as_expression, inner, rewrite_value, template

PER_CALL = ("retry", "call.done", "call.error")


class LegacyStep:
    """The 000/004 constructs of one step (``case``, ``retry``, ``sink``, ``vars``) made canonical."""

    def __init__(
        self,
        t: Translation,
        step: dict[str, Any],
        path: Path,
        structural: list[dict[str, Any]],
        step_names: set[str],
        plain_names: set[str],
    ) -> None:
        self.t = t
        self.step = step
        self.path = path
        self.name = str(step["step"])
        self.who = f"step '{self.name}'"
        self.structural = structural
        loop = step.get("loop")
        self.loop = isinstance(loop, dict)
        it = loop.get("iterator") if isinstance(loop, dict) else None
        iterator = it if isinstance(it, str) and it not in plain_names else None
        exit_name = f"{self.name}_exit"
        while exit_name in step_names:
            exit_name += "_"
        self.exit_name = exit_name
        self.call: dict[str, Any] | None = None
        self.pipeline: list[dict[str, Any]] = []
        self.scopes = Scopes(step=self.name, call=f"{self.name}_task", loop=self.loop, iterator=iterator)
        self.result_label = f"{self.name}_result"
        self.repeat_label: str | None = None
        self.route_key: str | None = None
        """ctx key where a step that calls again records which call.done rule ended it (for arcs)."""
        self.route_ids: dict[int, int] = {}
        self.authored_tool: Any = None

    # -- entry ---------------------------------------------------------------------------------
    def translate(self) -> list[dict[str, Any]]:
        """Rewrite the step in place; return the steps to add after it."""
        t, step, path, who = self.t, self.step, self.path, self.who
        rules: list[LegacyRule] = []
        done: list[tuple[Path, str]] = []
        if "retry" in step:
            rules += parse_retry(t, step.pop("retry"), (*path, "retry"), who)
            done.append(
                ((*path, "retry"), f"{who}: 000 'retry' policies translated to the call's spec.policy.rules")
            )
        if "case" in step:
            rules += parse_case(t, step.pop("case"), (*path, "case"), who)
            done.append(
                ((*path, "case"), f"{who}: 000/004 'case' translated to task policy rules and next.arcs")
            )
        sink = step.pop("sink", None)
        vars_ = step.pop("vars", None)
        if vars_ is not None and not isinstance(vars_, dict):
            raise t.error((*path, "vars"), f"{who}: 'vars' must be a mapping of names to templates")
        enter = [r for r in rules if r.event == "step.enter"]
        per_call = [r for r in rules if r.event in PER_CALL]
        exits = [r for r in rules if r.event == "step.exit"]
        self._tool(per_call)
        self._check(per_call, enter, exits)
        sc = self.scopes
        sc.collected = list(dict.fromkeys(c.into for r in per_call for c in r.collect))
        results = {r.result for r in per_call if r.result is not None}
        sc.sets_result = bool(results)
        if len(results) == 1 and next(iter(results)) in sc.collected:
            sc.result_name = next(iter(results))
        for r in rules:
            sc.context |= set(r.set_iter) | {c.into for c in r.collect}
            sc.ctx_keys |= set(r.ctx_keys)
        self._admission(enter)
        tasks = self._enter(enter)
        sinks: list[dict[str, Any]] = []
        if self.call is not None:
            tasks.append(self.call)
            self._call_rules(per_call, sinks)
        else:
            tasks.extend(self.pipeline)
        post = self._post(sink, None if self.loop else vars_, bool(sinks))
        if post and self.call is None:
            breaks_to(self.pipeline, post[0]["name"])
        tasks += post + sinks
        call = self.call
        if call is not None and tasks == [call] and isinstance(self.authored_tool, dict):
            if call.get("name") == f"{self.name}_task":  # the name a single task gets anyway
                del call["name"]
            step["tool"] = call
        elif tasks:
            step["tool"] = tasks
        added = routes(self, per_call, exits, vars_ if self.loop else None)
        for where, message in done:
            t.warn(where, message)
        return added

    def rw(
        self, value: Any, path: Path, where: str, *, failed: bool = False, result: str | None = None
    ) -> Any:
        try:
            return self.scopes.rewrite(value, where, failed=failed, result=result)
        except ScopeError as exc:
            raise self.t.error(path, f"{self.who}: no faithful translation: {exc}") from None

    def cond(self, expr: str | None, path: Path, where: str, *, failed: bool = False) -> str | None:
        if expr is None:
            return None
        out = inner(self.rw(template(expr), path, where, failed=failed))
        return out if out is not None else expr

    # -- the call ------------------------------------------------------------------------------
    def _tool(self, per_call: list[LegacyRule]) -> None:
        t, raw = self.t, self.step.get("tool")
        self.authored_tool = raw
        tpath: Path = (*self.path, "tool")
        if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], dict) and "kind" in raw[0]:
            raw, tpath = raw[0], (*tpath, 0)
        if isinstance(raw, dict) and "kind" in raw:
            call = raw
            if "name" in call:
                self.scopes.call = str(call["name"])
            else:
                call = t.mark({"name": self.scopes.call, **call}, tpath)
            legacy_tool_keys(t, call, tpath, self.who)
            default_auth(t, call, tpath, self.who)
            self.call = call
        elif isinstance(raw, list):
            self.pipeline = [x for x in raw if isinstance(x, dict)]
        if per_call and self.call is None:
            what = f"a pipeline of {len(self.pipeline)} tasks" if self.pipeline else "no tool"
            first = per_call[0]
            raise t.error(
                first.path,
                f"{self.who}: '{'retry' if first.event == 'retry' else 'case'}' rules on the step's call "
                f"need exactly one tool call; this step has {what} (no faithful translation: which task "
                "would they apply to?)",
            )

    def _check(self, per_call: list[LegacyRule], enter: list[LegacyRule], exits: list[LegacyRule]) -> None:
        t, who = self.t, self.who
        block = [r for r in per_call if r.event == "retry"]
        acting = [r for r in per_call if r.event != "retry" and r.pipeline]
        if block and acting:
            raise t.error(
                acting[0].then_path,
                f"{who}: a 'retry' policy and a case rule on {acting[0].event} both act on each call "
                "(legacy applies the first match of each); one canonical rule list cannot do both: move "
                "the case actions into the retry policies",
            )
        busy = any(r.repeats or r.collect or r.result is not None for r in per_call)
        for r in per_call:
            if r.next is None or guard(r) == ERR:
                continue
            if self.loop:
                raise t.error(
                    r.next_path,
                    f"{who}: 'next' on {r.event} in a looped step has no canonical translation: it would "
                    "end the loop at one iteration's call (route on step.exit instead)",
                )
            if busy and r.event == "call.done":  # the call's policy records the rule that ended it
                self.route_key = f"{self.name}_route"
        for r in enter:
            if r.sink is not None and self.loop:
                raise t.error(
                    (*r.then_path, "sink"),
                    f"{who}: a sink on step.enter of a looped step has no canonical translation (there is "
                    "no hook before the first iteration)",
                )
        for r in exits:
            if r.set_iter or r.set_ctx:
                t.warn(
                    (*r.then_path, "set"),
                    f"{who}: 'set' on step.exit writes the step's own context as the step ends: no "
                    "effect, dropped",
                )
                r.set_iter, r.set_ctx = {}, {}

    # -- admission and step.enter --------------------------------------------------------------
    def _admission(self, enter: list[LegacyRule]) -> None:
        if not any(r.skip for r in enter):
            return
        t = self.t
        spec = put_spec(self.step) if isinstance(self.step.get("spec", {}), dict) else None
        policy = spec.setdefault("policy", {}) if isinstance(spec, dict) else None
        first = next(r for r in enter if r.skip)
        if not isinstance(policy, dict) or "admit" in policy:
            raise t.error(first.then_path, f"{self.who}: 'skip' and spec.policy.admit both given; keep one")
        rules: list[dict[str, Any]] = []
        earlier: list[str] = []
        for r in enter:
            cond = self.cond(r.cond, r.path, "admission")
            if r.skip:
                when = conj(cond, *(negate(e) for e in earlier)) or "true"
                rules.append(t.mark({"when": template(when), "then": {"allow": False}}, r.path))
                t.warn(
                    (*r.then_path, "skip"),
                    f"{self.who}: 'skip' on step.enter translated to spec.policy.admit",
                )
            if cond is None:
                break
            earlier.append(cond)
        rules.append(else_rule({"allow": True}))
        policy["admit"] = {"rules": rules}

    def _enter(self, enter: list[LegacyRule]) -> list[dict[str, Any]]:
        active = [r for r in enter if r.set_iter or r.set_ctx or r.fail or r.sink is not None]
        if not active:
            return []
        t = self.t
        label = f"{self.name}_enter"
        if self.call is not None:
            first: str | None = self.scopes.call
        else:
            first = str(self.pipeline[0]["name"]) if self.pipeline and "name" in self.pipeline[0] else None
        with_sinks = any(r.sink is not None for r in active)
        rules: list[dict[str, Any]] = []
        sinks: list[dict[str, Any]] = []
        covered = False
        for i, r in enumerate(enter):
            if r not in active:
                continue
            then: dict[str, Any] = {"do": "continue"}
            self._patches(then, r, "enter")
            if r.fail:
                then["do"] = "fail"
            elif r.sink is not None:
                task = self.make_sink(r.sink, (*r.then_path, "sink"), f"{label}_sink_{i}", "enter")
                task["spec"] = fail_on_error(goto(first))
                sinks.append(task)
                then.update(do="jump", to=task["name"])
            elif with_sinks:
                then.update(goto(first))
            cond = self.cond(r.cond, r.path, "enter")
            rules.append(t.mark({"when": template(cond), "then": then}, r.path) if cond else else_rule(then))
            t.warn(r.path, f"{self.who}: case on step.enter translated to a first task '{label}'")
            if cond is None:
                covered = True
                break
        if with_sinks and not covered:
            rules.append(else_rule(goto(first)))
        return [{"name": label, "kind": "noop", "spec": policy(*rules)}, *sinks]

    # -- per-call rules ------------------------------------------------------------------------
    def _call_rules(self, per_call: list[LegacyRule], sinks: list[dict[str, Any]]) -> None:
        t, who, call, sc = self.t, self.who, self.call, self.scopes
        assert call is not None
        for key in list(call):
            if key not in ("name", "kind", "spec"):
                call[key] = self.rw(call[key], (*self.path, "tool"), "tool")
        if not any(r.pipeline for r in per_call):
            return
        leaves = self._overrides([r for r in per_call if r.repeats])
        if any(r.sink is not None and r.repeats for r in per_call):
            self.repeat_label = f"{self.name}_repeat"
        rules: list[dict[str, Any]] = []
        covered = False
        for i, r in enumerate(per_call):
            routed = self.route_key is not None and r.event == "call.done" and guard(r) != ERR
            if routed:
                self.route_ids[id(r)] = i + 1 if r.next else 0
            if not r.pipeline and not routed:
                continue  # it only transitions: next.arcs does that
            g = guard(r)
            cond = self.cond(r.cond, r.path, "call")
            when = conj(guard_expr(r), cond)
            patches: dict[str, Any] = {}
            self._patches(patches, r, "call")
            ending = dict(patches)
            if routed and self.route_key:
                ending["set_ctx"] = {**ending.get("set_ctx", {}), self.route_key: self.route_ids[id(r)]}
            sink_name = None
            if r.sink is not None:
                sink_name = f"{self.name}_sink_{i}"
                task = self.make_sink(r.sink, (*r.then_path, "sink"), sink_name, "after")
                task["spec"] = fail_on_error({"do": "jump", "to": self.repeat_label or self.result_label})
                sinks.append(task)
            if r.retry is not None:
                rules.append(self.rule(when, {**r.retry, **patches}, r))
                t.warn(r.then_path, f"{who}: legacy retry translated to 'do: retry' on task '{sc.call}'")
            elif r.repeats:
                again = with_iter(patches, next_call=self._next_call(r, leaves) or None)
                if sink_name:
                    then = {"do": "jump", "to": sink_name, **with_iter(again, call_again=True)}
                else:
                    then = {
                        "do": "jump",
                        "to": sc.call,
                        **with_iter(again, retry_index=template(f"{RETRY_INDEX} + 1")),
                    }
                rules.append(
                    self.rule(conj(when, f"{RETRY_INDEX} < {r.limit}") if r.limit else when, then, r)
                )
                until = f" while iter.retry_index < {r.limit}" if r.limit else ""
                t.warn(
                    r.then_path, f"{who}: calling again translated to a jump back to task '{sc.call}'{until}"
                )
                if r.limit:  # the policy still matches when its calls are used up: the step goes on
                    rules.append(self.rule(when, self._passive(ending, sink_name), r))
            elif r.fail or g == ERR:
                rules.append(self.rule(when, {"do": "fail", **patches}, r))
            elif g == OK:
                rules.append(self.rule(when, self._passive(ending, sink_name), r))
            else:  # it matches failed calls too: they still fail the step
                rules.append(self.rule(conj(ERR, cond), {"do": "fail"}, r))
                rules.append(self.rule(conj(OK, cond), self._passive(ending, sink_name), r))
            if when is None:
                covered = True
                break
        if not covered:
            if self.route_key:  # no rule matched: the step ends, no call.done rule transitions
                rules.append(
                    {"when": template(OK), "then": {"do": "continue", "set_ctx": {self.route_key: 0}}}
                )
            rules.append({"when": template(ERR), "then": {"do": "fail"}})
        spec = call.setdefault("spec", {})
        if not isinstance(spec, dict) or "policy" in spec:
            raise t.error(
                (*self.path, "tool"), f"{who}: the call already has spec.policy next to legacy rules"
            )
        spec["policy"] = {"rules": rules}
        if self.repeat_label:
            sinks.append(
                {
                    "name": self.repeat_label,
                    "kind": "noop",
                    "spec": policy(
                        {
                            "when": template("iter.call_again | default(false)"),
                            "then": {
                                "do": "jump",
                                "to": sc.call,
                                "set_iter": {
                                    "call_again": False,
                                    "retry_index": template(f"{RETRY_INDEX} + 1"),
                                },
                            },
                        },
                        else_rule({"do": "jump", "to": self.result_label}),
                    ),
                }
            )

    def rule(self, when: str | None, then: dict[str, Any], r: LegacyRule) -> dict[str, Any]:
        rule = {"when": template(when), "then": then} if when else else_rule(then)
        return self.t.mark(rule, r.path)

    def _passive(self, patches: dict[str, Any], sink_name: str | None) -> dict[str, Any]:
        if sink_name is None:
            return {"do": "continue", **patches}
        out = {"do": "jump", "to": sink_name, **patches}
        return {**out, **with_iter(out, call_again=False)} if self.repeat_label else out

    def _patches(self, then: dict[str, Any], r: LegacyRule, where: str) -> None:
        set_iter: dict[str, Any] = {}
        for k, v in r.set_iter.items():
            set_iter[k] = self.rw(v, (*r.then_path, "set"), where)
        for c in r.collect:
            value = self.cond(c.value, c.path, where)
            add = f"({value})" if c.extend else f"[{value}]"
            set_iter[c.into] = template(f"(iter.{c.into} | default([])) + {add}")
            self.t.warn(
                c.path, f"{self.who}: 'collect' into '{c.into}' translated to set_iter (iter.{c.into})"
            )
        if r.result is not None:
            expr = self.cond(r.result, (*r.then_path, "result"), where) or "none"
            if r.collect:  # the rule collects first: its result sees what it collected
                fresh = {("iter", c.into): inner(set_iter[c.into]) or f"iter.{c.into}" for c in r.collect}
                expr = inner(rewrite_value(template(expr), Rewrite(attrs=fresh))) or expr
            set_iter["step_result"] = template(expr)
        if set_iter:
            then["set_iter"] = set_iter
        if r.set_ctx:
            then["set_ctx"] = {k: self.rw(v, (*r.then_path, "set"), where) for k, v in r.set_ctx.items()}
            self.t.ctx_vars.update(r.set_ctx)

    def _overrides(self, repeating: list[LegacyRule]) -> list[tuple[Any, ...]]:
        """Make the call read each input a next call overrides from ``iter.next_call``."""
        t, call = self.t, self.call
        assert call is not None
        leaves: list[tuple[Any, ...]] = []
        for r in repeating:
            for keys, _ in leaf_paths(r.call or {}):
                if keys not in leaves:
                    leaves.append(keys)
        for keys in leaves:
            node: Any = call
            for k in keys[:-1]:
                child = node.setdefault(k, {}) if isinstance(node, dict) else None
                if not isinstance(child, dict):
                    raise t.error(
                        (*self.path, "tool"),
                        f"{self.who}: a next call overrides '{'.'.join(map(str, keys))}', so the tool's "
                        f"'{k}' must be a mapping",
                    )
                node = child
            expr = as_expression(node.get(keys[-1]))
            if expr is None:
                raise t.error(
                    (*self.path, "tool"),
                    f"{self.who}: the tool's '{'.'.join(map(str, keys))}' cannot be overridden by a next "
                    "call (its template has statements)",
                )
            node[keys[-1]] = template(f"{access('iter.next_call', keys)} | default({expr})")
        return leaves

    def _next_call(self, r: LegacyRule, leaves: list[tuple[Any, ...]]) -> dict[str, Any]:
        own = dict(leaf_paths(r.call or {}))
        assert self.call is not None
        pairs: list[tuple[tuple[Any, ...], Any]] = []
        for keys in leaves:
            if keys in own:
                pairs.append((keys, self.rw(own[keys], (*r.then_path, "call"), "call")))
            else:  # another policy overrides it: keep its current value
                node: Any = self.call
                for k in keys:
                    node = node[k]
                pairs.append((keys, node))
        return nest(pairs)

    # -- sinks, result, vars -------------------------------------------------------------------
    def make_sink(
        self, raw: Any, path: Path, name: str, where: str, result: str | None = None
    ) -> dict[str, Any]:
        task = sink_task(self.t, raw, path, self.who, name)
        for key in list(task):
            if key not in ("name", "kind"):
                task[key] = self.rw(task[key], path, where, result=result)
        return task

    def _result_expr(self, per_call_sinks: bool) -> str | None:
        """The step's result, for the task that ends the pipeline (None: the last task's as is)."""
        if self.call is None:
            return None
        sc = self.scopes
        if len(sc.collected) == 1:
            collected = f"iter.{sc.collected[0]} | default([])"
        elif sc.collected:
            collected = "{" + ", ".join(f'"{n}": iter.{n} | default([])' for n in sc.collected) + "}"
        else:
            collected = sc.call
        if sc.sets_result:
            return f"iter.step_result | default({collected})"
        return collected if (sc.collected or per_call_sinks) else None

    def _post(self, sink: Any, vars_: dict[str, Any] | None, per_call_sinks: bool) -> list[dict[str, Any]]:
        t, who, label = self.t, self.who, self.result_label
        res = self._result_expr(per_call_sinks)
        if sink is None and vars_ is None and res is None and not per_call_sinks:
            return []
        if self.call is None and not self.pipeline:
            raise t.error(
                (*self.path, "vars" if vars_ is not None else "sink"),
                f"{who}: a step without a tool has no result for 'vars' or 'sink' to read",
            )
        result_task: dict[str, Any] = {"name": label, "kind": "noop"}
        if res is not None:
            result_task["result"] = template(res)
        post = [result_task]
        then: dict[str, Any] = {"do": "continue"}
        if vars_ is not None:
            then["set_ctx"] = t.mark(
                {
                    k: self.rw(v, (*self.path, "vars", k), "after", result="outcome.result")
                    for k, v in vars_.items()
                },
                (*self.path, "vars"),
            )
            t.ctx_vars.update(str(k) for k in vars_)
            t.warn(
                (*self.path, "vars"),
                f"{who}: 000 'vars' translated to set_ctx on task '{label}' (vars.<name> reads become ctx.<name>)",
            )
        if sink is not None:
            post.append(
                self.make_sink(sink, (*self.path, "sink"), f"{self.name}_sink", "after", result=label)
            )
            post.append({"name": f"{self.name}_done", "kind": "noop", "result": template(label)})
            if self.loop:
                t.warn(
                    (*self.path, "sink"), f"{who}: the step 'sink' of a looped step runs for each iteration"
                )
        if per_call_sinks and post[-1] is result_task:
            then["do"] = "break"  # the per-call sinks follow: do not fall into them
        elif per_call_sinks:
            post[-1]["spec"] = policy(else_rule({"do": "break"}))
        if "set_ctx" in then or then["do"] != "continue":
            result_task["spec"] = policy(else_rule(then))
        return [t.mark(x, self.path) for x in post]

    # -- routing -------------------------------------------------------------------------------


__all__ = ["LegacyStep", "UntranslatableError"]
