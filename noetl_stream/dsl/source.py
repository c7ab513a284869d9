"""YAML text -> plain Python data plus a map of where every node came from.

ruamel.yaml keeps 0-based line/column for every mapping key, mapping value and
sequence item. We convert the round-trip tree to plain ``dict``/``list``/scalars
(so the rest of the compiler never sees ruamel types) and record 1-based
positions keyed by the node's path.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedKeyMap, CommentedMap, CommentedSeq
from ruamel.yaml.constructor import ConstructorError, RoundTripConstructor
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.reader import ReaderError

from noetl_stream.dsl.diagnostics import Diagnostic, Path, PlaybookError, format_path
from noetl_stream.errors import NoetlError

# Alias expansion can make a small document enormous ("billion laughs").
MAX_NODES = 200_000
MAX_DEPTH = 200


class SourceMap:
    """Positions (1-based line, col) of values and keys, by YAML path."""

    __slots__ = ("_authored", "_keys", "_values", "file", "lines")

    def __init__(self, file: str, text: str = "") -> None:
        self.file = file
        self.lines = text.splitlines()
        self._values: dict[Path, tuple[int, int]] = {}
        self._keys: dict[Path, tuple[int, int]] = {}
        self._authored: dict[Path, Path] = {}  # a rewritten tree's paths -> what the author wrote there

    def set_authored(self, table: dict[Path, Path]) -> None:
        """The paths of the tree this map describes -> what the author wrote there (after a rewrite; kept
        only if some path differs)."""
        if any(new != old for new, old in table.items()):
            self._authored = table

    def authored(self, path: Path) -> Path:
        """The path the author wrote for ``path``: its node's authored path (or its nearest ancestor's, with
        the rest of ``path`` after it, for a path with no node); ``path`` itself where nothing was
        rewritten."""
        if not self._authored:
            return path
        for n in range(len(path), -1, -1):
            found = self._authored.get(path[:n])
            if found is not None:
                return (*found, *path[n:])
        return path

    def set_value(self, path: Path, line: int, col: int) -> None:
        self._values.setdefault(path, (line + 1, col + 1))

    def set_key(self, path: Path, line: int, col: int) -> None:
        self._keys.setdefault(path, (line + 1, col + 1))

    def value(self, path: Path) -> tuple[int, int]:
        """Where the value at ``path`` starts; falls back to the nearest ancestor."""
        p = path
        while True:
            if p in self._values:
                return self._values[p]
            if p in self._keys:
                return self._keys[p]
            if not p:
                return (1, 1)
            p = p[:-1]

    def key(self, path: Path) -> tuple[int, int]:
        """Where the mapping key that ends ``path`` stands (else where its value does)."""
        return self._keys.get(path) or self.value(path)

    def diagnostic(
        self,
        path: Path,
        message: str,
        *,
        severity: str = "error",
        at_key: bool = False,
        code: str = "invalid",
    ) -> Diagnostic:
        line, col = self.key(path) if at_key else self.value(path)
        return Diagnostic(
            severity="warning" if severity == "warning" else "error",
            message=message,
            file=self.file,
            line=line,
            col=col,
            path=format_path(self.authored(path)),
            code=code,
        )


class _Converter:
    def __init__(self, smap: SourceMap) -> None:
        self.smap = smap
        self.nodes = 0
        self.problems: list[Diagnostic] = []

    def convert(self, node: Any, path: Path, depth: int = 0) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise _TooLargeError(
                (), f"document is too large (more than {MAX_NODES} nodes after alias expansion)"
            )
        if depth > MAX_DEPTH:
            raise _TooLargeError(path, f"document is nested too deeply (more than {MAX_DEPTH} levels)")
        if isinstance(node, CommentedMap):
            if not path:
                self.smap.set_value(path, node.lc.line, node.lc.col)
            out: dict[Any, Any] = {}
            for key, value in node.items():
                k = self._key(key, path)
                child = (*path, k)
                try:
                    kl, kc = node.lc.key(key)
                    self.smap.set_key(child, kl, kc)
                    vl, vc = node.lc.value(key)
                    if value is None and vl != kl:
                        # An empty value ("key:" and nothing) is marked where the next token starts.
                        vl, vc = kl, kc
                    self.smap.set_value(child, vl, vc)
                except (KeyError, TypeError, AttributeError):
                    pass
                out[k] = self.convert(value, child, depth + 1)
            return out
        if isinstance(node, CommentedSeq):
            items: list[Any] = []
            for i, value in enumerate(node):
                child = (*path, i)
                try:
                    il, ic = node.lc.item(i)
                    self.smap.set_value(child, il, ic)
                except (KeyError, TypeError, AttributeError, IndexError):
                    pass
                items.append(self.convert(value, child, depth + 1))
            return items
        return _scalar(node)

    def _key(self, key: Any, path: Path) -> Any:
        if isinstance(key, CommentedKeyMap):
            # `when: {{ x }}` without quotes is a YAML mapping whose key is the mapping `{x: null}`.
            inner = ", ".join(str(k) for k in key)
            line, col = self.smap.value(path)
            source = self.smap.lines[line - 1][col - 1 :] if 0 < line <= len(self.smap.lines) else ""
            if source.startswith("{{"):
                message = f'unquoted template: YAML reads {{{{ {inner} }}}} as a mapping; quote it: "{{{{ {inner} }}}}"'
            else:
                message = "a mapping key must be a plain value, not a mapping"
            self.problems.append(self.smap.diagnostic(path, message, code="yaml-syntax"))
            return f"{{{{ {inner} }}}}"
        value = _scalar(key)
        if isinstance(value, (dict, list)) or value is None:
            return str(value)
        if isinstance(value, tuple):
            return "[" + ", ".join(str(v) for v in value) + "]"
        return value


def _check_size(node: Any, memo: dict[int, int], active: set[int], depth: int = 0) -> int:
    """Nodes ``node`` expands to, counting each alias use (memoized: linear in distinct nodes)."""
    if not isinstance(node, (CommentedMap, CommentedSeq)):
        return 1
    key = id(node)
    if key in memo:
        return memo[key]
    if key in active:
        raise _TooLargeError((), "document contains a recursive alias (a node that contains itself)")
    if depth > MAX_DEPTH:
        raise _TooLargeError((), f"document is nested too deeply (more than {MAX_DEPTH} levels)")
    active.add(key)
    total = 1
    for child in node.values() if isinstance(node, CommentedMap) else node:
        total += _check_size(child, memo, active, depth + 1)
        if total > MAX_NODES:
            raise _TooLargeError(
                (), f"document is too large (more than {MAX_NODES} nodes after alias expansion)"
            )
    active.discard(key)
    memo[key] = total
    return total


class _Constructor(RoundTripConstructor):
    """ruamel builds a node that contains itself (``a: &x [*x]``) as null; report it instead."""

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        if node not in self.constructed_objects and node in self.recursive_objects:
            raise ConstructorError(
                None, None, "recursive alias: the node anchored here contains itself", node.start_mark
            )
        return super().construct_object(node, deep)


class _TooLargeError(NoetlError):
    def __init__(self, path: Path, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message


def _scalar(node: Any) -> Any:
    if node is None or isinstance(node, bool):
        return node
    if isinstance(node, str):
        return str(node)
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, (datetime.datetime, datetime.date)):
        return node.isoformat()
    if isinstance(node, (bytes, bytearray)):
        return bytes(node).decode("utf-8", "replace")
    if isinstance(node, (CommentedMap, CommentedSeq, dict, list)):
        return node
    # Tagged scalars and anything exotic: keep its text.
    value = getattr(node, "value", None)
    return str(value if value is not None else node)


_TOKENS = (
    ("'<stream end>'", "the end of the file"),
    ("<stream end>", "the end of the file"),
    ("'<block end>'", "the end of the block"),
    ("<block end>", "the end of the block"),
    ("'?'", "a mapping key"),
    ("'<block mapping start>'", "a mapping"),
    ("<block mapping start>", "a mapping"),
)
_DUPLICATE = re.compile(r'found duplicate key "(?P<key>.*)" with value')


def _yaml_error(file: str, text: str, exc: YAMLError) -> Diagnostic:
    line, col = 1, 1
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    code = "yaml-syntax"
    if isinstance(exc, ReaderError) and isinstance(exc.position, int) and 0 <= exc.position <= len(text):
        line = text.count("\n", 0, exc.position) + 1
        col = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
    if isinstance(exc, MarkedYAMLError):
        pmark, cmark = exc.problem_mark, exc.context_mark
        mark = pmark or cmark
        if mark is not None:
            line, col = mark.line + 1, mark.column + 1
        problem = str(exc.problem or exc.context or message).strip()
        for token, words in _TOKENS:
            problem = problem.replace(token, words)
        dup = _DUPLICATE.search(problem)
        if dup is not None and pmark is not None:
            code = "duplicate-key"
            key = dup.group("key")
            first = _first_key(text, key, cmark, pmark)
            message = f"duplicate key '{key}'" + (f" (first at line {first})" if first else "")
        else:
            message = problem
            context = str(exc.context or "").strip()
            if exc.problem and context and cmark is not None and cmark is not pmark:
                what = context.removeprefix("while parsing ").removeprefix("while scanning ")
                message += f" (in {what} that starts at {cmark.line + 1}:{cmark.column + 1})"
            at = _char_at(text, pmark)  # what the parser stopped at, from the text: not from its words
            if "the end of the block" in message:
                message += "; check the indentation"
            elif at == ":" and cmark is None:  # a ': ' in a plain value, not an unclosed [ or {
                message += "; quote a value that contains ': ', or check the indentation"
            elif at == "\t":
                message += "; indent with spaces, not tabs"
    return Diagnostic("error", f"YAML syntax error: {message}", file, line, col, "<root>", code)


def _char_at(text: str, mark: Any) -> str:
    """The character of `text` at a parser's `mark` (``""`` past the end, or without a mark)."""
    if mark is None:
        return ""
    lines = text.split("\n")
    if not 0 <= mark.line < len(lines):
        return ""
    return str(lines[mark.line][mark.column : mark.column + 1])


def _first_key(text: str, key: str, start: Any, end: Any) -> int | None:
    """Line (1-based) of the first occurrence of ``key`` in the mapping that holds a duplicate."""
    lines = text.splitlines()
    pattern = re.compile(r"(?:^|[\s{,])[\"']?" + re.escape(key) + r"[\"']?\s*:")
    first = start.line if start is not None else 0
    for n in range(first, end.line + 1):
        chunk = lines[n] if n < len(lines) else ""
        if n == end.line:
            chunk = chunk[: end.column]
        if n == first and start is not None:
            chunk = " " * start.column + chunk[start.column :]
        if pattern.search(chunk):
            return n + 1
    return None


def _deep_flow(text: str) -> tuple[int, int] | None:
    """Where ``[``/``{`` nesting passes ``MAX_DEPTH`` (ruamel's scanner is quadratic in it), if it does."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return None
    depth = 0
    line, col = 1, 0
    for ch in text:
        col += 1
        if ch in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return line, col
        elif ch in "]}":
            depth = max(0, depth - 1)
        elif ch == "\n":
            line, col = line + 1, 0
    return None


def load_yaml(text: str, file: str = "<playbook>") -> tuple[Any, SourceMap]:
    """Parse one YAML document. Raises ``PlaybookError`` on syntax errors."""
    smap = SourceMap(file, text)
    deep = _deep_flow(text)
    if deep is not None:
        message = f"document is nested too deeply (more than {MAX_DEPTH} levels)"
        raise PlaybookError([Diagnostic("error", message, file, deep[0], deep[1], "<root>", "too-large")])
    yaml = YAML(typ="rt", pure=True)
    yaml.Constructor = _Constructor
    yaml.allow_duplicate_keys = False
    try:
        docs = list(yaml.load_all(text))
    except YAMLError as exc:
        raise PlaybookError([_yaml_error(file, text, exc)]) from None
    except RecursionError:
        raise PlaybookError(
            [Diagnostic("error", "document is nested too deeply", file, 1, 1, "<root>", "too-large")]
        ) from None
    except (ValueError, TypeError, OverflowError, AttributeError, KeyError, IndexError) as exc:
        # ruamel raises these for a few malformed inputs (bad tags, odd anchors) instead of YAMLError.
        raise PlaybookError(
            [Diagnostic("error", f"YAML could not be read: {exc}", file, 1, 1, "<root>", "yaml-syntax")]
        ) from None
    docs = [d for d in docs if d is not None]
    if len(docs) != 1:
        what = "no YAML document" if not docs else f"{len(docs)} YAML documents"
        raise PlaybookError(
            [
                Diagnostic(
                    "error", f"expected one playbook document, found {what}", file, 1, 1, "<root>", "yaml"
                )
            ]
        )
    converter = _Converter(smap)
    try:
        _check_size(docs[0], {}, set())
        data = converter.convert(docs[0], ())
    except _TooLargeError as exc:
        raise PlaybookError([smap.diagnostic(exc.path, exc.message, code="too-large")]) from None
    except RecursionError:
        raise PlaybookError(
            [Diagnostic("error", "document is nested too deeply", file, 1, 1, "<root>", "too-large")]
        ) from None
    if converter.problems:
        raise PlaybookError(converter.problems)
    return data, smap
