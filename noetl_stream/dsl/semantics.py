"""Warnings where a playbook written for the earlier defaults means something else now (code ``semantics``).

Two defaults changed (docs/semantics.md, "Routing" and "Tasks and policies"):

* an arc without ``when`` is taken on success boundaries only, no longer on ``step.failed``;
* an error that no task policy rule matches fails the task, where it used to continue.

Each warning marks a place where the playbook itself shows the author expected a failure there, so a
plain linear playbook (arcs without ``when`` meaning "then") is not warned about: its failures used to
be routed on silently, which is what the change fixes.

A third warning marks a cycle a failure keeps going: an arc back with a ``when`` that does not test the
boundary (NoETL's engines route on success only, so their playbooks write such guards).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from noetl_stream.dsl.diagnostics import Path
from noetl_stream.dsl.graph import build_graph
from noetl_stream.dsl.model import Arc, Playbook, Rule, Step, TaskPolicy
from noetl_stream.dsl.policy import MAX_FAILED_REENTRIES
from noetl_stream.dsl.rewrite import as_expression, compared_literals, reads_attr
from noetl_stream.dsl.templates import RenderError, evaluate_when

if TYPE_CHECKING:
    from noetl_stream.dsl.compiler import Compiler

CODE = "semantics"
_ANY_FAILURE = {"event": {"name": "step.failed", "status": "error"}}
"""What every failure's boundary has: a ``when`` true in this scope takes every failure."""
_ANY_ERROR = {"outcome": {"status": "error"}}
"""What every error outcome has: a rule true in this scope matches every error."""
ROUTE_FAILURES = "when: \"{{ event.name == 'step.failed' }}\""


def _always(when: Any, scope: dict[str, Any]) -> bool:
    """``when`` is true whatever else the scope holds (it reads only what ``scope`` has)."""
    try:
        return evaluate_when(when, scope)
    except RenderError:
        return False


def _never(when: Any, scope: dict[str, Any]) -> bool:
    """``when`` is false whatever else the scope holds (it reads only what ``scope`` has)."""
    try:
        return not evaluate_when(when, scope)
    except RenderError:
        return False


def _matches_errors(when: Any) -> bool:
    """A rule's ``when`` picks out errors: it reads ``outcome.error`` or compares ``outcome.status``
    (``== 'error'``, ``!= 'ok'``, ``in [...'error'...]``)."""
    if not isinstance(when, str):
        return False
    if reads_attr(when, "outcome", "error"):
        return True
    for op, names in compared_literals(when, "outcome", "status"):
        if ("error" in names and op in ("==", "in")) or ("ok" in names and op in ("!=", "not in")):
            return True
    return False


def _tests_boundary(value: Any, *, failure: bool = False) -> bool:
    """A template tells the boundaries apart: it reads ``event.error`` or compares ``event.name`` or
    ``event.status`` (with ``failure``: with ``'step.failed'`` or ``'error'``)."""
    if isinstance(value, dict):
        return any(_tests_boundary(v, failure=failure) for v in value.values())
    if isinstance(value, list):
        return any(_tests_boundary(v, failure=failure) for v in value)
    if not isinstance(value, str):
        return False
    if reads_attr(value, "event", "error"):
        return True
    for attr, failed in (("name", "step.failed"), ("status", "error")):
        for _, names in compared_literals(value, "event", attr):
            if not failure or failed in names:
                return True
    return False


# -- task policies ---------------------------------------------------------------------------------


def check_unmatched_errors(c: Compiler, policy: TaskPolicy, path: Path, who: str) -> None:
    """Warn about a policy without ``else`` whose rules match some errors but not every one: an error
    none matches used to continue and now fails the task."""
    if policy.on_unmatched is not None or any(_unconditional(r) for r in policy.rules):
        return
    if not any(_matches_errors(r.when) for r in policy.rules):
        return
    if any(_always(r.when, _ANY_ERROR) for r in policy.rules):
        return  # every error matches one rule: nothing is left unmatched
    c.warn(
        (*path, "rules"),
        f"{who}: this policy has no 'else' and its rules match only some errors: an error no rule "
        "matches now fails the task (it used to continue); end the rules with "
        "'- else: {then: {do: continue}}' (or set 'on_unmatched: continue') to go on past it",
        at_key=True,
        code=CODE,
    )


def _unconditional(rule: Rule) -> bool:
    return rule.is_else or rule.when is True


# -- routing ---------------------------------------------------------------------------------------


def check_failure_routes(c: Compiler, playbook: Playbook, data: dict[str, Any]) -> None:
    """Warn at the arcs without ``when`` that a step's failure used to take, where the playbook shows
    the failure was expected: a task policy that fails or retries, arcs that test the boundary, or a
    target that admits on it."""
    index = {
        name: i
        for i, item in enumerate(data.get("workflow") or [])
        if isinstance(item, dict) and isinstance(name := item.get("step"), str)
    }
    steps = {s.name: s for s in playbook.workflow}
    for step in playbook.workflow:
        if step.name not in index or not step.tasks or step.next is None:
            continue
        if step.loop is not None and step.failure_mode == "best_effort":
            continue  # its tasks' failures end in loop.done, a success boundary
        taken = _plain_arcs_taken_on_failure(step)
        if not taken:
            continue
        why = _expected_failure(step, [a for _, a in taken], steps)
        if why is None:
            continue
        k, first = taken[0]
        one = len(taken) == 1
        targets = " and ".join(f"'{a.step}'" for _, a in taken)
        c.warn(
            ("workflow", index[step.name], "next", "arcs", k),
            f"step '{step.name}': {'the arc' if one else 'the arcs'} to {targets} "
            f"{'has' if one else 'have'} no 'when', so {'it is' if one else 'they are'} taken only when "
            f"the step succeeds ({'it' if one else 'they'} used to be taken on step.failed too), and the "
            f"playbook expects this step to fail ({why}). Such a failure now fails the execution unless "
            f"an arc with a 'when' takes it; to route it to '{first.step}' as before, add "
            f"{{step: {first.step}, {ROUTE_FAILURES}}}",
            code=CODE,
        )


def _plain_arcs_taken_on_failure(step: Step) -> list[tuple[int, Arc]]:
    """The arcs without ``when`` that the earlier semantics took on ``step.failed``: in an inclusive
    router all of them; in an exclusive one the first, unless an arc before it takes every failure."""
    assert step.next is not None
    arcs = list(enumerate(step.next.arcs))
    if step.next.mode == "inclusive":
        return [(k, a) for k, a in arcs if a.when is None]
    for k, arc in arcs:
        if arc.when is None:
            return [(k, arc)]
        if _always(arc.when, _ANY_FAILURE):
            return []
    return []


def _expected_failure(step: Step, plain: Iterable[Arc], steps: dict[str, Step]) -> str | None:
    """Why the playbook expects ``step`` to fail (None: nothing says so)."""
    for task in step.tasks:
        for i, rule in enumerate(task.policy.rules if task.policy is not None else ()):
            retries_errors = rule.then.do == "retry" and (_unconditional(rule) or _matches_errors(rule.when))
            if rule.then.do == "fail" or retries_errors:
                return f"its task '{task.name}' can fail: its policy's rules[{i}] says {rule.then.do}"
    assert step.next is not None
    if any(_tests_boundary(arc.when) or _tests_boundary(arc.args) for arc in step.next.arcs):
        return "its arcs test which boundary ended it"
    for arc in plain:
        target = steps.get(arc.step)
        admit = target.admit if target is not None else None
        if admit is not None and any(_tests_boundary(r.when, failure=True) for r in admit.rules):
            return f"step '{arc.step}' admits on a failure"
    return None


def check_failure_reentry(c: Compiler, playbook: Playbook, data: dict[str, Any]) -> None:
    """Warn at an arc with a ``when`` that loops back (a back edge or a self-loop) without testing which
    boundary it sees: it is taken when its step fails too, so a step that keeps failing re-enters the
    cycle until the guard turns false, which a failure does not make it do (NoETL's engines route
    on success only). The controller ends such a run after `MAX_FAILED_REENTRIES` failures in a row."""
    index = {
        name: i
        for i, item in enumerate(data.get("workflow") or [])
        if isinstance(item, dict) and isinstance(name := item.get("step"), str)
    }
    back = build_graph(playbook).back_edges
    for step in playbook.workflow:
        if step.name not in index or not step.tasks or step.next is None:
            continue  # (a step without tasks is routed by the controller: it does not fail)
        for k, arc in enumerate(step.next.arcs):
            if arc.when is None or (step.name, arc.step) not in back or _tests_boundary(arc.when):
                continue
            if _never(arc.when, _ANY_FAILURE):
                continue  # (`when: false`, "{{ false }}": it never loops)
            if step.next.mode == "exclusive" and any(
                _always(a.when, _ANY_FAILURE) for a in step.next.arcs[:k] if a.when is not None
            ):
                continue  # an arc before it takes every failure
            fix = _failure_guard(arc.when)
            c.warn(
                ("workflow", index[step.name], "next", "arcs", k, "when"),
                f"step '{step.name}': the arc back to '{arc.step}' is taken when its 'when' is true on any "
                "boundary, step.failed too, and a failure does not change what it tests: a step that keeps "
                f"failing re-enters the cycle until the execution ends (the controller ends it after "
                f"{MAX_FAILED_REENTRIES} failures of one step in a row); to loop on success only, write "
                f"{fix}",
                code=CODE,
            )


def _failure_guard(when: Any) -> str:
    """``when`` with ``and event.name != 'step.failed'`` (a boolean: the guard alone)."""
    inner = as_expression(when)
    guard = "event.name != 'step.failed'"
    if inner is None or when is True:
        return f'"{{{{ {guard} }}}}"'
    if " or " in inner or " if " in inner:
        inner = f"({inner})"
    return f'"{{{{ {inner} and {guard} }}}}"'
