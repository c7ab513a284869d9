"""Credentials written into URLs, masked by the URL's structure, never by searching the text.

A URL can carry a credential in two places: the password of its userinfo (``https://user:pw@host``) and
the values of query parameters named like credentials (``access_token``, ``key``, ``sig``, ...
`SENSITIVE_PARAMS`, plus the ``names`` a caller adds: the ``param`` of the ``api_key`` credential a
request uses), also in the fragment (``#access_token=...``, OAuth's implicit flow). `masked_url`
replaces exactly those parts of one URL with ``***``; `mask_urls` does so for every URL inside a text (an
exception's message, a ``Link`` or ``Location`` header, a relative ``/path?key=...`` included).

Only the parts of URLs are masked: a value that also occurs elsewhere in the text stays as it is there
(``key=auth`` must not turn the status reason ``Unauthorized`` into ``Un***orized``). The rest of a URL
keeps its exact text (no re-encoding), and a URL that is not valid (a port past 65535) is masked alike.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection
from urllib.parse import unquote_plus

from noetl_stream.kv.keychain import MASK

__all__ = ["SENSITIVE_PARAMS", "mask_urls", "masked_url"]

SENSITIVE_PARAMS = frozenset(
    {
        "access_token", "token", "id_token", "refresh_token", "api_key", "apikey", "key", "password",
        "passwd", "secret", "client_secret", "signature", "sig", "auth", "x-amz-signature",
        "x-amz-credential", "x-amz-security-token",
    }
)  # fmt: skip
# A URL with a scheme, up to what ends a URL in text: white space, a quote or an angle bracket.
_ABSOLUTE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]*")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
# A ``name=value`` pair of a query string or fragment, wherever a text has one (relative URLs too).
_PAIR = re.compile(r"(?<=[?&#])([^=&#?\s\"'<>]+)=([^&#\s\"'<>]*)")


def _sensitive(name: str, names: Collection[str]) -> bool:
    key = unquote_plus(name).strip().lower()
    return key in SENSITIVE_PARAMS or key in names


def _pairs(part: str, names: Collection[str]) -> str:
    """A query string or fragment (``a=1&key=x``) with the values of credential-named pairs masked."""
    items = []
    for item in part.split("&"):
        name, eq, value = item.partition("=")
        items.append(f"{name}={MASK}" if eq and value and _sensitive(name, names) else item)
    return "&".join(items)


def masked_url(url: str, names: Collection[str] = ()) -> str:
    """`url` with its userinfo password and the values of query (and fragment) parameters named like
    credentials (or one of `names`, lower-case) as ``***``; every other character as it was. (Worked out
    once per URL and names: a loop's tasks mask the same URL each time.)"""
    return _masked_url(url, frozenset(names))  # (a frozenset is itself: no copy)


@functools.lru_cache(maxsize=1024)
def _masked_url(url: str, names: frozenset[str]) -> str:
    rest, hash_, fragment = url.partition("#")
    rest, qmark, query = rest.partition("?")
    scheme = _SCHEME.match(rest)
    if scheme is not None:
        authority, slash, path = rest[scheme.end() :].partition("/")
        userinfo, at, host = authority.rpartition("@")  # the last @ ends it: a raw @ in a password too
        user, colon, password = userinfo.partition(":")
        if at and colon and password:
            rest = f"{scheme.group(0)}{user}:{MASK}@{host}{slash}{path}"
    if qmark:
        query = _pairs(query, names)
    if hash_ and "=" in fragment:
        fragment = _pairs(fragment, names)
    return f"{rest}{qmark}{query}{hash_}{fragment}"


def mask_urls(text: str, names: Collection[str] = ()) -> str:
    """`text` with the credentials of every URL in it masked as in `masked_url`: those of URLs with a
    scheme (which end at white space, a quote or an angle bracket), and the values of credential-named
    ``name=value`` pairs after a ``?``, ``&`` or ``#`` (relative URLs: ``/items?key=...``)."""

    def pair(match: re.Match[str]) -> str:
        name, value = match.group(1), match.group(2)
        return f"{name}={MASK}" if value and _sensitive(name, names) else match.group(0)

    if "://" in text:
        text = _ABSOLUTE.sub(lambda m: masked_url(m.group(0), names), text)
    if "=" in text and ("?" in text or "&" in text or "#" in text):  # (a pair follows one of them)
        text = _PAIR.sub(pair, text)
    return text
