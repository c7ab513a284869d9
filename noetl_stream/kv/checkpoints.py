"""Per-run checkpoints in the ``noetl_loops`` bucket: where a paginating pipeline stands.

Key ``<execution_id>.<step_run_id>[.<iteration>]``; value: the next task, ``iter``, ``_prev`` and the
ctx patches so far. Written at each backward jump, read only when a command is redelivered, removed
when the run ends (its purge marker expires, see `forget`).
"""

from __future__ import annotations

import msgspec
from nats.js.client import JetStreamContext
from nats.js.errors import KeyDeletedError, KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from noetl_stream.kv.forget import forget_key
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Checkpoint, guarded

_decode = guarded(msgspec.json.Decoder(Checkpoint))
_BUCKETS: dict[tuple[int, str], KeyValue] = {}
"""Bucket handles by JetStream context (looking a bucket up costs an API round trip)."""


class KvCheckpoints:
    def __init__(self, js: JetStreamContext, topology: Topology, execution_id: str) -> None:
        self.js = js
        self.topology = topology
        self.execution_id = execution_id
        self._kv: KeyValue | None = None

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            key = (id(self.js), self.topology.loops_bucket)
            kv = _BUCKETS.get(key)
            if kv is None:
                kv = _BUCKETS[key] = await self.js.key_value(self.topology.loops_bucket)
            self._kv = kv
        return self._kv

    def _key(self, scope_id: str) -> str:
        return f"{self.execution_id}.{scope_id}"

    async def save(self, scope_id: str, checkpoint: Checkpoint) -> None:
        kv = await self._bucket()
        await kv.put(self._key(scope_id), msgspec.json.encode(checkpoint))

    async def load(self, scope_id: str) -> Checkpoint | None:
        kv = await self._bucket()
        try:
            entry = await kv.get(self._key(scope_id))
        except (KeyNotFoundError, KeyDeletedError, NotFoundError):
            return None
        return _decode(entry.value) if entry.value else None

    async def clear(self, scope_id: str) -> None:
        """Forget the run's checkpoint (a purge marker that expires: nothing is left behind)."""
        await forget_key(await self._bucket(), self._key(scope_id))
