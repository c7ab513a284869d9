"""``playbook``: run another playbook as a child execution; its result is this task's result.

A child's result above the inline limit reaches the parent as a reference to the results store; it is
fetched here, so the task's result is the child's result itself, whatever its size.

``spec.child_timeout_s`` bounds the wait: past it the child is cancelled and the task fails with
``timeout`` (retryable; a retry starts a new child). The task's ``timeout_s`` and its step's
``lifecycle.timeout_s`` cancel the child too (`ChildRunner.run`), as does the parent execution's end; a
task of an ended execution starts no child (``cancelled``), and args too large for a NATS message fail
it with ``payload_too_large`` before anything is sent.
"""

from __future__ import annotations

import contextlib
from typing import Any

from noetl_stream.dataplane.children import ChildNotStartedError
from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.dataplane.tools.base import ToolContext
from noetl_stream.errors import StoreMissingError
from noetl_stream.kv.results import ResultStore
from noetl_stream.wire import ExecutionRequest, derived_execution_id


async def run_playbook(config: dict[str, Any], ctx: ToolContext) -> Outcome:
    path = config.get("path")
    if not isinstance(path, str) or not path:
        return Outcome.fail("config_error", "playbook task needs 'path'")
    # A path shipped with the parent (a file next to it) runs that text; any other path is looked up in
    # the catalog by the controller's intake (with `version`, or the latest).
    text = ctx.attachments.get(path)
    version = config.get("version")
    runner = ctx.services.children if ctx.services is not None else None
    if runner is None:
        return Outcome.fail("config_error", "this worker cannot start child executions")
    payload = config.get("args", config.get("payload")) or {}
    if not isinstance(payload, dict):
        return Outcome.fail("config_error", "playbook task 'args' must render to a mapping")
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
        return_step=config.get("return_step"),
        attachments=ctx.attachments,
    )
    timeout = ctx.spec.get("child_timeout_s")
    limit = float(timeout) if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) else None
    try:
        ev = await runner.run(request, timeout=limit, stop_check=ctx.stop_check)
    except ChildNotStartedError as exc:
        return Outcome.fail(exc.kind, f"child playbook '{path}' ({child_id}) {exc}")
    except TimeoutError:  # spec.child_timeout_s (the pipeline's own timeout_s cancels instead)
        if limit is None:  # not ours: e.g. NATS did not answer the child's request
            raise
        with contextlib.suppress(Exception):
            await runner.cancel(child_id, f"the parent task waited spec.child_timeout_s ({limit} s)")
        return Outcome.fail(
            "timeout",
            f"child playbook '{path}' ({child_id}) did not finish within {limit} s (cancelled)",
            retryable=True,
            playbook={"execution_id": child_id, "status": None, "path": path},
        )
    status = ev.payload.get("status")
    info = {"execution_id": child_id, "status": status, "path": path}
    if status == "success":
        try:
            result = await ResultStore(runner.js, runner.topology).resolve(ev.payload.get("result"))
        except StoreMissingError as exc:
            return Outcome.fail(
                "child_failed",
                f"child playbook '{path}' ({child_id}) succeeded but its result cannot be read: {exc}",
                playbook=info,
            )
        return Outcome.ok(result, playbook=info)
    error = ev.payload.get("error") or {}
    message = error.get("message") if isinstance(error, dict) else None
    return Outcome.fail(
        "child_failed",
        f"child playbook '{path}' ({child_id}) ended {status}: {message or 'no error message'}",
        playbook={**info, "error": error},
    )
