"""Prometheus metrics of the control plane, in the text exposition format (``GET /metrics``).

Three sources, each as cheap as it can be:

- the events the controller folds and the effects it writes (`Metrics.observe`, called from the
  controller's fold loop: plain integer counters and dict updates, histograms observed on step
  boundaries only): executions started/finished by playbook and status, step durations by kind
  (scheduled -> boundary, queueing included), events folded and written;
- the workers' task events, read with a core NATS subscription (no JetStream consumer, nothing
  acked; dropped under overload rather than slowing anything): task durations by kind and retries;
- JetStream state read at scrape time: commands pending and in flight per pool (the ``pool-<pool>``
  consumers' ``num_pending`` / ``num_ack_pending``) and the events stream's last sequence, whose
  rate is the events/s of the installation (also given as a gauge over the last scrape interval);
- the process and the Python runtime (prometheus_client's collectors: ``process_*``, ``python_*``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.errors import NotFoundError
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from noetl_stream.control.core.plans import PlanCache
from noetl_stream.control.core.state import ExecutionState
from noetl_stream.prometheus import DURATION_BUCKETS, runtime_collectors
from noetl_stream.protocol import events as E
from noetl_stream.protocol.carried import decode_all, subject_names
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event, epoch_of

__all__ = ["Metrics"]

log = structlog.get_logger(__name__)

_BOUNDARIES = E.BOUNDARY_EVENTS
_SCHEDULES = frozenset({E.STEP_SCHEDULED, E.LOOP_STARTED})


_TASK_SUBJECTS = (f".{E.TASK_STARTED}", f".{E.TASK_DONE}")


class Metrics:
    """One registry per controller process (tests run several in one interpreter)."""

    def __init__(self, topology: Topology, plans: PlanCache | None = None) -> None:
        self.topology = topology
        self.plans = plans
        self.registry = CollectorRegistry()
        r = self.registry
        runtime_collectors(r)
        self.started = Counter(
            "noetl_executions_started", "Executions started, by playbook path", ["playbook"], registry=r
        )
        self.finished = Counter(
            "noetl_executions_finished",
            "Executions finished, by playbook path and final status",
            ["playbook", "status"],
            registry=r,
        )
        self.running = Gauge(
            "noetl_executions_running",
            "Executions started and not finished, of the partitions this controller holds",
            registry=r,
        )
        self.running.set_function(self._count_running)
        self.step_seconds = Histogram(
            "noetl_step_duration_seconds",
            "Step runs from scheduling to their boundary event, by kind (tool kind, loop or router)",
            ["kind"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.task_seconds = Histogram(
            "noetl_task_duration_seconds",
            "Task runs (task.started -> task.done on the worker), by tool kind",
            ["kind"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.retries = Counter(
            "noetl_task_retries", "Task runs retried by a policy, by kind", ["kind"], registry=r
        )
        self.events = Counter(
            "noetl_controller_events",
            "Events folded (input) and written (output) by the controller",
            ["direction"],
            registry=r,
        )
        self.pending = Gauge(
            "noetl_commands_pending",
            "Commands waiting for a worker, by pool (consumer num_pending)",
            ["pool"],
            registry=r,
        )
        self.in_flight = Gauge(
            "noetl_commands_in_flight",
            "Commands delivered and not acknowledged, by pool (num_ack_pending)",
            ["pool"],
            registry=r,
        )
        self.redelivered = Gauge(
            "noetl_commands_redelivered",
            "Commands being redelivered, by pool (num_redelivered)",
            ["pool"],
            registry=r,
        )
        self.stored = Gauge(
            "noetl_events_stream_last_seq",
            "Last sequence of the events stream (rate() = events/s)",
            registry=r,
        )
        self.rate = Gauge(
            "noetl_events_per_second", "Events stored per second over the last scrape interval", registry=r
        )
        # hot-path state: plain ints and dicts, turned into metrics at scrape time or on boundaries
        self._folded = 0
        self._written = 0
        self._runs: dict[str, dict[str, tuple[float, str]]] = {}
        self._kinds: dict[tuple[str, str], str] = {}
        self._playbooks: dict[str, str] = {}
        self._running: set[str] = set()
        """Executions seen running in a fold here; counted while their partition is held here."""
        self.holds: Callable[[str], bool] = lambda execution_id: True
        """Whether this controller holds an execution's partition (the API server sets it)."""
        self._tasks: dict[tuple[str, str, int], float] = {}
        self._last_seq: tuple[float, int] | None = None
        self._subs: list[Subscription] = []

    # -- the controller's fold loop ---------------------------------------------------------------
    def observe(self, event: Event | None, written: list[Event], state: ExecutionState | None) -> None:
        """Called once per folded input event with the events the reducer wrote for it; with None and
        what a resume published (an execution taken over, or a controller restarted)."""
        if event is not None:
            self._folded += 1
        self._written += len(written)
        try:
            if state is not None:  # running is what the folds say, wherever the execution started
                if state.terminal:
                    self._running.discard(state.execution_id)
                elif state.status != "rejected":
                    self._running.add(state.execution_id)
            if event is None:
                pass
            elif event.name in _BOUNDARIES:
                self._boundary(event)
            elif (
                event.name == E.EXECUTION_REQUESTED
                and state is not None
                and state.status == "rejected"
                and "rejected" in event.payload  # intake wrote the rejection: no effect will say so
            ):
                self.finished.labels(state.path or state.file, "rejected").inc()
            for ev in written:
                name = ev.name
                if name in _SCHEDULES:
                    self._scheduled(ev, state)
                elif name == E.REQUEST_EVALUATED:
                    playbook = str(ev.payload.get("path") or ev.entity_id)
                    self._playbooks[ev.execution_id] = playbook
                    self.started.labels(playbook).inc()
                elif name == E.PLAYBOOK_PROCESSED:
                    self._processed(ev, state)
        except Exception as exc:  # metrics must never break folding
            log.warning("metrics.observe_failed", error=str(exc) or type(exc).__name__)

    def _scheduled(self, ev: Event, state: ExecutionState | None) -> None:
        if ev.step_run_id is None or ev.step is None:
            return
        runs = self._runs.setdefault(ev.execution_id, {})
        if ev.step_run_id in runs:  # a distributed loop's loop.started after its step.scheduled
            return
        kind = "loop" if ev.name == E.LOOP_STARTED else self._kind(state, ev.step)
        runs[ev.step_run_id] = (time.monotonic(), kind)

    def _boundary(self, event: Event) -> None:
        runs = self._runs.get(event.execution_id)
        started = runs.pop(event.step_run_id, None) if runs is not None and event.step_run_id else None
        if started is not None:
            self.step_seconds.labels(started[1]).observe(time.monotonic() - started[0])

    def _processed(self, ev: Event, state: ExecutionState | None) -> None:
        playbook = self._playbooks.pop(ev.execution_id, None)
        status = str(ev.payload.get("status") or ("success" if ev.status == "success" else "failed"))
        self._running.discard(ev.execution_id)
        label = playbook or (state.path or state.file if state is not None else "") or ev.entity_id
        self.finished.labels(label, status).inc()
        self._runs.pop(ev.execution_id, None)

    def _count_running(self) -> float:
        """At scrape: the running executions whose partition is held here (one a controller handed over
        is counted by its new owner; this one forgets it)."""
        held = {eid for eid in self._running if self.holds(eid)}
        self._running = held
        return float(len(held))

    def _kind(self, state: ExecutionState | None, step: str) -> str:
        if state is None or self.plans is None:
            return "step"
        key = (state.content_hash, step)
        kind = self._kinds.get(key)
        if kind is None:
            plan = self.plans.get(state.content_hash)
            spec = plan.steps.get(step) if plan is not None else None
            if spec is None:
                return "step"
            kind = "loop" if spec.loop is not None else (spec.tasks[0].kind if spec.tasks else "router")
            if len(self._kinds) < 10_000:
                self._kinds[key] = kind
        return kind

    # -- the workers' task events -----------------------------------------------------------------
    async def start(self, nc: NATS) -> None:
        """Subscribe to task events (core NATS: nothing is acked, slow delivery drops, never blocks)."""
        if not self._subs:
            for name in sorted(subject_names((E.TASK_STARTED, E.TASK_DONE))):  # carriers hold some
                subject = self.topology.any_execution_filter(name)
                self._subs.append(await nc.subscribe(subject, cb=self._on_task, pending_msgs_limit=65_536))

    async def stop(self) -> None:
        subs, self._subs = self._subs, []
        for sub in subs:
            try:
                await sub.unsubscribe()
            except Exception:
                pass

    async def _on_task(self, msg: Msg) -> None:
        if not msg.subject.endswith(_TASK_SUBJECTS) and b'"carried":' not in msg.data:
            return  # a boundary that carries nothing: not decoded (the results it may hold can be large)
        try:
            for event in decode_all(msg.data):
                self.task_event(event)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError):
            return

    def task_event(self, ev: Event) -> None:
        attempt = ev.payload.get("attempt")
        key = (ev.execution_id, ev.task_run_id or ev.entity_id, attempt if isinstance(attempt, int) else 0)
        if ev.name == E.TASK_STARTED:
            at = epoch_of(ev.timestamp)
            if at is not None and len(self._tasks) < 100_000:
                self._tasks[key] = at
            return
        if ev.name != E.TASK_DONE:
            return
        kind = str(ev.payload.get("kind") or "unknown")
        started, ended = self._tasks.pop(key, None), epoch_of(ev.timestamp)
        if started is not None and ended is not None:
            self.task_seconds.labels(kind).observe(max(0.0, ended - started))
        if ev.payload.get("do") == "retry":
            self.retries.labels(kind).inc()

    # -- scrape -----------------------------------------------------------------------------------
    async def refresh(self, nc: NATS) -> None:
        """Read consumer lag and the events stream's position (called by ``GET /metrics``)."""
        folded, self._folded = self._folded, 0
        written, self._written = self._written, 0
        self.events.labels("folded").inc(folded)
        self.events.labels("written").inc(written)
        js = nc.jetstream()
        try:
            consumers: list[Any] = await js.consumers_info(self.topology.commands_stream)
            for info in consumers:
                name = str(info.name)
                if name.startswith("pool-"):
                    pool = name[len("pool-") :]
                    self.pending.labels(pool).set(info.num_pending or 0)
                    self.in_flight.labels(pool).set(info.num_ack_pending or 0)
                    self.redelivered.labels(pool).set(info.num_redelivered or 0)
            stream = await js.stream_info(self.topology.events_stream)
        except (NotFoundError, TimeoutError) as exc:
            log.warning("metrics.refresh_failed", error=str(exc) or type(exc).__name__)
            return
        last = int(stream.state.last_seq or 0)
        now = time.monotonic()
        self.stored.set(last)
        if self._last_seq is not None and now > self._last_seq[0]:
            self.rate.set(max(0, last - self._last_seq[1]) / (now - self._last_seq[0]))
        self._last_seq = (now, last)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
