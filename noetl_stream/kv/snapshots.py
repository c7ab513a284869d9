"""Execution snapshots in the ``noetl_executions`` bucket: a state and the stream sequence it reflects."""

from __future__ import annotations

from typing import Generic, TypeVar

import msgspec
from nats.js.client import JetStreamContext
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from noetl_stream.errors import StateConflictError
from noetl_stream.subjects import Topology

S = TypeVar("S", bound=msgspec.Struct)


class SnapshotStore(Generic[S]):
    """Typed snapshots keyed by execution id; remembers the revision it last read or wrote."""

    def __init__(self, kv: KeyValue, type_: type[S]) -> None:
        self.kv = kv
        self._decoder = msgspec.json.Decoder(type_)
        self.revisions: dict[str, int] = {}

    @classmethod
    async def open(cls, js: JetStreamContext, topology: Topology, type_: type[S]) -> SnapshotStore[S]:
        return cls(await js.key_value(topology.executions_bucket), type_)

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
        if record:
            self.revisions[execution_id] = entry.revision or 0
        return self._decoder.decode(entry.value)

    async def put(self, execution_id: str, state: S) -> None:
        """Compare-and-set: create the key, or update it from the revision this store last saw.

        Raises ``StateConflictError`` when someone else wrote since (a controller that lost ownership
        of the execution cannot overwrite the owner's snapshot).
        """
        data = msgspec.json.encode(state)
        last = self.revisions.get(execution_id)
        try:
            if last is None:
                rev = await self.kv.create(execution_id, data)
            else:
                rev = await self.kv.update(execution_id, data, last=last)
        except KeyWrongLastSequenceError:
            raise StateConflictError(f"snapshot of {execution_id} changed since revision {last}") from None
        self.revisions[execution_id] = rev

    async def put_any(self, execution_id: str, state: S) -> None:
        """Unconditional write (tests and tools only)."""
        self.revisions[execution_id] = await self.kv.put(execution_id, msgspec.json.encode(state))

    def forget(self, execution_id: str) -> None:
        self.revisions.pop(execution_id, None)
