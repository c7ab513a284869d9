"""Child executions whose parent ended: cancelled by the controller that holds them.

A ``kind: playbook`` task waits for its child and cancels it when its wait is cut short
(`dataplane/children.py`). When nothing waits any more (the parent's worker was killed), the parent's
redelivered command stops before its task once the parent has ended, and the child would run on
unwatched. So each controller keeps the running child executions of the partitions it holds, by parent,
and when a parent ends with any status but ``success`` it records ``execution.cancel.requested`` for
each of them (`wire.parent_ended_cancel`: one id per child, so a waiting worker's cancel and this one are
stored once), which it folds like an operator's cancel. A cancelled child ends ``cancelled``; its own
children are cancelled in turn, the same way.

Which children: one is added when a running state of it is recorded (`note`, from
`ExecutionCache.remember`: after a fold is stored, or when it is loaded from its snapshot and the stream)
or when its partition is taken (the partition's keys in `kv/children.py`, written here so that a child in
a long step, which sends no event that would load it, is known to the next owner). It goes when its end
is recorded or its partition released. This is not the cache: a child dropped from memory still runs.

How an end is learnt: a core subscription on every execution's ``workflow.finished`` (as published),
open only while this controller holds a running child, and read only for the parents of those (the
subject names the execution). An end can be missed (this controller was not running, a reconnect, the
child's partition moved), so a child is also checked once when it is added: the parent's last stored
``workflow.finished`` (one read of its subject, after the child is in the index and the subscription is
open, so an end falls in one or the other), and every parent again after the connection reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from typing import Any

import msgspec
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from noetl_stream.control.backoff import retry_delay
from noetl_stream.control.core.state import ExecutionState
from noetl_stream.control.indexwriter import IndexWriter
from noetl_stream.jetstream.outbox import Outbox
from noetl_stream.kv.children import ChildIndex
from noetl_stream.kv.history import end_status, last_event
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import decode_event, parent_ended_cancel

log = structlog.get_logger(__name__)

__all__ = ["ChildWatch"]

RETRY_S = 1.0
"""How soon a parent whose children are held here while their partition's lease is not valid yet (by
our clock) is tried again. One whose end could not be read, or whose children's cancels could not be
written, is tried again after `retry_delay` (1 s doubling to 30 s, while children of it are held here)."""
GETS_AT_ONCE = 32
"""Direct gets of executions' ends in flight at once (a takeover checks every indexed child)."""
IDLE_S = 30.0
"""How long the subscription stays open once no running child is held (children come in bursts)."""
RECONNECT_POLL_S = 1.0
"""How often the connection's reconnect count is looked at (ends published meanwhile were not heard)."""
STOP_WRITES_S = 2.0
"""How long `stop` waits for index writes in flight."""
ENDS_KEPT = 4096
"""Ends heard of executions none of whose children is held, kept for children added right after."""


class ChildWatch:
    def __init__(
        self,
        nc: NATS,
        topology: Topology,
        controller_id: str,
        *,
        fence_of: Callable[[int], int | None],
        held: Callable[[int], bool],
        is_terminal: Callable[[str], bool],
    ) -> None:
        """``fence_of(partition)``: the fencing token while this controller validly holds the partition,
        else None. ``held(partition)``: the partition is this controller's (valid or not yet renewed).
        ``is_terminal(eid)``: the execution is known (in memory) to be over."""
        self.nc = nc
        self.js = nc.jetstream()
        self.topology = topology
        self.controller_id = controller_id
        self._fence_of = fence_of
        self._held = held
        self._is_terminal = is_terminal
        self.index: ChildIndex | None = None
        self.children: dict[str, set[str]] = {}
        """Parent execution id -> its running children held here."""
        self.parent_of: dict[str, str] = {}
        """Running child held here -> its parent."""
        self._writer: IndexWriter[str] | None = None
        """Writes the index: by child, its parent (add) or None (remove)."""
        self._check_failures: dict[str, int] = {}
        """Parents whose last check failed (a read, a publish), and how many times in a row."""
        self._unchecked: set[str] = set()
        """Parents whose end is to be read (children of theirs were added since the last read)."""
        self._ended: OrderedDict[str, str] = OrderedDict()
        """Executions heard ending otherwise than with success while none of their children was held, the
        last `ENDS_KEPT` (an end is heard before it is stored: a child added meanwhile reads no end)."""
        self._checker: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._gets = asyncio.Semaphore(GETS_AT_ONCE)
        self._sub: Any = None
        self._listening = asyncio.Lock()
        self._idle: asyncio.TimerHandle | None = None
        self._head = f"{topology.prefix}.events."
        self._tail = "." + E.WORKFLOW_FINISHED
        self._reconnects = 0
        self._stopped = False

    def open(self, index: ChildIndex, topology: Topology) -> None:
        """Start indexing (``topology``: the installation's, as the controller read it at start)."""
        self.index = index
        self.topology = topology
        self._head = f"{topology.prefix}.events."

    async def start(self) -> None:
        self._stopped = False
        if self.index is not None:
            self._writer = IndexWriter(
                self.index, self.topology, self._still, "controller.child_index_failed"
            )
        self._reconnects = self.nc.stats["reconnects"]
        self._spawn(self._watch_reconnects())

    async def stop(self) -> None:
        """Stop listening and checking; let the index writes in flight finish (briefly)."""
        self._stopped = True
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        for task in list(self._tasks):
            task.cancel()
        if self._checker is not None:
            self._checker.cancel()
        if self._writer is not None:
            await self._writer.stop(STOP_WRITES_S)
        await self._unlisten(force=True)
        self.children.clear()
        self.parent_of.clear()
        self._ended.clear()
        self._check_failures.clear()

    # -- the index ---------------------------------------------------------------------------------
    def note(self, state: ExecutionState) -> None:
        """A state of a child execution was recorded (a stored fold, a load): index it while it runs."""
        child = state.execution_id
        if state.terminal:
            if child in self.parent_of:
                self._forget(child)
                self._write(child, None)
            return
        parent = state.parent_execution_id
        if (
            child not in self.parent_of
            and parent is not None
            and self._held(self.topology.partition_of(child))
        ):
            self._add(child, parent)
            self._write(child, parent)

    def acquired(self, partition: int) -> None:
        """A partition was taken: its indexed children are added (and their parents checked)."""
        self._spawn(self._take(partition))

    def release(self, partition: int) -> None:
        """The partition is not ours any more: its children are its next owner's (the index keys stay)."""
        for child in [c for c in self.parent_of if self.topology.partition_of(c) == partition]:
            self._forget(child)

    def _add(self, child: str, parent: str) -> None:
        self.parent_of[child] = parent
        self.children.setdefault(parent, set()).add(child)
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        ended = self._ended.get(parent)
        if ended is not None:
            self._spawn(self._cancel(parent, ended))
        else:
            self._check_soon(parent)

    def _forget(self, child: str) -> None:
        parent = self.parent_of.pop(child)
        siblings = self.children.get(parent)
        if siblings is not None:
            siblings.discard(child)
            if not siblings:
                del self.children[parent]
        if not self.parent_of and self._idle is None and not self._stopped:
            self._idle = asyncio.get_running_loop().call_later(IDLE_S, self._idle_now)

    def _write(self, child: str, parent: str | None) -> None:
        if self._writer is not None:
            self._writer.write(child, parent)

    def _still(self, child: str, parent: str | None) -> bool:
        """A failed index write still says what is true here: the child is (still) held with this parent
        on a partition held here, or (a removal) not held any more. Until it is written, a missing key: a
        next owner learns of the child when it loads it (its next event; a child in one long task sends
        none); a stale one: a next owner finds the child ended and removes it."""
        if self.parent_of.get(child) != parent:
            return False
        return parent is None or self._held(self.topology.partition_of(child))

    async def _take(self, partition: int) -> None:
        """Add the partition's indexed children, but those that have ended (a key left by a controller
        that stopped before removing it: removed now)."""
        assert self.index is not None
        while True:
            if not self._held(partition):
                return
            try:
                indexed = await self.index.of_partition(partition)
                break
            except Exception as exc:
                log.warning(
                    "controller.child_index_read_failed",
                    partition=partition,
                    error=str(exc) or type(exc).__name__,
                )
                await asyncio.sleep(RETRY_S)
        candidates = [
            (child, parent)
            for child, parent in indexed
            if self.topology.partition_of(child) == partition and child not in self.parent_of
        ]
        ends = await asyncio.gather(*(self._end_of(child) for child, _ in candidates), return_exceptions=True)
        if not self._held(partition):
            return
        for (child, parent), end in zip(candidates, ends, strict=True):
            if isinstance(end, str) or self._is_terminal(child):
                self._write(child, None)  # it ended
            elif child not in self.parent_of:
                self._add(child, parent)  # (one whose end could not be read: as running)

    # -- ends ---------------------------------------------------------------------------------------
    def _check_soon(self, parent: str) -> None:
        """Read the parent's end (at the next turn, with the others of this turn)."""
        self._unchecked.add(parent)
        if self._checker is None and not self._stopped:
            self._checker = asyncio.ensure_future(self._check_all())

    async def _check_all(self) -> None:
        try:
            while self._unchecked:
                try:
                    await self._listen()  # before the reads: an end is then either read or heard
                except Exception as exc:  # (not connected): all of them again in a moment
                    log.warning("controller.end_subscribe_failed", error=str(exc) or type(exc).__name__)
                    for parent in self._unchecked:
                        self._retry(parent, failed=True)
                    self._unchecked = set()
                    return
                parents, self._unchecked = self._unchecked, set()
                await asyncio.gather(*(self._check(p) for p in parents))
        finally:
            self._checker = None

    async def _check(self, parent: str) -> None:
        if parent not in self.children:
            return
        try:
            status = await self._end_of(parent)
        except Exception as exc:
            log.warning(
                "controller.parent_end_unknown",
                parent_execution_id=parent,
                error=str(exc) or type(exc).__name__,
            )
            self._retry(parent, failed=True)
            return
        if status is not None and status != "success":
            await self._cancel(parent, status)
        else:
            self._check_failures.pop(parent, None)

    async def _end_of(self, execution_id: str) -> str | None:
        """How the execution ended (its stored ``workflow.finished``); None while it has not."""
        async with self._gets:
            finished = await last_event(self.js, self.topology, execution_id, E.WORKFLOW_FINISHED)
        return end_status(finished) if finished is not None else None

    async def _on_finished(self, msg: Msg) -> None:
        """An execution ended: if it is the parent of children held here and did not succeed, cancel them."""
        subject = msg.subject
        if not (subject.startswith(self._head) and subject.endswith(self._tail)):
            return
        parent = subject[len(self._head) : -len(self._tail)]
        try:
            status = end_status(decode_event(msg.data))
        except (msgspec.DecodeError, msgspec.ValidationError):
            return
        if status == "success":
            return
        if parent in self.children:
            self._spawn(self._cancel(parent, status))
            return
        self._ended[parent] = status
        while len(self._ended) > ENDS_KEPT:
            self._ended.popitem(last=False)

    async def _cancel(self, parent: str, status: str) -> None:
        """Record the cancel of each running child of `parent` held here (under its partition's fence)."""
        outbox = Outbox(self.js, self.topology)
        cancelled: list[str] = []
        later = False
        reason = f"parent execution {parent} ended ({status})"
        for child in sorted(self.children.get(parent, ())):
            fence = self._fence_of(self.topology.partition_of(child))
            if fence is None:
                # Held but not (yet) valid by our clock: again in a moment. Not held: its owner's.
                later = later or self._held(self.topology.partition_of(child))
                continue
            ev = parent_ended_cancel(child, reason)
            ev.controller, ev.fence = self.controller_id, fence
            outbox.event(ev)
            cancelled.append(child)
        if cancelled:
            try:
                await outbox.flush()
            except Exception as exc:
                log.warning(
                    "controller.child_cancel_failed",
                    parent_execution_id=parent,
                    children=cancelled,
                    error=str(exc) or type(exc).__name__,
                )
                self._retry(parent, failed=True)
                return
            else:
                log.info(
                    "controller.children_cancelled",
                    parent_execution_id=parent,
                    parent_status=status,
                    children=cancelled,
                )
        self._check_failures.pop(parent, None)
        if later:
            self._retry(parent)

    def _retry(self, parent: str, failed: bool = False) -> None:
        """Check `parent` again in a moment, while children of it are held here: in `RETRY_S`, or after a
        failure in `retry_delay` of the failures in a row (one warning per parent per try while NATS is
        away, not one a second). (Its children's cancels have one id each: published again, they are
        stored once.)"""
        if self._stopped:
            return
        delay = RETRY_S
        if failed:
            failures = self._check_failures[parent] = self._check_failures.get(parent, 0) + 1
            delay = retry_delay(failures)
        asyncio.get_running_loop().call_later(delay, self._retry_now, parent)

    def _retry_now(self, parent: str) -> None:
        if parent in self.children and not self._stopped:
            self._check_soon(parent)
        else:
            self._check_failures.pop(parent, None)

    # -- the subscription ---------------------------------------------------------------------------
    async def _listen(self) -> None:
        async with self._listening:
            if self._sub is None and not self._stopped:
                self._reconnects = self.nc.stats["reconnects"]
                self._sub = await self.nc.subscribe(
                    self.topology.any_execution_filter(E.WORKFLOW_FINISHED), cb=self._on_finished
                )

    def _idle_now(self) -> None:
        self._idle = None
        if not self.parent_of:
            self._spawn(self._unlisten())

    async def _unlisten(self, force: bool = False) -> None:
        async with self._listening:
            if self._sub is not None and (force or not self.parent_of):
                sub, self._sub = self._sub, None
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    async def _watch_reconnects(self) -> None:
        """Ends published while the connection was down were not heard: read every parent's end again."""
        while True:
            await asyncio.sleep(RECONNECT_POLL_S)
            reconnects = self.nc.stats["reconnects"]
            if reconnects != self._reconnects:
                self._reconnects = reconnects
                if self._sub is not None:
                    for parent in list(self.children):
                        self._check_soon(parent)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
