"""What the controller's and the workers' ``/metrics`` share: the text format's content type, the
buckets of the task duration histograms (so the two compare) and the process and runtime collectors."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

__all__ = ["CONTENT_TYPE", "DURATION_BUCKETS", "runtime_collectors"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The content type of what ``generate_latest`` writes (the classic text format)."""

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
"""Seconds: the buckets of ``noetl_task_duration_seconds`` and ``noetl_worker_task_duration_seconds``."""


def runtime_collectors(registry: CollectorRegistry) -> None:
    """Register the process (``process_*``: CPU seconds, resident memory, open files, start time) and the
    Python runtime (``python_info``, ``python_gc_*``) collectors in `registry`, as prometheus_client's
    default registry has them."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
