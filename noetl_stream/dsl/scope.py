"""Template scopes (001 §4, DESIGN §7): what a template can read, built in one place."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from noetl_stream.dsl.model import Step
from noetl_stream.dsl.templates import has_template, undeclared_names


def build_scope(
    *,
    workload: Mapping[str, Any],
    ctx: Mapping[str, Any],
    execution_id: str,
    args: Mapping[str, Any] | None = None,
    results: Mapping[str, Any] | None = None,
    keychain: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Bare workload keys, then step results by name, then the reserved scopes (which win)."""
    scope: dict[str, Any] = dict(workload)
    if results:
        scope.update(results)
    scope["workload"] = workload
    scope["ctx"] = ctx
    scope["args"] = args if args is not None else {}
    scope["execution_id"] = execution_id
    scope["keychain"] = keychain if keychain is not None else {}
    if extra:
        scope.update(extra)
    return scope


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        if has_template(node):
            yield node
    elif isinstance(node, dict):
        for v in node.values():
            yield from _strings(v)
    elif isinstance(node, (list, tuple)):
        for v in node:
            yield from _strings(v)


def names_read_by_step(step: Step) -> frozenset[str]:
    """Top-level names the step's tasks and loop read (to ship only the results a worker needs)."""
    names: set[str] = set()
    parts: list[Any] = []
    if step.input:
        parts.append(step.input)
    if step.loop is not None:
        parts.append(step.loop.in_)
        parts.append(step.loop.spec.max_in_flight)
    for task in step.tasks:
        parts.append(task.config)
        parts.append(task.spec)
        if task.policy is not None:
            for rule in task.policy.rules:
                parts.append(rule.when)
                parts.append(rule.then.set_iter)
                parts.append(rule.then.set_ctx)
                parts.append(rule.then.delay)
    for text in _strings(parts):
        names |= undeclared_names(text)
    return frozenset(names)
