"""JSON values: what rendered templates and task results are made of before they travel.

Events, commands and snapshots hold JSON. A template may compute other Python values (a ``range``,
a tuple, a generator from a filter, a ``str`` subclass); those with a natural JSON form are
converted (to a list, a plain ``str``, ...). A value without one (a function, an arbitrary object)
raises ``NotJSONError``, naming its type, so that it fails the template or the task that made it
instead of the publish that carries it.

``enc_hook`` is the same conversion for the wire encoder: msgspec calls it only for values it cannot
encode itself, so plain JSON costs nothing extra.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, cast

from noetl_stream.errors import NoetlError

PLAIN_TYPES = frozenset({str, int, float, bool, type(None)})
"""Exact types that are JSON as they are (a subclass is converted)."""

_SEQUENCES: tuple[type, ...] = (
    tuple,
    set,
    frozenset,
    range,
    type({}.keys()),
    type({}.values()),
    type({}.items()),
)
MAX_DEPTH = 100


class NotJSONError(NoetlError, TypeError):
    """A value has no JSON form. ``path`` says where inside the value (``""``: the value itself)."""

    def __init__(self, value: Any, path: str = "") -> None:
        self.type_name = type(value).__name__
        self.path = path
        at = f" at {path}" if path else ""
        super().__init__(f"a value of type '{self.type_name}'{at} is not JSON")


def _scalar(value: Any) -> Any:
    """A subclass of str/int/float as its base type; anything else unchanged."""
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__index__(value)
    if isinstance(value, float):
        return float.__float__(value)
    return value


def _key(key: Any, path: str) -> str:
    if type(key) is str:
        return key
    if isinstance(key, str):
        return str.__str__(key)
    if isinstance(key, (int, float)) and not isinstance(key, bool):
        return str(key)  # how JSON writes a numeric key
    raise NotJSONError(key, f"{path} (a mapping key)" if path else "a mapping key")


def to_json(value: Any, _path: str = "", _depth: int = 0) -> Any:
    """``value`` with every part in its JSON form (the same object when it already is JSON).

    Raises ``NotJSONError`` for a part that has none."""
    t = type(value)
    if t in PLAIN_TYPES:
        return value
    if _depth > MAX_DEPTH:
        raise NotJSONError(value, _path or "depth")
    if t is list:
        out = None
        for i, item in enumerate(value):
            new = to_json(item, f"{_path}[{i}]", _depth + 1)
            if new is not item and out is None:
                out = list(value[:i])
            if out is not None:
                out.append(new)
        return value if out is None else out
    if t is dict:
        changed = False
        items: list[tuple[str, Any]] = []
        for k, v in value.items():
            nk = _key(k, _path)
            nv = to_json(v, f"{_path}.{nk}" if _path else nk, _depth + 1)
            changed = changed or nk is not k or nv is not v
            items.append((nk, nv))
        return dict(items) if changed else value
    if isinstance(value, (str, int, float)):
        return _scalar(value)
    if isinstance(value, Mapping):
        return to_json(dict(value), _path, _depth)
    if isinstance(value, (list, *_SEQUENCES, Iterator)):
        return to_json(list(cast(Iterable[Any], value)), _path, _depth)
    raise NotJSONError(value, _path)


def enc_hook(value: Any) -> Any:
    """msgspec's hook for a value it cannot encode: its JSON form, or ``NotJSONError``."""
    if isinstance(value, (str, int, float)):
        return _scalar(value)
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (*_SEQUENCES, Iterator)):
        return list(cast(Iterable[Any], value))
    raise NotJSONError(value)


__all__ = ["PLAIN_TYPES", "NotJSONError", "enc_hook", "to_json"]
