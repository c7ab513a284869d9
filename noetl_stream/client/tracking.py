"""Following executions: the events of one folded into a summary (`Tracker`, `follow`), the ends of many (`Completions`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.js import api

from noetl_stream.protocol import events as E
from noetl_stream.protocol.carried import decode_all
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import (
    Event,
    decode_event,
)


class StepSummary(msgspec.Struct):
    status: str = "pending"
    runs: int = 0


class RunSummary(msgspec.Struct):
    execution_id: str
    status: str = "running"
    ctx: dict[str, Any] = {}
    steps: dict[str, StepSummary] = {}
    result: Any = None
    error: dict[str, Any] | None = None
    events: int = 0
    duration_s: float = 0.0


class Tracker:
    """Folds an execution's events into what a user wants to see."""

    _STEP_STATUS = {
        E.STEP_SCHEDULED: "scheduled",  # its command waits for a worker of its pool
        E.STEP_STARTED: "running",
        E.STEP_DONE: "done",
        E.LOOP_DONE: "done",
        E.STEP_FAILED: "failed",
        E.STEP_SKIPPED: "skipped",
    }

    def __init__(self, execution_id: str) -> None:
        self.summary = RunSummary(execution_id=execution_id)
        self.finished = False
        """``playbook.processed`` was read, or the request's rejection (see `apply`)."""
        self.processed = False
        self._started = time.monotonic()
        self._runs: dict[str, set[str]] = {}
        self._ended = E.EndedRuns()

    def apply(self, ev: Event) -> None:
        s = self.summary
        s.events += 1
        if self.processed:
            return  # what a task still running wrote after the end: the outcome stands as recorded
        if ev.name == E.EXECUTION_REQUESTED:  # a retry resumes with the ctx of the execution it retries
            request = ev.payload.get("request")
            resume = request.get("resume") if isinstance(request, dict) else None
            ctx = resume.get("ctx") if isinstance(resume, dict) else None
            if isinstance(ctx, dict):
                s.ctx.update(ctx)
        if ev.step and ev.name in self._STEP_STATUS and not self._ended.stale(ev):
            step = s.steps.setdefault(ev.step, StepSummary())
            if ev.step_run_id:
                runs = self._runs.setdefault(ev.step, set())
                runs.add(ev.step_run_id)
                step.runs = len(runs)
            step.status = self._STEP_STATUS[ev.name]
        if ev.name == E.CTX_PATCHED:
            for patch in ev.payload.get("patches") or []:
                if isinstance(patch, dict):
                    s.ctx.update(patch)
        elif ev.name == E.PLAYBOOK_PROCESSED:
            s.status = str(ev.payload.get("status") or ("success" if ev.status == "success" else "failed"))
            for step in s.steps.values():  # stopped by the end (cancel, failure, deadline), as the graph says
                if step.status in ("scheduled", "running"):
                    step.status = "cancelled"
            s.result = ev.payload.get("result")
            s.error = ev.payload.get("error")
            s.duration_s = round(time.monotonic() - self._started, 6)
            self.finished = self.processed = True
        elif ev.name in (E.WORKFLOW_PAUSED, E.WORKFLOW_RESUMED):  # the controller's, on pause and resume
            s.status = "paused" if ev.name == E.WORKFLOW_PAUSED else "running"
        elif ev.name == E.REQUEST_REJECTED:  # (nothing is folded after playbook.processed)
            # Final too: a rejected request never runs. Its `playbook.processed` comes right after it,
            # unless whoever wrote the rejection stopped in between (it is written when the request is
            # submitted again): a reader does not wait for it for ever.
            error = ev.payload.get("error")
            s.status, s.error = "rejected", error if isinstance(error, dict) else None
            s.duration_s = round(time.monotonic() - self._started, 6)
            self.finished = True


REJECTED_GRACE_S = 1.0
"""How long `follow` waits for the ``playbook.processed`` of a rejection it has read."""


async def follow(
    nc: NATS,
    topology: Topology,
    execution_id: str,
    on_event: Callable[[Event], None] | None = None,
    timeout: float | None = None,
) -> RunSummary:
    """Read the execution's events from the start until ``playbook.processed`` (or, for a rejected
    request, its rejection and then its ``playbook.processed`` if it comes within `REJECTED_GRACE_S`)."""
    tracker = Tracker(execution_id)
    done, processed = asyncio.Event(), asyncio.Event()

    async def cb(msg: Any) -> None:
        try:
            events = decode_all(msg.data)
        except msgspec.DecodeError:
            return
        for ev in events:
            tracker.apply(ev)
            if on_event is not None:
                on_event(ev)
        if tracker.finished:
            done.set()
        if tracker.processed:
            processed.set()

    js = nc.jetstream()
    sub = await js.subscribe(
        topology.events_filter(execution_id),
        stream=topology.events_stream,
        cb=cb,
        ordered_consumer=True,
        deliver_policy=api.DeliverPolicy.ALL,
    )
    try:
        async with asyncio.timeout(timeout):
            await done.wait()
        if not tracker.processed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REJECTED_GRACE_S):
                    await processed.wait()
    finally:
        await sub.unsubscribe()
    return tracker.summary


class Completions:
    """Waits for ``playbook.processed`` of many executions with one subscription (cheap; for load)."""

    def __init__(self, nc: NATS, topology: Topology) -> None:
        self.nc = nc
        self.topology = topology
        self._waiters: dict[str, asyncio.Future[Event]] = {}
        self._early: dict[str, Event] = {}
        self._sub: Any = None

    async def __aenter__(self) -> Completions:
        subject = self.topology.event_subject("x", E.PLAYBOOK_PROCESSED).replace(".x.", ".*.", 1)
        self._sub = await self.nc.subscribe(subject, cb=self._on_msg)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()

    async def _on_msg(self, msg: Any) -> None:
        ev = decode_event(msg.data)
        fut = self._waiters.pop(ev.execution_id, None)
        if fut is None:
            self._early[ev.execution_id] = ev
        elif not fut.done():
            fut.set_result(ev)

    async def wait(self, execution_id: str, timeout: float | None = None) -> Event:
        if execution_id in self._early:
            return self._early.pop(execution_id)
        fut = self._waiters.setdefault(execution_id, asyncio.get_running_loop().create_future())
        async with asyncio.timeout(timeout):
            return await fut
