"""What a command run uses of the worker that runs it (`RunParts`), and nothing else of it.

The `Worker` builds one when it is made and hands it to every `CommandRun` it starts: the run, its
events, its task events and its loops read the worker's name, stores, services and settings from here,
and ask it whether it is shutting down, without reaching into the worker itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nats.js.client import JetStreamContext

    from noetl_stream.dataplane.metrics import WorkerMetrics
    from noetl_stream.dataplane.tools.base import WorkerServices
    from noetl_stream.kv.results import ResultStore
    from noetl_stream.protocol.subjects import Topology

__all__ = ["RunParts"]


@dataclass(slots=True, eq=False)
class RunParts:
    """The worker's parts a command run uses."""

    name: str
    """The worker's name (on its events and spans)."""
    js: JetStreamContext
    topology: Topology
    results: ResultStore
    """Where results by reference are stored and read."""
    services: WorkerServices
    """What the tools share on this worker: sessions, pools, the credential resolver."""
    log: Any
    """The worker's logger (bound to its name and pool)."""
    task_events: str
    """Which task events it writes (`task_events.TASK_EVENTS`)."""
    carry: bool
    """Whether a step run's earlier events travel inside its boundary's message (`carried.py`)."""
    ended: Mapping[str, str]
    """Executions that ended while commands of theirs may run here (a run checks it between tasks)."""
    stopping: Callable[[], bool]
    """Whether the worker is shutting down (local loops start no more iterations)."""
    metrics: WorkerMetrics | None = None
    """Counts and times the task runs that end here (None: nothing is counted)."""
