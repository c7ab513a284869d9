"""The playbook catalog: registered playbooks in the ``<prefix>_catalog`` KV bucket, by path and version.

Keys are ``<path>.<version>``, each part encoded as one KV token: letters, digits, ``-`` and ``_``
stay, every other byte becomes ``=XX`` (``examples/hello`` -> ``examples=2Fhello``, ``1.2`` ->
``1=2E2``), so keys never contain the ``.`` that separates them. ``<path>.latest`` points at the
version registered last (``latest`` is not a valid version name).

A version is immutable and content-addressed: the entry records the sha256 of the text, registering
the same text again is a no-op, and registering other text under an existing version is refused.
A playbook without ``metadata.version`` gets the next number (``1``, ``2``, ...). Texts above
`inline_limit` bytes live in the ``<prefix>_results`` object store under ``catalog/<sha256>``.
An execution started from the catalog carries the resolved text and its hash in its request event,
so replay never depends on the catalog again.
"""

from __future__ import annotations

import builtins
import datetime
import re
from collections.abc import Iterable

import msgspec
import structlog
from nats.js.client import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from noetl_stream.dsl.compiler import compile_playbook
from noetl_stream.errors import NoetlError, StateConflictError
from noetl_stream.kv import scan
from noetl_stream.protocol.operations import CatalogEntryInfo
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import content_hash, decode_json

log = structlog.get_logger(__name__)

__all__ = [
    "LATEST",
    "Catalog",
    "CatalogConflictError",
    "CatalogError",
    "CatalogNotFoundError",
    "decode_part",
    "encode_part",
    "parse_ref",
]

LATEST = "latest"
DEFAULT_INLINE_LIMIT = 256 * 1024
_SAFE = re.compile(r"[A-Za-z0-9_-]")
_MAX_PATH = 256
_MAX_VERSION = 64


class CatalogError(NoetlError, ValueError):
    """A playbook that cannot be registered (``diagnostics`` lists compile errors, if any)."""

    def __init__(self, message: str, diagnostics: list[str] | None = None) -> None:
        super().__init__(message)
        self.diagnostics = diagnostics or []


class CatalogNotFoundError(NoetlError, LookupError):
    """No such path, or no such version of it."""


class CatalogConflictError(StateConflictError):
    """A version that is already registered with other content."""


def encode_part(text: str) -> str:
    """One KV key token for a path or version (reversible, see the module doc)."""
    return "".join(ch if _SAFE.fullmatch(ch) else "".join(f"={b:02X}" for b in ch.encode()) for ch in text)


def decode_part(token: str) -> str:
    out = bytearray()
    i = 0
    while i < len(token):
        if token[i] == "=":
            out.append(int(token[i + 1 : i + 3], 16))
            i += 3
        else:
            out += token[i].encode()
            i += 1
    return out.decode()


def parse_ref(ref: str) -> tuple[str, str | None]:
    """``PATH[@VERSION]`` -> ``(path, version or None)``."""
    path, sep, version = ref.rpartition("@")
    return (path, version or None) if sep and path else (ref, None)


def _check_path(path: str) -> str:
    if not isinstance(path, str) or not path.strip() or len(path) > _MAX_PATH or not path.isprintable():
        raise CatalogError(f"invalid catalog path {path!r}: a printable string of 1-{_MAX_PATH} characters")
    return path


def _check_version(version: str) -> str:
    if (
        not isinstance(version, str)
        or not version.strip()
        or len(version) > _MAX_VERSION
        or not version.isprintable()
        or version == LATEST
    ):
        raise CatalogError(
            f"invalid version {version!r}: a printable string of 1-{_MAX_VERSION} characters, not '{LATEST}'"
        )
    return version


class _Stored(msgspec.Struct, omit_defaults=True):
    path: str
    version: str
    seq: int
    content_hash: str
    name: str
    size: int
    registered_at: str
    description: str | None = None
    text: str | None = None
    object_key: str | None = None
    extensions: list[str] = []
    """DSL extensions the playbook was registered (compiled) with: its executions use them too."""

    def info(self, latest: bool = False) -> CatalogEntryInfo:
        return CatalogEntryInfo(
            path=self.path,
            version=self.version,
            content_hash=self.content_hash,
            name=self.name,
            size=self.size,
            registered_at=self.registered_at,
            storage="object_store" if self.object_key else "kv",
            latest=latest,
            description=self.description,
        )


class _Pointer(msgspec.Struct):
    version: str
    seq: int


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Catalog:
    """Typed access to the catalog bucket of one installation."""

    def __init__(
        self,
        js: JetStreamContext,
        topology: Topology,
        *,
        inline_limit: int = DEFAULT_INLINE_LIMIT,
        extensions: Iterable[str] = (),
    ) -> None:
        self._js = js
        self._topology = topology
        self.inline_limit = inline_limit
        self.extensions = tuple(sorted(set(extensions)))
        """DSL extensions playbooks are compiled with when registered (``legacy``); recorded per entry."""
        self._kv: KeyValue | None = None
        self._objects: ObjectStore | None = None

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            self._kv = await self._js.key_value(self._topology.catalog_bucket)
        return self._kv

    async def _store(self) -> ObjectStore:
        if self._objects is None:
            self._objects = await self._js.object_store(self._topology.results_store)
        return self._objects

    @staticmethod
    def _key(path: str, version: str) -> str:
        return f"{encode_part(path)}.{encode_part(version)}"

    async def _read(self, key: str, type_: type[_Stored] | type[_Pointer]) -> tuple[object | None, int]:
        kv = await self._bucket()
        try:
            entry = await kv.get(key)
        except (KeyNotFoundError, NotFoundError):
            return None, 0
        if not entry.value:
            return None, 0
        return decode_json(entry.value, type_), entry.revision or 0  # msgspec.DecodeError if not one of ours

    async def _entry(self, path: str, version: str) -> _Stored | None:
        value, _ = await self._read(self._key(path, version), _Stored)
        assert value is None or isinstance(value, _Stored)
        return value

    async def _pointer(self, path: str) -> tuple[_Pointer | None, int]:
        value, rev = await self._read(self._key(path, LATEST), _Pointer)
        assert value is None or isinstance(value, _Pointer)
        return value, rev

    # -- register -------------------------------------------------------------------------------
    async def register(self, text: str, file: str = "<playbook>") -> tuple[CatalogEntryInfo, bool]:
        """Store a playbook under its ``metadata.path`` and version; ``(entry, created)``.

        Raises `CatalogError` (does not compile, bad path/version) or `CatalogConflictError`.
        """
        result = compile_playbook(text, file, extensions=self.extensions)
        if result.playbook is None or result.errors:
            errors = [d.format() for d in result.diagnostics if d.severity == "error"]
            raise CatalogError(
                f"invalid playbook: {errors[0] if errors else 'does not compile'}"
                + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""),
                errors,
            )
        meta = result.playbook.metadata
        path = _check_path(meta.path)
        explicit = _check_version(meta.version) if meta.version is not None else None
        digest = content_hash(text)
        for _ in range(16):
            pointer, pointer_rev = await self._pointer(path)
            seq = pointer.seq + 1 if pointer is not None else 1
            if explicit is not None:
                version = explicit
            else:
                if pointer is not None:
                    latest = await self._entry(path, pointer.version)
                    if latest is not None and latest.content_hash == digest:
                        return latest.info(latest=True), False
                version = str(seq)
                while await self._entry(path, version) is not None:
                    seq += 1
                    version = str(seq)
            existing = await self._entry(path, version)
            if existing is not None:
                if existing.content_hash == digest:
                    return existing.info(pointer is not None and pointer.version == version), False
                raise CatalogConflictError(
                    f"{path}@{version} is already registered with other content "
                    f"(sha256 {existing.content_hash[:12]}...): versions are immutable; "
                    "change metadata.version or delete that version first"
                )
            stored = await self._new_entry(text, path, version, seq, digest, meta.name, meta.description)
            kv = await self._bucket()
            try:
                await kv.create(self._key(path, version), msgspec.json.encode(stored))
            except KeyWrongLastSequenceError:
                continue  # registered concurrently: look again
            await self._advance(path, _Pointer(version, seq), pointer, pointer_rev)
            return stored.info(latest=True), True
        raise CatalogConflictError(f"could not register {path}: too many concurrent registrations")

    async def _new_entry(
        self, text: str, path: str, version: str, seq: int, digest: str, name: str, description: str | None
    ) -> _Stored:
        data = text.encode("utf-8")
        object_key: str | None = None
        if len(data) > self.inline_limit:
            object_key = f"catalog/{digest}"
            await (await self._store()).put(object_key, data)
        return _Stored(
            path=path,
            version=version,
            seq=seq,
            content_hash=digest,
            name=name,
            size=len(data),
            registered_at=_now(),
            description=description,
            text=None if object_key else text,
            object_key=object_key,
            extensions=list(self.extensions),
        )

    async def _advance(self, path: str, new: _Pointer, seen: _Pointer | None, rev: int) -> None:
        """Point ``latest`` at ``new`` unless a later registration got there first (CAS)."""
        kv = await self._bucket()
        key = self._key(path, LATEST)
        for _ in range(16):
            if seen is not None and seen.seq >= new.seq:
                return
            try:
                if rev:
                    await kv.update(key, msgspec.json.encode(new), last=rev)
                else:
                    await kv.create(key, msgspec.json.encode(new))
                return
            except KeyWrongLastSequenceError:
                seen, rev = await self._pointer(path)

    # -- read -----------------------------------------------------------------------------------
    async def _resolve_entry(self, path: str, version: str | None) -> tuple[_Stored, bool]:
        _check_path(path)
        pointer, _ = await self._pointer(path)
        if version is None or version == LATEST:
            if pointer is None:
                raise CatalogNotFoundError(f"unknown playbook path '{path}': not in the catalog")
            version = pointer.version
        stored = await self._entry(path, _check_version(version))
        if stored is None:
            if pointer is None:
                raise CatalogNotFoundError(f"unknown playbook path '{path}': not in the catalog")
            raise CatalogNotFoundError(f"playbook '{path}' has no version '{version}' in the catalog")
        return stored, pointer is not None and pointer.version == stored.version

    async def _text(self, stored: _Stored) -> str:
        if stored.text is not None:
            return stored.text
        assert stored.object_key is not None
        result = await (await self._store()).get(stored.object_key)
        try:
            text = (result.data or b"").decode("utf-8")
        except UnicodeDecodeError:
            raise CatalogError(f"{stored.path}@{stored.version}: stored text is not valid UTF-8") from None
        if content_hash(text) != stored.content_hash:
            raise CatalogError(f"{stored.path}@{stored.version}: stored text does not match its sha256")
        return text

    async def resolve(self, path: str, version: str | None = None) -> tuple[CatalogEntryInfo, str]:
        """The entry and text of ``path`` at ``version`` (default ``latest``); `CatalogNotFoundError`."""
        stored, latest = await self._resolve_entry(path, version)
        return stored.info(latest), await self._text(stored)

    async def resolve_for_run(
        self, path: str, version: str | None = None
    ) -> tuple[CatalogEntryInfo, str, tuple[str, ...]]:
        """Like ``resolve``, with the DSL extensions the entry was registered with."""
        stored, latest = await self._resolve_entry(path, version)
        return stored.info(latest), await self._text(stored), tuple(stored.extensions)

    async def info(self, path: str, version: str | None = None) -> CatalogEntryInfo:
        stored, latest = await self._resolve_entry(path, version)
        return stored.info(latest)

    async def list(self, path: str | None = None) -> list[CatalogEntryInfo]:
        """Every entry (or every version of ``path``), by path then registration order."""
        kv = await self._bucket()
        keys = await scan.keys(kv)  # to the end (nats-py's keys() may end before the first key)
        prefix = f"{encode_part(path)}." if path is not None else ""
        latest_suffix = f".{LATEST}"
        out: list[tuple[str, int, CatalogEntryInfo]] = []
        pointers: dict[str, str] = {}
        for key in keys:
            if not key.startswith(prefix):
                continue
            try:
                if key.endswith(latest_suffix):
                    pointer, _ = await self._read(key, _Pointer)
                    if isinstance(pointer, _Pointer):
                        pointers[decode_part(key[: -len(latest_suffix)])] = pointer.version
                    continue
                stored, _ = await self._read(key, _Stored)
            except msgspec.DecodeError as exc:  # a key written by something else: the others still list
                log.warning("catalog.bad_entry", key=key, error=str(exc))
                continue
            if isinstance(stored, _Stored):
                out.append((stored.path, stored.seq, stored.info()))
        out.sort(key=lambda item: (item[0], item[1]))
        return [
            msgspec.structs.replace(info, latest=pointers.get(info.path) == info.version)
            for _, _, info in out
        ]

    # -- delete ---------------------------------------------------------------------------------
    async def delete(self, path: str, version: str | None = None) -> builtins.list[str]:
        """Remove one version (or every version of ``path``); returns the versions removed.

        Executions that ran a removed version keep its text in their history.
        """
        _check_path(path)
        versions = [e for e in await self.list(path) if e.path == path]
        if version is not None and version != LATEST:
            versions = [e for e in versions if e.version == version]
        elif version == LATEST:
            versions = [e for e in versions if e.latest]
        if not versions:
            if version is None:
                raise CatalogNotFoundError(f"unknown playbook path '{path}': not in the catalog")
            raise CatalogNotFoundError(f"playbook '{path}' has no version '{version}' in the catalog")
        kv = await self._bucket()
        removed = []
        for entry in versions:
            stored = await self._entry(path, entry.version)
            await kv.purge(self._key(path, entry.version))
            removed.append(entry.version)
            if stored is not None and stored.object_key:
                await self._drop_blob(stored)
        remaining = [e for e in await self.list(path) if e.path == path]
        if remaining:
            last = remaining[-1]
            stored = await self._entry(path, last.version)
            _, rev = await self._pointer(path)
            if stored is not None:
                new = msgspec.json.encode(_Pointer(stored.version, stored.seq))
                try:
                    await kv.update(self._key(path, LATEST), new, last=rev)
                except KeyWrongLastSequenceError:
                    pass  # a concurrent registration moved it forward: that one is the latest
        else:
            await kv.purge(self._key(path, LATEST))
        return removed

    async def _drop_blob(self, stored: _Stored) -> None:
        """Delete a large text from the object store unless another entry has the same content."""
        if any(e.content_hash == stored.content_hash for e in await self.list()):
            return
        assert stored.object_key is not None
        try:
            await (await self._store()).delete(stored.object_key)
        except NotFoundError:
            pass
