"""Running one command: the step's pipeline, local loop or distributed iteration (or the controller's
keychain check), and its worker events.

`CommandRun` renders the step's inputs, resolves its keychain entries and results by reference, runs
the pipeline, and collects the events it writes. `fit` keeps every event under the server's payload
limit (a large result goes to the object store). The `Worker` (worker.py) pulls, supervises and settles.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import msgspec

from noetl_stream import tracing
from noetl_stream.dataplane.checkpoints import Checkpoints
from noetl_stream.dataplane.children import in_iteration
from noetl_stream.dataplane.cursor import run_cursor_loop, with_ref
from noetl_stream.dataplane.keychain import CredentialError, resolve_keychain
from noetl_stream.dataplane.loops import Completed, HandedBack, LoopResult, iteration_scope, run_local_loop
from noetl_stream.dataplane.pipeline import PipelineInput, run_pipeline, task_run_id
from noetl_stream.dsl.inflight import MaxInFlightError, loop_max_in_flight
from noetl_stream.dsl.model import Task
from noetl_stream.dsl.scope import build_scope
from noetl_stream.dsl.templates import RenderError, render_value
from noetl_stream.jetstream.outbox import Outbox
from noetl_stream.kv.checkpoints import KvCheckpoints
from noetl_stream.kv.history import read_events
from noetl_stream.kv.refs import may_hold_refs, resolve_refs
from noetl_stream.kv.results import inline_limit, is_ref
from noetl_stream.protocol import events as E
from noetl_stream.protocol.carried import carry
from noetl_stream.protocol.errorinfo import ErrorInfo
from noetl_stream.protocol.wire import Command, Event, encode, make_event, now_iso

if TYPE_CHECKING:
    from noetl_stream.dataplane.worker import Worker

MAX_EVENT_BYTES = 900 * 1024

TASK_EVENTS_ALL = "all"
TASK_EVENTS_SEPARATE = "separate"
TASK_EVENTS_INFORMATIVE = "informative"
TASK_EVENTS = (TASK_EVENTS_ALL, TASK_EVENTS_SEPARATE, TASK_EVENTS_INFORMATIVE)
"""Which ``task.started``/``task.done`` a worker writes, and how. ``all`` (the default): every task run's,
the spec's recommended event set; a step run that ends before its events are published sends its
``step.started`` and task events inside its boundary's message (`carried.py`). ``separate``: the same
events, each a message of its own (for consumers of ``task.*`` subjects). ``informative``: a step (or loop
iteration) whose pipeline ran one task once, which succeeded with no policy rule fired and no captured
output, writes only its step events — its task events would repeat them (docs/architecture.md, "Task
events"); carried as with ``all``."""


class CommandRun:
    """One delivery of a command: runs its step (pipeline, local loop or one distributed iteration) and
    collects the worker events it writes, each fitted under the size limits before it is published."""

    def __init__(self, worker: Worker, cmd: Command, outbox: Outbox, delivery: int = 1) -> None:
        self.worker = worker
        self.cmd = cmd
        self.outbox = outbox
        self.delivery = delivery
        """How many times JetStream delivered the command (1 the first time)."""
        self._id_suffix = "" if delivery == 1 else f"~{delivery}"
        """A redelivery's events get ids of their own, so its run is recorded next to the earlier one's
        instead of being dropped as their duplicates (the reducer ignores a boundary of a run that ended)."""
        self.pending: list[Event] = []
        self.finished = False
        self.wake: asyncio.Event | None = None
        self.watcher: asyncio.Task[None] | None = None
        """Publishes progress and keeps the message alive while the command runs long (worker.py)."""
        # None unless OpenTelemetry tracing is on (a keychain check is no step run: no span)
        self.trace = None if cmd.keychain_check else tracing.step_run(cmd, worker.name)
        self.trace_id = cmd.trace_id if self.trace is None else self.trace.trace_id
        """What the events carry: the request's trace id, the trace's when tracing is on, else None."""
        self._stored: dict[str, dict[str, Any]] = {}
        """References of the large results this run stored, by checksum (`fit`: each is stored once)."""
        self._holding: dict[str, TaskEvents] = {}
        """Scopes whose first task events are held (``--task-events informative``), by scope id."""
        self._inline_limit: int | None = None
        self._unconfirmed: list[tuple[Event, bytes]] = []
        """What `publish_pending_nowait` published, kept until it is known to be stored."""

    @property
    def redelivered(self) -> bool:
        return self.delivery > 1

    def event(
        self,
        name: str,
        entity_type: str,
        entity_id: str,
        status: str,
        scope: str,
        payload: dict[str, Any],
        task_run_id: str | None = None,
        at: tuple[str, int] | None = None,
        *,
        of_step: bool = True,
    ) -> None:
        """Queue a worker event; `at` (ISO timestamp, epoch ns): when it happened, if not now (a held
        task event written later, `TaskEvents`); `of_step` false: an event of no step (a keychain check's
        answer), with the command's run id all the same."""
        cmd = self.cmd
        if self.trace is not None:
            self.trace.on_event(name, status, entity_id, payload, at[1] if at is not None else None)
        if status == "error" and name in _FAILURES:
            _log_failure(self.worker._log, name, payload)
        self.pending.append(
            make_event(
                cmd.execution_id,
                name,
                source="worker",
                entity_type=entity_type,
                entity_id=entity_id,
                status=status,
                scope=scope + self._id_suffix,
                payload=payload,
                timestamp=None if at is None else at[0],
                step=cmd.step if of_step else None,
                step_run_id=cmd.step_run_id,
                task_run_id=task_run_id,
                trace_id=self.trace_id,
                worker=self.worker.name,
            )
        )

    async def send_pending_now(self) -> None:
        pending, self.pending = self.pending, []
        for ev in pending:
            fitted, data = await self.fit(ev)
            await self.outbox.send_now(fitted, data)

    async def completed_iterations(self) -> dict[int, Completed]:
        """Iterations of this loop run that an earlier delivery finished (from the events stream)."""
        cmd = self.cmd
        done: dict[int, Completed] = {}
        async for _, ev in read_events(
            self.worker.js, self.worker.topology, cmd.execution_id, names=(E.LOOP_ITERATION_DONE,)
        ):
            index = ev.payload.get("index")
            if ev.step_run_id == cmd.step_run_id and isinstance(index, int):
                done[index] = Completed(ev.payload.get("result"), list(ev.payload.get("ctx_patches") or []))
        if done:
            self.worker._log.info("worker.loop_resumed", step_run_id=cmd.step_run_id, completed=len(done))
        return done

    def publish_pending_nowait(self) -> asyncio.Future[Any] | None:
        """`publish_pending` without waiting: the events join this turn's write, and the returned future
        settles when they are stored (or fails: then `publish_pending` them). None, having published
        nothing, when they need more first (a large result for the object store, progress sent before,
        a publisher that has not looked at the stream yet)."""
        outbox = self.outbox
        if outbox.sent:
            return None
        limit = self.inline_limit
        ready: list[tuple[Event, bytes]] = []
        for ev in self.pending:
            data = encode(ev)
            if len(data) > limit:
                return None
            ready.append((ev, data))
        if self.worker.carry:
            ready = carry(ready, MAX_EVENT_BYTES)
        for ev, data in ready:
            outbox.event(ev, data)
        fut = outbox.flush_nowait()
        if fut is None:
            outbox.clear()
            return None
        self.pending = []
        self._unconfirmed = ready
        return fut

    async def publish_unconfirmed(self) -> None:
        """Publish again, waiting and retrying as `publish_pending`, what `publish_pending_nowait` published
        when its future failed (same ids: what was stored after all is dropped as a duplicate)."""
        ready, self._unconfirmed = self._unconfirmed, []
        for ev, data in ready:
            self.outbox.event(ev, data)
        await self.outbox.flush()

    async def publish_pending(self) -> None:
        pending, self.pending = self.pending, []
        limit = self.inline_limit
        ready: list[tuple[Event, bytes]] = []
        for ev in pending:
            data = encode(ev)
            if len(data) <= limit:  # the usual case, without a coroutine per event
                ready.append((ev, data))
            else:
                ready.append(await self.fit(ev, data))
        if self.worker.carry:
            ready = carry(ready, MAX_EVENT_BYTES)
        for ev, data in ready:
            self.outbox.event(ev, data)
        await self.outbox.flush()

    @property
    def inline_limit(self) -> int:
        """Bytes of an event's result that travel inline (the executor's limit; computed once)."""
        limit = self._inline_limit
        if limit is None:
            limit = self._inline_limit = inline_limit(self.cmd.executor_spec)
        return limit

    async def fit(self, ev: Event, data: bytes | None = None) -> tuple[Event, bytes]:
        """Reference-first: a result above the inline limit goes to the object store and the event
        carries its reference; no event ever exceeds the server's payload limit. ``data``: ``ev``
        encoded, if the caller has it."""
        if data is None:
            data = encode(ev)
        limit = self.inline_limit
        if len(data) <= limit or "result" not in ev.payload or ev.name not in _WITH_RESULT:
            return _fit(ev, data)
        try:
            out = ev
            if isinstance(ev.payload.get("tasks"), dict):  # a pipeline's results by label, first
                out, data = await self.store_tasks(ev, limit)
            if len(data) > limit and not is_ref(out.payload["result"]):
                out = msgspec.structs.replace(
                    out, payload={**out.payload, "result": await self.store_result(out)}
                )
                data = encode(out)
        except Exception as exc:  # the object store is unavailable: fail clearly rather than lose it
            reason = f"could not store the large result ({len(data)} bytes): {exc}"
            if ev.name in _BOUNDARY_WITH_RESULT:
                return _fit(ev, data, reason)
            # task.done is progress: its step's boundary reports the failure (or stores the value)
            out = msgspec.structs.replace(
                ev, payload={**ev.payload, "result": {"truncated": True, "size": len(data), "error": reason}}
            )
            return _fit(out, encode(out))
        return _fit(out, data)

    async def store_result(self, ev: Event, value: Any = None, name: str = "result") -> dict[str, Any]:
        """Store the event's result (or `value`) under ``<execution_id>/<entity id>[~<delivery>]/<name>``
        and return its reference; a value this run stored already (a task's result that is also its
        step's, or its iteration's) is not stored again: its reference is returned."""
        data = msgspec.json.encode(ev.payload["result"] if value is None else value)
        checksum = hashlib.sha256(data).hexdigest()
        ref = self._stored.get(checksum)
        if ref is None:
            key = f"{ev.execution_id}/{ev.entity_id}{self._id_suffix}/{name}"
            ref = self._stored[checksum] = await self.worker.results.put_encoded(key, data)
        return ref

    async def store_tasks(self, ev: Event, limit: int) -> tuple[Event, bytes]:
        """A pipeline's boundary with its result and its results by task label (``tasks``) stored by
        reference, the largest first, until it fits `limit` (each is the value its ``task.done``
        stored: not stored again)."""
        tasks = dict(ev.payload["tasks"])
        result = ev.payload.get("result")
        sizes = {label: len(msgspec.json.encode(value)) for label, value in tasks.items()}
        parts: list[str | None] = sorted(tasks, key=sizes.__getitem__, reverse=True)
        result_size = len(msgspec.json.encode(result))
        parts.insert(
            next((i for i, label in enumerate(parts) if sizes[label] < result_size), len(parts)), None
        )
        out, data = ev, encode(ev)
        for label in parts:  # None: the step's result
            if len(data) <= limit:
                break
            if label is None:
                result = await self.store_result(ev)
            else:
                tasks[label] = await self.store_result(ev, tasks[label], f"tasks/{label}")
            out = msgspec.structs.replace(ev, payload={**ev.payload, "tasks": tasks, "result": result})
            data = encode(out)
        return out, data

    def task_hook(self, scope_id: str) -> TaskEvents:
        """The pipeline's task-event callback for one scope (a step run or a loop iteration); the caller
        `settle`s it when the scope's pipeline ends."""
        hold = self.worker.task_events == TASK_EVENTS_INFORMATIVE and not self.redelivered
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
            await resolve_keychain(cmd.keychain, self.worker.services)
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
        try:
            issued = datetime.datetime.fromisoformat(self.cmd.issued_at.replace("Z", "+00:00")).timestamp()
        except ValueError:
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
        cmd = self.cmd
        step = cmd.step_def
        # Results by reference, at any depth: what the step reads, its args, a distributed iteration's
        # item and a large outer iteration (children.py). One encode each when there are none (kv/refs.py).
        # (`may_hold_refs` first: no coroutine for what holds none, the usual case)
        fetch, fetched = self.worker.results.get, dict[str, Any]()
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
        scope = build_scope(
            workload=cmd.workload,
            ctx=cmd.ctx,
            execution_id=cmd.execution_id,
            args=cmd.args,
            results=cmd.results,
            result_meta=cmd.result_meta,
        )
        base = PipelineInput(
            execution_id=cmd.execution_id,
            step=step,
            scope=scope,
            executor_spec=cmd.executor_spec,
            services=self.worker.services,
            scope_id=cmd.step_run_id,
            workbook=cmd.workbook,
            attachments=cmd.attachments,
            stop_check=lambda: self.worker.ended.get(cmd.execution_id),
            # outcome.meta.trace_id: the events' trace id, else the one the execution's trace has.
            trace_id=self.trace_id or tracing.execution_trace_id(cmd.execution_id),
            checkpoints=Checkpoints(
                KvCheckpoints(self.worker.js, self.worker.topology, cmd.execution_id),
                self.worker.results,
                budget=self.inline_limit,
                tag=self._id_suffix,
            ),
            resume=self.redelivered,
            # A child started from a loop iteration: its steps without a loop read it as iter.parent too.
            iter={"parent": cmd.parent_iter} if cmd.parent_iter is not None else None,
            iteration_total=cmd.iteration.total if cmd.iteration is not None else None,
        )
        run_id = cmd.step_run_id
        if cmd.keychain:
            try:
                resolved, secrets = await resolve_keychain(cmd.keychain, self.worker.services)
            except CredentialError as exc:
                self.fail(_credential_error(exc))
                return
            scope["keychain"] = resolved
            # `auth: <name>` of a task resolves the step's declarations first, as templates do.
            base = replace(
                base, secrets=frozenset(secrets), services=self.worker.services.declaring(resolved)
            )
        if step.input:
            # The step's own inputs (dialect `input:`), rendered once per step run before anything else.
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
                return
            scope["input"] = rendered
            if isinstance(rendered, dict):
                scope["args"] = {**scope.get("args", {}), **rendered}
        if cmd.iteration is not None:
            await self.distributed_iteration(base)
            return
        started: dict[str, Any] = {"pool": cmd.pool}
        if self.redelivered:
            started["delivery"] = self.delivery
        self.event(E.STEP_STARTED, "step", run_id, "in_progress", run_id, started)
        if step.loop is not None:
            await (run_cursor_loop(self, base) if step.loop.cursor is not None else self.local_loop(base))
            return
        with in_iteration(cmd.parent_iter):  # not a loop: its children nest in the same outer iteration
            res = await run_pipeline(base, self.task_hook(run_id))
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

    async def distributed_iteration(self, base: PipelineInput) -> None:
        cmd = self.cmd
        it = cmd.iteration
        assert it is not None and cmd.step_def.loop is not None
        loop = cmd.step_def.loop
        scope_id = f"{cmd.step_run_id}.{it.index}"
        self.event(E.LOOP_ITERATION_STARTED, "loop", scope_id, "in_progress", scope_id, {"index": it.index})
        scope = iteration_scope(loop.iterator, it.item, it.index, cmd.parent_iter)
        inp = replace(base, scope_id=scope_id, iter=scope)
        with in_iteration(scope):
            res = await run_pipeline(inp, self.task_hook(scope_id))
        self.settle(scope_id, res.status == "ok")
        if res.status == "ok":
            self.event(
                E.LOOP_ITERATION_DONE,
                "loop",
                scope_id,
                "success",
                scope_id,
                {"index": it.index, "result": res.result, "ctx_patches": res.ctx_patches},
            )
        else:
            self.event(
                E.LOOP_ITERATION_FAILED,
                "loop",
                scope_id,
                "error",
                scope_id,
                {"index": it.index, "error": res.error, "ctx_patches": res.ctx_patches},
            )

    async def local_loop(self, base: PipelineInput) -> None:
        cmd = self.cmd
        step = cmd.step_def
        loop = step.loop
        assert loop is not None
        run_id = cmd.step_run_id
        where = f"step '{step.name}' loop"
        try:
            items = render_value(loop.in_, base.scope, f"{where}.in", as_input=True)
            mif = render_value(loop.spec.max_in_flight, base.scope, f"{where}.spec.max_in_flight")
        except RenderError as exc:
            self.fail(ErrorInfo(kind="template_error", message=str(exc)).to_dict())
            return
        if items is None:  # as NoETL: nothing to iterate over (an empty list, a query without rows)
            items = []
        if not isinstance(items, list):
            message = f"{where}.in: 'in' must render to a list, got {type(items).__name__}"
            self.fail(ErrorInfo(kind="loop_error", message=message).to_dict())
            return
        try:
            max_in_flight = loop_max_in_flight(loop.spec, mif, len(items), f"{where}.spec.max_in_flight")
        except MaxInFlightError as exc:
            self.fail(ErrorInfo(kind="loop_error", message=str(exc)).to_dict())
            return
        parallel = loop.spec.mode == "parallel"
        # 003 §8: the loop's start, as the controller writes it for a distributed loop (one per loop run).
        self.event(
            E.LOOP_STARTED,
            "loop",
            run_id,
            "in_progress",
            run_id,
            {
                "total": len(items),
                "max_in_flight": max_in_flight if parallel else 1,
                "exec": "local",
                "mode": loop.spec.mode,
                "pool": cmd.pool,
            },
        )

        async def on_iteration(name: str, index: int, payload: dict[str, Any]) -> None:
            sid = f"{run_id}.{index}"
            if name != E.LOOP_ITERATION_STARTED:
                self.settle(sid, name == E.LOOP_ITERATION_DONE)
            status = {"loop.iteration.started": "in_progress", "loop.iteration.done": "success"}.get(
                name, "error"
            )
            self.event(name, "loop", sid, status, sid, {"index": index, **payload})
            if name == E.LOOP_ITERATION_DONE:
                # Recorded at once: a redelivered command skips the iterations its events show as done.
                await self.send_pending_now()

        completed = await self.completed_iterations() if self.redelivered else None

        res: LoopResult = await run_local_loop(
            replace(base, iteration_total=len(items)),
            items,
            parallel=parallel,
            max_in_flight=max_in_flight,
            fail_fast=step.failure_mode == "fail_fast",
            on_iteration=on_iteration,
            on_task=lambda i: self.task_hook(f"{run_id}.{i}"),
            completed=completed,
            parent_iter=cmd.parent_iter,
            hand_back=lambda: self.worker.stopping,
        )
        self.release_held()  # iterations a fail-fast stopped never settled: their tasks ran, write them
        if res.handed_back:
            raise HandedBack(f"{res.done + res.failed} of {res.total} iterations settled")
        summary = {"total": res.total, "done": res.done, "failed": res.failed, "ctx_patches": res.ctx_patches}
        if res.failed and step.failure_mode == "fail_fast":
            self.event(E.STEP_FAILED, "step", run_id, "error", run_id, {"error": res.first_error, **summary})
        else:
            self.event(
                E.LOOP_DONE,
                "loop",
                run_id,
                "success" if not res.failed else "error",
                run_id,
                {"result": res.results, **summary},
            )


class TaskEvents:
    """One scope's task-event callback (a step run or a loop iteration: `CommandRun.task_hook`).

    With ``--task-events informative`` (`held` is a list) the first task run's ``task.started`` and, if
    it is plain (`_plain`), its ``task.done`` are held back with the time they happened. A second task
    run, or a first ``task.done`` that is not plain, writes them (in order) and everything after; when
    the scope ends (`settle`), they are dropped if it succeeded with that one plain run, and written
    otherwise. With ``all`` (`held` is None) every event is written as it happens."""

    __slots__ = ("held", "run", "scope_id", "started")

    def __init__(self, run: CommandRun, scope_id: str, hold: bool) -> None:
        self.run = run
        self.scope_id = scope_id
        self.held: list[tuple[str, Task, int, int, dict[str, Any], tuple[str, int]]] | None = (
            [] if hold else None
        )
        self.started = 0.0
        """When the scope's task run now running started (its tasks run one after another)."""

    def __call__(self, name: str, task: Task, run_no: int, attempt: int, payload: dict[str, Any]) -> None:
        metrics = self.run.worker.metrics
        if metrics is not None:  # every task run, whatever the events written for it
            if name == E.TASK_STARTED:
                self.started = time.monotonic()
            elif name == E.TASK_DONE:
                status = "ok" if payload.get("status") == "ok" else "error"
                metrics.task_done(task.kind, status, time.monotonic() - self.started)
        held = self.held
        if held is not None:
            first_start = name == E.TASK_STARTED and not held
            plain_done = name == E.TASK_DONE and len(held) == 1 and _plain(payload)
            if first_start or plain_done:
                held.append((name, task, run_no, attempt, payload, (now_iso(), time.time_ns())))
                return
            self.release()
        self._emit(name, task, run_no, attempt, payload, None)

    def settle(self, ok: bool) -> None:
        """The scope's pipeline ended; `ok`: it succeeded."""
        if self.held is not None and ok and len(self.held) == 2:
            self.held = None  # one task, run once, plain: step.done says it all
        self.release()

    def release(self) -> None:
        """Write what is held, in order, with the times it happened; from now on write as it happens."""
        held, self.held = self.held, None
        for name, task, run_no, attempt, payload, at in held or ():
            self._emit(name, task, run_no, attempt, payload, at)

    def _emit(
        self,
        name: str,
        task: Task,
        run_no: int,
        attempt: int,
        payload: dict[str, Any],
        at: tuple[str, int] | None,
    ) -> None:
        run_id = task_run_id(self.scope_id, task.name, run_no)
        status = (
            "in_progress"
            if name == E.TASK_STARTED
            else ("success" if payload.get("status") == "ok" else "error")
        )
        self.run.event(
            name,
            "task",
            run_id,
            status,
            run_id,
            {"task": task.name, "kind": task.kind, "attempt": attempt, **payload},
            run_id,
            at,
        )


def _plain(done: dict[str, Any]) -> bool:
    """A ``task.done`` payload that adds nothing to its step's ``step.done``: success, the default
    decision, no rule fired, no captured stdout/stderr."""
    return (
        done.get("status") == "ok"
        and done.get("do") == "continue"
        and done.get("rule") is None
        and ("output" not in done)
    )


_FAILURES = frozenset({E.STEP_FAILED, E.LOOP_ITERATION_FAILED, E.KEYCHAIN_FAILED})


def _credential_error(exc: CredentialError) -> dict[str, Any]:
    """The error of a declared keychain entry that could not be resolved: its name, where it was looked
    for, never a value."""
    return ErrorInfo(kind="credential_error", retryable=False, message=str(exc), entry=exc.entry).to_dict()


def _log_failure(logger: Any, name: str, payload: dict[str, Any]) -> None:
    error = payload.get("error")
    if isinstance(error, dict):
        logger.warning(name, error_kind=error.get("kind"), error=error.get("message"))
    else:
        logger.warning(name, error=error)


_BOUNDARY_WITH_RESULT = frozenset({E.STEP_DONE, E.LOOP_DONE, E.LOOP_ITERATION_DONE})
_WITH_RESULT = _BOUNDARY_WITH_RESULT | {E.TASK_DONE}
"""Events whose large ``result`` goes to the object store (`CommandRun.fit`)."""


def _fit(ev: Event, data: bytes, reason: str | None = None) -> tuple[Event, bytes]:
    """Last resort: an event still above the server's payload limit becomes a clear error."""
    if len(data) <= MAX_EVENT_BYTES and reason is None:
        return ev, data
    data_len = len(data)
    payload = {
        k: v
        for k, v in ev.payload.items()
        if k not in ("result", "results", "ctx_patches", "tasks", "result_task")
    }
    error = ErrorInfo(
        kind="result_too_large",
        retryable=False,
        message=reason
        or f"the event is {data_len} bytes, above the {MAX_EVENT_BYTES}-byte limit (large ctx patches or "
        "errors?); store large data with a storage task and keep references in ctx",
    ).to_dict()
    if ev.name in (E.STEP_DONE, E.LOOP_DONE):
        out = msgspec.structs.replace(
            ev, name=E.STEP_FAILED, status="error", payload={**payload, "error": error}
        )
    elif ev.name == E.LOOP_ITERATION_DONE:
        out = msgspec.structs.replace(
            ev, name=E.LOOP_ITERATION_FAILED, status="error", payload={**payload, "error": error}
        )
    else:
        out = msgspec.structs.replace(ev, payload={**payload, "truncated": True})
    return out, encode(out)
