"""The running child executions, by partition, and the parent of each.

Keys ``child.<partition>.<child_execution_id>`` in the ``noetl_executions`` bucket (an execution id is one
subject token, so they never collide with a snapshot's key), value ``{"parent": <execution_id>}``. The
controller writes a key when it first records a running child execution and removes it (its purge
marker expires, see `forget`) when the child ends. A controller that takes a partition over lists only
that partition's keys: they name the children it must cancel when their parent ends, among them those
it has no reason to load (a child in a long step sends no event).
"""

from __future__ import annotations

import msgspec
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

from noetl_stream.kv import scan
from noetl_stream.kv.forget import forget_key
from noetl_stream.subjects import Topology

PREFIX = "child"


class _Child(msgspec.Struct, frozen=True):
    parent: str


_decoder = msgspec.json.Decoder(_Child)


class ChildIndex:
    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    @classmethod
    async def open(cls, js: JetStreamContext, topology: Topology) -> ChildIndex:
        return cls(await js.key_value(topology.executions_bucket))

    @staticmethod
    def key(partition: int, child_id: str) -> str:
        return f"{PREFIX}.{partition}.{child_id}"

    async def add(self, partition: int, child_id: str, parent_id: str) -> None:
        await self.kv.put(self.key(partition, child_id), msgspec.json.encode(_Child(parent_id)))

    async def remove(self, partition: int, child_id: str) -> None:
        """Forget the key (a purge marker that expires: nothing is left behind, see `forget`)."""
        await forget_key(self.kv, self.key(partition, child_id))

    async def of_partition(self, partition: int) -> list[tuple[str, str]]:
        """``(child_execution_id, parent_execution_id)`` of the partition's indexed children (one filtered
        read to the end: `scan.entries`)."""
        prefix = f"{PREFIX}.{partition}."
        out: list[tuple[str, str]] = []
        async for entry in scan.entries(self.kv, prefix + "*"):
            if not entry.value or not entry.key.startswith(prefix):
                continue
            try:
                child = _decoder.decode(entry.value)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            out.append((entry.key[len(prefix) :], child.parent))
        return out
