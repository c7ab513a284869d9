"""Results stored by reference, as the controller's templates see them.

A result above its step's inline limit (``executor.spec.policy.limits.max_payload_bytes``, 256 KiB by
default) travels as a reference to the results object store (reference-first, 001 §14); the worker
resolves it for the tasks that read it. The controller does not: arcs, admission rules and a
distributed loop's ``in`` see the reference (001 §13.3: "summarized step outcome references"). Passed on
whole (``args: {rows: "{{ start }}"}``) it stays a reference for the next step's worker to resolve; a
read *into* it (``start.rows``, ``event.result[0]``) used to find nothing there, and a condition quietly
took the other branch. `ByReference` makes that read an error that says what happened and what to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jinja2.exceptions import TemplateError

from noetl_stream.errors import NoetlError
from noetl_stream.protocol.refs import REF, is_ref

__all__ = ["ByReference", "ByReferenceError", "guard"]


class ByReferenceError(NoetlError, TemplateError):
    """A controller-side template read a field of a result it only has a reference to."""


class ByReference(dict[str, Any]):
    """The reference (``{"$ref": {...}}``, passed on as it is), refusing reads of the value's fields."""

    __slots__ = ("what",)

    def __init__(self, ref: Mapping[str, Any], what: str) -> None:
        super().__init__(ref)
        self.what = what

    def __getitem__(self, key: Any) -> Any:
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        raise ByReferenceError(self.message(key))

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key]

    def message(self, key: Any) -> str:
        ref = dict.get(self, REF)
        size = ref.get("size") if isinstance(ref, dict) else None
        stored = f"{size:,} bytes, " if isinstance(size, int) else ""
        return (
            f"{self.what} is stored by reference ({stored}above its step's inline limit): arcs, admission "
            f"rules and a distributed loop's 'in' see the reference, not the value, so {key!r} cannot be "
            "read here. Have the task set what routing needs in ctx (set_ctx) and read that, read the "
            "result in a task (workers resolve references), or raise "
            "executor.spec.policy.limits.max_payload_bytes (at most 512 KiB)"
        )


def guard(values: Mapping[str, Any] | None, what: str) -> Mapping[str, Any] | None:
    """`values` with every top-level reference wrapped (`ByReference`, named ``what`` % its key); the
    same mapping when it holds none (the usual case: a type check per value)."""
    if not values:
        return values
    out: dict[str, Any] | None = None
    for key, value in values.items():
        if type(value) is dict and is_ref(value):
            if out is None:
                out = dict(values)
            out[key] = ByReference(value, what % key)
    return values if out is None else out
