"""A worker's pipeline checkpoints: the KV record, with large values kept in the results object store.

A checkpoint holds what a resumed run needs to go on (`Checkpoint`): the next task, ``iter``, ``_prev``,
the ctx patches and the results of the tasks that ran, by name (later tasks read them, e.g. a token or
a cursor). Those results are the values the tasks returned, of any size, while the KV record must stay
small (a NATS message). So the results and ``_prev`` are kept inline up to `budget` bytes together
(the step's inline limit, at most 512 KiB): above it, the largest go to the results object store under
``<execution_id>/<scope id>[~<delivery>]/checkpoint/<name>``, one object per name (overwritten at the
next checkpoint, stored again only when the value changed), and the record carries their references,
as events do. The record's size is then bounded by the budget plus one reference per task; ``iter``
and the ctx patches are the run's state and stay inline as they are.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any

import msgspec

from noetl_stream.kv.checkpoints import KvCheckpoints
from noetl_stream.kv.results import ResultStore
from noetl_stream.protocol.refs import REF, is_ref
from noetl_stream.protocol.wire import Checkpoint

PREV = "_prev"
"""The object name of a large ``_prev`` (a reserved name: no task has it)."""

_encode = msgspec.json.Encoder().encode


class Checkpoints:
    """The `CheckpointStore` of one command's pipelines (pipeline.py)."""

    def __init__(self, kv: KvCheckpoints, results: ResultStore, budget: int, tag: str = "") -> None:
        self.kv = kv
        self.results = results
        self.budget = budget
        """Bytes of results and ``_prev`` a record carries inline."""
        self.tag = tag
        """``~<delivery>`` of a redelivery: its objects are its own, never another delivery's."""
        self._stored: dict[str, tuple[str, dict[str, Any]]] = {}
        """Object key -> (checksum, reference) of what this delivery stored."""

    def _key(self, scope_id: str, name: str) -> str:
        return f"{self.kv.execution_id}/{scope_id}{self.tag}/checkpoint/{name}"

    async def save(self, scope_id: str, checkpoint: Checkpoint) -> None:
        parts = {name: _encode(value) for name, value in checkpoint.results.items()}
        parts[PREV] = _encode(checkpoint.prev)
        total = sum(len(data) for data in parts.values())
        for name in sorted(parts, key=lambda n: len(parts[n]), reverse=True):
            if total <= self.budget:
                break
            data = parts[name]
            ref = _encode(await self._put(self._key(scope_id, name), data))
            total += len(ref) - len(data)
            parts[name] = ref
        prev = msgspec.Raw(parts.pop(PREV))
        results = {name: msgspec.Raw(data) for name, data in parts.items()}
        await self.kv.save(scope_id, msgspec.structs.replace(checkpoint, results=results, prev=prev))

    async def load(self, scope_id: str) -> Checkpoint | None:
        checkpoint = await self.kv.load(scope_id)
        if checkpoint is None:
            return None
        prefix = f"{self.kv.execution_id}/{scope_id}"
        results = {name: await self._get(value, prefix) for name, value in checkpoint.results.items()}
        prev = await self._get(checkpoint.prev, prefix)
        return msgspec.structs.replace(checkpoint, results=results, prev=prev)

    async def clear(self, scope_id: str) -> None:
        await self.kv.clear(scope_id)
        doomed = [key for key in self._stored if key.startswith(self._key(scope_id, ""))]
        for key in doomed:
            del self._stored[key]
            # What is left (a failed delete, an earlier delivery's objects) goes with the execution's
            # other objects (`noetl-stream prune`); the run itself has ended well.
            with contextlib.suppress(Exception):
                await self.results.delete(key)

    async def _put(self, key: str, data: bytes) -> dict[str, Any]:
        checksum = hashlib.sha256(data).hexdigest()
        stored = self._stored.get(key)
        if stored is not None and stored[0] == checksum:
            return stored[1]
        ref = await self.results.put_encoded(key, data)
        self._stored[key] = (checksum, ref)
        return ref

    async def _get(self, value: Any, prefix: str) -> Any:
        """A value `save` stored by reference, fetched; any other value as it is."""
        if is_ref(value) and str(value[REF].get("key", "")).startswith(prefix):
            return await self.results.get(value)
        return value
