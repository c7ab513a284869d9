"""Running one command: the step's pipeline, local loop or distributed iteration (or the controller's
keychain check), within its step's timeout and deadline.

`CommandRun` resolves the command's results by reference, builds the step's scope, resolves its keychain
entries, renders its inputs and runs the pipeline (a loop step: loop_step.py, cursor.py). The events it
writes go through its `RunEvents` (run_events.py: queued, fitted under the size limits by fitting.py,
published), its task events through a `TaskEvents` per scope (task_events.py). The `Worker` (worker.py)
pulls, supervises and settles.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from noetl_stream import tracing
from noetl_stream.dataplane.checkpoints import Checkpoints
from noetl_stream.dataplane.children import in_iteration
from noetl_stream.dataplane.cursor import run_cursor_loop, with_ref
from noetl_stream.dataplane.fitting import EventFitter
from noetl_stream.dataplane.keychain import CredentialError, resolve_keychain
from noetl_stream.dataplane.loop_step import run_distributed_iteration, run_list_loop
from noetl_stream.dataplane.pipeline import PipelineInput, PipelineResult, run_pipeline
from noetl_stream.dataplane.run_events import RunEvents
from noetl_stream.dataplane.task_events import TASK_EVENTS_INFORMATIVE, TaskEvents
from noetl_stream.dsl.scope import build_scope
from noetl_stream.dsl.templates import RenderError, render_value
from noetl_stream.jetstream.outbox import Outbox
from noetl_stream.kv.checkpoints import KvCheckpoints
from noetl_stream.kv.refs import may_hold_refs, resolve_refs
from noetl_stream.protocol import events as E
from noetl_stream.protocol.errorinfo import ErrorInfo
from noetl_stream.protocol.wire import Command, epoch_of

if TYPE_CHECKING:
    from noetl_stream.dataplane.runparts import RunParts


class CommandRun:
    """One delivery of a command: runs its step (pipeline, local loop or one distributed iteration) and
    writes its worker events (`events`), each fitted under the size limits before it is published."""

    def __init__(self, parts: RunParts, cmd: Command, outbox: Outbox, delivery: int = 1) -> None:
        self.parts = parts
        """What it uses of the worker running it (`RunParts`)."""
        self.cmd = cmd
        self.delivery = delivery
        """How many times JetStream delivered the command (1 the first time)."""
        self._id_suffix = "" if delivery == 1 else f"~{delivery}"
        """A redelivery's events get ids of their own, so its run is recorded next to the earlier one's
        instead of being dropped as their duplicates (the reducer ignores a boundary of a run that ended)."""
        self.finished = False
        self.wake: asyncio.Event | None = None
        self.watcher: asyncio.Task[None] | None = None
        """Publishes progress and keeps the message alive while the command runs long (worker.py)."""
        # None unless OpenTelemetry tracing is on (a keychain check is no step run: no span)
        self.trace = None if cmd.keychain_check else tracing.step_run(cmd, parts.name)
        self.trace_id = cmd.trace_id if self.trace is None else self.trace.trace_id
        """What the events carry: the request's trace id, the trace's when tracing is on, else None."""
        self.fitter = EventFitter(parts.results, cmd.executor_spec, self._id_suffix)
        self.events = RunEvents(parts, cmd, outbox, self.fitter, self.trace, self.trace_id, self._id_suffix)
        """The worker events this run writes, until the `Worker` publishes them."""
        self.event = self.events.event
        """Queue a worker event (`RunEvents.event`; bound once: no call in between)."""
        self._holding: dict[str, TaskEvents] = {}
        """Scopes whose first task events are held (``--task-events informative``), by scope id."""

    @property
    def redelivered(self) -> bool:
        return self.delivery > 1

    def task_hook(self, scope_id: str) -> TaskEvents:
        """The pipeline's task-event callback for one scope (a step run or a loop iteration); the caller
        `settle`s it when the scope's pipeline ends."""
        hold = self.parts.task_events == TASK_EVENTS_INFORMATIVE and not self.redelivered
        hook = TaskEvents(self, scope_id, hold)
        if hook.held is not None:
            self._holding[scope_id] = hook
        return hook

    def settle(self, scope_id: str, ok: bool) -> None:
        """The scope's pipeline ended (`ok`: it succeeded): its held task events are dropped or written."""
        hook = self._holding.pop(scope_id, None)
        if hook is not None:
            hook.settle(ok)

    def release_held(self) -> None:
        """The run ends without its scopes settling (a timeout, an error): write every held event."""
        holding, self._holding = self._holding, {}
        for hook in holding.values():
            hook.release()

    def fail(self, error: dict[str, Any]) -> None:
        """The command failed before its step (or its loop iteration) could run to the end."""
        cmd = self.cmd
        run_id = cmd.step_run_id
        if cmd.iteration is not None:
            sid = f"{run_id}.{cmd.iteration.index}"
            self.event(
                E.LOOP_ITERATION_FAILED,
                "loop",
                sid,
                "error",
                sid,
                {"index": cmd.iteration.index, "error": error},
            )
        else:
            self.event(E.STEP_FAILED, "step", run_id, "error", run_id, {"error": error})

    async def execute(self) -> None:
        """Run the command under its step's ``lifecycle.timeout_s`` (this delivery) and ``deadline_s``
        (what is left of it since the controller issued the command), whichever ends first."""
        if self.cmd.keychain_check:  # no step: none of its limits applies
            await self.check_keychain()
            return
        try:
            timeout = self.cmd.timeout_s
            if timeout is not None and timeout <= 0:
                timeout = None
            left = self.deadline_left()
            if left is not None and left <= 0:
                self.fail(self.deadline_error())  # a redelivery (or a long wait in the queue) too late
            elif left is not None and (timeout is None or left < timeout):
                await self._run_within(left, deadline=True)
            elif timeout is not None:
                await self._run_within(timeout)
            else:
                await self.run()
        finally:
            self.release_held()  # an error or a cancellation: nothing held is dropped unseen

    async def check_keychain(self) -> None:
        """The controller's keychain check (`Command.keychain_check`): resolve every declaration the
        command carries as a step would, run no task, and answer ``keychain.resolved`` with their names,
        or ``keychain.failed`` naming the first that cannot be resolved (never a value)."""
        cmd = self.cmd
        run_id = cmd.step_run_id
        try:
            await resolve_keychain(cmd.keychain, self.parts.services)
        except CredentialError as exc:
            self.event(
                E.KEYCHAIN_FAILED,
                "workflow",
                cmd.execution_id,
                "error",
                run_id,
                {"error": _credential_error(exc)},
                of_step=False,
            )
            return
        entries = [decl.name for decl in cmd.keychain]
        self.event(
            E.KEYCHAIN_RESOLVED,
            "workflow",
            cmd.execution_id,
            "success",
            run_id,
            {"entries": entries},
            of_step=False,
        )

    def deadline_left(self) -> float | None:
        """Seconds left of the step's ``lifecycle.deadline_s``, counted from the command's ``issued_at``
        (the controller's clock when it scheduled the run), so every delivery shares one bound. None
        without a deadline, and for a distributed iteration, whose ``timeout_s`` the controller already
        cut to what is left of its loop's."""
        deadline = self.cmd.step_def.deadline_s
        if deadline is None or self.cmd.iteration is not None:
            return None
        issued = epoch_of(self.cmd.issued_at)
        if issued is None:
            return deadline  # no issue time (a hand-made command): the deadline counts from now
        return issued + deadline - time.time()

    def deadline_error(self) -> dict[str, Any]:
        return ErrorInfo(
            kind="deadline",
            retryable=False,
            message=f"step '{self.cmd.step}' did not finish within its lifecycle.deadline_s "
            f"({self.cmd.step_def.deadline_s} s) since it was scheduled",
        ).to_dict()

    async def _run_within(self, timeout: float, *, deadline: bool = False) -> None:
        try:
            async with asyncio.timeout(timeout):
                await self.run()
        except TimeoutError:
            self.release_held()  # the tasks cut short are written before the failure
            error = (
                self.deadline_error()
                if deadline
                else ErrorInfo(
                    kind="timeout",
                    retryable=False,
                    message=f"step '{self.cmd.step}' ran longer than its lifecycle.timeout_s ({timeout} s)",
                ).to_dict()
            )
            self.fail(error)

    async def run(self) -> None:
        """Run the command's step: its results by reference fetched, its scope built with its keychain
        entries and its ``input:``, then one distributed iteration, or ``step.started`` and a loop or the
        pipeline, which write the step's boundary (a failure before the step runs writes its own)."""
        cmd = self.cmd
        await self._resolve_refs()
        scope = build_scope(
            workload=cmd.workload,
            ctx=cmd.ctx,
            execution_id=cmd.execution_id,
            args=cmd.args,
            results=cmd.results,
            result_meta=cmd.result_meta,
        )
        base = self._pipeline_input(scope)
        if cmd.keychain:
            with_keychain = await self._resolve_keychain(base, scope)
            if with_keychain is None:
                return
            base = with_keychain
        if cmd.step_def.input and not self._render_input(scope):
            return
        if cmd.iteration is not None:
            await run_distributed_iteration(self, base)
            return
        self._step_started()
        loop = cmd.step_def.loop
        if loop is not None:
            await (run_cursor_loop(self, base) if loop.cursor is not None else run_list_loop(self, base))
            return
        with in_iteration(cmd.parent_iter):  # not a loop: its children nest in the same outer iteration
            res = await run_pipeline(base, self.task_hook(cmd.step_run_id))
        self._step_ended(res)

    async def _resolve_refs(self) -> None:
        """Results by reference, at any depth: what the step reads, its args, a distributed iteration's
        item and a large outer iteration (children.py). One encode each when there are none (kv/refs.py)."""
        cmd = self.cmd
        # (`may_hold_refs` first: no coroutine for what holds none, the usual case)
        fetch, fetched = self.parts.results.get, dict[str, Any]()
        if cmd.results and may_hold_refs(cmd.results):
            cmd.results = await resolve_refs(cmd.results, fetch, fetched)
        if cmd.result_meta and may_hold_refs(cmd.result_meta):
            cmd.result_meta = await resolve_refs(cmd.result_meta, fetch, fetched)
        if cmd.args and may_hold_refs(cmd.args):
            cmd.args = await resolve_refs(cmd.args, fetch, fetched)
        if cmd.iteration is not None:
            cmd.iteration.item = await resolve_refs(cmd.iteration.item, fetch, fetched)
        if cmd.parent_iter is not None:
            cmd.parent_iter = await resolve_refs(cmd.parent_iter, fetch, fetched)

    def _pipeline_input(self, scope: dict[str, Any]) -> PipelineInput:
        """What the step's pipeline runs with (a loop's iterations too, each with its own ``iter``)."""
        cmd = self.cmd
        return PipelineInput(
            execution_id=cmd.execution_id,
            step=cmd.step_def,
            scope=scope,
            executor_spec=cmd.executor_spec,
            services=self.parts.services,
            scope_id=cmd.step_run_id,
            workbook=cmd.workbook,
            attachments=cmd.attachments,
            stop_check=lambda: self.parts.ended.get(cmd.execution_id),
            # outcome.meta.trace_id: the events' trace id, else the one the execution's trace has.
            trace_id=self.trace_id or tracing.execution_trace_id(cmd.execution_id),
            checkpoints=Checkpoints(
                KvCheckpoints(self.parts.js, self.parts.topology, cmd.execution_id),
                self.parts.results,
                budget=self.fitter.inline_limit,
                tag=self._id_suffix,
            ),
            resume=self.redelivered,
            # A child started from a loop iteration: its steps without a loop read it as iter.parent too.
            iter={"parent": cmd.parent_iter} if cmd.parent_iter is not None else None,
            iteration_total=cmd.iteration.total if cmd.iteration is not None else None,
        )

    async def _resolve_keychain(self, base: PipelineInput, scope: dict[str, Any]) -> PipelineInput | None:
        """The step's keychain entries resolved: ``keychain`` in its scope, their values secret, and an
        ``auth: <name>`` of a task resolving the step's declarations first, as templates do. None when one
        cannot be resolved: the step failed."""
        try:
            resolved, secrets = await resolve_keychain(self.cmd.keychain, self.parts.services)
        except CredentialError as exc:
            self.fail(_credential_error(exc))
            return None
        scope["keychain"] = resolved
        return replace(base, secrets=frozenset(secrets), services=self.parts.services.declaring(resolved))

    def _render_input(self, scope: dict[str, Any]) -> bool:
        """The step's own inputs (dialect ``input:``), rendered once per step run before anything else:
        ``input`` in its scope, and over its ``args`` when a mapping. False when they do not render: the
        step failed."""
        step, run_id = self.cmd.step_def, self.cmd.step_run_id
        try:
            rendered = render_value(step.input, scope, f"step '{step.name}' input", as_input=True)
        except RenderError as exc:
            self.event(
                E.STEP_FAILED,
                "step",
                run_id,
                "error",
                run_id,
                {"error": ErrorInfo(kind="template_error", retryable=False, message=str(exc)).to_dict()},
            )
            return False
        scope["input"] = rendered
        if isinstance(rendered, dict):
            scope["args"] = {**scope.get("args", {}), **rendered}
        return True

    def _step_started(self) -> None:
        """``step.started``: the pool that runs it, and which delivery of its command this is after the
        first."""
        cmd = self.cmd
        started: dict[str, Any] = {"pool": cmd.pool}
        if self.redelivered:
            started["delivery"] = self.delivery
        self.event(E.STEP_STARTED, "step", cmd.step_run_id, "in_progress", cmd.step_run_id, started)

    def _step_ended(self, res: PipelineResult) -> None:
        """The step's boundary after its pipeline: ``step.done`` with its result, its ctx patches and (of a
        pipeline of several tasks) its results by task label, or ``step.failed`` with its error."""
        cmd = self.cmd
        run_id = cmd.step_run_id
        self.settle(run_id, res.status == "ok")
        if res.status == "ok":
            done: dict[str, Any] = {"result": with_ref(cmd, res.result), "ctx_patches": res.ctx_patches}
            if res.tasks is not None:  # a pipeline's results by task label (its step result's view)
                done.update(tasks=res.tasks, result_task=res.result_task)
            self.event(E.STEP_DONE, "step", run_id, "success", run_id, done)
        else:
            self.event(
                E.STEP_FAILED,
                "step",
                run_id,
                "error",
                run_id,
                {"error": res.error, "ctx_patches": res.ctx_patches},
            )


def _credential_error(exc: CredentialError) -> dict[str, Any]:
    """The error of a declared keychain entry that could not be resolved: its name, where it was looked
    for, never a value."""
    return ErrorInfo(kind="credential_error", retryable=False, message=str(exc), entry=exc.entry).to_dict()
