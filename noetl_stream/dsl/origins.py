"""Where the nodes of a rewritten playbook came from in the authored one.

Legacy translation, authoring sugar and the dialect normalization rewrite the plain data of a
playbook before it is validated. Diagnostics must still point at what the author wrote, and
``migrate`` must find the authored node (with its comments and quoting) behind each rewritten one.

``Origins`` records the authored path of every container of the data when it is created, by
identity; rewrites move containers around (identity is kept) or create new ones and say where
they come from (``mark``). ``resolve`` then walks the rewritten tree and gives every node's
authored path; ``source_map`` turns that into a ``SourceMap`` for the rewritten tree.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any, TypeVar

from noetl_stream.dsl.diagnostics import Path
from noetl_stream.dsl.source import SourceMap

T = TypeVar("T")


class Origins:
    """Authored paths of containers, by identity. Holds every registered container alive, so that an
    id is never reused by a new container while the rewrite runs."""

    def __init__(self) -> None:
        self._by_id: dict[int, Path] = {}
        self._keys: dict[tuple[int, Any], Path] = {}
        self._alive: list[Any] = []

    @classmethod
    def of(cls, data: Any) -> tuple[Any, Origins]:
        """A private deep copy of ``data`` (safe to rewrite in place) and the origins of its nodes."""
        own = copy.deepcopy(data)
        origins = cls()
        for path, node in _containers(own, ()):
            origins.mark(node, path)
        return own, origins

    def mark(self, node: T, path: Path) -> T:
        """``node`` (a new dict or list) stands for what the author wrote at ``path``."""
        if isinstance(node, (dict, list)):
            self._by_id.setdefault(id(node), path)
            self._alive.append(node)
        return node

    def mark_tree(self, node: T, path: Path) -> T:
        """``mark`` a copy of what the author wrote at ``path`` and every container in it, each at its
        own place under ``path``."""
        for rel, container in _containers(node, ()):
            self.mark(container, (*path, *rel))
        return node

    def mark_key(self, node: dict[str, Any], key: str, path: Path) -> None:
        """The value under ``node[key]`` was written at ``path`` (e.g. a key that was renamed)."""
        self._keys[(id(node), key)] = path
        self._alive.append(node)

    def path_of(self, node: Any) -> Path | None:
        return self._by_id.get(id(node))

    def resolve(self, data: Any) -> dict[Path, Path]:
        """Every node path of the rewritten ``data`` -> the authored path it stands for."""
        table: dict[Path, Path] = {}
        self._walk(data, (), (), table, set())
        return table

    def renamed(self, data: Any) -> set[Path]:
        """Paths of the rewritten ``data`` whose mapping key replaces an authored key (``mark_key``)."""
        keyed: set[Path] = set()
        self._walk(data, (), (), {}, keyed)
        return keyed

    def _walk(
        self, node: Any, path: Path, inherited: Path, table: dict[Path, Path], keyed: set[Path]
    ) -> None:
        own = self._by_id.get(id(node)) if isinstance(node, (dict, list)) else None
        where = own if own is not None else inherited
        table[path] = where
        if isinstance(node, dict):
            for k, v in node.items():
                child = self._keys.get((id(node), k))
                if child is None:
                    child = (*where, k) if own is not None or not path else where
                else:
                    keyed.add((*path, k))
                self._walk(v, (*path, k), child, table, keyed)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                self._walk(v, (*path, i), (*where, i) if own is not None else where, table, keyed)

    def source_map(self, data: Any, authored: SourceMap) -> SourceMap:
        """A source map of the rewritten ``data`` whose positions are those of the authored text."""
        out = SourceMap(authored.file)
        out.lines = authored.lines
        table = self.resolve(data)
        out.set_authored(table)
        for new, old in table.items():
            line, col = authored.value(old)
            out.set_value(new, line - 1, col - 1)
            kline, kcol = authored.key(old)
            out.set_key(new, kline - 1, kcol - 1)
        return out


def _containers(node: Any, path: Path) -> Iterator[tuple[Path, Any]]:
    if isinstance(node, dict):
        yield path, node
        for k, v in node.items():
            yield from _containers(v, (*path, k))
    elif isinstance(node, list):
        yield path, node
        for i, v in enumerate(node):
            yield from _containers(v, (*path, i))
