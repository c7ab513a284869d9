"""Parsing of a step's ``next`` router: ``spec.mode`` and the ``arcs`` to other steps."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from noetl_stream.dsl import vocabulary as V
from noetl_stream.dsl.diagnostics import Path
from noetl_stream.dsl.model import Arc, Next
from noetl_stream.dsl.rules import check_when
from noetl_stream.dsl.speckeys import check_keys

if TYPE_CHECKING:
    from noetl_stream.dsl.compiler import Compiler


def parse_next(c: Compiler, raw: Any, path: Path, who: str, step_names: set[str]) -> Next | None:
    if isinstance(raw, (str, list)):
        shape = "a string" if isinstance(raw, str) else "a list"
        hint = raw if isinstance(raw, str) and V.is_identifier(raw) else "..."
        c.error(
            path,
            f"{who}: 'next' as {shape} {V.NOT_V10}; use a router object "
            f"'next: {{spec: {{mode: exclusive}}, arcs: [{{step: {hint}}}]}}'{c.legacy_hint()}",
            code="deprecated",
        )
        return None
    if not isinstance(raw, dict):
        c.error(path, f"{who}: 'next' must be a router object with 'arcs'")
        return None
    ok = c.unknown_keys(raw, V.NEXT_KEYS, path, who, "next")
    spec = {} if raw.get("spec") is None else raw["spec"]
    mode = "exclusive"
    if not isinstance(spec, dict):
        c.error((*path, "spec"), f"{who}: next.spec must be a mapping")
        ok, spec = False, {}
    else:
        for k in spec:
            if k not in V.NEXT_SPEC_KEYS:
                c.error(
                    (*path, "spec", k),
                    f"{who}: unknown next.spec key '{k}'{V.key_hint(str(k), V.NEXT_SPEC_KEYS)}",
                    at_key=True,
                    code="unknown-key",
                )
                ok = False
        mode = spec.get("mode", "exclusive")
        if mode not in V.ROUTE_MODES:
            c.error(
                (*path, "spec", "mode"),
                f"{who}: next.spec.mode must be one of {V.one_of(V.ROUTE_MODES)}, "
                f"got '{mode}'{V.suggest(str(mode), V.ROUTE_MODES)}",
            )
            ok, mode = False, "exclusive"
        policy = spec.get("policy")
        if policy is not None and not isinstance(policy, dict):
            c.error((*path, "spec", "policy"), f"{who}: next.spec.policy must be a mapping")
            ok = False
        if isinstance(policy, dict):
            for k in policy:
                if k in V.CONTROL_KEYS:
                    c.error(
                        (*path, "spec", "policy", k),
                        f"{who}: task control '{k}' is not allowed in a next router",
                        at_key=True,
                        code="control-at-step",
                    )
                    ok = False
            check_keys(c, policy, (*path, "spec", "policy"), who, "next.spec.policy", V.CONTROL_KEYS)
    arcs_raw = raw.get("arcs")
    if not arcs_raw:
        c.error(
            (*path, "arcs") if "arcs" in raw else path,
            f"{who}: 'next' has no arcs; list the steps to go to (arcs: [{{step: ...}}]) or remove 'next'",
            at_key=True,
            code="missing",
        )
        return None
    if not isinstance(arcs_raw, list):
        c.error((*path, "arcs"), f"{who}: next.arcs must be a list of {{step, when, args}}")
        return None
    arcs: list[Arc] = []
    for i, arc in enumerate(arcs_raw):
        apath = (*path, "arcs", i)
        if isinstance(arc, str):
            c.error(apath, f"{who}: arc must be a mapping like '{{step: {arc}}}'")
            ok = False
            continue
        if not isinstance(arc, dict):
            c.error(apath, f"{who}: arc must be a mapping with 'step'")
            ok = False
            continue
        for k in arc:
            if k == "expr":
                c.error(
                    (*apath, k),
                    f"{who}: 'expr' {V.NOT_V10}; use 'when'{c.legacy_hint(translated=False)}",
                    at_key=True,
                    code="deprecated",
                )
                ok = False
            elif k not in V.ARC_KEYS and k != "set":  # (NoETL's 'set', normalized by dsl/dialect.py)
                c.error(
                    (*apath, k),
                    f"{who}: unknown arc key '{k}'{V.key_hint(str(k), V.ARC_KEYS)}",
                    at_key=True,
                    code="unknown-key",
                )
                ok = False
        target = arc.get("step")
        if target is None:
            c.error(apath, f"{who}: arc needs 'step' (the target step)", code="missing")
            ok = False
            continue
        if not isinstance(target, str):
            c.error((*apath, "step"), f"{who}: arc 'step' must be a step name, got {target!r}")
            ok = False
            continue
        if target not in step_names:
            c.error(
                (*apath, "step"),
                f"{who}: arc target '{target}' is not a step of this workflow"
                f"{V.suggest(str(target), step_names)}",
                code="unknown-target",
            )
            ok = False
        when = arc.get("when")
        if "when" in arc and not check_when(c, when, (*apath, "when"), who, "arc 'when'"):
            ok = False
        args = arc.get("args")
        if args is not None and not isinstance(args, dict):
            c.error((*apath, "args"), f"{who}: arc 'args' must be a mapping")
            ok = False
        aspec = {} if arc.get("spec") is None else arc["spec"]
        if not isinstance(aspec, dict):
            c.error((*apath, "spec"), f"{who}: arc 'spec' must be a mapping")
            ok = False
            aspec = {}
        set_ctx = arc.get("set")
        if set_ctx is not None and not isinstance(set_ctx, dict):
            c.error((*apath, "set"), f"{who}: arc 'set' must be a mapping of ctx names to values")
            ok = False
        arcs.append(Arc(step=str(target), when=when, args=args, spec=aspec, set_ctx=set_ctx or None))
    if not ok:
        return None
    return Next(arcs=tuple(arcs), mode=mode, spec=spec)  # type: ignore[arg-type]
