"""Authoring sugar (003 §14): ``choose``, ``while`` and ``until`` inside a pipeline.

They compile, before validation, into canonical ``noop`` tasks whose policies ``jump``:

``- choose: [{when: C1, then: [...]}, ..., {else: [...]}]`` (optional ``name: L``)::

    L          noop   when C1 -> jump to the first task of branch 1, ..., else -> the else branch
    ...branch 1...    then  L_when0_end: jump L_end   (no branch falls into the next one)
    ...else branch...
    L_end      noop   the merge point

``- while: C`` with ``do: [...]``: ``L`` (when C continue, else jump ``L_end``), the body,
``L_repeat`` (jump ``L``), ``L_end``. ``- until: C`` with ``do: [...]``: ``L``, the body, ``L_until``
(when C continue, else jump ``L``): the body runs at least once.

Labels are stable: ``L`` is the block's ``name`` or ``<kind>_<index>`` (its index in the authored
list), generated labels derive from it, and unnamed tasks inside a block are ``<L>_..._task_<j>``
(unnamed tasks of the pipeline keep the ``task_<index>`` they would have had). ``noop`` passes
``_prev`` through, so the markers do not change what the next task sees.
"""

from __future__ import annotations

from typing import Any

from noetl_stream.dsl import vocabulary as V
from noetl_stream.dsl.diagnostics import Diagnostic, Path
from noetl_stream.dsl.origins import Origins
from noetl_stream.dsl.source import SourceMap
from noetl_stream.dsl.templates import has_template
from noetl_stream.errors import NoetlError

SUGAR = ("choose", "while", "until")
KEYS = {"choose": ("choose", "name"), "while": ("while", "do", "name"), "until": ("until", "do", "name")}


def is_sugar(item: Any) -> bool:
    return isinstance(item, dict) and "kind" not in item and any(k in item for k in SUGAR)


def has_sugar(data: Any) -> bool:
    workflow = data.get("workflow") if isinstance(data, dict) else None
    for step in workflow if isinstance(workflow, list) else []:
        tool = step.get("tool") if isinstance(step, dict) else None
        items = tool if isinstance(tool, list) else [tool]
        if any(is_sugar(x) for x in items):
            return True
    return False


class _SugarError(NoetlError):
    pass


class Sugar:
    def __init__(self, origins: Origins, smap: SourceMap) -> None:
        self.origins = origins
        self.smap = smap
        self.diagnostics: list[Diagnostic] = []

    def error(self, path: Path, message: str) -> _SugarError:
        self.diagnostics.append(self.smap.diagnostic(path, message, at_key=True, code="sugar"))
        return _SugarError(message)

    def step(self, step: dict[str, Any], path: Path) -> None:
        tool = step.get("tool")
        tpath: Path = (*path, "tool")
        if is_sugar(tool):
            tool = self.origins.mark([tool], tpath)
            single = True
        else:
            single = False
        if not isinstance(tool, list) or not any(is_sugar(x) for x in tool):
            return
        who = f"step '{step.get('step')}'"
        try:
            tasks = self.items(tool, tpath, who, "", top=True, single=single)
        except _SugarError:  # reported: keep the blocks from being reported again as tasks without a kind
            step["tool"] = [
                {"name": f"sugar_{i}", "kind": "noop"} if is_sugar(x) else x for i, x in enumerate(tool)
            ]
            return
        step["tool"] = self.origins.mark(tasks, tpath)

    def items(
        self, raw: list[Any], path: Path, who: str, prefix: str, *, top: bool = False, single: bool = False
    ) -> list[Any]:
        out: list[Any] = []
        for i, item in enumerate(raw):
            ipath: Path = path if single else (*path, i)
            if is_sugar(item):
                out.extend(self.block(item, ipath, who, prefix, i))
            elif (
                isinstance(item, dict)
                and "kind" not in item
                and len(item) == 1
                and isinstance(next(iter(item.values())), dict)
            ):
                out.append(item)  # label-as-key: labels.py normalizes it (and warns)
            elif isinstance(item, dict) and "name" not in item:
                name = f"task_{i}" if top else f"{prefix}task_{i}"
                new = self.origins.mark({"name": name, **item}, ipath)
                out.append(new)
            else:
                out.append(item)
        return out

    def block(self, item: dict[str, Any], path: Path, who: str, prefix: str, index: int) -> list[Any]:
        kinds = [k for k in SUGAR if k in item]
        if len(kinds) > 1:
            raise self.error(
                path, f"{who}: one block is either choose, while or until, not {' and '.join(kinds)}"
            )
        kind = kinds[0]
        for k in item:
            if k not in KEYS[kind]:
                raise self.error(
                    (*path, k),
                    f"{who}: unknown key '{k}' in a '{kind}' block (allowed: {', '.join(KEYS[kind])})",
                )
        label = item.get("name", f"{prefix}{kind}_{index}")
        if not V.is_identifier(label) or label in V.RESERVED_NAMES:
            raise self.error((*path, "name"), f"{who}: '{kind}' block name {label!r} must be an identifier")
        if kind == "choose":
            return self._choose(item["choose"], (*path, "choose"), who, str(label))
        return self._loop(kind, item, path, who, str(label))

    def _body(self, raw: Any, path: Path, who: str, prefix: str, what: str) -> list[Any]:
        if isinstance(raw, dict):
            return self.items([raw], path, who, prefix, single=True)
        if not isinstance(raw, list):
            raise self.error(path, f"{who}: {what} must be a list of tasks")
        return self.items(raw, path, who, prefix)

    def _cond(self, raw: Any, path: Path, who: str, what: str) -> Any:
        if isinstance(raw, bool) or (isinstance(raw, str) and has_template(raw)):
            return raw
        raise self.error(
            path, f'{who}: {what} must be a template like "{{{{ iter.has_more }}}}" or a boolean'
        )

    def _noop(self, name: str, path: Path, rules: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        task: dict[str, Any] = {"name": name, "kind": "noop"}
        if rules:
            task["spec"] = {"policy": {"rules": rules}}
        return self.origins.mark(task, path)

    def _choose(self, raw: Any, path: Path, who: str, label: str) -> list[Any]:
        if not isinstance(raw, list) or not raw:
            raise self.error(
                path, f"{who}: 'choose' is a list of {{when, then}} branches (and an optional else)"
            )
        end = f"{label}_end"
        branches: list[tuple[Path, Any, list[Any], str]] = []
        for k, br in enumerate(raw):
            bp: Path = (*path, k)
            if not isinstance(br, dict):
                raise self.error(
                    bp, f"{who}: a choose branch is {{when: ..., then: [tasks]}} or {{else: [tasks]}}"
                )
            if "else" in br:
                if set(br) != {"else"}:
                    raise self.error(bp, f"{who}: an 'else' branch has only 'else: [tasks]'")
                if k != len(raw) - 1:
                    raise self.error(bp, f"{who}: the 'else' branch of choose must come last")
                tasks = self._body(br["else"], (*bp, "else"), who, f"{label}_else_", "'else'")
                branches.append((bp, None, tasks, f"{label}_else"))
                continue
            extra = [x for x in br if x not in ("when", "then")]
            if extra or "when" not in br or "then" not in br:
                raise self.error(bp, f"{who}: a choose branch is {{when: ..., then: [tasks]}}")
            cond = self._cond(br["when"], (*bp, "when"), who, "a choose 'when'")
            tasks = self._body(br["then"], (*bp, "then"), who, f"{label}_when{k}_", "'then'")
            branches.append((bp, cond, tasks, f"{label}_when{k}"))
        rules: list[dict[str, Any]] = []
        out: list[Any] = []
        for n, (bp, cond, tasks, tag) in enumerate(branches):
            target = _first(tasks) or end
            then = {"do": "jump", "to": target}
            rules.append({"when": cond, "then": then} if cond is not None else {"else": {"then": then}})
            out.extend(tasks)
            if tasks and n != len(branches) - 1:
                out.append(self._noop(f"{tag}_end", bp, [{"else": {"then": {"do": "jump", "to": end}}}]))
        if branches[-1][1] is not None:
            rules.append({"else": {"then": {"do": "jump", "to": end}}})
        return [self._noop(label, path, rules), *out, self._noop(end, path)]

    def _loop(self, kind: str, item: dict[str, Any], path: Path, who: str, label: str) -> list[Any]:
        cond = self._cond(item[kind], (*path, kind), who, f"'{kind}'")
        if "do" not in item:
            raise self.error(path, f"{who}: '{kind}' needs 'do: [tasks]' (the body)")
        body = self._body(item["do"], (*path, "do"), who, f"{label}_", "'do'")
        if not body:
            raise self.error((*path, "do"), f"{who}: '{kind}' has an empty body")
        if kind == "while":
            end = f"{label}_end"
            head = self._noop(
                label,
                path,
                [{"when": cond, "then": {"do": "continue"}}, {"else": {"then": {"do": "jump", "to": end}}}],
            )
            repeat = self._noop(f"{label}_repeat", path, [{"else": {"then": {"do": "jump", "to": label}}}])
            return [head, *body, repeat, self._noop(end, path)]
        check = self._noop(
            f"{label}_until",
            (*path, kind),
            [{"when": cond, "then": {"do": "continue"}}, {"else": {"then": {"do": "jump", "to": label}}}],
        )
        return [self._noop(label, path), *body, check]


def _first(tasks: list[Any]) -> str | None:
    for task in tasks:
        if isinstance(task, dict):
            name = task.get("name")
            if isinstance(name, str):
                return name
            if "kind" not in task and len(task) == 1:
                return str(next(iter(task)))
    return None


def expand(data: Any, origins: Origins, smap: SourceMap) -> list[Diagnostic]:
    """Expand every sugar block of the workflow in place; errors for malformed blocks."""
    sugar = Sugar(origins, smap)
    workflow = data.get("workflow") if isinstance(data, dict) else None
    for i, step in enumerate(workflow if isinstance(workflow, list) else []):
        if isinstance(step, dict):
            sugar.step(step, ("workflow", i))
    return sugar.diagnostics
