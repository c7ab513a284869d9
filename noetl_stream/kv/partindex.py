"""Indexes of executions by partition in the ``noetl_executions`` bucket, beside the snapshots.

Keys ``<prefix>.<partition>.<execution_id>`` with a small JSON value each. An execution id is one subject
token, so an index key never collides with a snapshot's (a snapshot's key is the execution id:
`is_snapshot_key`). A controller that takes a partition over lists only that partition's keys
(`PartitionIndex.values_of`, which each index's ``of_partition`` wraps), however many executions the
bucket holds; a key is removed with a purge marker that expires (`forget`), so nothing is left behind.
"""

from __future__ import annotations

from typing import ClassVar, Generic, Self, TypeVar, cast

import msgspec
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

from noetl_stream.kv import scan
from noetl_stream.kv.forget import forget_key
from noetl_stream.protocol.subjects import Topology

__all__ = ["PartitionIndex", "is_snapshot_key"]

V = TypeVar("V", bound=msgspec.Struct)


def is_snapshot_key(key: str) -> bool:
    """A key of the executions bucket that holds an execution's snapshot (not an index's)."""
    return "." not in key


class PartitionIndex(Generic[V]):
    """One index: its key `prefix` and the struct of its values (`value_type`), set by each subclass."""

    prefix: ClassVar[str]
    value_type: ClassVar[type[msgspec.Struct]]

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv
        self._decoder = msgspec.json.Decoder(self.value_type)

    @classmethod
    async def open(cls, js: JetStreamContext, topology: Topology) -> Self:
        return cls(await js.key_value(topology.executions_bucket))

    @classmethod
    def key(cls, partition: int, execution_id: str) -> str:
        return f"{cls.prefix}.{partition}.{execution_id}"

    async def put(self, partition: int, execution_id: str, value: V) -> None:
        await self.kv.put(self.key(partition, execution_id), msgspec.json.encode(value))

    async def remove(self, partition: int, execution_id: str) -> None:
        """Forget the key (a purge marker that expires: nothing is left behind, see `forget`)."""
        await forget_key(self.kv, self.key(partition, execution_id))

    async def values_of(self, partition: int) -> list[tuple[str, V]]:
        """``(execution_id, value)`` of the partition's keys (one filtered read to the end: `scan.entries`,
        not nats-py's watch, which may end before the first value); a value that does not decode is
        skipped."""
        prefix = f"{self.prefix}.{partition}."
        out: list[tuple[str, V]] = []
        async for entry in scan.entries(self.kv, prefix + "*"):
            if not entry.value or not entry.key.startswith(prefix):
                continue
            try:
                value = cast(V, self._decoder.decode(entry.value))
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            out.append((entry.key[len(prefix) :], value))
        return out
