"""An arc's ``set:`` (NoETL's) written as ``set_ctx`` in the step's task policy, where that is the same.

The controller writes an arc's ``set:`` keys to ctx when it takes the arc (docs/semantics.md, "``set:``
in four places"); v10 has no form of that, and writes ctx only with ``set_ctx`` in a task policy. For
the arcs of a step that succeeds, the same writes can be made by the step itself: on each rule that ends
its pipeline (as a step ``set:`` is), a copy of the rule taken when the arc is the one the router takes
(its condition holds, and in an ``exclusive`` router no arc before it holds) writes the arc's keys:

    - when: "{{ outcome.status == 'ok' and outcome.result.data.next_cursor }}"
      then: {do: continue, set_ctx: {cursor: "{{ outcome.result.data.next_cursor }}"}}
    - when: "{{ outcome.status == 'ok' }}"
      then: {do: continue, set_ctx: {cursor: done}}

That is the same as the controller's write when:

* the step has no loop and has tasks (a looped step's arcs see the loop's end, which no task sees; a
  step without tasks would become one a worker runs, with another result);
* no arc with a ``set:`` can be taken on the step's failure (its condition tests the success boundary,
  or has a part that reads only ``output``/``result`` and ``event.name``/``event.status`` and is false
  or fails on a failed step's, where the result is null), since a failed step's rules write nothing;
* the arcs' conditions, up to the last one with a ``set:``, and the ``set:`` values read the step's
  result (``output``, ``result``, its name; one task: a pipeline's result reads its tasks' fields and
  labels, which a policy's ``outcome.result`` does not), ctx, the workload and other steps' results,
  ``event.name`` and ``event.status`` (the success boundary's), and nothing else of the arc's scope;
* they read no ctx key the step's own rules write in the same block (a task's ``set_ctx`` renders
  before its patch, the controller after it), and no arc's condition or ``args`` reads a key an arc's
  ``set:`` writes (the controller evaluates them before the write, and now after it);
* an ``inclusive`` router has one arc with a ``set:`` (several may be taken together).

Otherwise the arc keeps its ``set:`` and ``migrate`` says why it cannot write it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from noetl_stream.dsl import dialect
from noetl_stream.dsl.diagnostics import Path
from noetl_stream.dsl.origins import Origins
from noetl_stream.dsl.rewrite import (
    EventSplit,
    Rewrite,
    SplitError,
    as_expression,
    conjuncts,
    inner,
    reads,
    rewrite_chains,
    rewrite_value,
    split_event,
    template,
)
from noetl_stream.dsl.templates import RenderError, attribute_reads, evaluate_when
from noetl_stream.errors import NoetlError
from noetl_stream.protocol.events import STEP_DONE, STEP_FAILED

FAILURES = frozenset({STEP_FAILED, "step.exit"})
ARC_ONLY = frozenset({"event", "args", "iter", "outcome", "_prev", "_task", "_attempt", "keychain"})
"""Names of the arc's scope a task policy does not read the same way (``event`` but for its name and
status, handled before the check)."""
RESULT = "outcome.result"
FAILED_SCOPE: dict[str, Any] = {
    "output": None,
    "result": None,
    "event": {"name": STEP_FAILED, "status": "error"},
}
"""What a failed step's arcs read as its result and (in part) its boundary."""


class BlockedError(NoetlError):
    """Why the arcs' ``set:`` of a step cannot be written in its policy."""


Write = tuple[str, dict[str, Any], int]
"""(the condition the arc is taken on, its ``set:`` as the policy reads it, its index)."""


def move(step: dict[str, Any], origins: Origins) -> str | None:
    """Move the arcs' ``set:`` of ``step`` into its tasks' policy rules; None when done (or there was
    none), else why not (the arcs are left as they are)."""
    arcs = dialect._arcs(step)
    if not any("set" in arc for arc in arcs):
        return None
    try:
        writes = _plan(step, arcs)
    except BlockedError as exc:
        return str(exc)
    tasks = dialect._tasks(step)
    where = [(*(origins.path_of(arc) or ()), "set") for arc in arcs]  # (as the author wrote them)
    for n, (_, task, _) in enumerate(tasks):
        last = n == len(tasks) - 1
        _add(task, writes, ("break", "continue") if last else ("break",), last, where, origins)
    for arc in arcs:
        arc.pop("set", None)
    return None


def _plan(step: dict[str, Any], arcs: list[dict[str, Any]]) -> list[Write]:
    name = str(step.get("step"))
    if "loop" in step:
        raise BlockedError("the step has a loop (its arcs see the loop's end, which no task sees)")
    tasks = dialect._tasks(step)
    if not tasks:
        raise BlockedError("the step has no task to write it")
    nxt = step.get("next")
    spec = nxt.get("spec") if isinstance(nxt, dict) else None
    mode = spec.get("mode", "exclusive") if isinstance(spec, dict) else "exclusive"
    setting = [i for i, arc in enumerate(arcs) if "set" in arc]
    if mode != "exclusive" and len(setting) > 1:
        raise BlockedError(
            f"the router is '{mode}' and several arcs have a 'set:' (they may be taken together)"
        )
    for n, (_, task, _) in enumerate(tasks):
        for rule in dialect._rules(task):
            if "else" not in rule and as_expression(rule.get("when", True)) is None:
                raise BlockedError(f"a rule of task {n + 1} has a condition that is not one expression")
    side = _PolicySide(name, len(tasks))
    conditions: list[str | None] = []
    for i, arc in enumerate(arcs[: setting[-1] + 1]):
        cond = _on_success(arc)
        conditions.append(cond if cond is None else side.expression(cond, f"arc {i + 1}'s condition"))
        if "set" in arc:
            _never_on_failure(arc, i)
    written: set[str] = set()
    out: list[Write] = []
    for i in setting:
        values = arcs[i]["set"]
        cond = conditions[i]
        if not isinstance(values, dict) or cond is None:
            raise BlockedError(f"arc {i + 1} is never taken when the step succeeds")
        moved = {str(k): side.value(v, f"arc {i + 1}'s set: value") for k, v in values.items()}
        # (exclusive: no arc before it holds. Those with a set: have their rules first, so only the others
        # are tested again.)
        before = (
            [c for j, c in enumerate(conditions[:i]) if c is not None and j not in setting]
            if mode == "exclusive"
            else []
        )
        guard = dialect._and(*(f"not ({c})" if " " in c else f"not {c}" for c in before), _bare(cond))
        out.append((guard or "true", moved, i))
        written |= set(moved)
    _check_ctx(step, arcs, out, written)
    return out


class _PolicySide:
    """An arc's templates as the step's task policy reads them: the step's result is
    ``outcome.result``, ``event.name`` and ``event.status`` the success boundary's."""

    def __init__(self, step: str, tasks: int) -> None:
        self.step = step
        self.tasks = tasks
        self.rw = Rewrite(
            names={"output": RESULT, "result": RESULT, step: RESULT},
            attrs={("event", "name"): repr(STEP_DONE), ("event", "status"): "'success'"},
        )

    def expression(self, expr: str, what: str) -> str | None:
        """The condition `expr` as the policy reads it, its parts that are true on the success boundary
        (``event.name != 'step.failed'``) left out; None when a part is false there."""
        out = self.value(template(expr), what)
        parts: list[str] = []
        for part in conjuncts(as_expression(out) or expr):
            if reads(template(part)):
                parts.append(part)
                continue
            try:
                if not evaluate_when(template(part), {}):
                    return None
            except RenderError:
                parts.append(part)
        return dialect._and(*parts) or "true"

    def value(self, value: Any, what: str) -> Any:
        found = reads(value)
        if self.tasks > 1 and (self.step in found or found & {"output", "result"}):
            raise BlockedError(
                f"{what} reads the result of a step of several tasks (its tasks' fields and labels)"
            )
        out = rewrite_value(copy.deepcopy(value), self.rw)
        late = sorted((reads(out) - {"outcome"}) & ARC_ONLY | (found & {"outcome"}))
        if late:
            raise BlockedError(f"{what} reads '{late[0]}', which a task policy does not see as an arc does")
        return out


def _bare(cond: str | None) -> str | None:
    return None if cond in (None, "true") else cond


def _on_success(arc: dict[str, Any]) -> str | None:
    """The arc's condition on the step's success boundary, as an expression ("true" without one); None
    when it is never taken there."""
    if "when" not in arc:
        return "true"
    when = arc["when"]
    if isinstance(when, bool):
        return "true" if when else None
    split = _split(when)
    if split.events is not None and STEP_DONE not in split.events:
        return None
    return split.rest or "true"


def _split(when: Any) -> EventSplit:
    """The event names a condition requires and the rest of it (all of it, with its ``event.name``
    tests, when they are not parts of their own)."""
    try:
        return split_event(when)
    except SplitError:
        expr = inner(when)
        if expr is None:
            raise BlockedError("an arc's condition is not one expression") from None
        return EventSplit(None, expr)


def _never_on_failure(arc: dict[str, Any], i: int) -> None:
    """An arc with a ``set:`` the router may take on the step's failure: its write cannot be a rule's."""
    if "when" not in arc:
        return
    split = _split(arc["when"])
    if split.events is not None:
        if split.events & FAILURES:
            raise BlockedError(f"arc {i + 1} is taken on the step's failure, where its rules write nothing")
        return
    for part in conjuncts(split.rest) if split.rest else ():
        text = template(part)
        event = {k for n, k in attribute_reads(text) if n == "event"}
        if reads(text) <= FAILED_SCOPE.keys() and event <= FAILED_SCOPE["event"].keys():
            try:
                if not evaluate_when(text, FAILED_SCOPE):
                    return
            except RenderError:
                return  # (it fails on a failed step's null result: the arc is not taken)
    raise BlockedError(
        f"arc {i + 1} may be taken on the step's failure (its condition does not exclude it), where its "
        "rules write nothing"
    )


def _ctx_keys(value: Any) -> set[str] | None:
    """The ctx keys templates in `value` read (as ``ctx.k`` or bare); None when one reads ``ctx`` whole."""
    keys: set[str] = set()
    whole = False

    def note(attrs: tuple[str, ...], compared: Callable[[int], bool]) -> tuple[str, int]:
        nonlocal whole
        if attrs:
            keys.add(attrs[0])
        else:
            whole = True
        return "ctx", 0

    for text in _texts(value):
        rewrite_chains(text, "ctx", note)
        keys |= reads(text)
    return None if whole else keys


def _texts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _texts(v)]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v)]
    return []


def _check_ctx(
    step: dict[str, Any], arcs: list[dict[str, Any]], writes: list[Write], written: set[str]
) -> None:
    own: set[str] = set()
    for _, task, _ in dialect._tasks(step):
        for then in dialect._thens(task):
            if isinstance(then.get("set_ctx"), dict):
                own |= set(map(str, then["set_ctx"]))
    for guard, values, i in writes:
        read = _ctx_keys([template(guard), values])
        if own and (read is None or read & own):
            which = "ctx as a whole" if read is None else f"'{sorted(read & own)[0]}'"
            raise BlockedError(
                f"arc {i + 1}'s condition or set: reads {which}, which the step's own rules write in "
                "the same block (the controller reads it after that write, a rule before it)"
            )
    for i, arc in enumerate(arcs):
        read = _ctx_keys([arc.get("when"), arc.get("args")])
        if read is None or read & written:
            which = "ctx as a whole" if read is None else f"'{sorted(read & written)[0]}'"
            raise BlockedError(
                f"arc {i + 1}'s condition or args read {which}, which an arc's set: writes (the controller "
                "reads it before that write, and would read it after)"
            )


def _add(
    task: dict[str, Any],
    writes: list[Write],
    dos: tuple[str, ...],
    create: bool,
    where: list[Path],
    origins: Origins,
) -> None:
    """Before each rule of `task` whose ``do`` is in `dos` (an ``ok`` outcome's ``continue`` when the
    policy has no ``else``), a copy of it for each arc's write, taken when the arc is."""
    spec = task.get("spec")
    if spec is None:
        if not create:
            return
        spec = task["spec"] = {}
    policy = spec.get("policy")
    if policy is None:
        if not create:
            return
        policy = spec["policy"] = {"rules": []}
    rules: list[dict[str, Any]] = policy["rules"]
    out: list[dict[str, Any]] = []
    # A policy without `else` continues an ok outcome no rule takes: a rule for it carries the writes,
    # unless one takes every ok outcome already.
    every_ok = any("else" in r or r.get("when") in (True, dialect.OK) for r in rules)
    tail = [] if every_ok or not create else [{"when": dialect.OK, "then": {"do": "continue"}}]
    for rule in [*rules, *tail]:
        body = rule.get("else", rule)
        then = body.get("then")
        if not isinstance(then, dict) or then.get("do", "continue") not in dos:
            out.append(rule)
            continue
        when = "true" if "else" in rule else as_expression(rule.get("when", True))
        for guard, values, i in writes:
            cond = dialect._and(None if when == "true" else when, None if guard == "true" else guard)
            copied = copy.deepcopy(then)
            copied["set_ctx"] = {**(copied.get("set_ctx") or {}), **values}
            at = where[i]
            for key in values:
                origins.mark_key(copied["set_ctx"], key, (*at, key))
            out.append(origins.mark({"when": template(cond) if cond else True, "then": copied}, at))
            if guard == "true":
                break  # it takes every outcome the rule takes: the rule is never reached
        else:
            out.append(rule)
    rules[:] = out
