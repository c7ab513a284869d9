"""``playbook``: start another playbook as a child execution.

The child's workload is the task's ``input``/``args`` when it is a non-empty mapping, else its
``payload``. ``path`` names a file shipped with the parent (that text runs), else a catalog entry (of
``version``, or the latest).

Without ``return_step`` the task is fire-and-forget: it returns ``{status: "started", execution_id,
path, async: true}`` as soon as the controller has accepted the child's request (`ChildRunner.start`),
and fails with ``child_failed`` if it was rejected. The child then runs to its end on its own; a parent
that ends with any status but ``success`` while it runs cancels it (`control/children.py`).

With ``return_step`` the task waits for the child's end and fails with ``child_failed`` unless the child
succeeded having run that step: its result is that step's result (fetched from the results store when
it travels by reference) with ``status`` and ``execution_id`` added (the step's own keys win), or
``{status, execution_id, data: <result>}`` when the step's result is not a mapping. The task's
``timeout:`` (seconds; else ``spec.child_timeout_s``; else `DEFAULT_TIMEOUT_S`; 0: no limit) bounds
the wait (for a fire-and-forget task, the wait for the child's acceptance): past it the child is
cancelled and the task fails with ``timeout`` (retryable; a retry starts a new child). The task's
``timeout_s`` and its step's ``lifecycle.timeout_s`` cancel the child too (`ChildRunner.run`), as does
the parent execution's end.

A task of an ended execution starts no child (``cancelled``), and a workload too large for a NATS
message fails it with ``payload_too_large`` before anything is sent.
"""

from __future__ import annotations

import contextlib
from typing import Any

from noetl_stream.dataplane.children import ChildNotStartedError, ChildRunner
from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.dataplane.tools.base import ToolContext, seconds
from noetl_stream.errors import StoreMissingError
from noetl_stream.kv.results import ResultStore
from noetl_stream.protocol.wire import ExecutionRequest, derived_execution_id

DEFAULT_TIMEOUT_S = 300.0
"""How long a task with ``return_step`` waits for its child when neither ``timeout`` nor
``spec.child_timeout_s`` says."""


def _workload(config: dict[str, Any]) -> dict[str, Any]:
    """The child's workload: a non-empty ``input``/``args`` wins over ``payload``; ``ValueError`` for
    one that is not a mapping."""
    for key in ("args", "payload"):
        value = config.get(key)
        if value is None or value == {}:
            continue
        if not isinstance(value, dict):
            shown = "'input' (or 'args')" if key == "args" else "'payload'"
            raise ValueError(f"playbook task {shown} must render to a mapping, got {type(value).__name__}")
        return value
    return {}


def _wait_limit(config: dict[str, Any], spec: dict[str, Any]) -> float | None:
    """Seconds a task with ``return_step`` waits (None: for ever); ``ValueError`` for a bad value."""
    if config.get("timeout") is not None:
        return seconds(config["timeout"], "playbook task 'timeout'")
    if spec.get("child_timeout_s") is not None:
        return seconds(spec["child_timeout_s"], "spec.child_timeout_s")
    return DEFAULT_TIMEOUT_S


def _step_result(result: Any, status: str, child_id: str) -> dict[str, Any]:
    if isinstance(result, dict):
        return {"status": status, "execution_id": child_id, **result}
    return {"status": status, "execution_id": child_id, "data": result}


def _not_reached(step: str, status: Any) -> str:
    if status is None:
        return f"never ran its return_step '{step}'"
    if status == "skipped":
        return f"skipped its return_step '{step}'"
    return f"ran its return_step '{step}' without success (its last run {status})"


async def _timed_out(runner: ChildRunner, request: ExecutionRequest, limit: float, what: str) -> Outcome:
    """Cancel a child the task stopped waiting for at its `limit`; the task's ``timeout`` error."""
    child_id = request.execution_id
    assert child_id is not None
    with contextlib.suppress(Exception):
        await runner.cancel(child_id, f"the parent task waited its timeout ({limit} s)")
    return Outcome.fail(
        "timeout",
        f"child playbook '{request.file}' ({child_id}) {what} within {limit} s (cancelled)",
        retryable=True,
        playbook={"execution_id": child_id, "status": None, "path": request.file},
    )


async def _start(
    runner: ChildRunner, request: ExecutionRequest, limit: float | None, ctx: ToolContext
) -> Outcome:
    """Fire-and-forget: start the child, return once the controller has accepted it."""
    child_id, path = request.execution_id, request.file
    assert child_id is not None
    try:
        rejected = await runner.start(request, timeout=limit, stop_check=ctx.stop_check)
    except ChildNotStartedError as exc:
        return Outcome.fail(exc.kind, f"child playbook '{path}' ({child_id}) {exc}")
    except TimeoutError:
        if limit is None:
            raise
        return await _timed_out(runner, request, limit, "was not accepted by a controller")
    if rejected is not None:
        return Outcome.fail(
            "child_failed",
            f"child playbook '{path}' ({child_id}) was not started: {rejected.get('message') or 'rejected'}",
            playbook={"execution_id": child_id, "status": "rejected", "path": path, "error": rejected},
        )
    started = {"status": "started", "execution_id": child_id, "path": path, "async": True}
    return Outcome.ok(started, playbook={"execution_id": child_id, "status": "started", "path": path})


async def run_playbook(config: dict[str, Any], ctx: ToolContext) -> Outcome:
    path = config.get("path")
    if not isinstance(path, str) or not path:
        return Outcome.fail("config_error", "playbook task needs 'path'")
    return_step = config.get("return_step")
    if return_step is not None and (not isinstance(return_step, str) or not return_step):
        return Outcome.fail(
            "config_error", f"playbook task 'return_step' must name a step, got {return_step!r}"
        )
    # A path shipped with the parent (a file next to it) runs that text; any other path is looked up in
    # the catalog by the controller's intake (with `version`, or the latest).
    text = ctx.attachments.get(path)
    version = config.get("version")
    runner = ctx.services.children if ctx.services is not None else None
    if runner is None:
        return Outcome.fail("config_error", "this worker cannot start child executions")
    try:
        payload = _workload(config)
        limit = _wait_limit(config, ctx.spec)
    except ValueError as exc:
        return Outcome.fail("config_error", str(exc))
    child_id = derived_execution_id(ctx.execution_id, ctx.scope_id, ctx.task, ctx.attempt)
    request = ExecutionRequest(
        playbook=text,
        path=None if text is not None else path,
        version=None if text is not None or version is None else str(version),
        file=path,
        payload=payload,
        execution_id=child_id,
        parent_execution_id=ctx.execution_id,
        parent_step_run_id=ctx.scope_id,
        return_step=return_step,
        attachments=ctx.attachments,
    )
    if return_step is None:
        return await _start(runner, request, limit, ctx)
    try:
        ev = await runner.run(request, timeout=limit, stop_check=ctx.stop_check)
    except ChildNotStartedError as exc:
        return Outcome.fail(exc.kind, f"child playbook '{path}' ({child_id}) {exc}")
    except TimeoutError:  # the wait's limit (the pipeline's own timeout_s cancels instead)
        if limit is None:  # not ours: e.g. NATS did not answer the child's request
            raise
        return await _timed_out(runner, request, limit, "did not finish")
    status = ev.payload.get("status")
    info = {"execution_id": child_id, "status": status, "path": path}
    if status == "success":
        steps = ev.payload.get("steps")
        reached = steps.get(return_step) if isinstance(steps, dict) else None
        if reached != "done":
            return Outcome.fail(
                "child_failed",
                f"child playbook '{path}' ({child_id}) ended success but {_not_reached(return_step, reached)}",
                playbook=info,
            )
        try:
            result = await ResultStore(runner.js, runner.topology).resolve(ev.payload.get("result"))
        except StoreMissingError as exc:
            return Outcome.fail(
                "child_failed",
                f"child playbook '{path}' ({child_id}) succeeded but its result cannot be read: {exc}",
                playbook=info,
            )
        return Outcome.ok(_step_result(result, status, child_id), playbook=info)
    error = ev.payload.get("error") or {}
    message = error.get("message") if isinstance(error, dict) else None
    return Outcome.fail(
        "child_failed",
        f"child playbook '{path}' ({child_id}) ended {status}: {message or 'no error message'}",
        playbook={**info, "error": error},
    )
