"""The controller's projection of one execution. Rebuilt by folding input events."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

ExecStatus = Literal["running", "success", "failed", "cancelled", "rejected"]
RunStatus = Literal["scheduled", "routing", "looping", "done", "failed", "skipped"]


class LoopRun(msgspec.Struct):
    """Progress of a distributed loop, owned by the controller.

    Its size does not grow with the results: which iterations are settled is a bitmap, only the first
    failure (by index) is kept, and the results stay in their ``loop.iteration.done`` events, assembled
    once for ``loop.done`` (`control/loopresults.py`). The items are packed once (`control/core/items.py`):
    inline when small, else in the object store under ``items_key``.
    """

    total: int
    max_in_flight: int
    next_index: int = 0
    in_flight: int = 0
    done: int = 0
    failed: int = 0
    settled: bytearray = msgspec.field(default_factory=bytearray)
    """Bit ``i`` is set once iteration ``i`` is done or failed (later duplicates are ignored);
    ``(total + 7) // 8`` bytes. Empty in a snapshot written before this layout (see `compatible`)."""
    first_error: dict[str, Any] | None = None
    first_error_index: int = -1
    """The failed iteration with the lowest index and its error (a fail-fast loop's error)."""
    packed_items: str | None = None
    """The packed items (JSON lines) when small."""
    items_key: str | None = None
    items_checksum: str = ""
    """Where the packed items are in the results object store when they are not inline."""
    after_seq: int = 0
    """Every iteration event of this loop is stored after this stream sequence."""
    stopping: bool = False
    finished: bool = False
    deadline_at: float | None = None
    """Epoch seconds: the step's ``lifecycle.timeout_s`` (or ``deadline_s``, the shorter) after the loop
    started (from the timestamp of the event it started on). Bounds the whole loop, as they bound a local
    loop's command."""

    @property
    def compatible(self) -> bool:
        """False for a loop read from a snapshot of the earlier layout (items and results in the state):
        the controller rebuilds such an execution from its events instead."""
        return self.finished or self.total == 0 or len(self.settled) == (self.total + 7) >> 3

    def is_settled(self, index: int) -> bool:
        return bool(self.settled[index >> 3] & (1 << (index & 7)))

    def settle(self, index: int) -> None:
        self.settled[index >> 3] |= 1 << (index & 7)


class StepRun(msgspec.Struct):
    step: str
    run_id: str
    status: RunStatus
    args: dict[str, Any] = {}
    loop: LoopRun | None = None
    ctx_base: int = 0
    """The ctx revision its latest command carried (the ctx its tasks read): a key written after it
    by another run is one this run's ``set_ctx`` must not overwrite (`Run.apply_ctx_patches`)."""


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
    ctx_written: dict[str, tuple[int, str]] = {}
    """Each ctx key's last write: the revision it made and the step run that made it."""
    results: dict[str, Any] = {}
    result_meta: dict[str, dict[str, Any]] = {}
    """What a step's boundary said about its result beyond the value (`noetl_stream.dsl.views.result_meta`),
    for the views templates read it through: a loop's counts, a pipeline's results by task label."""
    step_status: dict[str, str] = {}
    failed_in_row: dict[str, int] = {}
    """Steps whose last runs failed: how many in a row (a cycle re-entering a failing step, `Run.route`)."""
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
    parent_iter: dict[str, Any] | None = None
    """The parent's loop iteration this child was started from (its request's): every command carries
    it, for ``iter.parent``."""
    pool: str | None = None
    """The request's ``pool``, as the intake recorded it with ``playbook.execution.requested``: where
    steps without a ``spec.pool`` of their own run (before the playbook's ``executor.spec.pool`` and the
    controller's default pool)."""
    keychain_check: bool = False
    """The playbook's keychain is being checked (`control/core/keychaincheck.py`): the workflow starts when a
    worker answers ``keychain.resolved``; until then no step runs and the execution does not complete."""
    paused: bool = False
    deferred: list[dict[str, Any]] = []
    """Tokens that arrived while paused: ``{step, args}``, scheduled on resume."""
    deadline_s: float | None = None
    deadline_at: float | None = None
    """Epoch seconds after which the execution fails with ``deadline_exceeded``."""
    fence: int = 0
    """The partition lease revision of the controller that wrote this snapshot (fencing token)."""
    started_at: str | None = None
    """When it was requested: the timestamp of its ``playbook.execution.requested``."""
    finished_at: str | None = None
    """When it ended: the timestamp of the event whose fold ended it (None while it runs)."""
    retry_of: str | None = None
    """The execution this one retries (its request's ``resume.execution_id``: ``noetl-stream retry``,
    ``POST /api/executions/{id}/retry``)."""

    @property
    def terminal(self) -> bool:
        return self.status != "running"

    @property
    def items_keys(self) -> list[str]:
        """The object-store keys of the packed items of this execution's unfinished distributed loops.
        A finished loop's items are deleted when it finishes (`Effects.dropped`); those still here when
        the execution ends (cancelled or failed mid-loop) are deleted after its final snapshot."""
        return [
            r.loop.items_key
            for r in self.runs.values()
            if r.loop is not None and r.loop.items_key is not None and not r.loop.finished
        ]
