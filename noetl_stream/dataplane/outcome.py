"""The tool outcome envelope (001 §11): exactly one per tool invocation."""

from __future__ import annotations

import datetime
import decimal
import ipaddress
import re
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, Literal

import msgspec

from noetl_stream.protocol.errorinfo import ErrorInfo


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
        error = ErrorInfo(kind=kind, retryable=retryable, message=message).to_dict()
        return cls(status="error", error=error, helpers=helpers)

    def as_scope(self) -> dict[str, Any]:
        """What templates see as ``outcome``."""
        scope: dict[str, Any] = dict(self.helpers)
        scope.update(status=self.status, result=self.result, error=self.error or {}, meta=self.meta)
        return scope

    def as_output(self) -> OutputView:
        """What a task policy sees as ``output``: NoETL's envelope of this outcome (`OutputView`)."""
        return OutputView(self)


class OutputView(Mapping[str, Any]):
    """NoETL's envelope of a task's outcome, ``output`` in its policy: ``{status, data, error, http,
    meta}``. ``data`` is the tool's result as it is (an http task's body is ``output.data.data``, a SQL
    task's rows ``output.data.rows``); ``error`` is ``{kind, retryable, code, message, status_code}``
    (nulls and false on success, so ``output.error.retryable`` is false there); ``http`` is ``{status,
    headers}`` (nulls for other kinds); ``meta`` has ``attempt`` and ``duration_ms`` besides the
    outcome's own. A view: each key is built when a template reads it, none for a rule that does not."""

    __slots__ = ("_outcome",)
    KEYS: ClassVar[tuple[str, ...]] = ("status", "data", "error", "http", "meta")

    def __init__(self, outcome: Outcome) -> None:
        self._outcome = outcome

    def __getitem__(self, key: str) -> Any:
        o = self._outcome
        if key == "status":
            return o.status
        if key == "data":
            return o.result
        if key == "error":
            error = o.error or {}
            http = o.helpers.get("http")
            pg = o.helpers.get("pg")
            status = error.get("status", http.get("status") if isinstance(http, dict) and o.error else None)
            code = error.get("code", pg.get("code") if isinstance(pg, dict) else None)
            return {
                "kind": error.get("kind"),
                "retryable": bool(error.get("retryable", False)),
                "code": code,
                "message": error.get("message"),
                "status_code": status,
            }
        if key == "http":
            http = o.helpers.get("http")
            if not isinstance(http, dict):
                return {"status": None, "headers": {}}
            return {"status": http.get("status"), "headers": http.get("headers") or {}}
        if key == "meta":
            meta = dict(o.meta)
            duration = meta.get("duration_s")
            meta["duration_ms"] = round(duration * 1000, 3) if isinstance(duration, (int, float)) else None
            return meta
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.KEYS)

    def __len__(self) -> int:
        return len(self.KEYS)


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
    if kind in ("Path", "Polygon") and hasattr(value, "points"):  # asyncpg's path / polygon
        # (point, box, lseg, line and circle are tuples: lists above)
        return {
            "points": json_safe(list(value.points), _depth + 1),
            "closed": bool(getattr(value, "is_closed", True)),
        }
    return _repr(value)


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")


def _repr(value: Any) -> str:
    """The value's repr, without the memory address of a default one (``<x.Y object>``): a result is
    the same every time it is computed."""
    try:
        text = repr(value)
    except Exception:  # user code's own __repr__ may raise
        return f"<{type(value).__name__} object>"
    return _ADDRESS.sub(">", text)


INFINITE_DATETIMES: tuple[tuple[Any, str], ...] = (
    (datetime.datetime.max, "infinity"),
    (datetime.datetime.min, "-infinity"),
    (datetime.date.max, "infinity"),
    (datetime.date.min, "-infinity"),
)
"""What DuckDB gives for ``infinity``/``-infinity`` timestamps and dates: these very objects."""


def sql_infinity(value: Any, sentinels: tuple[tuple[Any, str], ...], _depth: int = 0) -> Any:
    """A database value with the objects its driver gives for ``infinity``/``-infinity`` timestamps and
    dates (`sentinels`) as those words, not ``9999-12-31T23:59:59.999999`` or ``0001-01-01``. They are
    told by identity: the driver returns these very objects, while a real ``9999-12-31`` is a new one.
    Lists (arrays) are walked."""
    if isinstance(value, list):
        return [sql_infinity(v, sentinels, _depth + 1) for v in value] if _depth < 100 else value
    if isinstance(value, datetime.date):
        for sentinel, word in sentinels:
            if value is sentinel:
                return word
    return value
