"""What a keychain entry must hold for a tool to use it (`dataplane/credentials.py`), checked when it is
stored (`keychain set`, `PUT /api/keychain/{name}`: their end-to-end tests cover two cases each). Pure:
the tools' own readers run on the entry."""

from __future__ import annotations

from typing import Any

import pytest

from noetl_stream.dataplane.credentials import BadCredentialError, check_credential


@pytest.mark.parametrize(
    ("kind", "fields", "said"),
    [
        ("http_basic", {"password": "p-123456"}, "keychain entry 'e' (kind http_basic) has no 'username'"),
        ("api_key", {"header": "X-Key"}, "keychain entry 'e' (kind api_key) has no 'value'"),
        ("postgres_credential", {"user": "u", "password": "p-123456"}, "needs 'host' (or a 'dsn')"),
        ("postgres_credential", {"host": "db", "port": "fivefourthreetwo"}, "port must be a number"),
        ("nosuchkind", {"a": "b"}, "unknown keychain entry kind 'nosuchkind'"),
    ],
)
def test_an_entry_no_tool_could_use_is_refused_naming_what_is_missing(
    kind: str, fields: dict[str, Any], said: str
) -> None:
    with pytest.raises(BadCredentialError) as exc:
        check_credential("e", kind, fields)
    assert said in str(exc.value)
    assert "p-123456" not in str(exc.value)  # fields are named, values never shown


@pytest.mark.parametrize(
    ("kind", "fields"),
    [
        ("static", {"anything": 1}),
        ("bearer", {"token": "t"}),
        ("basic", {"username": "u", "password": "p"}),
        ("api_key", {"value": "v", "param": "appid"}),
        ("postgres_credential", {"dsn": "postgresql://u:p@db/x"}),
        ("postgres_credential", {"host": "db", "port": "5432", "user": "u"}),
    ],
)
def test_entries_the_tools_take_pass(kind: str, fields: dict[str, Any]) -> None:
    check_credential("e", kind, fields)
