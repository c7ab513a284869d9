"""The step graph: forward arcs, back edges and joins.

An arc ``u -> v`` is a back edge when ``v`` is an ancestor of ``u`` on a depth-first
walk from ``start`` (self-loops included). A step with more than one incoming
forward arc is a join: it runs once, when every forward predecessor has resolved.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import msgspec

from noetl_stream.dsl.model import Playbook


class Graph(msgspec.Struct, frozen=True):
    successors: dict[str, tuple[str, ...]]
    """Forward successors of each step (distinct, YAML order)."""
    predecessors: dict[str, tuple[str, ...]]
    """Forward predecessors of each step (distinct)."""
    back_edges: frozenset[tuple[str, str]]
    joins: frozenset[str]

    def is_join(self, step: str) -> bool:
        return step in self.joins

    def is_forward(self, source: str, target: str) -> bool:
        return (source, target) not in self.back_edges


def build_graph(playbook: Playbook) -> Graph:
    steps = {s.name: s for s in playbook.workflow}
    arcs: dict[str, list[str]] = {}
    for s in playbook.workflow:
        targets: list[str] = []
        for arc in s.next.arcs if s.next else ():
            if arc.step in steps and arc.step not in targets:
                targets.append(arc.step)
        arcs[s.name] = targets

    roots = ["start"] if "start" in steps else []
    roots += [s.name for s in playbook.workflow if s.name != "start"]
    back = back_edges(arcs, roots)

    successors = {n: tuple(t for t in ts if (n, t) not in back) for n, ts in arcs.items()}
    reachable = _reachable(arcs, "start") if "start" in steps else set(steps)
    preds: dict[str, list[str]] = {n: [] for n in steps}
    for n, ts in successors.items():
        if n not in reachable:
            continue  # a step no token can reach never resolves: it must not hold a join back
        for t in ts:
            preds[t].append(n)
    predecessors = {n: tuple(p) for n, p in preds.items()}
    joins = frozenset(n for n, p in predecessors.items() if len(p) > 1)
    return Graph(successors=successors, predecessors=predecessors, back_edges=frozenset(back), joins=joins)


def back_edges(arcs: Mapping[str, Sequence[str]], roots: Iterable[str]) -> set[tuple[str, str]]:
    """The arcs ``u -> v`` that close a cycle (``v`` is on the depth-first walk's path to ``u``), walking
    from each of `roots` in turn (self-loops included)."""
    back: set[tuple[str, str]] = set()
    state: dict[str, int] = {}  # 1 = on stack, 2 = done
    for root in roots:
        if root in state:
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        state[root] = 1
        while stack:
            node, i = stack[-1]
            targets = arcs.get(node, ())
            if i < len(targets):
                stack[-1] = (node, i + 1)
                nxt = targets[i]
                mark = state.get(nxt)
                if mark == 1:
                    back.add((node, nxt))
                elif mark is None:
                    state[nxt] = 1
                    stack.append((nxt, 0))
            else:
                state[node] = 2
                stack.pop()
    return back


def path(arcs: Mapping[str, Sequence[str]], source: str, target: str) -> list[str]:
    """A shortest walk from `source` to `target` along `arcs` (both ends included; [] when none)."""
    came: dict[str, str | None] = {source: None}
    todo = [source]
    while todo:
        node = todo.pop(0)
        if node == target:
            out = [node]
            while (prev := came[out[-1]]) is not None:
                out.append(prev)
            return out[::-1]
        for nxt in arcs.get(node, ()):
            if nxt not in came:
                came[nxt] = node
                todo.append(nxt)
    return []


def multi_entry_cycles(
    arcs: Mapping[str, Sequence[str]], root: str
) -> list[tuple[list[str], dict[str, list[str]]]]:
    """The cycles (strongly connected steps, reachable from `root`) that tokens can enter at more than
    one step, with each entry's predecessors outside the cycle (`root` enters at itself: ``[]``).

    Such a cycle has no one loop head: which of its arcs is the back edge depends on the order of the
    depth-first walk, that is on the order the arcs are written, and with it which forward predecessors
    a join inside the cycle waits for."""
    reachable = _reachable(arcs, root)
    preds: dict[str, list[str]] = {n: [] for n in reachable}
    for n in reachable:
        for t in arcs.get(n, ()):
            preds.setdefault(t, []).append(n)
    out: list[tuple[list[str], dict[str, list[str]]]] = []
    seen: set[str] = set()
    for n in sorted(reachable):
        if n in seen:
            continue
        component = {m for m in _reachable(arcs, n) if n in _reachable(arcs, m)}
        seen |= component
        if len(component) < 2 and n not in arcs.get(n, ()):
            continue  # no cycle
        entries = {
            m: [p for p in preds.get(m, []) if p not in component]
            for m in component
            if m == root or any(p not in component for p in preds.get(m, []))
        }
        if len(entries) > 1:
            out.append((sorted(component), entries))
    return out


def _reachable(arcs: Mapping[str, Sequence[str]], root: str) -> set[str]:
    seen = {root}
    todo = [root]
    while todo:
        for t in arcs.get(todo.pop(), ()):
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return seen
