"""The credential store: keychain entries in the ``<prefix>_keychain`` KV bucket, encrypted at rest.

An entry is a name, a kind and a mapping of fields. The kind stays readable (so ``list`` works without
the key); the fields are one Fernet token (AES-128-CBC + HMAC-SHA256, from the ``cryptography``
package). The key comes from ``NOETL_KEYCHAIN_KEY`` (a Fernet key; several comma-separated keys decrypt
with any of them and encrypt with the first, for rotation) or from the file named by
``NOETL_KEYCHAIN_KEY_FILE`` (e.g. a Kubernetes secret mount). Reading or writing a secret without a key
is a `ConfigurationError`; listing and deleting need no key.

Kinds the tools understand (fields in braces)::

    postgres_credential   {host, port, user, password, database} or {dsn}
    bearer / http_bearer  {token}                 Authorization: Bearer <token>
    basic / http_basic    {username, password}    Authorization: Basic ...
    api_key               {value, header?} or {value, param}   header (default X-API-Key) or query parameter
    static / secret_manager  {value} or any fields  read with the `secrets` tool

`redact` replaces secret values anywhere in a structure with ``"***"``; tools apply it to everything
they report about a request made with a credential. What it masks comes from `secret_strings`: each
secret value also in the forms a tool sends it in (URL-encoded in a query, path, userinfo or form body,
a JSON string's escapes, the token of an ``Authorization: Basic`` header), since a server echoes those.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import msgspec
from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyDeletedError, KeyNotFoundError
from nats.js.kv import KeyValue

from noetl_stream.errors import ConfigurationError, NoetlError
from noetl_stream.kv import scan
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import decode_json

__all__ = [
    "KEY_ENV",
    "KEY_FILE_ENV",
    "MASK",
    "NON_SECRET_FIELDS",
    "CredentialNotFoundError",
    "Keychain",
    "KeychainEntry",
    "KeychainKey",
    "encoded_forms",
    "generate_key",
    "redact",
    "secret_strings",
    "secret_values",
]

KEY_ENV = "NOETL_KEYCHAIN_KEY"
KEY_FILE_ENV = "NOETL_KEYCHAIN_KEY_FILE"
MASK = "***"
# Field names whose values are identifiers, not secrets (everything else of an entry is secret), with
# NoETL's names of a postgres credential's (``db_password`` is a secret).
NON_SECRET_FIELDS = frozenset(
    {"host", "port", "database", "dbname", "user", "username", "header", "param", "sslmode", "kind"}
    | {"db_host", "db_port", "db_name", "db_user"}
)
# Secrets shorter than this are only redacted where a whole string equals them: replacing every
# occurrence of "ab" inside unrelated text would make events unreadable without protecting anything.
MIN_SUBSTRING_SECRET = 4
# How URL encoders write a value, as (quote function, characters left as they are): every reserved
# character escaped; urllib's default; a form body or hand-built query (urlencode); a query value as
# aiohttp (yarl) writes it; a path segment (RFC 3986 pchar); a URL's userinfo (user:password@).
_URL_FORMS: tuple[tuple[Callable[..., str], str], ...] = (
    (quote, ""),
    (quote, "/"),
    (quote_plus, ""),
    (quote_plus, "/"),
    (quote_plus, "/?:@!$'()*,"),
    (quote, "/:@!$&'()*+,;="),
    (quote, "!$&'()*+,;="),
)
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")


class CredentialNotFoundError(NoetlError, KeyError):
    """There is no keychain entry of that name."""

    def __str__(self) -> str:
        return f"no keychain entry {self.args[0]!r}"


class KeychainEntry(msgspec.Struct, frozen=True):
    name: str
    kind: str
    fields: dict[str, Any]

    def resolved(self) -> dict[str, Any]:
        """The fields plus ``kind``: what a credential resolver returns."""
        return {**self.fields, "kind": self.kind}


class _Stored(msgspec.Struct, frozen=True):
    """The stored form: the kind in clear, the fields as one Fernet token."""

    kind: str
    secret: str
    updated_at: float = 0.0
    v: int = 1


class KeychainKey:
    """The encryption key(s). The first key encrypts; any of them decrypts."""

    def __init__(self, keys: Iterable[str | bytes]) -> None:
        parsed: list[Fernet] = []
        for key in keys:
            try:
                parsed.append(Fernet(key.strip() if isinstance(key, bytes) else key.strip().encode()))
            except (ValueError, TypeError):
                raise ConfigurationError(
                    "invalid keychain key: expected a Fernet key (32 url-safe base64-encoded bytes); "
                    "make one with `noetl-stream keychain keygen`"
                ) from None
        if not parsed:
            raise ConfigurationError("empty keychain key")
        self._fernet = MultiFernet(parsed)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> KeychainKey | None:
        """The key from ``NOETL_KEYCHAIN_KEY`` or the file named by ``NOETL_KEYCHAIN_KEY_FILE``, if any."""
        env = os.environ if environ is None else environ
        value = env.get(KEY_ENV, "").strip()
        if not value and env.get(KEY_FILE_ENV):
            path = Path(env[KEY_FILE_ENV])
            try:
                value = path.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ConfigurationError(
                    f"cannot read the keychain key file {str(path)!r} ({KEY_FILE_ENV}): {exc.strerror}"
                ) from None
        if not value:
            return None
        return cls([k for k in value.replace("\n", ",").split(",") if k.strip()])

    def encrypt(self, data: bytes) -> str:
        return self._fernet.encrypt(data).decode()

    def decrypt(self, token: str, name: str) -> bytes:
        try:
            return self._fernet.decrypt(token.encode())
        except InvalidToken:
            raise ConfigurationError(
                f"cannot decrypt keychain entry {name!r}: it was encrypted with a different key "
                f"(check {KEY_ENV} / {KEY_FILE_ENV})"
            ) from None


def generate_key() -> str:
    """A new random Fernet key."""
    return Fernet.generate_key().decode()


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ConfigurationError(
            f"invalid keychain name {name!r}: use letters, digits, '_' or '-' (not starting with '-')"
        )
    return name


class Keychain:
    """Typed access to the keychain bucket of one installation."""

    def __init__(
        self,
        js: JetStreamContext,
        topology: Topology,
        key: KeychainKey | None = None,
        *,
        from_env: bool = True,
    ) -> None:
        self._js = js
        self._bucket = topology.keychain_bucket
        self._key = key
        self._key_from_env = from_env and key is None
        self._kv: KeyValue | None = None

    @property
    def key(self) -> KeychainKey:
        if self._key is None and self._key_from_env:
            self._key = KeychainKey.from_env()
        if self._key is None:
            raise ConfigurationError(
                f"no keychain key: set {KEY_ENV} (or {KEY_FILE_ENV}) to read or write secrets; "
                "make one with `noetl-stream keychain keygen`"
            )
        return self._key

    async def _store(self) -> KeyValue:
        if self._kv is None:
            try:
                self._kv = await self._js.key_value(self._bucket)
            except BucketNotFoundError:
                raise ConfigurationError(
                    f"keychain bucket {self._bucket!r} does not exist: run `noetl-stream provision`"
                ) from None
        return self._kv

    async def put(self, name: str, kind: str, fields: Mapping[str, Any]) -> None:
        """Create or replace entry `name`."""
        check_name(name)
        if not isinstance(kind, str) or not kind:
            raise ConfigurationError(f"keychain entry {name!r} needs a kind")
        if "kind" in fields:
            raise ConfigurationError(f"keychain entry {name!r}: 'kind' is not a field name (use the kind)")
        token = self.key.encrypt(msgspec.json.encode(dict(fields)))
        stored = _Stored(kind=kind, secret=token, updated_at=time.time())
        kv = await self._store()
        await kv.put(name, msgspec.json.encode(stored))

    async def _stored(self, name: str) -> _Stored:
        check_name(name)
        kv = await self._store()
        try:
            entry = await kv.get(name)
        except (KeyNotFoundError, KeyDeletedError):
            raise CredentialNotFoundError(name) from None
        if not entry.value:
            raise CredentialNotFoundError(name)
        return decode_json(entry.value, _Stored)

    async def get(self, name: str) -> KeychainEntry:
        """The decrypted entry (raises `CredentialNotFoundError`, or `ConfigurationError` without a key)."""
        stored = await self._stored(name)
        fields = decode_json(self.key.decrypt(stored.secret, name), object)
        if not isinstance(fields, dict):
            raise ConfigurationError(f"keychain entry {name!r} is corrupt (fields are not a mapping)")
        return KeychainEntry(name=name, kind=stored.kind, fields=fields)

    async def kind(self, name: str) -> str:
        """The kind of entry `name`, without decrypting it."""
        return (await self._stored(name)).kind

    async def list(self) -> list[tuple[str, str]]:
        """``(name, kind)`` of every entry, sorted by name. Needs no key."""
        kv = await self._store()
        names = await scan.keys(kv)  # to the end (nats-py's keys() may end before the first key)
        out = []
        for name in sorted(names):
            try:
                out.append((name, (await self._stored(name)).kind))
            except CredentialNotFoundError:
                continue  # deleted meanwhile
        return out

    async def delete(self, name: str) -> bool:
        """Remove entry `name` (its encrypted value too); False when there was none."""
        check_name(name)
        kv = await self._store()
        try:
            await kv.get(name)
        except (KeyNotFoundError, KeyDeletedError):
            return False
        await kv.purge(name)
        return True

    def resolver(self, cache_s: float = 2.0) -> Callable[[str], Awaitable[dict[str, Any]]]:
        """A credential resolver for ``WorkerServices``: name -> fields plus ``kind``.

        Entries are cached for `cache_s` seconds, so a hot loop of tasks with ``auth`` does not read KV
        for every task while a changed credential is picked up soon after.
        """
        cache: dict[str, tuple[float, dict[str, Any]]] = {}

        async def resolve(name: str) -> dict[str, Any]:
            now = time.monotonic()
            hit = cache.get(name)
            if hit is not None and now - hit[0] < cache_s:
                return dict(hit[1])
            value = (await self.get(name)).resolved()
            cache[name] = (now, value)
            return dict(value)

        return resolve


def secret_values(fields: Mapping[str, Any]) -> set[str]:
    """The values of an entry (or resolved credential) that must never be shown.

    Every string (and number) leaf of the fields except identifiers such as ``host``, ``user`` and
    ``header`` (`NON_SECRET_FIELDS`).
    """
    out: set[str] = set()

    def leaves(value: Any) -> None:
        if isinstance(value, str):
            if value:
                out.add(value)
        elif isinstance(value, bool) or value is None:
            return
        elif isinstance(value, (int, float)):
            out.add(str(value))
        elif isinstance(value, Mapping):
            for v in value.values():
                leaves(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                leaves(v)

    for key, value in fields.items():
        if key not in NON_SECRET_FIELDS:
            leaves(value)
    return out


def encoded_forms(value: str) -> set[str]:
    """`value` and the encoded forms a tool may send it in, so that a server echoing the request
    (``/items?key=AK%2B%2Fx``) does not show it: URL-encoded (a query, a path, a URL's userinfo, a form
    body: `_URL_FORMS`) and escaped in a JSON string (a ``json`` body; ``\"``, ``\\``, ``\u00e9``).

    A value shorter than `MIN_SUBSTRING_SECRET` only as it is: `redact` masks it only where a whole
    value equals it, and its encoded forms (longer) would be masked inside any text.
    """
    if len(value) < MIN_SUBSTRING_SECRET:
        return {value}
    json_forms = {msgspec.json.encode(value).decode()[1:-1], json.dumps(value)[1:-1]}
    return {value} | json_forms | {encode(value, safe=safe) for encode, safe in _URL_FORMS}


def _basic_tokens(fields: Mapping[str, Any]) -> set[str]:
    """The token of the ``Authorization: Basic <token>`` header the fields' user name and password make
    (with and without its ``=`` padding); none without a password. A short password gives a token of
    at least 4 characters that reads as noise, so masking it inside any text garbles nothing."""
    user = fields.get("username", fields.get("user"))
    password = fields.get("password")
    if isinstance(password, (int, float)) and not isinstance(password, bool):
        password = str(password)
    if not isinstance(user, str) or not isinstance(password, str) or not password:
        return set()
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {token, token.rstrip("=")}


def secret_strings(value: Any) -> set[str]:
    """The strings to redact for a secret value: a mapping's secret values as in `secret_values` (else
    every leaf), each also in its URL-encoded forms (`encoded_forms`), and the token of the Basic
    authorization header a mapping's user name and password make.

    Remembered by the value's JSON (`SECRETS_REMEMBERED` of them): a loop's tasks ask for the same
    credential's every time."""
    try:
        key = msgspec.json.encode(value)
    except (TypeError, ValueError):  # (not JSON: worked out each time)
        return _secret_strings(value)
    known = _SECRETS.get(key)
    if known is None:
        if len(_SECRETS) >= SECRETS_REMEMBERED:
            _SECRETS.clear()
        known = _SECRETS[key] = frozenset(_secret_strings(value))
    return set(known)


SECRETS_REMEMBERED = 256
_SECRETS: dict[bytes, frozenset[str]] = {}


def _secret_strings(value: Any) -> set[str]:
    fields = value if isinstance(value, Mapping) else {"value": value}
    out = _basic_tokens(fields)
    for secret in secret_values(fields):
        out |= encoded_forms(secret)
    return out


class Redactor:
    """Replaces every one of a set of secret values with ``"***"`` in a copy of a value: in strings, keys
    and bytes. Built once for a set of secrets (one pattern), applied to whatever a step run reports.

    Secrets of at least 4 characters are replaced wherever they occur inside a string (an error
    message quoting a DSN, a ``Bearer <token>`` header); shorter ones only where a whole value equals
    them. Non-string leaves equal to a secret's text (a numeric PIN) are masked too.
    """

    __slots__ = ("_anywhere", "_exact", "_numeric", "_pattern")

    def __init__(self, secrets: Iterable[str]) -> None:
        self._exact = frozenset(s for s in secrets if isinstance(s, str) and s)
        long = sorted((s for s in self._exact if len(s) >= MIN_SUBSTRING_SECRET), key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(s) for s in long)) if long else None
        everything = sorted(self._exact, key=len, reverse=True)
        self._anywhere = re.compile(
            b"|".join(re.escape(s.encode("utf-8", "surrogatepass")) for s in everything)
        )
        """Any secret, as bytes: searched in a container's MessagePack form (`__call__`)."""
        self._numeric = any(_number_text(s) for s in self._exact)
        """A secret is a number's text (a PIN): numbers are binary in MessagePack, so always walk."""

    def __bool__(self) -> bool:
        return bool(self._exact)

    def text(self, s: str) -> str:
        if s in self._exact:
            return MASK
        return self._pattern.sub(MASK, s) if self._pattern is not None else s

    def __call__(self, value: Any) -> Any:
        """A copy of `value` with the secrets masked; `value` itself when a container holds none of them.

        A container is first looked at whole: its MessagePack form holds every string, key and bytes
        value as it is (UTF-8, no escaping), so a secret found nowhere in it is in none of them, and the
        walk that copies it is skipped (the usual case: a task's result holds no credential)."""
        if not self._exact or value is None:
            return value
        t = type(value)
        if t is str:
            return self.text(value)
        if (t is dict or t is list) and not self._numeric:
            try:
                packed = _PACK(value)
            except (TypeError, ValueError, OverflowError):  # (not plain data: walked)
                pass
            else:
                if self._anywhere.search(packed) is None:
                    return value
        return self._walk(value)

    def _walk(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {(self.text(k) if isinstance(k, str) else k): self._walk(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self._walk(v) for v in value]
        if isinstance(value, (bytes, bytearray)):
            try:
                decoded = bytes(value).decode()
            except UnicodeDecodeError:
                return value
            masked = self.text(decoded)
            return masked.encode() if masked != decoded else value
        if isinstance(value, (int, float)) and not isinstance(value, bool) and str(value) in self._exact:
            return MASK
        return value


_PACK = msgspec.msgpack.Encoder().encode


def _number_text(s: str) -> bool:
    """Whether `s` may be the text of a number (``str`` of an int or float)."""
    try:
        float(s)
    except ValueError:
        return False
    return True


def redact(obj: Any, secrets: Iterable[str]) -> Any:
    """A copy of `obj` with every secret value replaced by ``"***"`` (`Redactor`)."""
    return redactor(frozenset(secrets))(obj)


@functools.lru_cache(maxsize=256)
def redactor(secrets: frozenset[str]) -> Redactor:
    """The `Redactor` of `secrets`, built once (its pattern compiled once) for every task that hides them."""
    return Redactor(secrets)
