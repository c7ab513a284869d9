"""``noetl-stream migrate``: rewrite a playbook in the canonical v10 form: the legacy drafts' forms
(000/004, 002) and those of NoETL's deployed dialect (noetl.io/v2 as NoETL's users write it).

The legacy translation (``dsl/legacy``), then the dialect's (``dsl/dialect``: ``set:``, the policy
shorthands, ``call.done``; ``dsl/arcsets``: an arc's ``set:``; ``dsl/respell``: ``output`` in
policies, the names templates read, NoETL's task keys) give canonical data and, for every node, the
authored node it came from. The output is built from the authored ruamel round-trip tree where it can:
comments, key order, quoting and flow or block style of what stays are kept (a rewritten template
keeps its quoting); what a translation generated is written in block style. The result must compile without extensions and without a
``dialect`` warning, else nothing is written: a form with no canonical spelling is an error that says
so (an arc's ``set:``, which v10 has no form of, where ``dsl/arcsets`` cannot write it the same as
``set_ctx`` in its step's task policy).
"""

from __future__ import annotations

import copy
import io
from pathlib import Path as FilePath
from typing import Any

import msgspec
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.scalarstring import (
    DoubleQuotedScalarString,
    FoldedScalarString,
    LiteralScalarString,
    SingleQuotedScalarString,
)

from noetl_stream.dsl import arcsets, compile_playbook, dialect, legacy, respell
from noetl_stream.dsl.canonical import styled
from noetl_stream.dsl.compiler import compile_data
from noetl_stream.dsl.diagnostics import Diagnostic, Path, PlaybookError
from noetl_stream.dsl.origins import Origins
from noetl_stream.dsl.source import SourceMap, load_yaml

_MISSING = object()
_STYLES = (LiteralScalarString, FoldedScalarString, SingleQuotedScalarString, DoubleQuotedScalarString)


class Migration(msgspec.Struct, frozen=True):
    text: str | None
    """The canonical playbook, or None when it could not be migrated (see ``diagnostics``)."""
    diagnostics: tuple[Diagnostic, ...]
    """The translation's warnings (one per translated construct) and errors."""
    changed: bool = False

    @property
    def errors(self) -> tuple[Diagnostic, ...]:
        return tuple(d for d in self.diagnostics if d.severity == "error")


def migrate_text(text: str, file: str = "<playbook>") -> Migration:
    """The canonical form of ``text``; validated without extensions before it is returned."""
    try:
        data, smap = load_yaml(text, file)
    except PlaybookError as exc:
        return Migration(None, exc.diagnostics)
    own, origins = Origins.of(data)
    diagnostics = dialect.call_names(own, origins, smap)
    diagnostics += legacy.translate(own, origins, smap)
    if any(d.severity == "error" for d in diagnostics):
        return Migration(None, tuple(diagnostics))
    refused = _dialect(own, origins, smap, diagnostics)
    if refused is not None:
        return refused
    changed = not _same(own, data)
    if changed:
        diagnostics += _unreported(text, file, diagnostics)
        yaml = _yaml()
        authored = yaml.load(text)
        tree = _Rebuild(origins.resolve(own), origins.renamed(own), authored, data).node(own, ())
        out = io.StringIO()
        yaml.dump(tree, out)
        result = out.getvalue()
    else:
        result = text  # nothing legacy or NoETL's in it: the file as it is
    check = compile_playbook(result, file)
    if check.errors and not changed:  # the authored text itself is invalid: its own diagnostics say where
        return Migration(None, check.errors)
    left = [d for d in check.diagnostics if d.code == respell.CODE]
    if check.errors or left:
        problems = [
            Diagnostic(
                "error",
                f"the migrated playbook {what}: {d.message} (line {d.line} of the output)",
                file,
                0,
                0,
                d.path,
                "migrate",
            )
            for what, found in (
                ("does not validate", check.errors),
                ("keeps a NoETL form migrate cannot rewrite", left),
            )
            for d in found
        ]
        return Migration(None, (*diagnostics, *problems))
    return Migration(result, tuple(diagnostics), changed=changed)


def _unreported(text: str, file: str, reported: list[Diagnostic]) -> list[Diagnostic]:
    """The ``dialect`` warnings of ``text`` at a place no rewrite reported (a form the legacy
    translation rewrote without a word, such as the loop's item read bare)."""
    seen = {(d.line, d.col) for d in reported}
    return [
        d
        for d in compile_playbook(text, file).diagnostics
        if d.code == respell.CODE and d.severity == "warning" and (d.line, d.col) not in seen
    ]


def _dialect(own: Any, origins: Origins, smap: SourceMap, diagnostics: list[Diagnostic]) -> Migration | None:
    """NoETL's dialect in ``own`` (after the legacy translation) rewritten in place in the canonical
    form, a warning in `diagnostics` for each form; a Migration that writes nothing when a form has no
    canonical spelling (or the playbook is invalid)."""
    kept = _task_inputs(own)
    workflow = own.get("workflow") if isinstance(own, dict) else None
    steps = [s for s in workflow if isinstance(s, dict)] if isinstance(workflow, list) else []
    toolless = {id(s) for s in steps if "tool" not in s}
    diagnostics += dialect.normalize(own, origins, smap)
    for body in _bodies(own):
        if id(body) in kept and "args" in body and "input" not in body:
            _rename(body, "args", "input")  # a task's input: is canonical as it stands
    for step in steps:
        if id(step) in toolless and "tool" in step and "next" in step:
            _before(step, "tool", "next")  # (a step set: on a step without tasks gave it one)
    if any(d.severity == "error" for d in diagnostics):
        return Migration(None, tuple(diagnostics))
    fix = respell.Respell(own, origins, smap)
    fix.task_keys()
    blocked: dict[int, str] = {}
    for i, step in enumerate(workflow if isinstance(workflow, list) else []):
        why = arcsets.move(step, origins) if isinstance(step, dict) else None
        if why is not None:
            blocked[i] = why
    fix.policies()
    compiled = compile_data(copy.deepcopy(own), origins.source_map(own, smap))
    if compiled.playbook is None:
        if not diagnostics and not fix.diagnostics:
            return None  # nothing to rewrite: migrate_text reports the playbook's own errors
        return Migration(None, (*diagnostics, *fix.diagnostics, *compiled.errors))
    fix.names(compiled.playbook)
    now = origins.source_map(own, smap)
    for path, who in respell.arc_sets(own):
        why = blocked.get(int(path[1]), "")
        fix.refuse(
            now,
            path,
            f"{who}: 'set:' on an arc has no canonical v10 form (the controller writes its keys to ctx when "
            "the arc is taken; nothing in v10 does), and migrate writes it as set_ctx in the step's task "
            f"policy only where that is the same, not here: {why}",
            at_key=True,
        )
    diagnostics += fix.diagnostics
    if any(d.severity == "error" for d in diagnostics):
        return Migration(None, tuple(diagnostics))
    return None


def _bodies(data: Any) -> list[dict[str, Any]]:
    return [body for _, _, body in respell.tasks(data)]


def _task_inputs(data: Any) -> set[int]:
    """The workflow tasks that give ``input:`` without ``args:`` (by identity)."""
    return {id(body) for body in _bodies(data) if "input" in body and "args" not in body}


def _before(node: dict[str, Any], key: str, anchor: str) -> None:
    """Move ``node[key]`` just before ``node[anchor]``."""
    value = node.pop(key)
    items = list(node.items())
    node.clear()
    for k, v in items:
        if k == anchor:
            node[key] = value
        node[k] = v


def _rename(node: dict[str, Any], old: str, new: str) -> None:
    items = list(node.items())
    node.clear()
    for k, v in items:
        node[new if k == old else k] = v


def migrate_file(path: FilePath, out: FilePath | None = None, *, in_place: bool = False) -> Migration:
    """Migrate ``path``; write to ``out`` (or over ``path`` with ``in_place``) when it succeeds."""
    text = path.read_text(encoding="utf-8")
    migration = migrate_text(text, str(path))
    target = path if in_place else out
    if migration.text is not None and target is not None:
        target.write_text(migration.text, encoding="utf-8")
    return migration


def _yaml() -> YAML:
    yaml = YAML(typ="rt", pure=True)
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.width = 4096
    yaml.preserve_quotes = True
    return yaml


def _same(a: Any, b: Any) -> bool:
    """Equal values of the same types (``True`` is not ``1``, a ruamel string is a ``str``)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    for kind in (str, int, float):
        if isinstance(b, kind):
            return isinstance(a, kind) and not isinstance(a, bool) and a == b
    return a is None and b is None


def _lookup(root: Any, path: Path | None) -> Any:
    if path is None:
        return _MISSING
    node = root
    for key in path:
        found = (isinstance(node, dict) and key in node) or (
            isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node)
        )
        if not found:
            return _MISSING
        node = node[key]
    return node


class _Rebuild:
    """Canonical data as ruamel nodes, reusing the authored node (comments, style) each came from."""

    def __init__(self, table: dict[Path, Path], renamed: set[Path], authored: Any, plain: Any) -> None:
        self.table = table
        self.renamed = renamed
        self.authored = authored
        self.plain = plain
        self.used: set[tuple[int, Any]] = set()

    def node(self, new: Any, path: Path) -> Any:
        origin = self.table.get(path)
        old = _lookup(self.authored, origin)
        if (
            isinstance(old, (CommentedMap, CommentedSeq))
            and _same(_lookup(self.plain, origin), new)
            and self._claim(old, "<node>")
        ):
            return old  # unchanged: the authored node as it is
        if isinstance(new, dict):
            cm = CommentedMap()
            for k, v in new.items():
                cm[k] = self.node(v, (*path, k))
                self._key_comment(cm, k, (*path, k))
            if isinstance(old, CommentedMap):
                if old.ca.comment and self._claim(old, None):
                    cm.ca.comment = old.ca.comment
                if old.fa.flow_style() and all(not isinstance(v, (dict, list)) for v in new.values()):
                    cm.fa.set_flow_style()
            return cm
        if isinstance(new, list):
            seq = CommentedSeq(self.node(v, (*path, i)) for i, v in enumerate(new))
            if isinstance(old, CommentedSeq) and origin is not None:
                if old.ca.comment and self._claim(old, None):
                    seq.ca.comment = old.ca.comment
                for i in range(len(new)):
                    src = self.table.get((*path, i))
                    if (
                        src is not None
                        and src[:-1] == origin
                        and src[-1] in old.ca.items
                        and self._claim(old, src[-1])
                    ):
                        seq.ca.items[i] = old.ca.items[src[-1]]
                if old.fa.flow_style() and all(not isinstance(v, (dict, list)) for v in new):
                    seq.fa.set_flow_style()
            return seq
        if old is not _MISSING and not isinstance(old, (dict, list)) and _same(old, new):
            return old  # keeps the authored scalar's quoting and format
        if isinstance(new, str) and isinstance(old, _STYLES):
            return type(old)(new)  # a rewritten template keeps its quoting or block style
        return styled(new) if isinstance(new, str) else new

    def _key_comment(self, cm: CommentedMap, key: Any, path: Path) -> None:
        """The comment of the authored key this key stands for: the same key, or one it replaces."""
        src = self.table.get(path)
        if not src or (src[-1] != key and path not in self.renamed):
            return
        parent = _lookup(self.authored, src[:-1])
        if isinstance(parent, CommentedMap) and src[-1] in parent.ca.items and self._claim(parent, src[-1]):
            cm.ca.items[key] = parent.ca.items[src[-1]]

    def _claim(self, node: Any, key: Any) -> bool:
        """Each authored comment is written once."""
        mark = (id(node), key)
        if mark in self.used:
            return False
        self.used.add(mark)
        return True
