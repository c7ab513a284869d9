"""What an ``http`` task makes of a response: its body decoded (`decode_body`), its headers with
credentials masked, the seconds of a ``Retry-After``, the error kind of a status that is not 2xx
(`status_error`) and the task's result, the envelope (`envelope`). Used by `http` (the tool)."""

from __future__ import annotations

import base64
import codecs
import datetime
import email.utils
import math
from collections.abc import Mapping
from typing import Any

import msgspec
from multidict import CIMultiDictProxy

from noetl_stream.kv.keychain import MASK


def retry_after_seconds(value: str | None, now: datetime.datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        delta = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, delta) if math.isfinite(delta) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    now = now or datetime.datetime.now(datetime.UTC)
    return max(0.0, (when - now).total_seconds())


def response_headers(headers: CIMultiDictProxy[str], sensitive: frozenset[str]) -> dict[str, str]:
    """The headers by lower-case name (a repeated one joined with ``, ``), those named in `sensitive`
    shown as ``***``."""
    out: dict[str, str] = {}
    for key, value in headers.items():
        name = key.lower()
        shown = MASK if name in sensitive else value
        out[name] = f"{out[name]}, {shown}" if name in out else shown
    return out


def decode_body(data: bytes, content_type: str, charset: str | None) -> tuple[Any, str | None, str | None]:
    """``(data, encoding, json_error)``: a JSON content type is decoded (after a UTF-8 byte order
    mark, which some servers send); a body that is not JSON then is kept as text and `json_error` says
    why it could not be decoded. Text of another content type that is a JSON object or array is decoded
    too (`_json_text`)."""
    if not data:
        return None, None, None
    ctype = content_type.lower()
    charset = _known(charset)
    json_error = None
    labelled = ctype.endswith("/json") or ctype.endswith("+json")
    if labelled:
        try:
            return msgspec.json.decode(data.removeprefix(codecs.BOM_UTF8)), None, None
        except msgspec.DecodeError as exc:
            json_error = str(exc)
    try:
        text = data.decode(charset or "utf-8")
    except UnicodeDecodeError:
        if ctype.startswith("text/"):
            return data.decode(charset or "utf-8", errors="replace"), None, json_error
        return base64.b64encode(data).decode(), "base64", json_error
    parsed = None if labelled else _json_text(text)
    return (text, None, json_error) if parsed is None else (parsed, None, None)


def _json_text(text: str) -> dict[str, Any] | list[Any] | None:
    """`text` decoded when it is a JSON object or array (what a server sends as ``text/plain`` or without
    a content type), else None: other text, a bare number or word among it, stays text."""
    text = text.lstrip("\ufeff")
    if text.lstrip(" \t\r\n")[:1] not in ("{", "["):
        return None
    try:
        value = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return None
    return value if isinstance(value, (dict, list)) else None


def decode_cut(data: bytes, charset: str | None) -> tuple[str, str | None]:
    """``(result, encoding)`` of a body cut at ``spec.max_body_bytes``: text, never JSON-decoded (cut,
    it would not decode), without a character the cut split; bytes that are not text as base64."""
    try:
        return codecs.getincrementaldecoder(_known(charset) or "utf-8")().decode(data), None
    except UnicodeDecodeError:
        return base64.b64encode(data).decode(), "base64"


def status_error(status: int) -> tuple[str, bool]:
    """``(error.kind, retryable)`` of a response of a status that is not 2xx."""
    if status == 429:
        return "rate_limit", True
    if status >= 500:
        return "server_error", True
    if status in (401, 403):
        return "auth", False
    if status == 404:
        return "not_found", False
    if 400 <= status < 500:
        return "client_error", False
    return "http_error", False  # 1xx, or a 3xx that was not followed (304, no Location)


def envelope(http: Mapping[str, Any], data: Any) -> dict[str, Any]:
    """The task's result for a response: its status, headers, final URL and time (``outcome.http``'s,
    masked) and the body as ``data``. Templates read the body as ``body`` too (a view's alias,
    `noetl_stream.dsl.views.ResultView`): events and stored results carry it once."""
    return {
        "status_code": http["status"],
        "headers": http["headers"],
        "url": http["url"],
        "elapsed": http["elapsed_s"],
        "data": data,
    }


def _known(charset: str | None) -> str | None:
    """`charset` if Python knows it, else None (UTF-8 then): a server may name any charset."""
    if charset:
        try:
            codecs.lookup(charset)
        except LookupError:
            return None
    return charset
