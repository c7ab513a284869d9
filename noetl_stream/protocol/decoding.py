"""Why bytes from outside are not a value of the type they should be, said in our own words.

msgspec decodes; when it refuses, `explain` works out why from the bytes themselves, never from msgspec's
message: its text, and even the type of what it raises, change between its releases (0.23 raises a
``DecodeError`` for invalid UTF-8 inside a JSON string where older ones raised ``UnicodeDecodeError``). It
runs only after a decode failed, so decoding costs nothing more. The most basic problem is named first:

- ``not valid UTF-8: byte 0xff at offset 17``
- ``not valid JSON: it is empty``, ``not valid JSON: it ends at offset 12, before its value is complete``,
  ``not valid JSON at line 2, column 5 (offset 31)``
- ``JSON nested too deeply``
- ``wrong shape at $.payload: expected an object, got an array`` (or ``missing field 'step'``,
  ``unknown field 'surprise'``, ``expected one of 'server', 'worker', got 'robot'``, ...)

Where it cannot tell what is wrong at a path, msgspec's own detail follows our words.
"""

from __future__ import annotations

import json
import math
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from noetl_stream.errors import NoetlError

Kind = Literal["utf8", "json", "depth", "shape", "other"]


class DecodingError(NoetlError, msgspec.DecodeError):
    """Bytes that are not a value of the type they should be. A ``msgspec.DecodeError``, so the one
    ``except msgspec.DecodeError`` of a consumer settles every bad message. `kind` says what is wrong,
    `offset` at which byte (when that is known), `path` where in the value (a ``shape`` problem)."""

    def __init__(self, kind: Kind, message: str, *, offset: int | None = None, path: str | None = None):
        super().__init__(message)
        self.kind: Kind = kind
        self.offset = offset
        self.path = path


class ShapeError(DecodingError, msgspec.ValidationError):
    """JSON (or a value) of the wrong shape for its type; a ``msgspec.ValidationError`` too."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__("shape", f"wrong shape at {path}: {reason}", path=path)
        self.reason = reason


def explain(
    data: bytes | bytearray | memoryview | str, exc: BaseException, type_: Any = Any
) -> DecodingError:
    """Why `data` did not decode as a `type_` (msgspec raised `exc`)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as bad:
        offset = bad.start
        return DecodingError(
            "utf8", f"not valid UTF-8: byte 0x{raw[offset]:02x} at offset {offset}", offset=offset
        )
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_int=_parse_int)
    except RecursionError:
        return too_deep()
    except _ConstantError:
        return _not_json(text, _constant_at(text))
    except ValueError as bad:  # json.JSONDecodeError
        return _not_json(text, getattr(bad, "pos", 0))
    at = _unpaired_surrogate_at(text)
    if at is not None:
        where, offset = _position(text, at)
        message = f"not valid JSON: the string at {where} holds an unpaired UTF-16 surrogate escape"
        return DecodingError("json", message, offset=offset)
    if isinstance(exc, RecursionError):
        return too_deep()
    return shape_error(value, type_, exc)


def shape_error(value: Any, type_: Any, exc: BaseException) -> DecodingError:
    """Why the JSON value `value` is not a `type_` (decoding or ``msgspec.convert`` raised `exc`): a
    `ShapeError` naming the path, or, when the value fits after all, an error of kind ``other``."""
    if _fits(value, type_):
        return DecodingError("other", f"cannot be decoded ({type(exc).__name__}: {exc})")
    try:
        path, reason = _mismatch(value, type_, "$")
    except RecursionError:
        path, reason = "$", None
    return ShapeError(path, reason if reason is not None else str(exc))


def too_deep() -> DecodingError:
    return DecodingError("depth", "JSON nested too deeply")


# -- syntax -----------------------------------------------------------------------------------------


class _ConstantError(NoetlError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _ConstantError(name)  # NaN, Infinity, -Infinity: Python's json takes them, JSON does not


def _parse_int(digits: str) -> Any:
    try:
        return int(digits)
    except ValueError:  # more digits than Python converts: out of any range we take
        return math.inf


_STRING_OR_CONSTANT = re.compile(r'"(?:[^"\\]|\\.)*"|(-?Infinity|NaN)', re.DOTALL)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _constant_at(text: str) -> int:
    """Where the first ``NaN``/``Infinity`` outside a string is (the text before it is valid JSON)."""
    for match in _STRING_OR_CONSTANT.finditer(text):
        if match.group(1) is not None:
            return match.start(1)
    return 0


def _unpaired_surrogate_at(text: str) -> int | None:
    """Where the first string of the (valid) JSON text with an unpaired surrogate escape starts."""
    if _SURROGATE_ESCAPE.search(text) is None:
        return None
    for match in _STRING.finditer(text):
        token = match.group()
        if _SURROGATE_ESCAPE.search(token) is None:
            continue
        try:
            json.loads(token).encode("utf-8")
        except UnicodeEncodeError:
            return match.start()
    return None


def _position(text: str, pos: int) -> tuple[str, int]:
    """``line L, column C (offset B)`` of character `pos` (the column counts characters, the offset
    bytes), and the offset."""
    line = text.count("\n", 0, pos) + 1
    column = pos - (text.rfind("\n", 0, pos) + 1) + 1
    offset = len(text[:pos].encode("utf-8"))
    return f"line {line}, column {column} (offset {offset})", offset


def _not_json(text: str, pos: int) -> DecodingError:
    end = len(text.rstrip(" \t\r\n"))
    if end == 0:
        return DecodingError("json", "not valid JSON: it is empty", offset=0)
    if pos >= end:
        size = len(text.encode("utf-8"))
        return DecodingError(
            "json", f"not valid JSON: it ends at offset {size}, before its value is complete", offset=size
        )
    where, offset = _position(text, pos)
    return DecodingError("json", f"not valid JSON at {where}", offset=offset)


# -- shape ------------------------------------------------------------------------------------------


def _fits(value: Any, type_: Any) -> bool:
    """Whether the JSON value decodes as a `type_` (as JSON: a ``msgspec.Raw`` takes anything, and a
    number out of range, made ``inf`` by Python's json, fits nothing)."""
    try:
        msgspec.json.decode(json.dumps(value), type=type_)
    except Exception:  # whatever msgspec refuses it with
        return False
    return True


_MAX_DESCENT = 32
"""Levels `_mismatch` goes down at most: each re-checks the part below it, so a hostile value nested deep
would cost its size times its depth. Below it the path stops, and msgspec's detail says the rest."""


def _mismatch(value: Any, type_: Any, path: str, depth: int = 0) -> tuple[str, str | None]:
    """The deepest path where `value` (which does not fit `type_`) goes wrong, and why, if we can tell."""
    if depth > _MAX_DESCENT:
        return path, None
    tp = _strip(type_)
    if isinstance(value, float) and not math.isfinite(value):
        return path, "a number out of range"
    kinds = _kinds(tp)
    if kinds is not None and _kind(value) not in kinds:
        return path, f"expected {_describe(tp)}, got {_shown(value, tp)}"
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct) and isinstance(value, dict):
        return _struct_mismatch(value, tp, path, depth)
    if origin is typing.Union or origin is types.UnionType:
        members = [m for m in args if (k := _kinds(_strip(m))) is None or _kind(value) in k]
        return _mismatch(value, members[0], path, depth) if len(members) == 1 else (path, None)
    if origin is Literal:
        return path, f"expected {_describe(tp)}, got {_shown(value, tp)}"
    if kinds is None and tp is not msgspec.Raw:  # any JSON value: what is wrong is inside it
        if isinstance(value, dict):
            origin, args = dict, (str, Any)
        elif isinstance(value, list):
            origin, args = list, (Any,)
    if isinstance(value, list) and origin in (list, tuple, set, frozenset):
        for i, item in enumerate(value):
            item_type = args[0] if args and (origin is not tuple or args[-1] is Ellipsis) else Any
            if origin is tuple and args and args[-1] is not Ellipsis and i < len(args):
                item_type = args[i]
            if not _fits(item, item_type):
                return _mismatch(item, item_type, f"{path}[{i}]", depth + 1)
        return path, None
    if isinstance(value, dict) and isinstance(origin, type) and issubclass(origin, Mapping):
        value_type = args[1] if len(args) == 2 else Any
        for key, item in value.items():
            if not _fits(item, value_type):
                return _mismatch(item, value_type, _child(path, key), depth + 1)
        return path, None
    if tp is int and isinstance(value, int) and not -(2**63) <= value < 2**64:
        return path, "an integer out of range"
    return path, None


def _struct_mismatch(
    value: dict[str, Any], tp: type[msgspec.Struct], path: str, depth: int
) -> tuple[str, str | None]:
    fields = msgspec.structs.fields(tp)
    config = tp.__struct_config__
    if config.forbid_unknown_fields:
        known = {f.encode_name for f in fields} | ({config.tag_field} if config.tag_field else set())
        for key in value:
            if key not in known:
                return path, f"unknown field {_quoted(key)}"
    for f in fields:
        if f.encode_name in value and not _fits(value[f.encode_name], f.type):
            return _mismatch(value[f.encode_name], f.type, _child(path, f.encode_name), depth + 1)
    for f in fields:
        if f.required and f.encode_name not in value:
            return path, f"missing field {_quoted(f.encode_name)}"
    return path, None


def _strip(type_: Any) -> Any:
    while typing.get_origin(type_) is typing.Annotated:
        type_ = typing.get_args(type_)[0]
    return type_


_STRINGS = frozenset({"string"})
_NUMBERS = frozenset({"integer", "number"})


def _kinds(tp: Any) -> frozenset[str] | None:
    """The kinds of JSON value a `tp` takes (``None``: any, or we cannot tell)."""
    origin = typing.get_origin(tp)
    if tp is Any or tp is object or tp is msgspec.Raw:
        return None
    if tp is None or tp is type(None):
        return frozenset({"null"})
    if tp is bool:
        return frozenset({"boolean"})
    if tp is int:
        return frozenset({"integer"})
    if tp is float:
        return _NUMBERS
    if tp in (str, bytes, bytearray):
        return _STRINGS
    if isinstance(tp, type) and issubclass(tp, (msgspec.Struct, dict)):
        return frozenset({"object"})
    if isinstance(tp, type) and issubclass(tp, (list, tuple, set, frozenset)):
        return frozenset({"array"})
    if origin is Literal:
        return frozenset(_kind(v) for v in typing.get_args(tp))
    if origin is typing.Union or origin is types.UnionType:
        out: set[str] = set()
        for member in typing.get_args(tp):
            kinds = _kinds(_strip(member))
            if kinds is None:
                return None
            out |= kinds
        return frozenset(out)
    if isinstance(origin, type):
        return _kinds(origin)
    return None


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


_ARTICLES = {
    "null": "null",
    "boolean": "true or false",
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "array": "an array",
    "object": "an object",
}


def _describe(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(_quoted(v) for v in typing.get_args(tp))
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        parts = dict.fromkeys(_describe(_strip(m)) for m in typing.get_args(tp))
        return " or ".join(parts)
    kinds = _kinds(tp) or frozenset()
    if kinds == _NUMBERS:
        return "a number"
    return " or ".join(_ARTICLES[k] for k in sorted(kinds)) or "a value"


def _shown(value: Any, tp: Any) -> str:
    """The value as a message shows it: its own text for a scalar a literal type lists, else its kind."""
    if typing.get_origin(tp) is Literal and not isinstance(value, (dict, list)):
        return _quoted(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return _ARTICLES[_kind(value)]


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_SHOWN = 40


def _quoted(value: Any) -> str:
    if isinstance(value, str) and len(value) > _SHOWN:
        return repr(value[:_SHOWN]) + "..."
    return repr(value)


def _child(path: str, key: str) -> str:
    if _IDENTIFIER.fullmatch(key) and len(key) <= _SHOWN:
        return f"{path}.{key}"
    shown = key if len(key) <= _SHOWN else key[:_SHOWN] + "..."
    return f"{path}[{json.dumps(shown)}]"
