"""The controller's projection of one execution. Rebuilt by folding input events."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

ExecStatus = Literal["running", "success", "failed", "cancelled", "rejected"]
RunStatus = Literal["scheduled", "routing", "looping", "done", "failed", "skipped"]


class LoopRun(msgspec.Struct):
    """Progress of a distributed loop, owned by the controller."""

    total: int
    items: list[Any]
    max_in_flight: int
    next_index: int = 0
    in_flight: int = 0
    done: int = 0
    failed: int = 0
    results: dict[int, Any] = {}
    errors: dict[int, Any] = {}
    stopping: bool = False
    finished: bool = False


class StepRun(msgspec.Struct):
    step: str
    run_id: str
    status: RunStatus
    args: dict[str, Any] = {}
    loop: LoopRun | None = None


class JoinState(msgspec.Struct):
    resolved: dict[str, bool] = {}
    args: dict[str, Any] = {}


class ExecutionState(msgspec.Struct):
    execution_id: str
    status: ExecStatus = "running"
    content_hash: str = ""
    name: str = ""
    path: str = ""
    file: str = ""
    workload: dict[str, Any] = {}
    ctx: dict[str, Any] = {}
    ctx_revision: int = 0
    results: dict[str, Any] = {}
    step_status: dict[str, str] = {}
    step_runs: dict[str, int] = {}
    runs: dict[str, StepRun] = {}
    joins: dict[str, JoinState] = {}
    unhandled: list[dict[str, Any]] = []
    last_step: str | None = None
    last_seq: int = 0
    events_applied: int = 0
    error: dict[str, Any] | None = None
    parent_execution_id: str | None = None
    parent_step_run_id: str | None = None
    trace_id: str | None = None
    return_step: str | None = None
    attachments: dict[str, str] = {}
    paused: bool = False
    deferred: list[dict[str, Any]] = []
    """Tokens that arrived while paused: ``{step, args}``, scheduled on resume."""
    deadline_s: float | None = None
    deadline_at: float | None = None
    """Epoch seconds after which the execution fails with ``deadline_exceeded``."""
    fence: int = 0
    """The partition lease revision of the controller that wrote this snapshot (fencing token)."""

    @property
    def terminal(self) -> bool:
        return self.status != "running"
