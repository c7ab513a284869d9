"""Spec layering (003 §3.1): kind defaults -> executor.spec -> step.spec -> loop.spec -> task.spec."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from noetl_stream.dsl.kinds import kind_info
from noetl_stream.dsl.model import Playbook, Step, Task


def deep_merge(outer: Mapping[str, Any], inner: Mapping[str, Any]) -> dict[str, Any]:
    """Maps merge recursively with ``inner`` winning; scalars and lists are replaced."""
    out = dict(outer)
    for key, value in inner.items():
        current = out.get(key)
        if isinstance(current, Mapping) and isinstance(value, Mapping):
            out[key] = deep_merge(current, value)
        else:
            out[key] = value
    return out


def merge_layers(*layers: Mapping[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for layer in layers:
        if layer:
            out = deep_merge(out, layer)
    return out


def effective_task_spec(playbook: Playbook, step: Step, task: Task) -> dict[str, Any]:
    """The spec a task runs with. Policy subtrees merge too; their meaning stays typed by scope."""
    info = kind_info(task.kind)
    return merge_layers(
        info.defaults if info else None,
        playbook.executor.spec,
        step.spec,
        step.loop.raw_spec if step.loop else None,
        task.spec,
    )
