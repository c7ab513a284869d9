"""What ``validate`` says about the names NoETL's playbooks read that v10 spells another way.

Each such read is a warning (code ``dialect``) naming the canonical spelling, and is not reported
again as an undefined name (``undefined-name``):

* a loop's iterator read bare in its step's tasks (``{{ uid }}``): ``iter.uid``;
* NoETL's loop positions: ``_index``, ``loop_index`` and ``iter._index`` (``iter.index``), ``_total``
  (``iter._total``), Jinja's ``loop.index`` (``iter.index + 1``), ``loop.first``, ``loop.last`` and
  ``loop.length`` (``iter._first``, ``iter._last``, ``iter._total``);
* a ctx value read bare (``{{ page }}`` where a ``set_ctx`` writes ``page``): ``ctx.page``;
* ``ctx`` as the whole namespace: ``ctx.<step>`` (``<step>``), ``ctx.<workload key>``
  (``workload.<key>``), when no ``set_ctx`` writes that key;
* ``output`` and ``result`` in an arc, the step's result: ``<step>``.

Bare workload keys and step results by name are canonical here (docs/semantics.md, "Templates").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from noetl_stream.dsl.model import Playbook

POSITIONS = {"_index": "iter.index", "loop_index": "iter.index", "_total": "iter._total"}
"""Bare names of a loop iteration's position, and their canonical spelling."""
ITER_KEYS = {"_index": "iter.index"}
"""``iter.<key>`` spellings NoETL's engines bind that are not canonical (``iter._total``, ``iter._first``
and ``iter._last`` are)."""
LOOP_KEYS = {
    "index": "iter.index + 1",
    "index0": "iter.index",
    "first": "iter._first",
    "last": "iter._last",
    "length": "iter._total",
    "revindex": "iter._total - iter.index",
    "revindex0": "iter._total - iter.index - 1",
}
"""Jinja's ``loop`` of a loop step's iteration (outside a ``{% for %}``), and what it is."""
RESULT_NAMES = ("output", "result")


@dataclass(frozen=True)
class Namespace:
    """What a playbook binds, for telling its names apart."""

    workload: frozenset[str]
    steps: frozenset[str]
    ctx: frozenset[str]
    """Keys something writes to ctx (a policy's ``set_ctx``, an arc's ``set``)."""

    @classmethod
    def of(cls, playbook: Playbook, data: dict[str, Any]) -> Namespace:
        return cls(
            workload=frozenset(playbook.workload),
            steps=frozenset(s.name for s in playbook.workflow),
            ctx=frozenset(_ctx_keys(data)),
        )


def _ctx_keys(data: dict[str, Any]) -> set[str]:
    """The keys written to ctx in (normalized) playbook data: ``set_ctx`` mappings anywhere, and the
    ``set`` of arcs (their keys are ctx names once the dialect is normalized)."""
    keys: set[str] = set()
    stack: list[Any] = [data.get("workflow"), data.get("workbook")]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "set_ctx" and isinstance(v, dict):
                    keys.update(map(str, v))
                stack.append(v)
        elif isinstance(node, list):
            stack.extend(node)
    workflow = data.get("workflow")
    for step in workflow if isinstance(workflow, list) else ():
        nxt = step.get("next") if isinstance(step, dict) else None
        arcs = nxt.get("arcs") if isinstance(nxt, dict) else None
        for arc in arcs if isinstance(arcs, list) else ():
            if isinstance(arc, dict) and isinstance(arc.get("set"), dict):
                keys.update(map(str, arc["set"]))
    return keys


@dataclass(frozen=True)
class Place:
    """Where a template stands: its site (`checks._site`), the loop iterators it may read (its step's,
    in its tasks; any loop's in a workbook template; none where no iteration exists), the names its
    step binds besides (task labels) and the step's name."""

    site: str | None
    iterators: frozenset[str]
    labels: frozenset[str]
    step: str | None


@dataclass(frozen=True)
class Spelling:
    """One dialect name a template reads: the warning, and how the canonical spelling rewrites it
    (`names`: a top-level name -> its expression; `attrs`: ``(name, key)`` -> an expression)."""

    message: str
    names: tuple[tuple[str, str], ...] = ()
    attrs: tuple[tuple[tuple[str, str], str], ...] = ()


def dialect_spellings(
    names: frozenset[str], attrs: frozenset[tuple[str, str]], place: Place, ns: Namespace
) -> tuple[list[Spelling], frozenset[str]]:
    """The dialect names a template reads (`names` at top level, `attrs` as ``name.key``), each with its
    canonical spelling, and the top-level names they cover."""
    out: list[Spelling] = []
    covered: set[str] = set()
    if place.iterators:
        for it in sorted(names & place.iterators - ns.workload - place.labels):
            out.append(
                Spelling(
                    f"'{{{{ {it} }}}}' reads the loop's item bare (NoETL's); canonical: 'iter.{it}'",
                    names=((it, f"iter.{it}"),),
                )
            )
            covered.add(it)
        for name in sorted(names & POSITIONS.keys()):
            out.append(
                Spelling(
                    f"'{name}' is NoETL's loop position; canonical: '{POSITIONS[name]}'",
                    names=((name, POSITIONS[name]),),
                )
            )
            covered.add(name)
        loop = sorted(k for n, k in attrs if n == "loop" and k in LOOP_KEYS)
        if "loop" in names and loop:
            out.append(
                Spelling(
                    "Jinja's 'loop' outside a '{% for %}' is NoETL's loop position ("
                    + ", ".join(f"loop.{k} is '{LOOP_KEYS[k]}'" for k in loop)
                    + ")",
                    attrs=tuple((("loop", k), LOOP_KEYS[k]) for k in loop),
                )
            )
            covered.add("loop")
        for key in sorted(k for n, k in attrs if n == "iter" and k in ITER_KEYS):
            out.append(
                Spelling(
                    f"'iter.{key}' is NoETL's; canonical: '{ITER_KEYS[key]}'",
                    attrs=((("iter", key), ITER_KEYS[key]),),
                )
            )
    bound = ns.workload | ns.steps | place.labels | covered
    for name in sorted((names & ns.ctx) - bound):
        out.append(
            Spelling(
                f"'{{{{ {name} }}}}' reads a ctx value bare (NoETL's); canonical: 'ctx.{name}'",
                names=((name, f"ctx.{name}"),),
            )
        )
        covered.add(name)
    if "ctx" in names:
        for key in sorted({k for n, k in attrs if n == "ctx"} - ns.ctx):
            if key in ns.steps:
                out.append(
                    Spelling(
                        f"'ctx.{key}' reads the result of step '{key}' through ctx (NoETL's); canonical: '{key}'",
                        attrs=((("ctx", key), key),),
                    )
                )
            elif key in ns.workload:
                out.append(
                    Spelling(
                        f"'ctx.{key}' reads a workload key through ctx (NoETL's); canonical: 'workload.{key}'",
                        attrs=((("ctx", key), f"workload.{key}"),),
                    )
                )
    if place.site == "an arc":
        for name in RESULT_NAMES:
            if name in names and name not in ns.workload and name not in ns.steps:
                step = place.step or "<step>"
                out.append(
                    Spelling(
                        f"'{name}' in an arc is NoETL's name for the step's result; canonical: '{step}'",
                        names=((name, step),) if place.step else (),
                    )
                )
                covered.add(name)
    return out, frozenset(covered)


def dialect_reads(
    names: frozenset[str], attrs: frozenset[tuple[str, str]], place: Place, ns: Namespace
) -> tuple[list[str], frozenset[str]]:
    """The warnings for the dialect names a template reads (`names` at top level, `attrs` as
    ``name.key``), and the top-level names they cover."""
    spellings, covered = dialect_spellings(names, attrs, place, ns)
    return [s.message for s in spellings], covered
