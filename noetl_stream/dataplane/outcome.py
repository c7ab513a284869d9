"""The tool outcome envelope (001 §11): exactly one per tool invocation."""

from __future__ import annotations

import datetime
import decimal
import ipaddress
import uuid
from typing import Any, Literal

import msgspec


class Outcome(msgspec.Struct, omit_defaults=True):
    status: Literal["ok", "error"]
    result: Any = None
    error: dict[str, Any] | None = None
    meta: dict[str, Any] = {}
    helpers: dict[str, Any] = {}
    """Kind helpers, exposed as ``outcome.<kind>`` (``outcome.http.status``, ``outcome.py.exception_type``)."""
    secret: bool = False
    """The result is a secret (the ``secrets`` tool): later tasks of the pipeline may read it, but no
    event, log or boundary payload may carry it (the pipeline redacts it, see ``secret_strings``)."""

    @classmethod
    def ok(cls, result: Any = None, **helpers: Any) -> Outcome:
        return cls(status="ok", result=result, helpers=helpers)

    @classmethod
    def fail(cls, kind: str, message: str, *, retryable: bool = False, **helpers: Any) -> Outcome:
        return cls(
            status="error", error={"kind": kind, "message": message, "retryable": retryable}, helpers=helpers
        )

    def as_scope(self) -> dict[str, Any]:
        """What templates see as ``outcome``."""
        scope: dict[str, Any] = dict(self.helpers)
        scope.update(status=self.status, result=self.result, error=self.error or {}, meta=self.meta)
        return scope


_AS_TEXT = (
    uuid.UUID,
    ipaddress.IPv4Address,
    ipaddress.IPv6Address,
    ipaddress.IPv4Network,
    ipaddress.IPv6Network,
    ipaddress.IPv4Interface,
    ipaddress.IPv6Interface,
)


def json_safe(value: Any, _depth: int = 0) -> Any:
    """Make values from databases and user code encodable (Decimal, UUID, timestamps, bytes, sets)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if _depth > 100:
        return _repr(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v, _depth + 1) for v in value]
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() and abs(value) < 2**53 else float(value)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, _AS_TEXT):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, msgspec.Struct):
        return json_safe(msgspec.to_builtins(value), _depth + 1)
    kind = type(value).__name__
    if kind == "Range" and hasattr(value, "isempty"):  # asyncpg's range types (int4range, tstzrange, ...)
        return {
            "lower": json_safe(value.lower, _depth + 1),
            "upper": json_safe(value.upper, _depth + 1),
            "lower_inc": bool(value.lower_inc),
            "upper_inc": bool(value.upper_inc),
            "empty": bool(value.isempty),
        }
    if kind == "BitString" and hasattr(value, "as_string"):  # asyncpg's bit / varbit
        return str(value.as_string())
    return _repr(value)


def _repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception:  # user code's own __repr__ may raise
        return f"<{type(value).__name__} object>"
