"""The running child executions, by partition, and the parent of each.

Keys ``child.<partition>.<child_execution_id>`` in the ``noetl_executions`` bucket (`kv/partindex.py`),
value ``{"parent": <execution_id>}``. The controller writes a key when it first records a running child
execution and removes it when the child ends. A controller that takes a partition over lists only that
partition's keys: they name the children it must cancel when their parent ends, among them those it has
no reason to load (a child in a long step sends no event).
"""

from __future__ import annotations

import msgspec

from noetl_stream.kv.partindex import PartitionIndex

PREFIX = "child"


class _Child(msgspec.Struct, frozen=True):
    parent: str


class ChildIndex(PartitionIndex[_Child]):
    prefix = PREFIX
    value_type = _Child

    async def add(self, partition: int, child_id: str, parent_id: str) -> None:
        await self.put(partition, child_id, _Child(parent_id))

    async def of_partition(self, partition: int) -> list[tuple[str, str]]:
        """``(child_execution_id, parent_execution_id)`` of the partition's indexed children."""
        return [(child_id, child.parent) for child_id, child in await self.values_of(partition)]
