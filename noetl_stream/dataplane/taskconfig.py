"""A task's config for its run: rendered with its args and the step's ``input:`` (`render_config`), and a
``kind: workbook`` task's root template resolved with its caller's args (`resolve_workbook`,
`with_caller_args`). The pipeline (pipeline.py) renders each task run's config here before its tool runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.dsl.layering import merge_layers
from noetl_stream.dsl.model import Task
from noetl_stream.dsl.templates import RenderError, render_value

_MISSING = object()


def render_config(
    config: dict[str, Any], scope: dict[str, Any], where: str, step_input: dict[str, Any] | None
) -> dict[str, Any]:
    """A task's config rendered. Its ``args`` (``input:``) render first, with the step's ``input:`` merged
    over them (the step's keys win); the other fields then read them as ``input`` and, over the step's
    ``args``, as ``args``. A task without inputs (and a step without) renders in one pass."""
    if "args" not in config and not step_input:
        rendered: dict[str, Any] = render_value(config, scope, where)
        return rendered
    own = render_value(config["args"], scope, f"{where}.args") if "args" in config else {}
    if not isinstance(own, dict):  # its tool reports it (a template that rendered to no mapping)
        return {**render_value({k: v for k, v in config.items() if k != "args"}, scope, where), "args": own}
    inputs = {**own, **step_input} if step_input else own
    saved_input, saved_args = scope.get("input", _MISSING), scope.get("args", _MISSING)
    outer = saved_args if isinstance(saved_args, dict) else {}
    scope["input"] = inputs
    scope["args"] = {**outer, **inputs}
    try:
        rest = render_value({k: v for k, v in config.items() if k != "args"}, scope, where)
    finally:
        for key, saved in (("input", saved_input), ("args", saved_args)):
            if saved is _MISSING:
                scope.pop(key, None)
            else:
                scope[key] = saved
    return {**rest, "args": inputs}


@dataclass
class Workbook:
    """A ``kind: workbook`` task resolved: the template to run, its spec, its scope, the caller's args."""

    task: Task
    spec: dict[str, Any]
    scope: dict[str, Any]
    args: dict[str, Any]


def resolve_workbook(
    templates: Mapping[str, Task], step: str, task: Task, spec: dict[str, Any], scope: dict[str, Any]
) -> Workbook | Outcome:
    """``kind: workbook`` runs a root workbook template (of `templates`) with the caller's rendered
    ``args`` as ``args``: in the scope its fields render with, and as its tool's ``args``
    (`with_caller_args`)."""
    name = str(task.config.get("task") or task.name)
    template = templates.get(name)
    if template is None:
        return Outcome.fail("config_error", f"task '{task.name}': no workbook template '{name}'")
    try:
        rendered = render_value(
            task.config.get("args") or {},
            scope,
            f"step '{step}' task '{task.name}'.args",
            as_input=True,
        )
    except RenderError as exc:
        return Outcome.fail("template_error", str(exc))
    args = rendered if isinstance(rendered, dict) else {"value": rendered}
    inner = dict(scope)
    inner["args"] = args
    return Workbook(template, merge_layers(template.spec, spec), inner, args)


def with_caller_args(config: dict[str, Any], caller_args: dict[str, Any]) -> dict[str, Any]:
    """A workbook template's rendered config with the caller's args as its ``args``: the template's own
    ``args`` (its ``input``; rendered with the caller's as ``args``) are defaults, and the caller's keys
    win, as in NoETL. Already rendered values are never rendered again. Own ``args`` that render to no
    mapping are left for its tool to report; a caller without args leaves the config as the template
    wrote it."""
    if not caller_args:
        return config
    own = config.get("args")
    if own is None:
        merged = dict(caller_args)
    elif isinstance(own, dict):
        merged = {**own, **caller_args}
    else:
        return config
    return {**config, "args": merged}
