"""Template scopes (001 §4, DESIGN §7): what a template can read, built in one place.

One flat namespace, layered (a later layer wins a name): bare workload keys, step results by name,
ctx values, then the canonical names (``workload``, ``ctx``, ``args``, ``execution_id``, ``job``,
``keychain``), then the scoped extras of the place (``event``, ``output``, the loop iterator, a
pipeline's locals). Step results are read through views (`noetl_stream.dsl.views`).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator, Mapping, Set
from typing import Any

from noetl_stream.dsl.layering import deep_merge
from noetl_stream.dsl.model import Step
from noetl_stream.dsl.templates import attribute_reads, has_template, render_value, undeclared_names
from noetl_stream.dsl.views import CtxView, result_view

CANONICAL_NAMES = frozenset(
    {
        "workload",
        "ctx",
        "args",
        "execution_id",
        "job",
        "keychain",
        "iter",
        "outcome",
        "event",
        "_prev",
        "_task",
        "_attempt",
    }
)
"""Names a scope always binds to what they mean: a ctx value of the same name is not read bare."""

_JOB_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "noetl-stream:job")


@functools.lru_cache(maxsize=4096)
def job_uuid(execution_id: str) -> str:
    """The execution's ``job.uuid``: the id itself in UUID form when it is 32 hex digits (as the
    default ids are), else a UUID derived from it. A function of the id, so a replay, a resumed
    controller and every step of the execution see the same one."""
    if len(execution_id) == 32:
        try:
            return str(uuid.UUID(hex=execution_id))
        except ValueError:
            pass
    return str(uuid.uuid5(_JOB_NAMESPACE, execution_id))


def job_of(execution_id: str) -> dict[str, Any]:
    """NoETL's ``job``: ``{uuid, execution_id, id}``."""
    return {"uuid": job_uuid(execution_id), "execution_id": execution_id, "id": execution_id}


def build_scope(
    *,
    workload: Mapping[str, Any],
    ctx: Mapping[str, Any],
    execution_id: str,
    args: Mapping[str, Any] | None = None,
    results: Mapping[str, Any] | None = None,
    result_meta: Mapping[str, Any] | None = None,
    keychain: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Bare workload keys, then step results by name (as views: `result_view`, with their meta), then
    ctx values, then the canonical names, then `extra` (each layer wins over the ones before)."""
    scope: dict[str, Any] = dict(workload)
    if results:
        meta = result_meta or {}
        for name, value in results.items():
            scope[name] = result_view(value, meta.get(name))
    if ctx:
        scope.update(ctx)
    scope["workload"] = workload
    scope["ctx"] = CtxView(ctx, scope)
    scope["args"] = args if args is not None else {}
    scope["execution_id"] = execution_id
    scope["job"] = job_of(execution_id)
    scope["keychain"] = keychain if keychain is not None else {}
    if extra:
        scope.update(extra)
    return scope


def layer_ctx(scope: dict[str, Any], values: Mapping[str, Any], keep: Set[str]) -> None:
    """Make ctx `values` readable bare in `scope`, except canonical names and the names in `keep` (the
    place's own extras, which win over ctx values)."""
    for name, value in values.items():
        if name not in CANONICAL_NAMES and name not in keep:
            scope[name] = value


ITERATION_NAMES = frozenset({"_index", "loop_index", "_total", "loop"})
"""The names `iteration_names` binds besides the iterator."""


def iteration_names(iterator: str, item: Any, index: int, total: int | None) -> dict[str, Any]:
    """What NoETL's engines bind in a loop iteration besides ``iter``: the iterator bare, ``_index``
    and ``loop_index`` (0-based), ``_total``, and Jinja's ``loop`` (``index`` 1-based, ``index0``,
    ``first``, ``last``, ``length``)."""
    names: dict[str, Any] = {iterator: item, "_index": index, "loop_index": index}
    loop: dict[str, Any] = {"index": index + 1, "index0": index, "first": index == 0}
    if total is not None:
        names["_total"] = total
        loop.update(
            last=index == total - 1, length=total, revindex=total - index, revindex0=total - index - 1
        )
    names["loop"] = loop
    return names


def render_workload(
    declared: Mapping[str, Any], payload: Mapping[str, Any], execution_id: str
) -> dict[str, Any]:
    """The execution's workload: the playbook's, the request's payload over it, with the templates the
    playbook's workload holds rendered once (``run_id: "{{ job.uuid }}"``) against the workload,
    ``execution_id`` and ``job``. Keys render in the order they are written; one reads the keys without
    templates, the payload's and those rendered before it (``k: "{{ k | default('x') }}"`` is ``x``
    unless the payload gives ``k``). A payload value is data: never rendered, and a key it replaces is
    not rendered either. Raises `RenderError` (``workload.<key>``)."""
    merged = deep_merge(dict(declared), dict(payload)) if payload else dict(declared)
    todo = [
        k
        for k, v in declared.items()
        if _templated(v) and not (k in payload and not (isinstance(v, dict) and isinstance(payload[k], dict)))
    ]
    if not todo:
        return merged
    pending = set(todo)
    ready = {k: v for k, v in merged.items() if k not in pending}
    scope: dict[str, Any] = dict(ready)
    job = job_of(execution_id)
    for key in todo:
        scope.update(workload=ready, execution_id=execution_id, job=job)
        value = render_value(declared[key], scope, f"workload.{key}")
        if key in payload and isinstance(value, dict):
            value = deep_merge(value, payload[key])
        merged[key] = ready[key] = scope[key] = value
    return merged


def _templated(value: Any) -> bool:
    return any(True for _ in _strings(value))


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
        names |= {attr for name, attr in attribute_reads(text) if name == "ctx"}  # ctx.<step>
    return frozenset(names)
