"""Execution snapshots in the ``noetl_executions`` bucket: a state and the stream sequence it reflects.

A state above `INLINE_LIMIT` (a distributed loop over many items keeps them all) does not fit in a KV
value (the server's message limit is 1 MiB): it goes to the object store under a name of its own for
each write, and the KV value is a small pointer to it. The compare-and-set is on the KV key either way,
so fencing holds: a writer whose compare-and-set fails never replaced what the pointer names (it
deletes its own object), and the previous object is deleted once the new pointer is in place.
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from typing import Generic, TypeVar

import msgspec
from nats.js.client import JetStreamContext
from nats.js.errors import (
    APIError,
    InvalidKeyError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoStreamResponseError,
    NotFoundError,
)
from nats.js.kv import VALID_KEY_RE, KeyValue
from nats.js.object_store import ObjectStore

from noetl_stream.errors import StateConflictError, StoreMissingError
from noetl_stream.jetstream.publish import (
    EXPECTED_LAST_SUBJECT_SEQUENCE,
    WRONG_LAST_SEQUENCE,
    WRONG_LAST_SEQUENCE_PENDING,
    publisher,
)
from noetl_stream.kv.results import purge_object
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import guarded

S = TypeVar("S", bound=msgspec.Struct)
MSG_TTL = "Nats-TTL"

INLINE_LIMIT = 512 * 1024
"""Encoded states above this many bytes are stored in the object store, the KV value points to them."""
_POINTER = b'{"$snapshot":'


class _Pointer(msgspec.Struct, frozen=True):
    object: str
    size: int
    sha256: str


class _PointerValue(msgspec.Struct, frozen=True, rename={"snapshot": "$snapshot"}):
    snapshot: _Pointer


_decode_pointer = guarded(msgspec.json.Decoder(_PointerValue))


def _missing(what: str, bucket: str) -> StoreMissingError:
    return StoreMissingError(
        f"the {what} bucket {bucket!r} is not on the server (deleted?): `noetl-stream provision` creates it again"
    )


def pointed_object(value: bytes) -> str | None:
    """The object a snapshot's KV value points to (a snapshot above `INLINE_LIMIT`), else None."""
    return _decode_pointer(value).snapshot.object if value.startswith(_POINTER) else None


class SnapshotStore(Generic[S]):
    """Typed snapshots keyed by execution id; remembers the revision it last read or wrote."""

    def __init__(
        self, kv: KeyValue, type_: type[S], js: JetStreamContext, objects_bucket: str, bucket: str
    ) -> None:
        self.kv = kv
        self._bucket = bucket
        """The KV bucket's name: `put` publishes to ``$KV.<bucket>.<key>`` itself (to set a TTL)."""
        self._decode = guarded(msgspec.json.Decoder(type_))
        self.revisions: dict[str, int] = {}
        self._js = js
        self._objects_bucket = objects_bucket
        self._objects: ObjectStore | None = None
        self._pointers: dict[str, str] = {}
        """The object each large snapshot we last wrote or read lives in (deleted when replaced)."""
        self.inline_limit = INLINE_LIMIT

    @classmethod
    async def open(cls, js: JetStreamContext, topology: Topology, type_: type[S]) -> SnapshotStore[S]:
        bucket = topology.executions_bucket
        return cls(await js.key_value(bucket), type_, js, topology.results_store, bucket)

    async def _object_store(self) -> ObjectStore:
        if self._objects is None:
            self._objects = await self._js.object_store(self._objects_bucket)
        return self._objects

    async def get(self, execution_id: str, *, record: bool = True) -> S | None:
        """The snapshot, remembering its revision for the next `put` (compare-and-set) unless not
        ``record``: a reader that does not write next (deadline timers, inspection) must not make a
        stale writer's next put succeed over a newer owner's snapshot."""
        try:
            entry = await self.kv.get(execution_id)
        except (KeyNotFoundError, NotFoundError):
            return None
        if entry.value is None:
            return None
        if record:  # also when the value turns out unreadable: the writer rebuilding it may replace it
            self.revisions[execution_id] = entry.revision or 0
        return await self.decode(execution_id, entry.value, record=record)

    async def decode(self, execution_id: str, value: bytes, *, record: bool = False) -> S:
        """The snapshot a KV value holds: inline, or in the object it points to (fetched, its checksum
        checked). Raises ``ValueError`` (``msgspec.DecodeError`` included) for a value that is not one."""
        data = value
        if data.startswith(_POINTER):
            pointer = _decode_pointer(data).snapshot
            data = (await (await self._object_store()).get(pointer.object)).data or b""
            if "sha256:" + hashlib.sha256(data).hexdigest() != pointer.sha256:
                raise ValueError(f"snapshot of {execution_id}: object {pointer.object} has another checksum")
            if record:
                self._pointers[execution_id] = pointer.object
        return self._decode(data)

    async def put(self, execution_id: str, state: S, ttl_s: float | None = None) -> None:
        """Compare-and-set: create the key, or update it from the revision this store last saw. With
        `ttl_s` (whole seconds, at least 1), the server removes this value that long after it is written
        (``Nats-TTL``; the bucket allows per-message TTLs).

        Raises ``StateConflictError`` when someone else wrote since (a controller that lost ownership
        of the execution cannot overwrite the owner's snapshot), ``StoreMissingError`` naming the bucket
        when the executions bucket (or, for a large state, the results bucket) is not on the server.
        """
        data = msgspec.json.encode(state)
        name = None
        if len(data) > self.inline_limit:
            name = f"snapshots/{execution_id}/{uuid.uuid4().hex}"
            try:
                await (await self._object_store()).put(name, data)
            except NotFoundError:  # no bucket (BucketNotFoundError), or its stream gone since
                raise _missing("results", self._objects_bucket) from None
            pointer = _Pointer(
                object=name, size=len(data), sha256="sha256:" + hashlib.sha256(data).hexdigest()
            )
            data = msgspec.json.encode(_PointerValue(snapshot=pointer))
        last = self.revisions.get(execution_id)
        try:
            rev = await self._write(execution_id, data, last or 0, ttl_s)
        except KeyWrongLastSequenceError:
            if name is not None:
                await self._delete_object(name)  # ours, never pointed to
            raise StateConflictError(f"snapshot of {execution_id} changed since revision {last}") from None
        self.revisions[execution_id] = rev
        previous = self._pointers.pop(execution_id, None)
        if name is not None:
            self._pointers[execution_id] = name
        if previous is not None and previous != name:
            await self._delete_object(previous)

    async def _write(self, key: str, data: bytes, last: int, ttl_s: float | None) -> int:
        """What ``KeyValue.create``/``update`` do, with a TTL (nats-py's public ones take none): a
        publish on the key's subject that only stores if the key's last revision is `last` (0: no value
        yet, or a deleted one)."""
        if not VALID_KEY_RE.match(key):
            raise InvalidKeyError(key)
        js = self._js
        subject = f"$KV.{self._bucket}.{key}"
        pub = publisher(js._nc)  # (the runtime's publisher: no nats-py request and inbox per write)
        for attempt in range(2):
            try:
                headers = {EXPECTED_LAST_SUBJECT_SEQUENCE: str(last)}
                if ttl_s is not None:
                    headers[MSG_TTL] = str(int(ttl_s))  # whole seconds, as nats-py's msg_ttl
                stored = await pub.acked_with(subject, data, headers, js._timeout)
                return (await stored).seq
            except NoStreamResponseError:  # no stream stores the key's subject: the bucket is gone
                raise _missing("executions", self._bucket) from None
            except APIError as err:
                if err.err_code not in (WRONG_LAST_SEQUENCE, WRONG_LAST_SEQUENCE_PENDING):
                    raise
                if last == 0 and attempt == 0:  # as ``KeyValue.create``: a deleted key may be written again
                    deleted = await self._deleted_revision(js, subject)
                    if deleted is not None:
                        last = deleted
                        continue
                raise KeyWrongLastSequenceError(err.description) from None
        raise AssertionError("unreachable")

    async def _deleted_revision(self, js: JetStreamContext, subject: str) -> int | None:
        """The revision of the key's delete or purge marker, if that is its last message."""
        try:
            msg = await js.get_last_msg(f"KV_{self._bucket}", subject)
        except NotFoundError:
            return None
        operation = (msg.headers or {}).get("KV-Operation")
        return msg.seq if operation in ("DEL", "PURGE") else None

    async def _delete_object(self, name: str) -> None:
        with contextlib.suppress(Exception):  # a leftover object costs space, never correctness
            await purge_object(self._js, self._objects_bucket, name)

    async def put_any(self, execution_id: str, state: S) -> None:
        """Unconditional write (tests and tools only)."""
        self.revisions[execution_id] = await self.kv.put(execution_id, msgspec.json.encode(state))

    def forget(self, execution_id: str) -> None:
        self.revisions.pop(execution_id, None)
        self._pointers.pop(execution_id, None)
