"""``noetl-stream migrate``: rewrite a legacy playbook (000/004, 002 forms) in the canonical v10 form.

The legacy translation (``dsl/legacy``) gives canonical data and, for every node, the authored node
it came from. The output is built from the authored ruamel round-trip tree where it can: comments,
key order, quoting and flow style of what stays are kept; what the translation generated is written
in block style. The result must compile without extensions, else nothing is written.
"""

from __future__ import annotations

import io
from pathlib import Path as FilePath
from typing import Any

import msgspec
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from noetl_stream.dsl import compile_playbook, legacy
from noetl_stream.dsl.canonical import styled
from noetl_stream.dsl.diagnostics import Diagnostic, Path, PlaybookError
from noetl_stream.dsl.origins import Origins
from noetl_stream.dsl.source import load_yaml

_MISSING = object()


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
    diagnostics = legacy.translate(own, origins, smap)
    if any(d.severity == "error" for d in diagnostics):
        return Migration(None, tuple(diagnostics))
    if diagnostics:
        yaml = _yaml()
        authored = yaml.load(text)
        tree = _Rebuild(origins.resolve(own), origins.renamed(own), authored, data).node(own, ())
        out = io.StringIO()
        yaml.dump(tree, out)
        result = out.getvalue()
    else:
        result = text  # nothing legacy in it: the file as it is
    check = compile_playbook(result, file)
    if check.errors:
        if not diagnostics:  # the authored text itself is invalid: its own diagnostics say where
            return Migration(None, check.errors)
        problems = [
            Diagnostic(
                "error",
                f"the migrated playbook does not validate: {d.message} (line {d.line} of the output)",
                file,
                0,
                0,
                d.path,
                "migrate",
            )
            for d in check.errors
        ]
        return Migration(None, (*diagnostics, *problems))
    return Migration(result, tuple(diagnostics), changed=bool(diagnostics))


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
