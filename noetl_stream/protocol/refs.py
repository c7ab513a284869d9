"""A value stored by reference: ``{"$ref": {"key": ..., ...}}`` stands, in an event, a command or a
snapshot, for a value kept in the object store (`kv.results.ResultStore` writes and reads them)."""

from __future__ import annotations

from typing import Any

__all__ = ["REF", "is_ref"]

REF = "$ref"


def is_ref(value: Any) -> bool:
    """Whether `value` is a reference (a mapping whose only key is ``$ref``, holding a mapping)."""
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get(REF), dict)
