"""Authored data -> canonical data, before validation: legacy translation, sugar, dialect, task labels.

Each rewrite works on a private copy whose nodes remember where they were authored (``Origins``),
so diagnostics keep pointing at the author's text. ``dump_yaml`` prints the result (what
``noetl-stream validate --show-canonical`` shows).
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import Any, NamedTuple

from ruamel.yaml import YAML
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

from noetl_stream.dsl import dialect, labels, legacy, sugar
from noetl_stream.dsl.diagnostics import Diagnostic
from noetl_stream.dsl.origins import Origins
from noetl_stream.dsl.source import SourceMap

LEGACY = "legacy"


class Expanded(NamedTuple):
    data: Any
    smap: SourceMap
    diagnostics: list[Diagnostic]
    origins: Origins | None


def declared_extensions(data: Any) -> set[str]:
    """``executor.spec.extensions`` of the authored data (before any rewrite)."""
    executor = data.get("executor") if isinstance(data, dict) else None
    spec = executor.get("spec") if isinstance(executor, dict) else None
    exts = spec.get("extensions") if isinstance(spec, dict) else None
    return {str(e) for e in exts} if isinstance(exts, list) else set()


def expand(data: Any, smap: SourceMap, extensions: Iterable[str] = ()) -> Expanded:
    """The canonical form of ``data``; ``data`` itself is not changed."""
    exts = set(extensions) | declared_extensions(data)
    use_legacy = LEGACY in exts
    if not (use_legacy or sugar.has_sugar(data) or dialect.has_dialect(data) or labels.has_labels(data)):
        return Expanded(data, smap, [], None)
    own, origins = Origins.of(data)
    diagnostics: list[Diagnostic] = []
    if use_legacy:
        diagnostics += legacy.translate(own, origins, smap)
    diagnostics += sugar.expand(own, origins, smap)
    diagnostics += dialect.normalize(own, origins, smap)
    diagnostics += labels.normalize(own, origins, smap)
    return Expanded(own, origins.source_map(own, smap), diagnostics, origins)


def styled(value: str) -> Any:
    """Templates are written in double quotes, as authors write them (when that needs no escapes)."""
    if ("{{" in value or "{%" in value) and '"' not in value and "\\" not in value and "\n" not in value:
        return DoubleQuotedScalarString(value)
    return value


def _styled(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _styled(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_styled(v) for v in node]
    return styled(node) if isinstance(node, str) else node


def dump_yaml(data: Any) -> str:
    """Block-style YAML of plain data, in key order."""
    yaml = YAML(typ="rt", pure=True)
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.width = 4096
    out = io.StringIO()
    yaml.dump(_styled(data), out)
    return out.getvalue()
