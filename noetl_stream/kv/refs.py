"""Results stored by reference, found and fetched wherever they sit in what a command carries.

A command's ``results``, ``args`` and distributed iteration item may hold references (001 §14) at any
depth: a distributed loop's result list holds one per large iteration, arc args nest them, and a
large list stored by reference may hold more. The worker resolves them all before the step runs.

Every command is checked, so the check is cheap: one encode to JSON (C speed) and a search for the
marker bytes ``"$ref":{``. A JSON string cannot hold them (its quotes are escaped), so only a mapping
with a ``$ref`` key matches; a mapping that is no reference (more keys) costs a walk that finds none.
Measured on 430 kB of rows: 0.9 ms, against 3.7 ms for the fastest Python walk.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from noetl_stream.protocol.refs import REF, is_ref

MARKER = b'"' + REF.encode() + b'":{'
MAX_ROUNDS = 8
"""Fetched values are searched again (a stored list holds its items' references), this many times."""

_encoder = msgspec.json.Encoder()

Fetch = Callable[[dict[str, Any]], Awaitable[Any]]


def may_hold_refs(value: Any) -> bool:
    """False when `value` holds no reference at any depth (True may still find none: see the module)."""
    try:
        return MARKER in _encoder.encode(value)
    except (TypeError, msgspec.EncodeError):  # not JSON: walk it
        return bool(_refs(value))


async def resolve_refs(value: Any, fetch: Fetch, fetched: dict[str, Any] | None = None) -> Any:
    """`value` with every reference inside it, at any depth, replaced by its value; `value` itself when
    it holds none. A fetched value's own references are fetched too. `fetched`: values fetched so far,
    shared by the calls of one command (a result read by name and passed in args is fetched once)."""
    if not may_hold_refs(value):
        return value
    if fetched is None:
        fetched = {}
    for _ in range(MAX_ROUNDS):
        refs = _refs(value)
        if not refs:
            break
        for key, ref in refs.items():
            if key not in fetched:
                fetched[key] = await fetch(ref)
        value = _replace(value, fetched)
    return value


def _key(ref: dict[str, Any]) -> str:
    info = ref[REF]
    return f"{info.get('bucket')}/{info.get('key')}/{info.get('checksum')}"


def _refs(value: Any) -> dict[str, dict[str, Any]]:
    """The references inside `value`, by `_key` (iterative: no recursion limit on deep values)."""
    found: dict[str, dict[str, Any]] = {}
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            if is_ref(v):
                found[_key(v)] = v
            else:
                stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return found


def _replace(value: Any, fetched: dict[str, Any]) -> Any:
    """`value` with the references in `fetched` replaced; containers without one are kept as they are."""
    if isinstance(value, dict):
        if is_ref(value):
            return fetched.get(_key(value), value)
        out = {k: _replace(v, fetched) for k, v in value.items()}
        return value if all(out[k] is v for k, v in value.items()) else out
    if isinstance(value, list):
        items = [_replace(v, fetched) for v in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    return value
