"""The label-as-key task shape of 001 (``- fetch: {kind: http, ...}``), written in the canonical form.

003 §7 names a task with ``name:``; 001's examples put the label as the key. Both are accepted: before
validation each label-as-key task becomes ``{name: fetch, kind: http, ...}`` (with a warning), so the
canonical form (``validate --show-canonical``) shows the one shape. The compiler checks the forms this
pass leaves alone: a ``name`` inside the body, keys beside the label, and a bare list of steps.
"""

from __future__ import annotations

from typing import Any, TypeGuard

from noetl_stream.dsl.diagnostics import Diagnostic, Path
from noetl_stream.dsl.origins import Origins
from noetl_stream.dsl.source import SourceMap


def is_label_as_key(item: Any) -> TypeGuard[dict[str, Any]]:
    """``{label: {task body}}``: one key, a mapping under it, no ``kind`` beside it."""
    return (
        isinstance(item, dict)
        and "kind" not in item
        and len(item) == 1
        and isinstance(next(iter(item.values())), dict)
    )


def label_as_key_warning(who: str, label: Any) -> str:
    return f"{who}: task '{label}' uses the label-as-key shape; write it as '- name: {label}' with 'kind: ...' (003 §7)"


def _normal(item: Any) -> TypeGuard[dict[str, Any]]:
    """A label-as-key task this pass rewrites (one that names itself again is left to the compiler)."""
    return is_label_as_key(item) and "name" not in next(iter(item.values()))


def has_labels(data: Any) -> bool:
    workflow = data.get("workflow") if isinstance(data, dict) else None
    for step in workflow if isinstance(workflow, list) else []:
        tool = step.get("tool") if isinstance(step, dict) else None
        if any(_normal(t) for t in (tool if isinstance(tool, list) else [tool])):
            return True
    return False


def normalize(data: Any, origins: Origins, smap: SourceMap) -> list[Diagnostic]:
    """Rewrite the label-as-key tasks of every step in place; a warning for each."""
    diagnostics: list[Diagnostic] = []
    workflow = data.get("workflow") if isinstance(data, dict) else None
    for i, step in enumerate(workflow if isinstance(workflow, list) else []):
        if not isinstance(step, dict):
            continue
        who = f"step '{step.get('step')}'"
        tool = step.get("tool")
        tpath: Path = ("workflow", i, "tool")
        if _normal(tool):
            step["tool"] = _named(tool, tpath, who, origins, smap, diagnostics)
        elif isinstance(tool, list):
            for n, item in enumerate(tool):
                if _normal(item):
                    tool[n] = _named(item, (*tpath, n), who, origins, smap, diagnostics)
    return diagnostics


def _named(
    item: dict[str, Any], path: Path, who: str, origins: Origins, smap: SourceMap, out: list[Diagnostic]
) -> dict[str, Any]:
    """``{label: body}`` -> ``{name: label, **body}``, standing where the author wrote the body (an earlier
    rewrite may have moved the item: its authored path is the one that counts)."""
    label, body = next(iter(item.items()))
    at = origins.path_of(body) or (*(origins.path_of(item) or path), label)
    out.append(
        smap.diagnostic(
            at, label_as_key_warning(who, label), severity="warning", at_key=True, code="label-as-key"
        )
    )
    new = origins.mark({"name": label, **body}, at)
    origins.mark_key(new, "name", at)
    return new


__all__ = ["has_labels", "is_label_as_key", "label_as_key_warning", "normalize"]
