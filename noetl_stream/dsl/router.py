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
    """A step's ``next`` router: its keys, its ``spec`` (``mode``, ``policy``) and its ``arcs``, each to a
    step of `step_names`. Every problem is reported to `c` (all of them, in the order they are found);
    None when there was one."""
    if not _is_router_object(c, raw, path, who):
        return None
    ok = c.unknown_keys(raw, V.NEXT_KEYS, path, who, "next")
    spec, mode, spec_ok = _parse_spec(c, raw, path, who)
    arcs = _parse_arcs(c, raw, path, who, step_names)
    if arcs is None or not (ok and spec_ok):
        return None
    return Next(arcs=tuple(arcs), mode=mode, spec=spec)  # type: ignore[arg-type]


def _is_router_object(c: Compiler, raw: Any, path: Path, who: str) -> bool:
    """Whether ``next`` is a mapping; a string or a list (earlier DSL versions' shapes) is reported with
    the router object to write instead."""
    if isinstance(raw, (str, list)):
        shape = "a string" if isinstance(raw, str) else "a list"
        hint = raw if isinstance(raw, str) and V.is_identifier(raw) else "..."
        c.error(
            path,
            f"{who}: 'next' as {shape} {V.NOT_V10}; use a router object "
            f"'next: {{spec: {{mode: exclusive}}, arcs: [{{step: {hint}}}]}}'{c.legacy_hint()}",
            code="deprecated",
        )
        return False
    if not isinstance(raw, dict):
        c.error(path, f"{who}: 'next' must be a router object with 'arcs'")
        return False
    return True


def _parse_spec(c: Compiler, raw: dict[str, Any], path: Path, who: str) -> tuple[dict[str, Any], str, bool]:
    """``next.spec``: the spec, its ``mode`` (``exclusive`` when it names none, or none it may) and whether
    it is well formed (its keys, its mode and its ``policy``)."""
    spec = {} if raw.get("spec") is None else raw["spec"]
    if not isinstance(spec, dict):
        c.error((*path, "spec"), f"{who}: next.spec must be a mapping")
        return {}, "exclusive", False
    ok = True
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
    policy_ok = _check_route_policy(c, spec.get("policy"), path, who)
    return spec, mode, ok and policy_ok


def _check_route_policy(c: Compiler, policy: Any, path: Path, who: str) -> bool:
    """``next.spec.policy``, if there is one: a mapping without the controls of a task's policy (a router
    runs no task), its keys checked as a policy's are."""
    if policy is None:
        return True
    if not isinstance(policy, dict):
        c.error((*path, "spec", "policy"), f"{who}: next.spec.policy must be a mapping")
        return False
    ok = True
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
    return ok


def _parse_arcs(
    c: Compiler, raw: dict[str, Any], path: Path, who: str, step_names: set[str]
) -> list[Arc] | None:
    """``next.arcs``: a non-empty list of arcs, every one checked; None when it is missing, no list, or
    one of its arcs has a problem."""
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
    ok = True
    for i, arc in enumerate(arcs_raw):
        parsed = _parse_arc(c, arc, (*path, "arcs", i), who, step_names)
        if parsed is None:
            ok = False
        else:
            arcs.append(parsed)
    return arcs if ok else None


def _parse_arc(c: Compiler, arc: Any, apath: Path, who: str, step_names: set[str]) -> Arc | None:
    """One arc, ``{step, when, args, spec, set}``: its keys, its target (a step of this workflow), its
    condition, and ``args``, ``spec`` and ``set`` (mappings). None when it has a problem."""
    if isinstance(arc, str):
        c.error(apath, f"{who}: arc must be a mapping like '{{step: {arc}}}'")
        return None
    if not isinstance(arc, dict):
        c.error(apath, f"{who}: arc must be a mapping with 'step'")
        return None
    ok = _check_arc_keys(c, arc, apath, who)
    target = arc.get("step")
    if target is None:
        c.error(apath, f"{who}: arc needs 'step' (the target step)", code="missing")
        return None
    if not isinstance(target, str):
        c.error((*apath, "step"), f"{who}: arc 'step' must be a step name, got {target!r}")
        return None
    if target not in step_names:
        c.error(
            (*apath, "step"),
            f"{who}: arc target '{target}' is not a step of this workflow{V.suggest(str(target), step_names)}",
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
    if not ok:
        return None
    return Arc(step=str(target), when=when, args=args, spec=aspec, set_ctx=set_ctx or None)


def _check_arc_keys(c: Compiler, arc: dict[str, Any], apath: Path, who: str) -> bool:
    """Whether an arc names only keys an arc has (``expr``, of earlier DSL versions, is reported with
    ``when`` to write instead)."""
    ok = True
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
    return ok
