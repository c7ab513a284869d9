"""The legacy translation of a whole playbook: root keys, every step, then names read everywhere."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from noetl_stream.dsl.diagnostics import Diagnostic, Path
from noetl_stream.dsl.legacy.context import Translation, Untranslatable
from noetl_stream.dsl.legacy.steps import STEP_000, translate_step
from noetl_stream.dsl.origins import Origins
from noetl_stream.dsl.rewrite import (
    Rewrite,
    alias_literals,
    aliases_to_canonical,
    reads_attr,
    rewrite_text,
    success_to_ok,
)
from noetl_stream.dsl.source import SourceMap
from noetl_stream.events import LEGACY_ALIASES

ROOT_METADATA = ("name", "path", "version", "description")


def translate(data: Any, origins: Origins, smap: SourceMap) -> list[Diagnostic]:
    """Rewrite ``data`` (a private copy registered in ``origins``) in place into canonical form."""
    t = Translation(origins, smap)
    if not isinstance(data, dict):
        return t.diagnostics
    _root(t, data)
    workflow = data.get("workflow")
    if isinstance(workflow, list):
        names = {s["step"] for s in workflow if isinstance(s, dict) and isinstance(s.get("step"), str)}
        workload = data.get("workload")
        plain = names | (set(workload) if isinstance(workload, dict) else set())
        out: list[Any] = []
        for i, step in enumerate(workflow):
            out.append(step)
            if isinstance(step, dict) and isinstance(step.get("step"), str):
                try:
                    out.extend(translate_step(t, step, ("workflow", i), names, plain))
                except Untranslatable:  # reported; keep the validator from reporting its other parts
                    for key in STEP_000:
                        step.pop(key, None)
                    if isinstance(step.get("next"), (str, list)):
                        step.pop("next")
        data["workflow"] = t.mark(out, ("workflow",))
        _names(t, data)
    _workbook(t, data)
    _keychain(t, data)
    _extensions(data)
    return t.diagnostics


def _root(t: Translation, data: dict[str, Any]) -> None:
    moved = [k for k in ROOT_METADATA if k in data]
    if moved:
        current = data.get("metadata")
        if current is None:
            meta: dict[str, Any] = t.mark({}, (moved[0],))
            items = list(data.items())
            data.clear()
            for k, v in items:
                if k in moved:
                    if "metadata" not in data:
                        data["metadata"] = meta
                    meta[k] = v
                    t.origins.mark_key(meta, k, (k,))
                else:
                    data[k] = v
            t.warn((moved[0],), f"root {', '.join(repr(k) for k in moved)} translated to metadata")
        elif isinstance(current, dict):
            meta = current
            for k in moved:
                if k in meta:
                    t.error((k,), f"root '{k}' and metadata.{k} both given; keep metadata.{k}")
                else:
                    meta[k] = data[k]
                    t.origins.mark_key(meta, k, (k,))
                del data[k]
            t.warn((moved[0],), f"root {', '.join(repr(k) for k in moved)} translated to metadata")
    if "vars" in data:
        t.error(
            ("vars",),
            "root 'vars' has no canonical translation: a playbook has no execution variables with "
            "initial values (put inputs in workload, and write state with set_ctx in a task policy)",
        )
        del data["vars"]


def _strings(node: Any, path: Path) -> Iterator[tuple[Any, Any, Path]]:
    """(container, key, path) of every string inside ``node``."""
    if isinstance(node, dict):
        for k, v in node.items():
            if isinstance(v, str):
                yield node, k, (*path, k)
            else:
                yield from _strings(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            if isinstance(v, str):
                yield node, i, (*path, i)
            else:
                yield from _strings(v, (*path, i))


def _names(t: Translation, data: dict[str, Any]) -> None:
    """``vars.<name>`` reads, ``outcome.status == 'success'`` and tests of legacy event aliases
    (``event.name == 'call.done'``), everywhere in the workflow."""
    table = t.origins.resolve(data)
    for i, step in enumerate(data["workflow"]):
        if not isinstance(step, dict):
            continue
        own = t.vars_by_step.get(str(step.get("step")), set())
        clash = own & t.ctx_vars
        rw = Rewrite(names={"vars": "ctx"}, attrs={("vars", n): f"iter.{n}" for n in sorted(own - clash)})
        told = False
        for node, key, path in _strings(step, ("workflow", i)):
            before = node[key]
            after = _spellings(t, rewrite_text(before, rw), table.get(path, path))
            if after == before:
                continue
            node[key] = after
            where = table.get(path, path)
            if rewrite_text(before, rw) != before:
                if any(reads_attr(before, "vars", n) for n in clash):
                    t.error(
                        where,
                        f"'vars.{sorted(clash)[0]}' is written both by a 000 'vars' block (execution scope) "
                        "and by 002 'set_vars' (step scope): no single translation",
                        at_key=False,
                    )
                elif not told:
                    told = True
                    t.warn(
                        where,
                        f"step '{step.get('step')}': legacy 'vars.<name>' reads translated to "
                        "ctx.<name> (iter.<name> for names of 002 set_vars)",
                        at_key=False,
                    )


def _spellings(t: Translation, text: str, where: Path) -> str:
    """``text`` with ``outcome.status == 'success'`` and legacy event aliases in canonical form."""
    after = aliases_to_canonical(success_to_ok(text))
    if after != text:
        if success_to_ok(text) != text:
            t.warn(where, "002 outcome status 'success' translated to 'ok'", at_key=False)
        for alias in dict.fromkeys(alias_literals(text)):
            t.warn(
                where,
                f"legacy event alias '{alias}' translated to the boundaries it stands for "
                f"({', '.join(LEGACY_ALIASES[alias])})",
                at_key=False,
            )
    return after


def _workbook(t: Translation, data: dict[str, Any]) -> None:
    """The legacy spellings in workbook templates (their tasks' policies)."""
    workbook = data.get("workbook")
    if not isinstance(workbook, (dict, list)):
        return
    table = t.origins.resolve(data)
    for node, key, path in _strings(workbook, ("workbook",)):
        node[key] = _spellings(t, node[key], table.get(path, path))


def _keychain(t: Translation, data: dict[str, Any]) -> None:
    if not t.keychain:
        return
    if "keychain" not in data:
        items = list(data.items())
        data.clear()
        for k, v in items:
            data[k] = v
            if k == "metadata":
                data["keychain"] = []
        data.setdefault("keychain", [])
    chain = data["keychain"]
    if not isinstance(chain, list):
        return
    declared = {e.get("name") for e in chain if isinstance(e, dict)}
    for name, kind in t.keychain.items():
        if name not in declared:
            chain.append({"name": name, "kind": kind})


def _extensions(data: dict[str, Any]) -> None:
    """The translated playbook needs no ``legacy`` extension any more."""
    executor = data.get("executor")
    spec = executor.get("spec") if isinstance(executor, dict) else None
    exts = spec.get("extensions") if isinstance(spec, dict) else None
    if not isinstance(executor, dict) or not isinstance(spec, dict) or not isinstance(exts, list):
        return
    if "legacy" not in exts:
        return
    exts[:] = [e for e in exts if e != "legacy"]
    if not exts:
        del spec["extensions"]
    if not spec:
        del executor["spec"]
    if not executor:
        del data["executor"]
