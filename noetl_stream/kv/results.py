"""Reference-first results (001 §14, 003 §10): large values live in the object store.

An event, a snapshot or a command never carries a value above the inline limit: the value is put in
the ``noetl_results`` object store and replaced by a reference::

    {"$ref": {"store": "nats.object_store", "bucket": "noetl_results",
              "key": "<execution_id>/<step_run_id>[.<index>]/result", "size": 20971552,
              "checksum": "sha256:..."}}

Workers resolve the references a step reads before they run it.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
from typing import Any

import msgspec
from nats.js.client import JetStreamContext
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.object_store import (
    OBJ_CHUNKS_PRE_TEMPLATE,
    OBJ_META_PRE_TEMPLATE,
    OBJ_STREAM_TEMPLATE,
    ObjectStore,
)

from noetl_stream.errors import StoreMissingError
from noetl_stream.protocol.refs import REF
from noetl_stream.protocol.subjects import Topology

DEFAULT_INLINE_LIMIT = 256 * 1024


def inline_limit(executor_spec: dict[str, Any]) -> int:
    """``executor.spec.policy.limits.max_payload_bytes`` (default 256 KiB), never above 512 KiB."""
    policy = executor_spec.get("policy") if isinstance(executor_spec, dict) else None
    limits = policy.get("limits") if isinstance(policy, dict) else None
    value = limits.get("max_payload_bytes") if isinstance(limits, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return min(value, 512 * 1024)
    return DEFAULT_INLINE_LIMIT


READ_BASE_S = 10.0
READ_S_PER_MIB = 1.0


async def purge_object(js: JetStreamContext, bucket: str, key: str, nuid: str | None = None) -> bool:
    """Remove object `key` of store `bucket` and every message of it (`ResultStore.delete`)."""
    stream = OBJ_STREAM_TEMPLATE.format(bucket=bucket)
    meta = OBJ_META_PRE_TEMPLATE.format(bucket=bucket, obj=base64.urlsafe_b64encode(key.encode()).decode())
    try:
        last = await js.get_last_msg(stream, meta)
    except NotFoundError:
        return False
    info = msgspec.json.decode(last.data or b"{}")
    if nuid is not None and (not isinstance(info, dict) or info.get("nuid") != nuid):
        return False
    if isinstance(info, dict) and info.get("nuid"):
        chunks = OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=bucket, obj=info["nuid"])
        await js.purge_stream(stream, subject=chunks)
    await js.purge_stream(stream, seq=(last.seq or 0) + 1, subject=meta)
    return True


class ResultStore:
    def __init__(self, js: JetStreamContext, topology: Topology) -> None:
        self.js = js
        self.topology = topology
        self._store: ObjectStore | None = None

    async def _bucket(self) -> ObjectStore:
        if self._store is None:
            try:
                self._store = await self.js.object_store(self.topology.results_store)
            except BucketNotFoundError:
                raise self._missing() from None
        return self._store

    def _missing(self) -> StoreMissingError:
        return StoreMissingError(
            f"the results bucket {self.topology.results_store!r} is not on the server (deleted?): "
            "`noetl-stream provision` creates it again"
        )

    async def put(self, key: str, value: Any) -> dict[str, Any]:
        """Store ``value`` (JSON) and return its reference."""
        return await self.put_encoded(key, msgspec.json.encode(value))

    async def put_encoded(self, key: str, data: bytes | bytearray) -> dict[str, Any]:
        """Store ``data`` (already encoded JSON, or any bytes) and return its reference."""
        store = await self._bucket()
        try:
            await store.put(key, data if isinstance(data, bytes) else bytes(data))
        except NotFoundError:  # its stream is gone (an object that is not there yet is no error here)
            raise self._missing() from None
        return {
            REF: {
                "store": "nats.object_store",
                "bucket": self.topology.results_store,
                "key": key,
                "size": len(data),
                "checksum": "sha256:" + hashlib.sha256(data).hexdigest(),
            }
        }

    async def get(self, ref: dict[str, Any]) -> Any:
        """The value behind a reference (its checksum is verified)."""
        info = ref[REF]
        size = info.get("size")
        data = await self.get_encoded(
            str(info["key"]), info.get("checksum") or "", size if isinstance(size, int) else None
        )
        return msgspec.json.decode(data)

    async def get_encoded(self, key: str, checksum: str = "", size: int | None = None) -> bytes:
        """The bytes stored under ``key``, checked against ``checksum`` when given.

        nats-py reads the chunks through a consumer without a deadline: an object deleted while it is
        read (its chunks purged after its meta was read) would make it wait forever. The read gets
        ``READ_BASE_S`` plus ``READ_S_PER_MIB`` per MiB of the object (``size``, from a reference, or
        read from its meta first), then raises ``TimeoutError``."""
        store = await self._bucket()
        if size is None:
            size = (await store.get_info(key)).size or 0
        async with asyncio.timeout(READ_BASE_S + READ_S_PER_MIB * size / 2**20):
            result = await store.get(key)
        data = result.data or b""
        if checksum and "sha256:" + hashlib.sha256(data).hexdigest() != checksum:
            raise ValueError(f"result {key}: checksum mismatch")
        return data

    async def delete(self, key: str, nuid: str | None = None) -> bool:
        """Remove the object stored under ``key``, leaving none of its messages in the bucket's stream.

        Its chunks first, then its meta up to the sequence read (a put of the same key after it
        survives): an attempt cut short leaves the meta, which the next one finds and finishes (the
        other order could leave chunks that no meta names). nats-py's ``ObjectStore.delete`` would also
        write a "deleted" meta kept for good, and purge the chunks itself. A reader caught between the
        two purges fails its read's deadline (`get_encoded`). False when nothing was stored under
        ``key``, or (with `nuid`) when what is stored now is another object than the one named by it (the
        key was written again since it was listed).
        """
        return await purge_object(self.js, self.topology.results_store, key, nuid)

    async def resolve(self, value: Any) -> Any:
        """``value`` with every reference inside it, at any depth, fetched (`kv.refs.resolve_refs`)."""
        from noetl_stream.kv.refs import resolve_refs  # (refs.py reads this module's names)

        return await resolve_refs(value, self.get)
