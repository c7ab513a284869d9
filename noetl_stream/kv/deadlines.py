"""The executions that have a deadline and are not finished, by partition.

Keys ``deadline.<partition>.<execution_id>`` in the ``noetl_executions`` bucket (an execution id is one
subject token, so they never collide with a snapshot's key), value ``{"deadline_at": <epoch s>}``. The
controller writes a key when it first folds an execution with a deadline and removes it (its purge
marker expires, see `forget`) when the execution ends; a controller that takes a partition over lists
only that partition's keys to re-arm its timers, however many executions the bucket holds.
"""

from __future__ import annotations

import msgspec
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

from noetl_stream.kv import children, scan
from noetl_stream.kv.forget import forget_key
from noetl_stream.subjects import Topology

PREFIX = "deadline"


class _Deadline(msgspec.Struct, frozen=True):
    deadline_at: float


_decoder = msgspec.json.Decoder(_Deadline)


_INDEX_PREFIXES = (PREFIX + ".", children.PREFIX + ".")


def is_index_key(key: str) -> bool:
    """A key of this index or of the running children's (`kv/children.py`), not an execution snapshot,
    in the executions bucket."""
    return key.startswith(_INDEX_PREFIXES)


class DeadlineIndex:
    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    @classmethod
    async def open(cls, js: JetStreamContext, topology: Topology) -> DeadlineIndex:
        return cls(await js.key_value(topology.executions_bucket))

    @staticmethod
    def key(partition: int, execution_id: str) -> str:
        return f"{PREFIX}.{partition}.{execution_id}"

    async def add(self, partition: int, execution_id: str, deadline_at: float) -> None:
        await self.kv.put(self.key(partition, execution_id), msgspec.json.encode(_Deadline(deadline_at)))

    async def remove(self, partition: int, execution_id: str) -> None:
        """Forget the key (a purge marker that expires: nothing is left behind, see `forget`)."""
        await forget_key(self.kv, self.key(partition, execution_id))

    async def of_partition(self, partition: int) -> list[tuple[str, float]]:
        """``(execution_id, deadline_at)`` of the partition's indexed executions (one filtered read to
        the end: `scan.entries`, not nats-py's watch, which may end before the first value)."""
        prefix = f"{PREFIX}.{partition}."
        out: list[tuple[str, float]] = []
        async for entry in scan.entries(self.kv, prefix + "*"):
            if not entry.value or not entry.key.startswith(prefix):
                continue
            try:
                deadline = _decoder.decode(entry.value)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            out.append((entry.key[len(prefix) :], deadline.deadline_at))
        return out
