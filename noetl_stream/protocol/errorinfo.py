"""The error an event carries (``payload.error``): its kind, its message and what some kinds add."""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["ErrorInfo", "error_text"]


class ErrorInfo(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One error as events record it. `to_dict` is the dict the payloads hold: the fields in this order
    (the order the payloads have always had), an absent optional left out."""

    kind: str
    """What went wrong, a word the routing and the clients match (``template_error``, ``timeout``, ...)."""
    retryable: bool | None = None
    """Whether a retry may help (task policies read it); absent where the error says nothing of it."""
    task: str | None = None
    """The task the error is of (a policy's ``fail``)."""
    message: str
    """What happened, for a person."""
    entry: str | None = None
    """The keychain entry a credential error names."""
    diagnostics: list[str] | None = None
    """An invalid playbook's diagnostics, each formatted."""
    key: str | None = None
    """The ctx key a ``ctx_conflict`` is over."""
    step_run_id: str | None = None
    """The step run whose ctx patches a ``ctx_conflict`` refused."""
    other_step_run_id: str | None = None
    """The step run that changed the key first (a ``ctx_conflict``)."""
    cause: Any = None
    """The error that led to this one (a ``failing_cycle``'s last failure), as its payload held it."""

    def to_dict(self) -> dict[str, Any]:
        """The error as the payloads hold it."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out


def error_text(error: Any, limit: int | None = None) -> str:
    """An event's error (``{kind, message, ...}``) on one line: ``kind: message``, the message alone when
    it names its kind already (``ZeroDivisionError: ...`` of kind ``ZeroDivisionError``), the kind alone
    without a message; cut after `limit` characters (None: whole). The CLI's lines and the spans' error
    statuses say an error with it."""
    if not isinstance(error, dict):
        return _one_line(str(error), limit)
    kind, message = str(error.get("kind") or "error"), str(error.get("message") or "")
    if not message:
        return _one_line(kind, limit)
    return _one_line(
        message if message == kind or message.startswith(f"{kind}:") else f"{kind}: {message}", limit
    )


def _one_line(text: str, limit: int | None) -> str:
    text = " ".join(text.split())
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"
