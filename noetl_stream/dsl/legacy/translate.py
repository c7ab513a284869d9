"""The legacy translation of a whole playbook: root keys, every step, then names read everywhere."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from noetl_stream.dsl.diagnostics import Diagnostic, Path
from noetl_stream.dsl.legacy.context import Translation, UntranslatableError
from noetl_stream.dsl.legacy.steps import STEP_000, translate_step
from noetl_stream.dsl.origins import Origins
from noetl_stream.dsl.rewrite import (
    Rewrite,
    Tok,
    alias_literals,
    aliases_to_canonical,
    join,
    reads_attr,
    rewrite_text,
    success_to_ok,
    tokenize,
)
from noetl_stream.dsl.source import SourceMap
from noetl_stream.protocol.events import LEGACY_ALIASES

ROOT_METADATA = ("name", "path", "version", "description")


def translate(data: Any, origins: Origins, smap: SourceMap) -> list[Diagnostic]:
    """Rewrite ``data`` (a private copy registered in ``origins``) in place into canonical form."""
    t = Translation(origins, smap)
    if not isinstance(data, dict):
        return t.diagnostics
    t.structural_next = reads_as_000(data)
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
                except UntranslatableError:  # reported; keep the validator from reporting its other parts
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


def reads_as_000(data: dict[str, Any]) -> bool:
    """Whether the playbook is in 000/004 form and shows nothing of 002. Both drafts write ``next`` as a
    list of ``{step, args}``: 000 means every target, on success (its ``next`` has no ``when``); 002
    means arcs whose ``when`` defaults to true, the first one taken, on failure too."""
    found_000 = any(k in data for k in ROOT_METADATA)
    found_002 = False
    workflow = data.get("workflow")
    for step in workflow if isinstance(workflow, list) else []:
        if not isinstance(step, dict):
            continue
        loop, spec, nxt = step.get("loop"), step.get("spec"), step.get("next")
        items = nxt if isinstance(nxt, list) else []
        found_000 = found_000 or any(k in step for k in (*STEP_000, "args"))
        found_000 = found_000 or (isinstance(loop, dict) and "mode" in loop)
        found_000 = found_000 or isinstance(nxt, str) or any(isinstance(x, str) for x in items)
        found_002 = found_002 or "when" in step or (isinstance(spec, dict) and "next_mode" in spec)
        found_002 = found_002 or any(isinstance(x, dict) and ("when" in x or "expr" in x) for x in items)
        found_002 = found_002 or _has_key(step.get("tool"), MARKS_002)
    return found_000 and not found_002


MARKS_002 = frozenset({"eval", "expr", "set_vars", "set_shared", "set_prev"})


def _has_key(node: Any, keys: frozenset[str]) -> bool:
    if isinstance(node, dict):
        return any(k in keys or _has_key(v, keys) for k, v in node.items())
    if isinstance(node, list):
        return any(_has_key(v, keys) for v in node)
    return False


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
        name = str(step.get("step"))
        own = t.vars_by_step.get(name, set())
        clash = own & t.ctx_vars
        rw = Rewrite(names={"vars": "ctx"}, attrs={("vars", n): f"iter.{n}" for n in sorted(own - clash)})
        late_rw = Rewrite(names={"vars": "ctx"})  # the step run's vars are gone once it has ended
        told = False
        for node, key, path in _strings(step, ("workflow", i)):
            before = node[key]
            ended = name in t.after_steps or path[2:3] == ("next",)
            use = late_rw if ended else rw
            late = [n for n in sorted(own - clash) if reads_attr(before, "vars", n)] if ended else []
            if late:
                place = f"step '{name}'" if name in t.after_steps else "'next'"
                t.error(
                    table.get(path, path),
                    f"step '{name}': 'vars.{late[0]}' (002 set_vars, step scope) is read in {place}, "
                    "after the step ended: no faithful translation (only the step's result, ctx, workload "
                    "and args are known then): write it with set_shared to route on it, or make it the "
                    "step's result",
                    at_key=False,
                )
            after = _spellings(t, rewrite_text(before, use), table.get(path, path))
            if after == before:
                continue
            node[key] = after
            where = table.get(path, path)
            if rewrite_text(before, use) != before and not late:
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
    attr = _status_attr(text)
    if success_to_ok(attr) != attr:
        text = attr
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


def _status_attr(text: str) -> str:
    """``text`` with ``outcome['status']`` read as ``outcome.status`` (the same value), so that a
    ``'success'`` test written with a subscript is translated too."""
    if "outcome" not in text or "status" not in text:
        return text
    tokens = tokenize(text)
    if tokens is None:
        return text
    code = [i for i, tok in enumerate(tokens) if tok.code and tok.kind not in ("whitespace", "raw")]
    drop: set[int] = set()
    for n in range(len(code) - 3):
        a, b, c, d = (tokens[j] for j in code[n : n + 4])
        if (
            (a.kind, a.value) == ("name", "outcome")
            and (b.kind, b.value) == ("operator", "[")
            and c.kind == "string"
            and c.value[1:-1] == "status"
            and (d.kind, d.value) == ("operator", "]")
        ):
            tokens[code[n + 1]] = Tok("operator", ".", True)
            tokens[code[n + 2]] = Tok("name", "status", True)
            drop.update(range(code[n + 1] + 1, code[n + 2]))
            drop.update(range(code[n + 2] + 1, code[n + 3] + 1))
    return join([tok for i, tok in enumerate(tokens) if i not in drop])


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
