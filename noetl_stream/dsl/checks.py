"""Whole-playbook checks that run after the structure is known: graph and templates."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from noetl_stream.dsl import vocabulary as V
from noetl_stream.dsl.canonical import LEGACY
from noetl_stream.dsl.diagnostics import Diagnostic, Path, format_path
from noetl_stream.dsl.graph import back_edges, multi_entry_cycles
from noetl_stream.dsl.graph import path as walk
from noetl_stream.dsl.model import Playbook
from noetl_stream.dsl.names import Namespace, Place, dialect_reads
from noetl_stream.dsl.rewrite import (
    alias_literals,
    compared_literals,
    event_name_literals,
    status_literals,
    success_to_ok,
)
from noetl_stream.dsl.templates import attribute_reads, check_syntax, has_template, undeclared_names
from noetl_stream.protocol.events import BOUNDARY_EVENTS, LEGACY_ALIASES, LOOP_DONE, STEP_DONE, STEP_FAILED

if TYPE_CHECKING:
    from noetl_stream.dsl.compiler import Compiler


def check_graph(c: Compiler, playbook: Playbook, data: dict[str, Any]) -> None:
    """Warn about steps no arc can reach from ``start``. A step with neither ``tool`` nor ``next`` is
    a terminal step, which ends the branch that reaches it: one that nothing reaches is an error."""
    steps = {s.name: s for s in playbook.workflow}
    if "start" not in steps:
        return
    seen = {"start"}
    todo = ["start"]
    while todo:
        step = steps.get(todo.pop())
        if step is None or step.next is None:
            continue
        for arc in step.next.arcs:
            if arc.step not in seen:
                seen.add(arc.step)
                todo.append(arc.step)
    raw = data.get("workflow") or []
    for i, item in enumerate(raw):
        name = item.get("step") if isinstance(item, dict) else None
        if not isinstance(name, str) or name not in steps or name in seen:
            continue
        if "tool" not in item and "next" not in item:
            c.error(
                ("workflow", i),
                f"step '{name}': a step needs 'tool' or 'next' (or both); a step with neither ends the "
                f"branch that reaches it, and '{name}' is not reachable from 'start'",
                code="empty-step",
            )
        else:
            c.warn(
                ("workflow", i, "step"), f"step '{name}' is not reachable from 'start'", code="unreachable"
            )


def check_cycles(c: Compiler, playbook: Playbook, data: dict[str, Any]) -> None:
    """Warn about a cycle whose steps always route on to the next one: every success boundary takes an
    arc without a condition, and no admission rule can stop it, so it ends only when a step fails."""
    steps = {s.name: s for s in playbook.workflow}
    forced: dict[str, list[str]] = {}
    for s in playbook.workflow:
        if s.admit is not None or s.next is None or not s.next.arcs:
            continue
        arcs = s.next.arcs if s.next.mode == "inclusive" else s.next.arcs[:1]  # exclusive: the first wins
        forced[s.name] = [
            a.step for a in arcs if a.when in (None, True) and a.step in steps and steps[a.step].admit is None
        ]
    index = {
        name: i
        for i, item in enumerate(data.get("workflow") or [])
        if isinstance(item, dict) and isinstance(name := item.get("step"), str)
    }
    reported: set[frozenset[str]] = set()
    for u, v in sorted(back_edges(forced, forced)):  # each closes a cycle v -> ... -> u -> v
        cycle = walk(forced, v, u)
        if frozenset(cycle) in reported or u not in index:
            continue
        reported.add(frozenset(cycle))
        route = " -> ".join([*cycle, v])
        c.warn(
            ("workflow", index[u], "step"),
            f"steps {route} route to each other whenever they succeed (arcs without 'when', no admission "
            "rule): this cycle ends only when one of them fails; give one of its arcs a 'when' (or a step "
            "an admission rule), or bound the execution with executor.spec.deadline_s",
            code="endless-cycle",
        )


def check_cycle_entries(c: Compiler, playbook: Playbook, data: dict[str, Any]) -> None:
    """Warn about a cycle that tokens enter at more than one step when one of its steps is a join (it has
    arcs from more than one step): which arc closes the cycle follows the order the arcs are written, and
    with it whether the join waits for the step that closes it (its first run may start without it)."""
    steps = {s.name for s in playbook.workflow}
    if "start" not in steps:
        return
    arcs: dict[str, list[str]] = {
        s.name: list(dict.fromkeys(a.step for a in (s.next.arcs if s.next else ()) if a.step in steps))
        for s in playbook.workflow
    }
    index = {
        name: i
        for i, item in enumerate(data.get("workflow") or [])
        if isinstance(item, dict) and isinstance(name := item.get("step"), str)
    }
    incoming: dict[str, set[str]] = {}
    for source, targets in arcs.items():
        for t in targets:
            incoming.setdefault(t, set()).add(source)
    for cycle, entries in multi_entry_cycles(arcs, "start"):
        joins = [n for n in cycle if len(incoming.get(n, ())) > 1]
        if not joins or not all(n in index for n in entries):
            continue
        first = min(entries, key=index.__getitem__)
        ways = "; ".join(
            f"'{n}' from " + (", ".join(f"'{p}'" for p in sorted(ps)) if ps else "the start")
            for n, ps in sorted(entries.items(), key=lambda e: index[e[0]])
        )
        c.warn(
            ("workflow", index[first], "step"),
            f"steps {', '.join(cycle)} form a cycle that routes enter at more than one step ({ways}): which "
            f"of its arcs loops back, and so which steps {_joins(joins)} for on a first run, follows the "
            "order the arcs are written. Route every way into the cycle to one step",
            code="multi-entry-cycle",
        )


def check_numbers(c: Compiler, data: dict[str, Any]) -> None:
    """Refuse ``.inf`` and ``.nan``: every value travels as JSON (commands, events), where they have no
    form and would arrive as null (``timeout: .inf`` silently meant "no limit")."""
    refused = {d.path for d in c.diagnostics if d.severity == "error"}
    stack: list[tuple[Path, Any]] = [((), data)]
    while stack:
        path, node = stack.pop()
        if (
            isinstance(node, float)
            and not math.isfinite(node)
            and format_path(c.smap.authored(path)) not in refused
        ):
            c.error(
                path,
                f"{node!r} is not a JSON number: values travel as JSON, where it would become null; write "
                "a finite number (or leave the key out)",
                code="non-finite-number",
            )
        elif isinstance(node, dict):
            stack.extend(((*path, k), v) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend(((*path, i), v) for i, v in enumerate(node))


def _joins(names: list[str]) -> str:
    quoted = [f"'{n}'" for n in names]
    if len(quoted) == 1:
        return f"the join {quoted[0]} waits"
    return f"the joins {', '.join(quoted[:-1])} and {quoted[-1]} wait"


def check_names(c: Compiler, playbook: Playbook, data: dict[str, Any]) -> None:
    """Warn when a step is named like a workload key: the bare name would change meaning mid-run."""
    raw = data.get("workflow") or []
    for i, item in enumerate(raw):
        name = item.get("step") if isinstance(item, dict) else None
        if isinstance(name, str) and name in playbook.workload:
            c.warn(
                ("workflow", i, "step"),
                f"step '{name}' has the name of a workload key: a bare '{{{{ {name} }}}}' reads the "
                f"workload value until the step has run and its result after; rename one of them",
                code="shadowed-name",
            )


def _strings(node: Any, path: Path) -> Iterator[tuple[Path, str]]:
    if isinstance(node, str):
        if has_template(node):
            yield path, node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from _strings(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _strings(v, (*path, i))


def _template_position(c: Compiler, path: Path, template: str, lineno: int) -> tuple[int, int]:
    """Where line ``lineno`` of a template stands in the file.

    A block scalar (``|``, ``>``) starts on the line after its indicator; a quoted or plain scalar
    spanning lines is folded by YAML, so the template's line is looked up in the source text.
    """
    line, col = c.smap.value(path)
    src = c.smap.lines
    first = src[line - 1] if 0 < line <= len(src) else ""
    indicator = first[col - 1 : col]
    block = indicator in ("|", ">")
    if lineno <= 1 and not block:
        return line, col
    parts = template.splitlines()
    wanted = parts[lineno - 1].strip() if 0 < lineno <= len(parts) else ""
    start = line + 1 if block else line
    window = range(start, min(len(src), start + 2 * lineno + 2) + 1)
    if wanted:
        for n in window:
            found = src[n - 1].find(wanted)
            if found >= 0:
                return n, found + 1
        if indicator == ">":  # folded: the template line is several source lines joined
            for n in window:
                text = src[n - 1].strip()
                if text and text in wanted and n - start >= lineno - 1:
                    return n, len(src[n - 1]) - len(src[n - 1].lstrip()) + 1
    target = min(max(start + lineno - 1, 1), max(len(src), 1))
    text = src[target - 1] if 0 < target <= len(src) else ""
    return target, len(text) - len(text.lstrip()) + 1


def _who(path: Path, data: dict[str, Any]) -> str:
    if len(path) >= 2 and path[0] == "workflow":
        item = (data.get("workflow") or [])[path[1]] if isinstance(path[1], int) else None
        name = item.get("step") if isinstance(item, dict) else None
        who = f"step '{name}'"
        if len(path) >= 4 and path[2] == "tool":
            tool = item.get("tool") if isinstance(item, dict) else None
            label = _task_label(tool, path[3], str(name))
            if label:
                who += f" task '{label}'"
        return who
    if path and path[0] == "workbook":
        return f"workbook '{path[1]}'" if len(path) > 1 else "workbook"
    return str(path[0]) if path else "playbook"


def _step_name(path: Path, data: dict[str, Any]) -> str | None:
    if len(path) < 2 or path[0] != "workflow" or not isinstance(path[1], int):
        return None
    item = (data.get("workflow") or [])[path[1]]
    name = item.get("step") if isinstance(item, dict) else None
    return name if isinstance(name, str) else None


def _task_label(tool: Any, key: Any, step: str) -> str | None:
    if isinstance(tool, list) and isinstance(key, int) and key < len(tool):
        item = tool[key]
        if isinstance(item, dict):
            if "name" in item:
                return str(item["name"])
            if "kind" not in item and len(item) == 1:
                return str(next(iter(item)))
        return f"task_{key}"
    if isinstance(tool, dict):
        if "kind" in tool:
            return f"{step}_task"
        return str(key)
    return None


def _legacy_fix(c: Compiler, what: str) -> str:
    """How to get a legacy spelling translated, or (the extension is on) that this form is not."""
    if LEGACY in c.extensions:
        return (
            f" (the legacy translation rewrites only comparisons with it: == '{what}', != '{what}' "
            "or in [...])"
        )
    return f"{V.LEGACY_HINT}{V.LEGACY_HOW}"


_WHERE = {
    "outcome": "only task policy rules see the outcome",
    "_prev": "a pipeline local",
    "_task": "a pipeline local",
    "_attempt": "a pipeline local",
    "event": "only routing and admission see the boundary event",
    "keychain": "credentials reach only the worker that runs a step's tasks, never the controller",
    "iter": "a loop iteration exists only in the looped step's tasks; a loop's arcs see its loop.done",
}
_STATUSES = {
    "outcome": ("ok", "error"),  # 001 §11 ('success' is the legacy spelling: its own message)
    "event": ("success", "error", "skipped", "in_progress"),  # 001 §15.1
}
_STATUS_HINT = {
    ("event", "ok"): " ('ok' is outcome.status, a task's, which routing does not see)",
    ("event", "failed"): " (a failed step's boundary is step.failed, status 'error')",
    ("outcome", "failed"): " (a failed task's outcome.status is 'error')",
}
_UNAVAILABLE = {
    "an admission rule": frozenset({"outcome", "_prev", "_task", "_attempt", "keychain", "iter"}),
    "an arc": frozenset({"outcome", "_prev", "_task", "_attempt", "keychain", "iter"}),
    "a task": frozenset({"event"}),
    "a loop's items": frozenset({"event", "outcome", "_prev", "_task", "_attempt"}),
}


def _site(path: Path) -> str | None:
    """Which evaluation site (001 §4, 003 §4) a workflow template belongs to, for the scopes it lacks."""
    rel = path[2:] if len(path) > 2 and path[0] == "workflow" else ()
    if rel[:4] == ("spec", "policy", "admit", "rules"):
        return "an admission rule"
    if rel[:2] == ("next", "arcs"):
        return "an arc"
    if rel[:1] == ("tool",):
        return "a task"
    if rel[:1] == ("loop",):
        return "a loop's items"
    return None


def _boundaries(playbook: Playbook) -> dict[str, tuple[str, ...]]:
    """The names of the boundary events each step's arcs see (a step with a loop ends with loop.done)."""
    return {
        s.name: (LOOP_DONE, STEP_FAILED) if s.loop is not None else (STEP_DONE, STEP_FAILED)
        for s in playbook.workflow
    }


def _admitted_on(playbook: Playbook, bounds: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """The event names an admission rule of each step can see: the boundaries of the steps routing there
    (all of them for a step no arc leads to)."""
    seen: dict[str, set[str]] = {}
    for s in playbook.workflow:
        for arc in s.next.arcs if s.next is not None else ():
            seen.setdefault(arc.step, set()).update(bounds[s.name])
    order = (STEP_DONE, STEP_FAILED, LOOP_DONE)
    return {
        s.name: tuple(n for n in order if n in seen.get(s.name, BOUNDARY_EVENTS)) for s in playbook.workflow
    }


def _check_event_names(
    c: Compiler, path: Path, text: str, who: str, site: str, names: tuple[str, ...], looped: bool
) -> None:
    """An error for each comparison of event.name with a name it never has at this site."""
    tolerated = set(names) | ({STEP_DONE} if looped and site == "an arc" else set())  # see loop-boundary
    reported: set[str] = set()
    for op, literals in compared_literals(text, "event", "name"):
        candidates = [n for n in literals if n not in LEGACY_ALIASES]  # aliases have their own message
        if not candidates:
            continue
        hopeless = op in ("==", "!=") or not any(n in tolerated for n in literals)
        for name in candidates:
            if name in tolerated or name in reported or (name in BOUNDARY_EVENTS and not hopeless):
                continue
            reported.add(name)
            it = " or ".join(repr(n) for n in names)
            where = "this step's arcs" if site == "an arc" else "an admission rule of this step"
            if name == LOOP_DONE and site == "an arc":
                hint = " (loop.done ends a step with a loop; this one has none)"
            elif name != name.lower():
                hint = " (the CamelCase event names are 000's; v10 names are dotted and lower case)"
            else:
                hint = ""
            c.error(
                path,
                f"{who}: event.name is never {name!r} in {where}: it is {it}{hint}",
                code="unknown-event",
            )


def _in_task_policy(path: Path) -> bool:
    """Whether `path` is inside a task's ``spec.policy`` (a step's task, one of its pipeline's, or a
    workbook entry's), not merely under a key named ``policy``."""
    if path[:1] == ("workflow",) and path[2:3] == ("tool",):
        rest = path[3:]
        if rest[:1] and isinstance(rest[0], int):
            rest = rest[1:]
    elif path[:1] == ("workbook",):
        rest = path[2:]
        if rest[:1] == ("tool",):
            rest = rest[1:]
    else:
        return False
    return rest[:2] == ("spec", "policy")


def _task_has_inputs(item: Any, path: Path) -> bool:
    """The task at `path` (under a step's ``tool``) has ``input:`` or ``args:``, or its step has ``input:``."""
    if not isinstance(item, dict):
        return False
    if item.get("input") is not None:
        return True
    tool = item.get("tool")
    if isinstance(tool, list):
        tool = tool[path[3]] if len(path) > 3 and isinstance(path[3], int) and path[3] < len(tool) else None
    return isinstance(tool, dict) and (tool.get("input") is not None or tool.get("args") is not None)


def check_templates(c: Compiler, playbook: Playbook, data: dict[str, Any]) -> None:
    """Every template parses; names it reads exist in some scope (a warning if not)."""
    workload_keys = set(playbook.workload)
    step_names = {s.name for s in playbook.workflow}
    labels_by_index: dict[int, set[str]] = {}
    raw_steps = data.get("workflow") or []
    by_name = {s.name: s for s in playbook.workflow}
    for i, item in enumerate(raw_steps):
        name = item.get("step") if isinstance(item, dict) else None
        step = by_name.get(name) if isinstance(name, str) else None
        if step is not None:
            labels_by_index[i] = {t.name for t in step.tasks} | (
                {"input"} if step.input is not None else set()
            )
    looped = {
        i for i, item in enumerate(raw_steps) if isinstance(item, dict) and item.get("loop") is not None
    }
    bounds = _boundaries(playbook)
    admitted = _admitted_on(playbook, bounds)
    base = V.SCOPE_NAMES | V.JINJA_GLOBALS | workload_keys | step_names | set(playbook.workbook) | {"job"}
    ns = Namespace.of(playbook, data)
    iterators = frozenset(s.loop.iterator for s in playbook.workflow if s.loop is not None)
    roots: list[tuple[Path, Any]] = [
        (("workflow",), raw_steps),
        (("workbook",), data.get("workbook")),
        (("workload",), data.get("workload")),  # rendered once, at start (scope.render_workload)
    ]
    at_start = V.JINJA_GLOBALS | workload_keys | {"workload", "execution_id", "job"}
    reported: set[tuple[Path, str]] = set()  # a rewrite may copy a template (a looped step's moved arcs)
    for root, node in roots:
        for path, text in _strings(node, root):
            who = _who(path, data)
            problem = check_syntax(text)
            if problem is not None:
                authored = c.smap.authored(path)
                if (authored, problem.message) in reported:
                    continue
                reported.add((authored, problem.message))
                line, col = _template_position(c, path, text, problem.lineno)
                c.diagnostics.append(
                    Diagnostic(
                        "error",
                        f"{who}: template syntax error: {problem.message}",
                        c.smap.file,
                        line,
                        col,
                        format_path(authored),
                        "template-syntax",
                    )
                )
                continue
            known = at_start if root == ("workload",) else base
            compiled = True
            if root == ("workflow",) and isinstance(path[1], int):
                # A step that did not compile: its errors say more than name checks could, but the
                # legacy spellings below are reported with them (all at once, not after the fixes).
                compiled = path[1] in labels_by_index
                known = base | labels_by_index.get(path[1], set())
                if _in_task_policy(path):
                    known = known | {"output"}  # a task policy's: NoETL's envelope of the outcome
                if path[2:3] == ("tool",) and _task_has_inputs(raw_steps[path[1]], path):
                    known = known | {"input"}  # a task's fields read its own input: (args:) as input
                if path[2:4] == ("loop", "cursor"):
                    known = known | {V.FRAME_ROWS}  # a cursor loop's claim reads the rows one claim asks for
            elif _in_task_policy(path):
                known = known | {"output"}
            if success_to_ok(text) != text:
                c.error(
                    path,
                    f"{who}: outcome.status is 'ok' or 'error' (001 §11); 'success' is the legacy (002) "
                    f"spelling{_legacy_fix(c, 'ok')}",
                    code="legacy-status",
                )
            for subject, statuses in _STATUSES.items():
                for status in dict.fromkeys(status_literals(text, subject)):
                    if status not in statuses and not (subject == "outcome" and status == "success"):
                        c.error(
                            path,
                            f"{who}: {subject}.status is never {status!r}: it is "
                            f"{' or '.join(repr(v) for v in statuses)}{_STATUS_HINT.get((subject, status), '')}",
                            code="unknown-status",
                        )
            for alias in dict.fromkeys(alias_literals(text)):
                canonical = " or ".join(f"'{n}'" for n in LEGACY_ALIASES[alias])
                c.error(
                    path,
                    f"{who}: '{alias}' is a legacy event alias; use {canonical}{_legacy_fix(c, alias)}",
                    code="legacy-event",
                )
            if (
                root == ("workflow",)
                and path[2:4] == ("next", "arcs")
                and path[-1] == "when"
                and path[1] in looped
                and "step.done" in (literals := event_name_literals(text))
                and "loop.done" not in literals
            ):
                c.warn(
                    path,
                    f"{who}: a step with a loop ends with 'loop.done' (or 'step.failed'), never 'step.done': "
                    "this condition never matches it; test event.name == 'loop.done'",
                    code="loop-boundary",
                )
            if not compiled:
                continue
            names = undeclared_names(text)
            site = _site(path)
            owner = _step_name(path, data)
            if site in ("an arc", "an admission rule") and owner in bounds and "event" in names:
                _check_event_names(
                    c,
                    path,
                    text,
                    who,
                    site,
                    bounds[owner] if site == "an arc" else admitted[owner],
                    path[1] in looped,
                )
            if site is not None:
                for name in sorted((names & _UNAVAILABLE[site]) - workload_keys):
                    c.warn(
                        path,
                        f"{who}: {site} cannot read '{name}' ({_WHERE[name]}); it is undefined here",
                        code="out-of-scope",
                    )
            step = by_name.get(owner) if owner is not None else None
            if step is not None and step.loop is not None and site == "a task":
                its = frozenset({step.loop.iterator})
            else:
                its = iterators if root == ("workbook",) else frozenset()
            labels = labels_by_index.get(path[1], set()) if isinstance(path[1], int) else set()
            place = Place(site, its, frozenset(labels), owner)
            messages, covered = dialect_reads(names, attribute_reads(text), place, ns)
            for message in messages:
                c.warn(path, f"{who}: {message}", code="dialect")
            for name in sorted(names - known - covered):
                hint = V.suggest(name, known - V.JINJA_GLOBALS)
                if any(s.loop is not None and s.loop.iterator == name for s in playbook.workflow):
                    hint = f"; did you mean 'iter.{name}'?"
                if root == ("workload",):
                    hint += " (the workload renders at start: it reads workload keys, execution_id and job)"
                c.warn(
                    path,
                    f"{who}: template reads '{name}', which is not defined in any scope{hint}",
                    code="undefined-name",
                )
