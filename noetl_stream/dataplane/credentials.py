"""What a keychain entry must hold for a tool to use it, checked where an entry is stored (``keychain
set``, ``PUT /api/keychain/{name}``) rather than when a task first reads it: a kind no tool knows, or an
entry without a field its kind needs, was stored and showed up later as a task's ``credential_error``.

What a kind needs is what the tool that reads it checks: http's auth and postgres's connection
arguments are built from the entry here, so the two cannot disagree."""

from __future__ import annotations

from typing import Any

from noetl_stream.dataplane.tools import http, postgres
from noetl_stream.errors import NoetlError

__all__ = ["GENERIC_KINDS", "BadCredentialError", "check_credential", "known_kinds"]

GENERIC_KINDS = ("static", "secret_manager")
"""Kinds whose fields are read as they are (the ``secrets`` tool, ``{{ keychain.<name> }}``): any fields."""
_HTTP_KINDS = http.BEARER_KINDS + http.BASIC_KINDS + http.API_KEY_KINDS


class BadCredentialError(NoetlError, ValueError):
    """No tool could use this keychain entry (the message names what is wrong, never a value)."""


def known_kinds() -> list[str]:
    return sorted({*_HTTP_KINDS, *postgres.CREDENTIAL_KINDS, *GENERIC_KINDS})


def check_credential(name: str, kind: str, fields: dict[str, Any]) -> None:
    """Raise `BadCredentialError` if no tool could use entry `name` of `kind` with `fields`."""
    cred = {**fields, "kind": kind}
    try:
        if kind in _HTTP_KINDS:
            http._apply_auth(cred, name, {}, [])
        elif kind in postgres.CREDENTIAL_KINDS:
            postgres._connect_args(cred, name)
        elif kind not in GENERIC_KINDS:
            raise BadCredentialError(
                f"unknown keychain entry kind {kind!r}: use one of {', '.join(known_kinds())}"
            )
    except (http._ConfigError, postgres._ConfigError) as exc:
        raise BadCredentialError(f"{exc} (its fields: {', '.join(sorted(fields))})") from None
