"""The executions that have a deadline and are not finished, by partition.

Keys ``deadline.<partition>.<execution_id>`` in the ``noetl_executions`` bucket (`kv/partindex.py`),
value ``{"deadline_at": <epoch s>}``. The controller writes a key when it first folds an execution with
a deadline and removes it when the execution ends; a controller that takes a partition over lists only
that partition's keys to re-arm its timers, however many executions the bucket holds.
"""

from __future__ import annotations

import msgspec

from noetl_stream.kv.partindex import PartitionIndex

PREFIX = "deadline"


class _Deadline(msgspec.Struct, frozen=True):
    deadline_at: float


class DeadlineIndex(PartitionIndex[_Deadline]):
    prefix = PREFIX
    value_type = _Deadline

    async def add(self, partition: int, execution_id: str, deadline_at: float) -> None:
        await self.put(partition, execution_id, _Deadline(deadline_at))

    async def of_partition(self, partition: int) -> list[tuple[str, float]]:
        """``(execution_id, deadline_at)`` of the partition's indexed executions."""
        return [(eid, d.deadline_at) for eid, d in await self.values_of(partition)]
