"""Parsing of a step's pipeline: the task shapes of 003 §7 normalized to named ``Task``s."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from noetl_stream.dsl import vocabulary as V
from noetl_stream.dsl.diagnostics import Path
from noetl_stream.dsl.kinds import COMMON_TASK_KEYS, kind_info, known_kinds
from noetl_stream.dsl.labels import is_label_as_key, label_as_key_warning
from noetl_stream.dsl.model import Task
from noetl_stream.dsl.pylibs import check_libs
from noetl_stream.dsl.rules import parse_task_policy
from noetl_stream.dsl.speckeys import check_task_spec
from noetl_stream.dsl.toolforms import nested_spec_keys, task_forms

if TYPE_CHECKING:
    from noetl_stream.dsl.compiler import Compiler


class _Item:
    """One authored task before parsing: where it is, its body, its label and where the label stands."""

    __slots__ = ("body", "label", "label_at_key", "label_path", "path")

    def __init__(self, path: Path, body: Any, label: Any, label_path: Path, label_at_key: bool) -> None:
        self.path = path
        self.body = body
        self.label = label
        self.label_path = label_path
        self.label_at_key = label_at_key

    @property
    def synthetic(self) -> bool:
        """The label was made up (``task_<i>``, ``<step>_task``): the author wrote no name."""
        return self.label_path == self.path and not self.label_at_key and self.body is not None


def _label_as_key(c: Compiler, path: Path, raw: dict[str, Any], who: str) -> _Item:
    """A label-as-key task the canonical rewrite (``labels.py``) left: in a bare list of steps, or one
    whose body names it again."""
    label = next(iter(raw))
    c.warn((*path, label), label_as_key_warning(who, label), at_key=True, code="label-as-key")
    body = raw[label]
    if "name" in body:
        c.error(
            (*path, label, "name"),
            f"{who}: task '{label}' has a 'name' inside its label-as-key body; the label is the task's "
            f"name: remove 'name: {body['name']}' (or write the task as '- name: ...' with 'kind: ...')",
            at_key=True,
            code="conflict",
        )
        return _Item((*path, label), None, str(label), (*path, label), True)
    return _Item((*path, label), body, str(label), (*path, label), True)


def _labels(item: dict[str, Any]) -> list[str]:
    """The labels of label-as-key tasks in a list item that is not one such task: keys holding a task
    body (``- fetch: {kind: ...}`` with ``spec:`` beside the label instead of under it, or two tasks)."""
    if "kind" in item or "name" in item or len(item) < 2:
        return []
    keys = _task_keys()
    return [k for k, v in item.items() if isinstance(v, dict) and "kind" in v and k not in keys]


def _task_keys() -> set[str]:
    """Keys some task kind has (a mapping under one of them is a value, not a task)."""
    keys = set(COMMON_TASK_KEYS)
    for kind in known_kinds():
        info = kind_info(kind)
        keys |= (info.keys or set()) if info is not None else set()
    return keys


def _misplaced(c: Compiler, path: Path, item: dict[str, Any], labels: list[str], who: str) -> _Item:
    label = labels[0]
    if len(labels) > 1:
        c.error(
            (*path, labels[1]),
            f"{who}: one list item holds the label-as-key tasks {', '.join(repr(x) for x in labels)}; "
            f"each task is a list item of its own: '- {labels[1]}: ...'",
            at_key=True,
            code="label-as-key",
        )
    else:
        for k in item:
            if k != label:
                c.error(
                    (*path, k),
                    f"{who}: '{k}' stands beside the label of task '{label}'; the keys of a label-as-key "
                    f"task belong inside it: indent '{k}' under '{label}:' (or write '- name: {label}' "
                    "with 'kind: ...' and its keys)",
                    at_key=True,
                    code="label-as-key",
                )
    return _Item((*path, label), None, label, (*path, label), True)


def _named(c: Compiler, path: Path, raw: dict[str, Any], synthetic: str) -> _Item:
    if "name" in raw:
        body = {k: v for k, v in raw.items() if k != "name"}
        lpath: Path = (*path, "name")
        written = c.smap.authored(lpath)
        label_at_key = written != lpath and written[-1:] != ("name",)  # a label-as-key task, rewritten
        return _Item(path, body, raw["name"], lpath, label_at_key)
    return _Item(path, raw, synthetic, path, False)


def _items(c: Compiler, raw: Any, path: Path, who: str, step_name: str) -> list[_Item] | None:
    """The authored shapes of 003 §7 (and 001's label-as-key) as a flat list of items."""
    shape_error = f"{who}: 'tool' must be a task (a mapping with 'kind') or a list of tasks"
    if isinstance(raw, dict):
        if "kind" in raw:
            return [_named(c, path, raw, f"{step_name}_task")]
        if is_label_as_key(raw):
            return [_label_as_key(c, path, raw, who)]
        labels = _labels(raw)
        if labels:
            _misplaced(c, path, raw, labels, who)
            return None
        c.error(path, f"{shape_error}; this mapping has no 'kind'", at_key=True)
        return None
    if isinstance(raw, list):
        if not raw:
            c.error(path, f"{who}: 'tool' is an empty list; give at least one task or remove 'tool'")
            return None
        items: list[_Item] = []
        for i, item in enumerate(raw):
            ipath = (*path, i)
            if is_label_as_key(item):
                items.append(_label_as_key(c, ipath, item, who))
            elif isinstance(item, dict) and (labels := _labels(item)):
                items.append(_misplaced(c, ipath, item, labels, who))
            elif isinstance(item, dict):
                items.append(_named(c, ipath, item, f"task_{i}"))
            else:
                c.error(ipath, f"{who}: task {i} must be a mapping with 'kind', got {item!r}")
                items.append(_Item(ipath, None, None, ipath, False))
        return items
    if isinstance(raw, str) and raw in known_kinds():
        c.error(path, f"{shape_error}; did you mean 'tool: {{kind: {raw}}}'?")
    else:
        c.error(path, shape_error, at_key=raw is None)
    return None


def parse_pipeline(
    c: Compiler, raw: Any, path: Path, who: str, step_name: str, keychain: set[str]
) -> list[Task] | None:
    items = _items(c, raw, path, who, step_name)
    if items is None:
        return None
    labels: dict[str, _Item] = {}
    for item in items:
        if isinstance(item.label, str):
            first = labels.get(item.label)
            if first is not None:
                line = (c.smap.key if first.label_at_key else c.smap.value)(first.label_path)[0]
                if item.synthetic:
                    message = (
                        f"{who}: this unnamed task gets the label '{item.label}', which the task at line "
                        f"{line} already has; give it a 'name'"
                    )
                elif first.synthetic:
                    message = (
                        f"{who}: task label '{item.label}' is already the label of the unnamed task at line "
                        f"{line}; choose another name"
                    )
                else:
                    message = f"{who}: task label '{item.label}' is used twice in this pipeline (first at line {line})"
                c.error(item.label_path, message, at_key=item.label_at_key, code="duplicate")
            else:
                labels[item.label] = item
    tasks: list[Task] = []
    ok = True
    for item in items:
        if item.body is None:
            ok = False
            continue
        task = parse_task(
            c,
            item.body,
            item.path,
            who,
            item.label,
            set(labels),
            keychain_names=keychain,
            label_path=item.label_path,
            label_at_key=item.label_at_key,
        )
        if task is None:
            ok = False
        else:
            tasks.append(task)
    return tasks if ok else None


def parse_task(
    c: Compiler,
    raw: Any,
    path: Path,
    who: str,
    label: Any,
    labels: set[str],
    *,
    keychain_names: set[str] | None,
    label_path: Path | None = None,
    label_at_key: bool = False,
) -> Task | None:
    if not isinstance(raw, dict):
        c.error(path, f"{who}: a task must be a mapping with 'kind'", at_key=True)
        return None
    lpath = label_path or path
    if not isinstance(label, str) or not V.is_identifier(label):
        c.error(
            lpath,
            f"{who}: task name {label!r} must be an identifier (letters, digits, '_', not starting "
            "with a digit)",
            at_key=label_at_key,
        )
        return None
    twho = f"{who} task '{label}'"
    if label in V.RESERVED_NAMES:
        c.error(lpath, f"{twho}: the name '{label}' is reserved for a template scope", at_key=label_at_key)
        return None
    kind = raw.get("kind")
    if kind is None:
        c.error(
            path, f"{twho}: missing 'kind' (one of {', '.join(known_kinds())})", at_key=True, code="missing"
        )
        return None
    if not isinstance(kind, str):
        c.error((*path, "kind"), f"{twho}: 'kind' must be a string")
        return None
    info = kind_info(kind)
    ok = True
    if info is None and "custom_kinds" not in c.extensions:
        c.error(
            (*path, "kind"),
            f"{twho}: unknown tool kind '{kind}'{V.suggest(kind, known_kinds())} (known: "
            f"{', '.join(known_kinds())}; enable the 'custom_kinds' extension for others)",
            code="unknown-kind",
        )
        return None
    auth_key = "auth"
    if "credential" in raw and info is not None and info.keys is not None and "auth" in info.keys:
        raw, ok = _credential_as_auth(c, raw, path, twho)
        auth_key = "credential" if ok else auth_key
    raw, good = task_forms(c, raw, path, twho, kind, info)
    ok = ok and good
    allowed = None if info is None or info.keys is None else COMMON_TASK_KEYS | info.keys
    for k in raw:
        if k in V.DEPRECATED_TASK:
            hint = c.legacy_hint(k in V.LEGACY_TASK and c.in_workflow(path))
            c.error(
                (*path, k),
                f"{twho}: '{k}' {V.NOT_V10}; {V.DEPRECATED_TASK[k]}{hint}",
                at_key=True,
                code="deprecated",
            )
            ok = False
        elif allowed is not None and k not in allowed:
            hint = V.key_hint(str(k), allowed, V.DEPRECATED_TASK)
            c.error(
                (*path, k),
                f"{twho}: unknown key '{k}' for kind '{kind}'{hint}",
                at_key=True,
                code="unknown-key",
            )
            ok = False
    if info is not None:
        for group in info.required_any:
            if not any(g in raw for g in group):
                need = " or ".join(f"'{g}'" for g in group)
                c.error(path, f"{twho}: kind '{kind}' needs {need}", at_key=True, code="missing")
                ok = False
        for group in info.exclusive:
            given = [g for g in group if g in raw]
            if len(given) > 1:
                which = " or ".join(f"'{g}'" for g in given)
                c.error(
                    (*path, given[1]),
                    f"{twho}: kind '{kind}' takes {which}, not both",
                    at_key=True,
                    code="conflict",
                )
                ok = False
        for group in info.first_wins:
            given = [g for g in group if g in raw]
            if kind == "http" and str(raw.get("method") or "GET").upper() == "GET":
                given = [g for g in given if g != "data"]  # a GET's `data` is its query
            for extra in given[1:]:
                c.warn(
                    (*path, extra),
                    f"{twho}: '{extra}' is ignored: kind '{kind}' uses the first of "
                    f"{', '.join(group)} that is given, here '{given[0]}'",
                    at_key=True,
                    code="ignored-key",
                )
        for key in sorted(info.ignored & raw.keys()):
            c.warn(
                (*path, key),
                f"{twho}: '{key}' is accepted for NoETL's playbooks and ignored by kind '{kind}'",
                at_key=True,
                code="ignored-key",
            )
    spec = {} if raw.get("spec") is None else raw["spec"]
    policy = None
    if not isinstance(spec, dict):
        c.error((*path, "spec"), f"{twho}: 'spec' must be a mapping")
        return None
    check_task_spec(c, spec, (*path, "spec"), twho, kind, skip=nested_spec_keys(spec, info, kind))
    if "policy" in spec:
        policy = parse_task_policy(c, spec["policy"], (*path, "spec", "policy"), twho, labels)
        ok = ok and policy is not None
    if kind == "workbook" and keychain_names is not None:
        ok = _workbook_ref(c, raw, path, twho, label) and ok
    if kind == "python":
        ok = check_libs(c, raw, path, twho) and ok
    auth = raw.get("auth")
    if (
        keychain_names is not None
        and isinstance(auth, str)
        and not c.is_template(auth)
        and auth not in keychain_names
    ):
        c.warn((*path, auth_key), f"{twho}: credential '{auth}' is not declared in the root keychain")
    if "args" in raw and not isinstance(raw["args"], (dict, str)):
        c.error((*path, "args"), f"{twho}: 'args' must be a mapping (or a template)")
        ok = False
    if not ok:
        return None
    line, col = c.smap.key(path) if label_at_key else c.smap.value(path)
    config = {k: v for k, v in raw.items() if k not in ("name", "kind", "spec")}
    return Task(name=label, kind=kind, config=config, spec=spec, policy=policy, line=line, col=col)


def _credential_as_auth(
    c: Compiler, raw: dict[str, Any], path: Path, who: str
) -> tuple[dict[str, Any], bool]:
    """``credential:`` (NoETL's spelling) is the task's ``auth:``, which is all the tools see; false when
    both are given (an error)."""
    if "auth" in raw:
        message = f"{who}: 'credential' is another spelling of 'auth': give one of them"
        c.error((*path, "credential"), message, at_key=True, code="conflict")
        return {k: v for k, v in raw.items() if k != "credential"}, False
    c.warn(
        (*path, "credential"),
        f"{who}: 'credential:' is NoETL's spelling of 'auth:'",
        at_key=True,
        code="dialect",
    )
    return {("auth" if k == "credential" else k): v for k, v in raw.items()}, True


def _workbook_ref(c: Compiler, raw: dict[str, Any], path: Path, who: str, label: str) -> bool:
    """A ``kind: workbook`` task names a root workbook template (its ``task``, else its own label)."""
    ref = raw.get("task", label)
    if not isinstance(ref, str) or c.is_template(ref):
        c.error((*path, "task"), f"{who}: 'task' must be the name of a root workbook template, got {ref!r}")
        return False
    if ref not in c.workbook_names:
        where = (*path, "task") if "task" in raw else path
        c.error(
            where,
            f"{who}: workbook template '{ref}' is not defined in the root workbook"
            f"{V.suggest(ref, c.workbook_names)}",
            at_key="task" not in raw,
            code="unknown-target",
        )
        return False
    return True
