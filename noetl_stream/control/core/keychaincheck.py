"""The keychain check: a playbook's declared ``keychain`` is resolved before its workflow starts.

The controller never reads a credential (its NATS user is denied the keychain bucket), and an ``env:`` or
``file:`` entry exists only where a worker has it. So after ``playbook.request.evaluated`` the reducer
sends one worker a check (`check_command`): it resolves the declarations as a step would, runs no task,
and answers ``keychain.resolved`` (then ``workflow.started``) or ``keychain.failed`` (the execution fails
before any step is scheduled). Steps still resolve what they read themselves: values never travel.
A worker of an earlier release answers with the boundary of a step without tasks (``step.done`` or
``step.failed`` of the check's run): taken as the same answers.

The check runs on the pool of ``start`` (of the first step with a tool, when ``start`` has none). It
covers every entry of the encrypted store, and ``env:``/``file:`` entries when every step that reads the
keychain runs on that pool as well (always, with one pool); otherwise those are left to the steps.
"""

from __future__ import annotations

from typing import Any

from noetl_stream.control.core.plan import Plan
from noetl_stream.control.core.state import ExecutionState
from noetl_stream.dsl.model import KeychainEntry, Step
from noetl_stream.protocol.errorinfo import ErrorInfo
from noetl_stream.protocol.wire import Command, KeychainDecl

CHECK_RUN = "keychain-check"
"""The check's run id: its command's ``step_run_id`` (and id), and its answer's. Never a step run's,
which is ``<step>-<n>``."""

CHECK_FLAG = "keychain_check"
"""Recorded true by the intake with ``playbook.execution.requested``: the reducer checks the keychain of
that execution. Requests recorded before the check existed lack it, and replay as they ran."""


def check_command(plan: Plan, state: ExecutionState, issued_at: str) -> Command | None:
    """The check of the execution's declared keychain, or None when it declares nothing the check
    covers (it has no ``start`` step: it fails anyway)."""
    start = plan.steps.get("start")
    if start is None or not plan.playbook.keychain:
        return None
    pool = check_pool(plan, state.pool)
    decls = [
        KeychainDecl(name=k.name, kind=k.kind, config=k.config)
        for k in checked_entries(plan, state.pool, pool)
    ]
    if not decls:
        return None
    return Command(
        command_id=f"{state.execution_id}:{CHECK_RUN}",
        execution_id=state.execution_id,
        step=start.name,
        step_run_id=CHECK_RUN,
        pool=pool,
        # No tasks: a worker of a release before the check (blind to `keychain_check`) runs it as a step
        # without tasks, which resolves the declarations and runs nothing; its step.done or step.failed
        # answers the check (`Run.on_keychain`).
        step_def=Step(name=start.name),
        trace_id=state.trace_id,
        issued_at=issued_at,
        keychain=decls,
        keychain_check=True,
    )


def check_pool(plan: Plan, request_pool: str | None) -> str:
    """The pool of ``start``, or of the first step in the playbook's order with a tool when ``start``
    only routes (the controller runs it: its pool may have no worker)."""
    start = plan.steps["start"]
    first = next((s for s in (start, *plan.playbook.workflow) if not s.is_router), start)
    return plan.pool_of(first, request_pool)


def checked_entries(plan: Plan, request_pool: str | None, pool: str) -> list[KeychainEntry]:
    """The declarations a worker of `pool` checks: every store entry; the ``env:``/``file:`` ones only
    when every step reading the keychain runs on `pool` (a worker of another pool may have them while
    this one does not)."""
    one_pool = all(
        plan.pool_of(plan.steps[name], request_pool) == pool
        for name in plan.keychain_readers
        if not plan.steps[name].is_router
    )
    return [k for k in plan.playbook.keychain if one_pool or not on_worker(k)]


def on_worker(entry: KeychainEntry) -> bool:
    """Whether the entry comes from the worker's own environment or files, not the encrypted store."""
    return "env" in entry.config or "file" in entry.config


def check_error(payload: dict[str, Any]) -> dict[str, Any]:
    """The execution's error from a ``keychain.failed`` payload, in the check's shape (the kind, the
    message, the entry it names), whatever else the payload holds."""
    error = payload.get("error")
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return ErrorInfo(
            kind="credential_error", retryable=False, message="the keychain check failed without saying why"
        ).to_dict()
    kind = error.get("kind")
    entry = error.get("entry")
    return ErrorInfo(
        kind=kind if isinstance(kind, str) and kind else "credential_error",
        retryable=False,
        message=error["message"],
        entry=entry if isinstance(entry, str) else None,
    ).to_dict()
