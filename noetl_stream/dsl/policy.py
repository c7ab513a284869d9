"""Pure evaluation of the three rule sites: task outcome policy, admission, routing.

The defaults follow NoETL's engines rather than the letter of 001 (§12.2, §13.1; docs/semantics.md):
an error no policy rule matches fails the task, and an arc without ``when`` is taken only when its
step succeeded, so a failure no arc takes fails the execution.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from noetl_stream.dsl.model import Admit, Arc, Next, TaskPolicy, Then
from noetl_stream.dsl.templates import evaluate_when

MAX_RETRY_DELAY_S = 600.0
MAX_FAILED_REENTRIES = 10
"""A step that fails this many times in a row (no successful run in between), re-entered each time by a
cycle's arc taken on its failure, ends the execution (control/core/routing.py, ``failing_cycle``)."""
CONTINUE = Then(do="continue")
FAIL = Then(do="fail")


def decide(
    policy: TaskPolicy | None, status: str, scope: Mapping[str, Any], where: str = ""
) -> tuple[Then, int | None]:
    """The directive for a task outcome and the index of the rule that matched.

    No policy, or no rule matches (and no ``else``): ``ok`` continues and ``error`` fails, as both
    NoETL engines do (001 §12.2 says continue for both: ``on_unmatched: continue`` asks for that).
    """
    if policy is not None:
        for i, rule in enumerate(policy.rules):
            if rule.is_else or evaluate_when(rule.when, scope, f"{where}.rules[{i}].when"):
                return rule.then, i
        if policy.on_unmatched == "continue":
            return CONTINUE, None
    return (CONTINUE if status == "ok" else FAIL), None


def admit(admission: Admit | None, scope: Mapping[str, Any], where: str = "") -> bool:
    """Admission gate: first matching rule decides; no admission policy (or no match) allows."""
    if admission is None:
        return True
    for i, rule in enumerate(admission.rules):
        if rule.is_else or evaluate_when(rule.when, scope, f"{where}.admit.rules[{i}].when"):
            return rule.allow
    return True


def route(
    router: Next | None, scope: Mapping[str, Any], where: str = "", *, failed: bool = False
) -> list[Arc]:
    """Arcs that fire: exclusive -> the first true arc in YAML order; inclusive -> every true arc.

    An arc without ``when`` is true on a success boundary (``step.done``, ``loop.done``) only; on
    ``step.failed`` (``failed``) only arcs with a ``when`` can fire."""
    if router is None:
        return []
    fired: list[Arc] = []
    for i, arc in enumerate(router.arcs):
        if arc.when is None:
            fires = not failed
        else:
            fires = evaluate_when(arc.when, scope, f"{where}.next.arcs[{i}].when")
        if fires:
            fired.append(arc)
            if router.mode == "exclusive":
                break
    return fired


def backoff_delay(then: Then, attempt: int, base: float | None) -> float:
    """Seconds to wait before run ``attempt + 1`` (``attempt`` counts runs so far, >= 1)."""
    delay = 1.0 if base is None else max(0.0, float(base))
    if then.backoff == "linear":
        delay *= attempt
    elif then.backoff == "exponential":
        delay *= 2.0 ** min(attempt - 1, 30)
    return min(delay, MAX_RETRY_DELAY_S)
