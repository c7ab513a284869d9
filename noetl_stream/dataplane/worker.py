"""The worker: pulls commands of one pool, supervises each one's run, settles its message, shuts down.

No inbound ports (``worker --metrics`` adds a ``/metrics`` listener, `services.MetricsServer`, fed by
`WorkerMetrics`). Any number of worker processes share one pool's durable consumer. Running one
command (pipeline, loops) is `CommandRun` in command.py; publishing its events, `RunEvents` in
run_events.py.
A message is settled in exactly one place (``_handle``): ack after the boundary event
is stored; nothing on cancellation or shutdown (so JetStream redelivers it); ``term``
for a message that can never be read.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import socket
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from noetl_stream.dataplane.children import ChildRunner
from noetl_stream.dataplane.command import CommandRun
from noetl_stream.dataplane.loops import HandedBackError
from noetl_stream.dataplane.metrics import WorkerMetrics
from noetl_stream.dataplane.runparts import RunParts
from noetl_stream.dataplane.task_events import TASK_EVENTS, TASK_EVENTS_ALL, TASK_EVENTS_SEPARATE
from noetl_stream.dataplane.tools.base import WorkerServices
from noetl_stream.jetstream.fastpath import ack_soon, num_delivered
from noetl_stream.jetstream.outbox import Outbox
from noetl_stream.jetstream.puller import ContinuousPuller
from noetl_stream.kv.history import end_status, last_event
from noetl_stream.kv.results import ResultStore
from noetl_stream.logs import bound
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Command, decode_command, decode_event, iso_at

log = structlog.get_logger(__name__)

PROGRESS_EVERY_S = 0.1
CLOCK_SKEW_S = 5.0
"""How far the controller's clock (a command's ``issued_at``) may run ahead of a worker's: commands
issued up to this long after the worker began to listen for ends are looked up too (`_ended_before`)."""


class Worker:
    """Runs commands from ``pool-<pool>``, at most ``concurrency`` at once."""

    def __init__(
        self,
        nc: NATS,
        topology: Topology,
        *,
        pool: str = "default",
        concurrency: int = 16,
        name: str | None = None,
        task_events: str = TASK_EVENTS_ALL,
        services: WorkerServices | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        if task_events not in TASK_EVENTS:
            raise ValueError(f"task_events: {task_events!r} is not one of {', '.join(TASK_EVENTS)}")
        self.nc = nc
        self.js = nc.jetstream()
        self.topology = topology
        self.pool = pool
        self.concurrency = concurrency
        self.name = name or f"{socket.gethostname()}-{os.getpid()}-{id(self) % 10000}"
        self.task_events = task_events
        self.carry = task_events != TASK_EVENTS_SEPARATE
        """Whether a step run's earlier events travel inside its boundary's message (`carried.py`)."""
        self.services = services or WorkerServices()
        self.results = ResultStore(self.js, topology)
        self._puller: ContinuousPuller | None = None
        self._ended_sub: Any = None
        self.ended: OrderedDict[str, str] = OrderedDict()
        """Executions that ended (cancelled, failed, deadline) while commands of theirs may run here."""
        self._running_when_checked: OrderedDict[str, None] = OrderedDict()
        """Executions `_ended_before` found running after this worker listened for ends: their later
        ends reach `_on_finished`, so their other early commands need no look-up."""
        self._lookups: dict[str, asyncio.Future[None]] = {}
        """`_ended_before` in progress, by execution: the commands of a backlog share one."""
        self.stopping = False
        """`shutdown` began: local loops start no more iterations (`HandedBackError`)."""
        self._listening_since = "~"  # (sorts after every ISO timestamp): until `start`, check them all
        self._stopped = asyncio.Event()
        self._log = log.bind(worker=self.name, pool=pool)
        # Commands running, for the progress scan: their message, start time and logging context.
        self._active: dict[CommandRun, tuple[Msg, float, contextvars.Context]] = {}
        self._scan: asyncio.TimerHandle | None = None
        # Commands whose events are published and not yet known stored (acked then), and their republishing.
        self._unconfirmed: dict[asyncio.Future[Any], tuple[Msg, CommandRun]] = {}
        self._republishing: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.run_parts = RunParts(
            name=self.name,
            js=self.js,
            topology=topology,
            results=self.results,
            services=self.services,
            log=self._log,
            task_events=task_events,
            carry=self.carry,
            ended=self.ended,
            stopping=lambda: self.stopping,
            metrics=metrics,
        )
        """What each `CommandRun` uses of this worker."""
        if metrics is not None:
            metrics.track(self.commands_running, concurrency)

    @property
    def metrics(self) -> WorkerMetrics | None:
        """Counts and times the task runs that end here (`WorkerMetrics`; None: nothing is counted)."""
        return self.run_parts.metrics

    @metrics.setter
    def metrics(self, metrics: WorkerMetrics | None) -> None:
        self.run_parts.metrics = metrics

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    def commands_running(self) -> int:
        """How many commands this worker runs now."""
        return len(self._active)

    def running_executions(self) -> set[str]:
        """The executions whose commands this worker runs now."""
        return {run.cmd.execution_id for run in self._active}

    async def start(self) -> None:
        if self._puller is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._puller = ContinuousPuller(
            self.nc,
            self.topology.commands_stream,
            self.topology.pool_consumer(self.pool),
            self._handle,
            max_concurrency=self.concurrency,
            error_nak_delay_s=1.0,
        )
        subject = self.topology.any_execution_filter(E.WORKFLOW_FINISHED)
        self._ended_sub = await self.nc.subscribe(subject, cb=self._on_finished)
        # Commands issued before this (plus the clocks' skew) may belong to executions that ended while
        # no worker listened: `_handle` looks those up (`_ended_before`).
        self._listening_since = iso_at(time.time() + CLOCK_SKEW_S)
        await self._puller.start()
        if self.services.children is None:
            self.services.children = ChildRunner(
                self.nc, self.topology, release_slot=self._release_slot, handing_back=self._handing_back
            )
        self._log.info("worker.started", concurrency=self.concurrency, task_events=self.task_events)

    @contextlib.asynccontextmanager
    async def _release_slot(self) -> AsyncIterator[None]:
        puller = self._puller
        if puller is None:
            yield
            return
        async with puller.released_slot():
            yield

    def _handing_back(self) -> bool:
        """The shutdown is cancelling running commands (redelivered later: their children go on)."""
        puller = self._puller
        return puller is None or puller.handing_back

    async def _on_finished(self, msg: Msg) -> None:
        """An execution ended: its running pipelines stop at their next task boundary."""
        try:
            ev = decode_event(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return
        status = end_status(ev)
        if status == "success":
            return
        self._end(ev.execution_id, f"the execution ended ({status}) while this step was running")

    def _end(self, execution_id: str, reason: str) -> None:
        _remember(self.ended, execution_id, reason)

    async def _ended_before(self, cmd: Command) -> None:
        """A command issued before this worker listened for ends (a backlog: a pool scaled from zero, a
        restart) may belong to an execution cancelled, failed or timed out meanwhile. Its stored end
        says so; then the command stops at its first task boundary like any of an ended execution.
        Once per execution: one found still running ends later, which the subscription hears."""
        try:
            finished = await last_event(self.js, self.topology, cmd.execution_id, E.WORKFLOW_FINISHED)
        except Exception as exc:  # NATS slow or down: run it (its events could not be written anyway)
            self._log.warning("worker.end_check_failed", error=str(exc) or type(exc).__name__)
            return
        if finished is None:
            _remember(self._running_when_checked, cmd.execution_id, None)
            return  # still running
        status = end_status(finished)
        if status != "success":
            self._end(cmd.execution_id, f"the execution ended ({status}) before this step started")

    async def run(self) -> None:
        await self.start()
        await self._stopped.wait()

    async def shutdown(self, grace_s: float = 30.0) -> None:
        """Stop pulling; let running commands finish within ``grace_s`` (the rest are redelivered). A
        local loop finishes the iterations it runs and hands the rest back."""
        self.stopping = True
        if self._puller is not None:
            # Just before the puller cancels what still runs at the end of the grace, name it: these
            # commands are left unacknowledged and run again on another worker after AckWait.
            expiry = asyncio.get_running_loop().call_later(max(grace_s - 0.05, 0.0), self._grace_expired)
            started = asyncio.get_running_loop().time()
            try:
                await self._puller.stop(timeout=grace_s)
            finally:
                expiry.cancel()
            self._puller = None
            left = grace_s - (asyncio.get_running_loop().time() - started)
            await self._settle_unconfirmed(max(left, 1.0))
        if self._ended_sub is not None:
            with contextlib.suppress(Exception):
                await self._ended_sub.unsubscribe()
            self._ended_sub = None
        if self._scan is not None:
            self._scan.cancel()
            self._scan = None
        await self.services.close()
        self._stopped.set()

    def _grace_expired(self) -> None:
        if self._active:
            self._log.warning(
                "worker.grace_expired",
                hint="these commands are stopped unfinished and redelivered after AckWait (--grace)",
                commands=[
                    {"execution_id": r.cmd.execution_id, "step": r.cmd.step, "step_run_id": r.cmd.step_run_id}
                    for r in self._active
                ],
            )

    # -- one command ------------------------------------------------------------------------------
    async def _handle(self, msg: Msg) -> None:
        try:
            cmd = decode_command(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self._log.error("worker.bad_command", error=str(exc), subject=msg.subject)
            await msg.term()
            return
        ids = {"execution_id": cmd.execution_id, "step": cmd.step, "step_run_id": cmd.step_run_id}
        with bound(**ids, worker=self.name):  # on every log line about this command
            eid = cmd.execution_id
            if (
                cmd.issued_at < self._listening_since
                and eid not in self.ended
                and eid not in self._running_when_checked
            ):
                lookup = self._lookups.get(eid)
                if lookup is None:
                    lookup = self._lookups[eid] = asyncio.ensure_future(self._ended_before(cmd))
                    lookup.add_done_callback(lambda _: self._lookups.pop(eid, None))
                await asyncio.shield(lookup)  # (a command cancelled meanwhile leaves it to the others)
            outbox = Outbox(self.js, self.topology)
            run = CommandRun(self.run_parts, cmd, outbox, delivery=num_delivered(msg))
            try:
                await self._supervise(msg, run)
            except HandedBackError as exc:  # shutting down mid-loop: another worker runs the rest
                await run.events.publish_pending()
                self._log.info("worker.loop_handed_back", settled=str(exc))
                with contextlib.suppress(Exception):
                    await msg.nak()
                return
            fut = run.events.publish_pending_nowait()
            if fut is None:
                await run.events.publish_pending()
                ack_soon(msg)
                return
            # Settled when the events are stored (`_stored`): the handler's slot is free meanwhile.
            self._unconfirmed[fut] = (msg, run)
            fut.add_done_callback(self._stored)

    def _stored(self, fut: asyncio.Future[Any]) -> None:
        """A command's events are stored: ack it. Their publish failed: publish them again, waiting and
        retrying as the outbox does, then ack (or hand the command back, as a failed handler does)."""
        msg, run = self._unconfirmed.pop(fut)
        if not fut.cancelled() and fut.exception() is None:
            try:
                ack_soon(msg)
            except Exception as exc:  # the connection is gone: the command comes again
                self._log.warning("worker.ack_failed", error=str(exc) or type(exc).__name__)
            return
        task = asyncio.ensure_future(self._republish(msg, run))
        self._republishing.add(task)
        task.add_done_callback(self._republishing.discard)

    async def _republish(self, msg: Msg, run: CommandRun) -> None:
        try:
            await run.events.publish_unconfirmed()
            ack_soon(msg)
        except Exception:
            self._log.exception("worker.publish_failed", subject=msg.subject)
            with contextlib.suppress(Exception):
                await msg.nak(delay=1.0)

    async def _settle_unconfirmed(self, timeout: float) -> None:
        """Wait (up to `timeout`) for the commands whose events are being stored to be settled."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self._unconfirmed or self._republishing:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                self._log.warning(
                    "worker.unsettled_at_stop", commands=len(self._unconfirmed) + len(self._republishing)
                )
                return
            await asyncio.wait([*self._unconfirmed, *self._republishing], timeout=left)

    async def _supervise(self, msg: Msg, run: CommandRun) -> None:
        """Run the command. If it is still running after ``PROGRESS_EVERY_S``, a watcher publishes its
        progress events and keeps the message alive until it ends. One periodic scan finds such commands
        (fast commands pay a dict entry, not a timer each)."""
        loop = self._loop  # (kept: asyncio.get_running_loop() costs a getpid system call)
        assert loop is not None  # (started)
        self._active[run] = (msg, loop.time(), contextvars.copy_context())
        if self._scan is None:
            self._scan = loop.call_later(PROGRESS_EVERY_S / 2, self._scan_active)
        try:
            await run.execute()
        finally:
            del self._active[run]
            run.finished = True
            if run.trace is not None:
                run.trace.end()
            if run.wake is not None:
                run.wake.set()
            if run.watcher is not None:  # let it finish its current publish: no event is dropped half-sent
                await run.watcher

    def _scan_active(self) -> None:
        """Start a watcher for each command running longer than ``PROGRESS_EVERY_S``; again in a moment
        while any command runs."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        for run, (msg, since, context) in self._active.items():
            if run.watcher is None and now - since >= PROGRESS_EVERY_S:
                run.watcher = loop.create_task(self._watch(msg, run), context=context)
        self._scan = loop.call_later(PROGRESS_EVERY_S / 2, self._scan_active) if self._active else None

    async def _watch(self, msg: Msg, run: CommandRun) -> None:
        keep_alive_every = max(0.5, self.topology.command_ack_wait_s / 3)
        loop = asyncio.get_running_loop()
        next_keep_alive = loop.time() + keep_alive_every
        run.wake = asyncio.Event()
        while not run.finished:
            try:
                await run.events.publish_pending(progress=True)
            except Exception as exc:  # the final flush reports failures; progress is best effort
                self._log.debug("worker.progress_publish_failed", error=str(exc))
            if loop.time() >= next_keep_alive:
                next_keep_alive = loop.time() + keep_alive_every
                with contextlib.suppress(Exception):
                    await msg.in_progress()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run.wake.wait(), PROGRESS_EVERY_S)


REMEMBERED = 10_000
"""Executions a worker keeps in `Worker.ended` and in its record of those found running (the oldest go)."""


def _remember(seen: OrderedDict[str, Any], execution_id: str, value: Any) -> None:
    seen[execution_id] = value
    while len(seen) > REMEMBERED:
        seen.popitem(last=False)
