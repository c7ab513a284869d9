"""Parsing of ``when``/``then`` rule lists: task outcome policies and step admission."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from noetl_stream.dsl import vocabulary as V
from noetl_stream.dsl.diagnostics import Path
from noetl_stream.dsl.model import Admit, AdmitRule, Rule, TaskPolicy, Then
from noetl_stream.dsl.rewrite import one_condition
from noetl_stream.dsl.semantics import check_unmatched_errors
from noetl_stream.dsl.templates import _single_expression, check_syntax

if TYPE_CHECKING:
    from noetl_stream.dsl.compiler import Compiler


def _split_rule(c: Compiler, raw: Any, path: Path, who: str, legacy: bool) -> tuple[Any, Any, bool] | None:
    """Return ``(when, then, is_else)`` of one rule, or report why it is not a rule. ``legacy``: the
    legacy extension translates the rules of this list."""
    if not isinstance(raw, dict):
        c.error(path, f"{who}: a rule must be a mapping with 'when' and 'then' (or 'else' and 'then')")
        return None
    if "expr" in raw:
        hint = c.legacy_hint(legacy)
        c.error((*path, "expr"), f"{who}: 'expr' {V.NOT_V10}; use 'when'{hint}", at_key=True)
        return None
    extra = [k for k in raw if k not in V.RULE_KEYS]
    for k in extra:
        if k in V.THEN_KEYS:
            c.error((*path, k), f"{who}: '{k}' belongs under the rule's 'then'", at_key=True)
        else:
            c.error(
                (*path, k), f"{who}: unknown rule key '{k}'{V.key_hint(str(k), V.RULE_KEYS)}", at_key=True
            )
    if extra:
        return None
    if "else" in raw:
        if "when" in raw:
            c.error(path, f"{who}: a rule has either 'when' or 'else', not both")
            return None
        body = raw["else"]
        if isinstance(body, dict) and "then" in body:
            unknown = [k for k in body if k != "then"]
            for k in unknown:
                c.error(
                    (*path, "else", k),
                    f"{who}: unknown key '{k}' under 'else' (expected 'then')",
                    at_key=True,
                )
            if "then" in raw:
                c.error(path, f"{who}: 'then' given twice (under 'else' and beside it)")
                return None
            return None if unknown else (None, body["then"], True)
        if "then" in raw and (body is None or body is True):
            return (None, raw["then"], True)
        c.error((*path, "else"), f"{who}: 'else' needs a 'then' (write '- else: {{then: {{...}}}}')")
        return None
    if "when" not in raw:
        c.error(path, f"{who}: a rule needs 'when' (or 'else')")
        return None
    if "then" not in raw:
        c.error(path, f"{who}: the rule has 'when' but no 'then'")
        return None
    when = raw["when"]
    if not check_when(c, when, (*path, "when"), who):
        return None
    return (when, raw["then"], False)


def check_when(c: Compiler, when: Any, path: Path, who: str, what: str = "'when'") -> bool:
    """A condition is one template expression (``"{{ ... }}"``) or a boolean. Anything else renders
    to text, which is true unless it is empty or spells false (``"False and False"`` is true)."""
    if isinstance(when, bool):
        return True
    if c.is_template(when):
        if _single_expression(when) is not None or check_syntax(when) is not None:
            return True  # a syntax error is reported (once, with its position) by the template checks
        fix = one_condition(when)
        c.error(
            path,
            f"{who}: {what} must be one '{{{{ ... }}}}' expression: "
            + (
                "a '{% ... %}' statement makes it render to text, which counts as true unless it is "
                "empty or spells false; write "
                if "{%" in when
                else "text around or between expressions makes it render to a string (such as "
                "'False and False'), which counts as true; write "
            )
            + (f'"{fix}"' if fix else 'the whole condition in one, e.g. "{{ workload.a and workload.b }}"'),
            code="mixed-when",
        )
        return False
    if isinstance(when, str):
        c.error(
            path,
            f"{who}: {what} is plain text, which would always be true; write it as a template: "
            f'"{{{{ {when.strip()} }}}}"',
        )
    elif when is None:
        c.error(path, f'{who}: {what} is empty; write a condition like "{{{{ ... }}}}" (or true)')
    else:
        c.error(path, f"{who}: {what} must be a template string or a boolean, got {when!r}")
    return False


def _rule_list(
    c: Compiler, raw: Any, path: Path, who: str, legacy: bool
) -> list[tuple[Path, Any, Any, bool]]:
    if not isinstance(raw, list):
        c.error(path, f"{who}: 'rules' must be a list")
        return []
    out: list[tuple[Path, Any, Any, bool]] = []
    seen_else: int | None = None
    for i, item in enumerate(raw):
        rp = (*path, i)
        parsed = _split_rule(c, item, rp, who, legacy)
        if seen_else is not None:
            c.error(rp, f"{who}: rule {i + 1} comes after 'else' (rule {seen_else + 1}) and can never match")
        if parsed is None:
            continue
        when, then, is_else = parsed
        if is_else and seen_else is None:
            seen_else = i
        out.append((rp, when, then, is_else))
    return out


def parse_task_policy(c: Compiler, raw: Any, path: Path, who: str, task_names: set[str]) -> TaskPolicy | None:
    if not isinstance(raw, dict):
        c.error(path, f"{who}: spec.policy must be an object with a required 'rules:' list (003 §5.4)")
        return None
    for k in raw:
        if k not in V.TASK_POLICY_KEYS:
            c.error(
                (*path, k),
                f"{who}: unknown task policy key '{k}'{V.key_hint(str(k), V.TASK_POLICY_KEYS)}",
                at_key=True,
            )
    ok = _task_policy_placeholders(c, raw, path, who)
    if "rules" not in raw:
        c.error(path, f"{who}: spec.policy needs a 'rules:' list (003 §5.4)", at_key=True)
        return None
    rules: list[Rule] = []
    rule_list = _rule_list(c, raw["rules"], (*path, "rules"), who, c.in_workflow(path))
    for rp, when, then_raw, is_else in rule_list:
        then = _task_then(
            c,
            then_raw,
            (*rp, "else", "then") if is_else and _nested(raw, rp) else (*rp, "then"),
            who,
            task_names,
        )
        if then is not None:
            rules.append(Rule(then=then, when=when, is_else=is_else))
    if not ok:
        return None
    policy = TaskPolicy(
        rules=tuple(rules), on_unmatched="continue" if raw.get("on_unmatched") == "continue" else None
    )
    if isinstance(raw["rules"], list) and len(rules) == len(raw["rules"]):  # (all of them parsed)
        check_unmatched_errors(c, policy, path, who)
    return policy


def _task_policy_placeholders(c: Compiler, raw: dict[str, Any], path: Path, who: str) -> bool:
    """``mode`` and the hooks are placeholders (003 §5.4): only their v10 values pass, so that nothing an
    author writes there is silently ignored. ``on_unmatched`` can only be ``continue``, which is honoured
    (`TaskPolicy.on_unmatched`)."""
    ok = True
    mode = raw.get("mode", "exclusive")
    if mode not in V.ROUTE_MODES:
        c.error(
            (*path, "mode"),
            f"{who}: spec.policy.mode must be one of {V.one_of(V.ROUTE_MODES)}, got {mode!r}"
            f"{V.suggest(str(mode), V.ROUTE_MODES)}",
        )
        ok = False
    unmatched = raw.get("on_unmatched", "continue")
    if unmatched != "continue":
        c.error(
            (*path, "on_unmatched"),
            f"{who}: spec.policy.on_unmatched can only be 'continue' (an outcome no rule matches "
            f"continues, an error too; without it such an error fails the task), got {unmatched!r}; add "
            "an 'else' rule for another action",
        )
        ok = False
    for hook in V.TASK_POLICY_HOOKS:
        if hook not in raw:
            continue
        items = raw[hook]
        if not isinstance(items, list):
            c.error((*path, hook), f"{who}: spec.policy.{hook} must be a list, got {V.type_name(items)}")
            ok = False
            continue
        for i, item in enumerate(items):
            control = sorted(k for k in item if k in V.CONTROL_KEYS) if isinstance(item, dict) else []
            if control:
                c.error(
                    (*path, hook, i, control[0]),
                    f"{who}: '{control[0]}' in spec.policy.{hook}: hooks have no control flow in v10; "
                    "control actions belong in spec.policy.rules",
                    at_key=True,
                    code="control-in-hook",
                )
                ok = False
    return ok


def _nested(raw: Any, rp: Path) -> bool:
    rules = raw.get("rules") if isinstance(raw, dict) else None
    idx = rp[-1]
    if isinstance(rules, list) and isinstance(idx, int) and idx < len(rules):
        item = rules[idx]
        return isinstance(item, dict) and isinstance(item.get("else"), dict)
    return False


def _task_then(c: Compiler, raw: Any, path: Path, who: str, task_names: set[str]) -> Then | None:
    if not isinstance(raw, dict):
        c.error(path, f"{who}: 'then' must be a mapping with 'do'")
        return None
    ok = True
    for k in raw:
        if k in V.DEPRECATED_THEN:
            hint = c.legacy_hint(c.in_workflow(path))
            c.error((*path, k), f"{who}: '{k}' {V.NOT_V10}; {V.DEPRECATED_THEN[k]}{hint}", at_key=True)
            ok = False
        elif k == "allow":
            c.error((*path, k), f"{who}: 'allow' is an admission action; task rules use 'do'", at_key=True)
            ok = False
        elif k not in V.THEN_KEYS:
            c.error(
                (*path, k),
                f"{who}: unknown key '{k}' in 'then'{V.key_hint(str(k), V.THEN_KEYS)}",
                at_key=True,
            )
            ok = False
    do = raw.get("do")
    if do is None:
        c.error(path, f"{who}: 'then' needs 'do' (one of {V.one_of(V.DO_VALUES)})")
        return None
    if do not in V.DO_VALUES:
        hint = V.suggest(str(do), V.DO_VALUES)
        c.error((*path, "do"), f"{who}: 'do' must be one of {V.one_of(V.DO_VALUES)}, got '{do}'{hint}")
        return None
    attempts = raw.get("attempts")
    if "attempts" in raw:
        if do != "retry":
            c.error(
                (*path, "attempts"), f"{who}: 'attempts' is only meaningful with 'do: retry'", at_key=True
            )
            ok = False
        elif isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            c.error((*path, "attempts"), f"{who}: 'attempts' must be a positive integer, got {attempts!r}")
            ok = False
    backoff = raw.get("backoff", "none")
    if backoff not in V.BACKOFF_VALUES:
        hint = V.suggest(str(backoff), V.BACKOFF_VALUES)
        c.error(
            (*path, "backoff"),
            f"{who}: 'backoff' must be one of {V.one_of(V.BACKOFF_VALUES)}, got '{backoff}'{hint}",
        )
        ok = False
    delay = raw.get("delay")
    if delay is not None and not (V.is_seconds(delay) or (isinstance(delay, str) and c.is_template(delay))):
        c.error(
            (*path, "delay"), f"{who}: 'delay' must be a number of seconds >= 0 or a template, got {delay!r}"
        )
        ok = False
    to = raw.get("to")
    if do == "jump":
        if to is None:
            c.error(path, f"{who}: 'do: jump' needs 'to' (a task label of this pipeline)")
            ok = False
        elif not isinstance(to, str):
            c.error((*path, "to"), f"{who}: jump 'to' must be a task label, got {to!r}")
            ok = False
        elif to not in task_names:
            hint = V.suggest(str(to), task_names)
            c.error(
                (*path, "to"),
                f"{who}: 'to: previous' jumps to the task before this one, and this is the first task"
                if to == "previous"
                else f"{who}: jump target '{to}' is not a task of this pipeline{hint}",
            )
            ok = False
    elif to is not None:
        c.error((*path, "to"), f"{who}: 'to' is only allowed with 'do: jump'", at_key=True)
        ok = False
    for key in ("set_iter", "set_ctx"):
        if key in raw and not isinstance(raw[key], dict):
            c.error((*path, key), f"{who}: '{key}' must be a mapping of names to values")
            ok = False
    if not ok:
        return None
    return Then(
        do=do,
        attempts=attempts,
        backoff=backoff,
        delay=float(delay) if isinstance(delay, (int, float)) else delay,
        to=to,
        set_iter=raw.get("set_iter"),
        set_ctx=raw.get("set_ctx"),
    )


def parse_admit(c: Compiler, raw: Any, path: Path, who: str) -> Admit | None:
    if not isinstance(raw, dict):
        c.error(path, f"{who}: spec.policy.admit must be a mapping with 'rules'")
        return None
    for k in raw:
        if k not in V.ADMIT_KEYS:
            c.error(
                (*path, k),
                f"{who}: unknown admission key '{k}'{V.key_hint(str(k), V.ADMIT_KEYS)}",
                at_key=True,
            )
    mode = raw.get("mode", "exclusive")
    if mode not in V.ROUTE_MODES:
        c.error(
            (*path, "mode"), f"{who}: admission 'mode' must be one of {V.one_of(V.ROUTE_MODES)}, got '{mode}'"
        )
        mode = "exclusive"
    if "rules" not in raw:
        c.error(path, f"{who}: spec.policy.admit needs a 'rules:' list", at_key=True)
        return None
    rules: list[AdmitRule] = []
    for rp, when, then, is_else in _rule_list(c, raw["rules"], (*path, "rules"), who, False):
        tp = (
            (*rp, "else", "then")
            if is_else and isinstance((raw["rules"][rp[-1]] or {}).get("else"), dict)
            else (*rp, "then")
        )
        if not isinstance(then, dict):
            c.error(tp, f"{who}: admission 'then' must be a mapping like {{allow: true}}")
            continue
        bad = [k for k in then if k != "allow"]
        for k in bad:
            if k in V.CONTROL_KEYS or k in V.THEN_KEYS:
                c.error(
                    (*tp, k),
                    f"{who}: '{k}' is a task policy action and is not allowed at step scope; admission "
                    "rules only set 'allow' (task control belongs in a task's spec.policy.rules)",
                    at_key=True,
                    code="control-at-step",
                )
            else:
                c.error((*tp, k), f"{who}: unknown key '{k}' in admission 'then' (only 'allow')", at_key=True)
        allow = then.get("allow")
        if "allow" not in then:
            c.error(tp, f"{who}: admission 'then' needs 'allow: true' or 'allow: false'")
            continue
        if not isinstance(allow, bool):
            c.error((*tp, "allow"), f"{who}: admission 'allow' must be true or false, got {allow!r}")
            continue
        if not bad:
            rules.append(AdmitRule(allow=allow, when=when, is_else=is_else))
    parsed_all = isinstance(raw["rules"], list) and len(rules) == len(raw["rules"])
    if parsed_all and all(r.allow and not r.is_else for r in rules):  # no rules at all too
        _admits_everything(c, (*path, "rules"), who, bool(rules))
    return Admit(rules=tuple(rules), mode=mode)


def _admits_everything(c: Compiler, path: Path, who: str, has_rules: bool) -> None:
    """Admission allows when no rule matches (``policy.admit``): rules that only allow, without an
    ``else``, let every event through."""
    what = "every admission rule allows and there is no 'else'" if has_rules else "admission has no rules"
    c.warn(
        path,
        f"{who}: {what}: when no rule matches, the step is admitted, so this gate lets every event "
        "through; add '- else: {then: {allow: false}}' to admit only what a rule matches",
        at_key=True,
        code="admit-all",
    )
