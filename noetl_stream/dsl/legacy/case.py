"""000/004: a step's ``case`` rules and ``retry`` policies, read into one list of ``LegacyRule``.

``case: [{when, then}]`` reacts to the step's events: ``step.enter`` (before the call),
``call.done`` (after each call, ok or error), ``call.error`` (a call failed) and ``step.exit`` (the
step ends). Which event a rule reacts to is its ``event.name`` test; the rest of its condition is
kept. ``then`` holds actions: ``call``, ``retry``, ``collect``, ``sink``, ``set``, ``result``,
``next`` (with ``args``), ``fail``, ``skip``. ``retry: [{when, then: {max_attempts, initial_delay,
backoff_multiplier, next_call, collect, sink}}]`` are per-call policies (000 §6).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from noetl_stream.dsl.diagnostics import Path
from noetl_stream.dsl.legacy.context import Translation, UntranslatableError
from noetl_stream.dsl.legacy.scopes import ERR, OK
from noetl_stream.dsl.rewrite import SplitError, inner, literal, reads, split_event, template
from noetl_stream.dsl.templates import has_template

EVENTS = ("step.enter", "call.done", "call.error", "step.exit")
ACTIONS = ("call", "retry", "collect", "sink", "set", "result", "next", "fail", "skip")
RETRY_THEN = ("max_attempts", "initial_delay", "backoff_multiplier", "next_call", "collect", "sink")
PER_CALL = ("retry", "call.done", "call.error")

# Which actions each event can carry, and why the others cannot be translated.
ALLOWED: dict[str, tuple[str, ...]] = {
    "step.enter": ("set", "sink", "fail", "skip"),
    "call.done": ("retry", "call", "collect", "sink", "set", "result", "fail", "next"),
    "call.error": ("retry", "call", "set", "fail", "next"),
    "step.exit": ("sink", "fail", "next", "set"),
}
WHY: dict[tuple[str, str], str] = {
    ("step.enter", "next"): "a transition before the step runs would bypass it; route on step.exit",
    ("call.done", "skip"): "a step that has already called its tool cannot be skipped",
    ("call.error", "collect"): "a failed call has no result to collect",
    ("call.error", "sink"): "a task run after a failed call cannot end the step with that call's error",
    ("call.error", "result"): "a failed step has no result",
    ("call.error", "skip"): "a step that has already called its tool cannot be skipped",
    ("step.exit", "result"): "the step's result is fixed when it ends; set 'result' on call.done",
    ("step.exit", "skip"): "a step that has run cannot be skipped",
}


@dataclass
class Collect:
    into: str
    value: str
    """Legacy expression of the collected value (e.g. ``response.data.data``)."""
    extend: bool
    path: Path


@dataclass
class LegacyRule:
    event: str
    """One of EVENTS, or ``retry`` for a policy of the step's ``retry`` block."""
    cond: str | None
    """The condition without its event test (a legacy expression), None when always true."""
    path: Path
    then_path: Path
    call: dict[str, Any] | None = None
    """Overrides for the next call (``call:`` / ``next_call:``): repeat the call."""
    retry: dict[str, Any] | None = None
    """``do: retry`` settings: attempts, backoff, delay."""
    limit: int | None = None
    """``max_attempts`` of a repeating policy: how many calls in all."""
    collect: list[Collect] = field(default_factory=list)
    sink: Any = None
    set_iter: dict[str, Any] = field(default_factory=dict)
    set_ctx: dict[str, Any] = field(default_factory=dict)
    ctx_keys: list[str] = field(default_factory=list)
    """Names of ``set_iter`` written as ``set: {ctx: ...}`` (read back as ``ctx.<name>``)."""
    result: str | None = None
    """Legacy expression of the step's result."""
    next: list[dict[str, Any]] | None = None
    next_path: Path = ()
    fail: bool = False
    skip: bool = False
    actions: tuple[str, ...] = ()

    @property
    def repeats(self) -> bool:
        return self.call is not None or (
            self.event == "retry" and (bool(self.collect) or self.sink is not None)
        )

    @property
    def pipeline(self) -> bool:
        """Whether the rule does something inside the step's pipeline (not only route)."""
        return any(a != "next" for a in self.actions)


def parse_case(t: Translation, raw: Any, path: Path, who: str) -> list[LegacyRule]:
    if not isinstance(raw, list):
        raise t.error(path, f"{who}: 'case' must be a list of {{when, then}} rules")
    rules: list[LegacyRule] = []
    for i, item in enumerate(raw):
        rp = (*path, i)
        if not isinstance(item, dict) or "then" not in item:
            raise t.error(rp, f"{who}: a case rule is a mapping with 'when' and 'then'")
        extra = [k for k in item if k not in ("when", "then")]
        if extra:
            raise t.error(
                (*rp, extra[0]), f"{who}: unknown case rule key '{extra[0]}' (a rule has 'when' and 'then')"
            )
        try:
            split = split_event(item.get("when"))
        except SplitError as exc:
            raise t.error((*rp, "when"), f"{who}: case condition cannot be translated: {exc}") from None
        if split.events is None:
            raise t.error(
                (*rp, "when") if "when" in item else rp,
                f"{who}: case rule without an event.name test; say which event it reacts to "
                f"({', '.join(EVENTS)})",
            )
        unknown = sorted(split.events - set(EVENTS))
        if unknown:
            raise t.error(
                (*rp, "when"),
                f"{who}: case event '{unknown[0]}' has no canonical translation (translated: "
                f"{', '.join(EVENTS)})",
            )
        then, tpath = _then(t, item["then"], (*rp, "then"), who)
        for event in sorted(split.events, key=EVENTS.index):
            rules.append(_rule(t, event, split.rest, rp, then, tpath, who))
    return rules


def _then(t: Translation, raw: Any, path: Path, who: str) -> tuple[dict[str, Any], Path]:
    if isinstance(raw, list):
        merged: dict[str, Any] = {}
        for j, part in enumerate(raw):
            if not isinstance(part, dict):
                raise t.error((*path, j), f"{who}: each action in 'then' must be a mapping")
            for k, v in part.items():
                if k in merged:
                    raise t.error((*path, j, k), f"{who}: action '{k}' is given twice in one rule")
                merged[k] = v
        return merged, path
    if not isinstance(raw, dict):
        raise t.error(path, f"{who}: a case rule's 'then' must be a mapping of actions")
    return raw, path


def _rule(
    t: Translation, event: str, cond: str | None, rp: Path, then: dict[str, Any], tpath: Path, who: str
) -> LegacyRule:
    rule = LegacyRule(event=event, cond=cond, path=rp, then_path=tpath, actions=tuple(then))
    for action, value in then.items():
        apath = (*tpath, action)
        if action not in ACTIONS:
            raise t.error(apath, f"{who}: unknown case action '{action}' (known: {', '.join(ACTIONS)})")
        if action not in ALLOWED[event]:
            why = WHY.get((event, action), f"'{action}' does not apply to {event}")
            raise t.error(apath, f"{who}: '{action}' on {event} has no canonical translation: {why}")
        if action == "retry":
            rule.retry = retry_settings(t, value, apath, who)
        elif action == "call":
            if not isinstance(value, dict):
                raise t.error(apath, f"{who}: 'call' takes the overrides of the next call (e.g. params)")
            rule.call = value
        elif action == "collect":
            rule.collect.extend(collect(t, value, apath, who))
        elif action == "sink":
            rule.sink = value
        elif action == "set":
            _set(t, rule, value, apath, who)
        elif action == "result":
            rule.result = result_expr(t, value, apath, who)
        elif action == "next":
            rule.next = targets(t, value, apath, who)
            rule.next_path = apath
        elif action == "fail":
            rule.fail = value is not False
        elif action == "skip":
            rule.skip = value is not False
    return rule


def _set(t: Translation, rule: LegacyRule, value: Any, path: Path, who: str) -> None:
    """004 ``set``: ``ctx:`` (and bare keys) is the step's own context; ``vars:`` persists (ctx)."""
    if not isinstance(value, dict):
        raise t.error(path, f"{who}: 'set' must be a mapping")
    for key, v in value.items():
        if key in ("ctx", "vars"):
            if not isinstance(v, dict):
                raise t.error((*path, key), f"{who}: 'set.{key}' must be a mapping")
            target = rule.set_iter if key == "ctx" else rule.set_ctx
            target.update({str(k): x for k, x in v.items()})
            if key == "ctx":
                rule.ctx_keys.extend(str(k) for k in v)
        else:
            rule.set_iter[str(key)] = v


def retry_settings(t: Translation, value: Any, path: Path, who: str) -> dict[str, Any]:
    """``{max_attempts, initial_delay, backoff_multiplier}`` as ``do: retry`` settings."""
    if value is True or value is None:
        value = {}
    if not isinstance(value, dict):
        raise t.error(
            path, f"{who}: 'retry' must be a mapping (max_attempts, initial_delay, backoff_multiplier)"
        )
    extra = [k for k in value if k not in ("max_attempts", "initial_delay", "backoff_multiplier")]
    if extra:
        raise t.error((*path, extra[0]), f"{who}: retry key '{extra[0]}' has no canonical translation")
    out: dict[str, Any] = {"do": "retry"}
    attempts = value.get("max_attempts")
    if attempts is not None:
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise t.error((*path, "max_attempts"), f"{who}: max_attempts must be a positive integer")
        out["attempts"] = attempts
    delay = value.get("initial_delay")
    mult = value.get("backoff_multiplier", 1)
    if delay is not None and (isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0):
        raise t.error((*path, "initial_delay"), f"{who}: initial_delay must be a number of seconds")
    if isinstance(mult, bool) or not isinstance(mult, (int, float)) or mult < 1:
        raise t.error((*path, "backoff_multiplier"), f"{who}: backoff_multiplier must be a number >= 1")
    base = 1.0 if delay is None else float(delay)
    if mult == 1:
        out["backoff"] = "none"
        if delay is not None:
            out["delay"] = delay
    elif mult == 2:
        out["backoff"] = "exponential"
        if delay is not None:
            out["delay"] = delay
    else:  # delay x multiplier^(n-1) before run n+1: the canonical delay may be a template
        out["backoff"] = "none"
        out["delay"] = "{{ " + f"{literal(base)} * {literal(float(mult))} ** (_attempt - 1)" + " }}"
    return out


def collect(t: Translation, value: Any, path: Path, who: str) -> list[Collect]:
    items = value if isinstance(value, list) else [value]
    out: list[Collect] = []
    for item in items:
        if not isinstance(item, dict) or "into" not in item:
            raise t.error(path, f"{who}: 'collect' needs 'into' and 'path' (or 'from')")
        extra = [k for k in item if k not in ("into", "path", "from", "strategy", "mode")]
        if extra:
            raise t.error((*path, extra[0]), f"{who}: collect key '{extra[0]}' has no canonical translation")
        into = item["into"]
        if not isinstance(into, str) or not into.isidentifier():
            raise t.error((*path, "into"), f"{who}: collect 'into' must be a name")
        strategy = item.get("strategy", item.get("mode", "append"))
        if strategy not in ("append", "extend"):
            raise t.error(
                (*path, "strategy" if "strategy" in item else "mode"),
                f"{who}: collect strategy '{strategy}' has no canonical translation (append, extend)",
            )
        if "from" in item:
            src = item["from"]
            expr = inner(src) if isinstance(src, str) and has_template(src) else src
        elif "path" in item:
            rel = item["path"]
            expr = "response" + ("" if not rel else f".{rel}") if isinstance(rel, str) else None
        else:
            expr = "response"
        if not isinstance(expr, str) or not expr:
            raise t.error(path, f"{who}: collect 'path'/'from' must be a path like data.items")
        out.append(Collect(into=into, value=expr, extend=strategy == "extend", path=path))
    return out


def result_expr(t: Translation, value: Any, path: Path, who: str) -> str:
    if isinstance(value, dict) and set(value) == {"from"} and isinstance(value["from"], str):
        src = value["from"]
        found = inner(src) if has_template(src) else src
        if found:
            return found
    if isinstance(value, str) and has_template(value):
        found = inner(value)
        if found is None:
            raise t.error(path, f"{who}: 'result' must be one '{{{{ ... }}}}' expression or {{from: name}}")
        return found
    return literal(value)


def targets(t: Translation, value: Any, path: Path, who: str) -> list[dict[str, Any]]:
    """``next`` as a step name, a list of names, or a list of ``{step, args}``."""
    items = value if isinstance(value, list) else [value]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        ip = (*path, i) if isinstance(value, list) else path
        problem = target_problem(item)
        if problem is not None:
            raise t.error(ip, f"{who}: a 'next' target is a step name or {{step, args}}, got {problem}")
        if isinstance(item, str):
            out.append(t.mark({"step": item}, ip))
        elif isinstance(item, dict):
            extra = [k for k in item if k not in ("step", "args", "with")]
            if extra:
                raise t.error(
                    (*ip, extra[0]),
                    f"{who}: '{extra[0]}' in a case 'next' has no canonical translation (a transition "
                    "has 'step' and 'args'; conditions belong in the rule's 'when')",
                )
            arc = t.mark({"step": item["step"]}, ip)
            args = item.get("args", item.get("with"))
            if args is not None:
                arc["args"] = args
                t.origins.mark_key(arc, "args", (*ip, "args" if "args" in item else "with"))
            out.append(arc)
    return out


def target_problem(item: Any) -> str | None:
    """What is wrong with a transition target (None: a step name, or a mapping with one in 'step')."""
    if isinstance(item, str):
        return None
    if isinstance(item, dict):
        if "step" not in item:
            return "a mapping without 'step'"
        step = item["step"]
        return None if isinstance(step, str) else f"a mapping whose 'step' is {shown(step)}"
    return shown(item)


def shown(value: Any) -> str:
    """A value as an author wrote it, for messages (YAML words for the scalars YAML spells so)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def parse_retry(t: Translation, raw: Any, path: Path, who: str) -> list[LegacyRule]:
    """000 §6: the step's ``retry`` policies (a list, or one mapping)."""
    items: list[tuple[Path, Any]]
    if isinstance(raw, list):
        items = [((*path, i), x) for i, x in enumerate(raw)]
    elif isinstance(raw, dict):
        items = [(path, raw if "then" in raw or "when" in raw else {"then": raw})]
    else:
        raise t.error(path, f"{who}: 'retry' must be a list of {{when, then}} policies")
    out: list[LegacyRule] = []
    for rp, item in items:
        if not isinstance(item, dict) or not isinstance(item.get("then", {}), dict):
            raise t.error(rp, f"{who}: a retry policy is a mapping with 'when' and 'then'")
        extra = [k for k in item if k not in ("when", "then")]
        if extra:
            raise t.error((*rp, extra[0]), f"{who}: unknown retry policy key '{extra[0]}'")
        when = item.get("when")
        cond = None
        if when is not None and when is not True:
            cond = inner(when)
            if cond is None:
                raise t.error(
                    (*rp, "when"), f"{who}: a retry condition must be one '{{{{ ... }}}}' expression"
                )
        then = item.get("then") or {}
        tp = (*rp, "then") if "then" in item else rp
        unknown = [k for k in then if k not in RETRY_THEN]
        if unknown:
            raise t.error((*tp, unknown[0]), f"{who}: retry key '{unknown[0]}' has no canonical translation")
        rule = LegacyRule(event="retry", cond=cond, path=rp, then_path=tp, actions=("retry",))
        if "next_call" in then:
            if not isinstance(then["next_call"], dict):
                raise t.error((*tp, "next_call"), f"{who}: 'next_call' takes the overrides of the next call")
            rule.call = then["next_call"]
        if "collect" in then:
            rule.collect = collect(t, then["collect"], (*tp, "collect"), who)
        if "sink" in then:
            rule.sink = then["sink"]
        settings = retry_settings(
            t,
            {k: v for k, v in then.items() if k in ("max_attempts", "initial_delay", "backoff_multiplier")},
            tp,
            who,
        )
        if rule.repeats:
            rule.limit = settings.get("attempts")
            if "initial_delay" in then:
                t.warn(
                    (*tp, "initial_delay"),
                    f"{who}: 'initial_delay' of a repeating policy (next_call/collect/sink) is not "
                    "translated: the next call follows at once",
                )
        else:
            rule.retry = settings
        out.append(rule)
    return out


_DEFINED = re.compile(r"\b(response|result|error)\s+is\s+(not\s+)?(defined|undefined)\b")


def guard(r: LegacyRule) -> str | None:
    """Which outcomes a per-call rule can match: ``error`` only, ``ok`` only, or both (None)."""
    if r.event == "call.error":
        return ERR
    cond = r.cond or ""
    tested = {m.group(1) for m in _DEFINED.finditer(cond) if not m.group(2) and m.group(3) == "defined"}
    if tested:
        return ERR if tested == {"error"} else OK if "error" not in tested else None
    names = reads(template(cond)) if cond else frozenset()
    err, ok = "error" in names, bool(names & {"response", "result"})
    if err and not ok:
        return ERR
    if ok and not err:
        return OK
    if r.event == "retry" and not cond and not r.repeats:
        return ERR  # a retry policy without a condition retries failed calls
    return None


def guard_expr(r: LegacyRule) -> str | None:
    """The guard to write before the rule's condition (None when the condition tests it itself)."""
    if r.event != "call.error" and _DEFINED.search(r.cond or ""):
        return None
    return guard(r)


__all__ = [
    "EVENTS",
    "PER_CALL",
    "Collect",
    "LegacyRule",
    "UntranslatableError",
    "guard",
    "guard_expr",
    "parse_case",
    "parse_retry",
    "target_problem",
]
