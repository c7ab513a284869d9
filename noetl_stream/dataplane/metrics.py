"""Prometheus metrics of one worker process (``noetl-stream worker --metrics HOST:PORT``, ``GET /metrics``).

- task runs by tool kind and status, counted and timed as they end on this worker (every task run,
  whatever ``--task-events`` writes): ``noetl_worker_tasks_total`` and the histogram
  ``noetl_worker_task_duration_seconds``;
- the commands this process runs now and how many it may run at once;
- read at scrape time, one request to JetStream: the pull lag of the pool's consumer (commands waiting
  for a worker, and delivered but not yet acknowledged, by any worker of the pool);
- the process and the Python runtime (CPU, memory, open files, garbage collections: prometheus_client's
  own collectors).

One registry per `WorkerMetrics` (tests run several workers in one interpreter).
"""

from __future__ import annotations

from collections.abc import Callable

import structlog
from nats.js import JetStreamContext
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from noetl_stream.prometheus import DURATION_BUCKETS, runtime_collectors
from noetl_stream.protocol.subjects import Topology

__all__ = ["WorkerMetrics"]

log = structlog.get_logger(__name__)


class WorkerMetrics:
    """The metrics of one worker process of `pool`."""

    def __init__(self, topology: Topology, pool: str, worker: str) -> None:
        self.topology = topology
        self.pool = pool
        self.registry = CollectorRegistry()
        r = self.registry
        runtime_collectors(r)
        info = Gauge(
            "noetl_worker_info", "This worker process: its name and pool", ["worker", "pool"], registry=r
        )
        info.labels(worker, pool).set(1)
        self.tasks = Counter(
            "noetl_worker_tasks",
            "Task runs ended on this worker, by tool kind and status (ok, error)",
            ["kind", "status"],
            registry=r,
        )
        self.task_seconds = Histogram(
            "noetl_worker_task_duration_seconds",
            "Task runs on this worker, start to end, by tool kind and status",
            ["kind", "status"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self._series: dict[tuple[str, str], tuple[Counter, Histogram]] = {}
        self.in_flight = Gauge(
            "noetl_worker_commands_in_flight", "Commands this worker process runs now", registry=r
        )
        self.capacity = Gauge(
            "noetl_worker_concurrency",
            "Commands this worker process runs at once at most (--concurrency)",
            registry=r,
        )
        self.pending = Gauge(
            "noetl_worker_consumer_pending",
            "Commands of the pool waiting for a worker (its consumer's num_pending, read at scrape time)",
            ["pool"],
            registry=r,
        )
        self.ack_pending = Gauge(
            "noetl_worker_consumer_ack_pending",
            "Commands of the pool delivered to a worker and not acknowledged yet (num_ack_pending)",
            ["pool"],
            registry=r,
        )

    def track(self, running: Callable[[], int], concurrency: int) -> None:
        """Read the commands in flight from `running` at scrape time."""
        self.in_flight.set_function(lambda: float(running()))
        self.capacity.set(concurrency)

    def task_done(self, kind: str, status: str, seconds: float) -> None:
        """A task run ended (called by the worker as it ends; the labelled series are looked up once)."""
        series = self._series.get((kind, status))
        if series is None:
            series = self._series[kind, status] = (
                self.tasks.labels(kind, status),
                self.task_seconds.labels(kind, status),
            )
        series[0].inc()
        series[1].observe(max(0.0, seconds))

    async def refresh(self, js: JetStreamContext) -> None:
        """Read the pool consumer's lag (called on each scrape); the last values stand if NATS does not
        answer (the lines of `exposition` then say nothing new rather than fail)."""
        try:
            info = await js.consumer_info(
                self.topology.commands_stream, self.topology.pool_consumer(self.pool)
            )
        except Exception as exc:  # timeout, no responders, the connection reconnecting
            log.debug("metrics.refresh_failed", error=str(exc) or type(exc).__name__)
            return
        self.pending.labels(self.pool).set(info.num_pending or 0)
        self.ack_pending.labels(self.pool).set(info.num_ack_pending or 0)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
