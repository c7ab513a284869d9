"""Writing a partition index (`kv/partindex.py`: the deadline and child keys) off the fold's path.

The controller asks for a key to be added or removed when it records a state; the write goes out at the
next turn, with the others asked for meanwhile (at most `WRITES_AT_ONCE` in flight), and the last write
asked for a key wins (a child added and ended in one turn: only its removal). A write that fails is tried
again after `retry_delay` (1 s doubling to 30 s) as long as it still says what is true here (`still`):
a key missing or left behind would otherwise wait for the execution's next event, which an execution in
one long task does not send, and a next owner of the partition would not learn of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

import structlog

from noetl_stream.control.backoff import retry_delay
from noetl_stream.protocol.subjects import Topology

log = structlog.get_logger(__name__)

WRITES_AT_ONCE = 64
"""Index writes in flight at once."""

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)


class Index(Protocol[T_contra]):
    async def add(self, partition: int, execution_id: str, value: T_contra, /) -> None: ...
    async def remove(self, partition: int, execution_id: str) -> None: ...


class IndexWriter(Generic[T]):
    """``write(execution_id, value)`` adds its key (None: removes it). ``still(execution_id, value)``: the
    write still says what is true here (checked before it is tried again). ``failed``: the warning
    logged when a write fails."""

    def __init__(
        self, index: Index[T], topology: Topology, still: Callable[[str, T | None], bool], failed: str
    ) -> None:
        self.index = index
        self.topology = topology
        self._still = still
        self._failed = failed
        self._writes: dict[str, T | None] = {}
        """Writes to make, by execution: the last one asked for wins."""
        self._failures: dict[str, int] = {}
        """Executions whose last write failed, and how many times in a row (the retry's backoff)."""
        self._writer: asyncio.Task[None] | None = None
        self._stopped = False

    def write(self, execution_id: str, value: T | None) -> None:
        self._writes[execution_id] = value
        if self._writer is None and not self._stopped:
            self._writer = asyncio.ensure_future(self._write_all())

    async def stop(self, timeout: float) -> None:
        """Let the writes in flight (and those asked for) finish, for up to ``timeout``; retry none later."""
        self._stopped = True
        writer = self._writer
        if writer is not None:
            await asyncio.wait({writer}, timeout=timeout)
            writer.cancel()
        self._failures.clear()

    async def _write_all(self) -> None:
        try:
            while self._writes:
                writes, self._writes = list(self._writes.items()), {}
                for i in range(0, len(writes), WRITES_AT_ONCE):
                    await asyncio.gather(*(self._write_one(e, v) for e, v in writes[i : i + WRITES_AT_ONCE]))
        finally:
            self._writer = None

    async def _write_one(self, execution_id: str, value: T | None) -> None:
        partition = self.topology.partition_of(execution_id)
        try:
            if value is None:
                await self.index.remove(partition, execution_id)
            else:
                await self.index.add(partition, execution_id, value)
        except Exception as exc:
            log.warning(self._failed, execution_id=execution_id, error=str(exc) or type(exc).__name__)
            if not self._stopped:
                failures = self._failures[execution_id] = self._failures.get(execution_id, 0) + 1
                loop = asyncio.get_running_loop()
                loop.call_later(retry_delay(failures), self._write_again, execution_id, value)
        else:
            self._failures.pop(execution_id, None)

    def _write_again(self, execution_id: str, value: T | None) -> None:
        """A failed write, again: unless a later one is asked for, or it no longer holds."""
        if self._stopped or execution_id in self._writes or not self._still(execution_id, value):
            self._failures.pop(execution_id, None)
            return
        self.write(execution_id, value)
