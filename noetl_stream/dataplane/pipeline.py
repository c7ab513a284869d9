"""The task pipeline of one step run (or one loop iteration): tasks, policies, locals.

Runs tasks in order under ``task.spec.policy`` (003 §5.4, 001 §12): ``continue``,
``retry`` (``attempts`` counts every run, the first included), ``jump``, ``break``
and ``fail``; ``set_iter``/``set_ctx`` render against the scope before the patch
and are visible to the next task at once.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from noetl_stream.dataplane.children import current_iteration
from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.dataplane.taskconfig import render_config, resolve_workbook, with_caller_args
from noetl_stream.dataplane.tools import TOOLS, ToolContext, close_resources
from noetl_stream.dataplane.tools.base import WorkerServices
from noetl_stream.dsl.kinds import kind_info
from noetl_stream.dsl.layering import merge_layers
from noetl_stream.dsl.model import Step, Task, Then
from noetl_stream.dsl.policy import backoff_delay, decide
from noetl_stream.dsl.scope import ITERATION_NAMES, iteration_names, layer_ctx
from noetl_stream.dsl.templates import RenderError, json_inputs, render_value
from noetl_stream.dsl.views import CtxView, IterView, plain, result_view
from noetl_stream.kv.keychain import Redactor, redactor, secret_strings
from noetl_stream.protocol.errorinfo import ErrorInfo
from noetl_stream.protocol.jsonvalue import PLAIN_TYPES, NotJSONError, to_json
from noetl_stream.protocol.wire import Checkpoint, now_iso

_ENCODE = msgspec.json.Encoder().encode
_DECODE = msgspec.json.Decoder().decode

DEFAULT_MAX_TASK_RUNS = 10_000

TaskEvent = Callable[[str, Task, int, int, dict[str, Any]], None]
"""``(event name, task, task run number, attempt, payload)``: the pipeline reports task boundaries."""


def task_run_id(scope_id: str, task: str, run_no: int) -> str:
    """The id of one task run (``<step_run_id>[.<iteration>].<task>.<run>``): its events' ``task_run_id``
    and its ``outcome.meta.task_run_id``."""
    return f"{scope_id}.{task}.{run_no}"


@dataclass
class PipelineResult:
    status: str  # "ok" | "error"
    result: Any = None
    error: dict[str, Any] | None = None
    ctx_patches: list[dict[str, Any]] = field(default_factory=list)
    iter: dict[str, Any] = field(default_factory=dict)
    task_runs: int = 0
    tasks: dict[str, Any] | None = None
    """A pipeline of several tasks: their results by label, but the one that is `result`'s."""
    result_task: str | None = None
    """... the label whose result is `result` (the step result's view reads it by that label)."""


class CheckpointStore(Protocol):
    async def save(self, scope_id: str, checkpoint: Checkpoint) -> None: ...
    async def load(self, scope_id: str) -> Checkpoint | None: ...
    async def clear(self, scope_id: str) -> None: ...


@dataclass
class PipelineInput:
    execution_id: str
    step: Step
    scope: dict[str, Any]
    """The base scope: workload (also bare), results, ctx, args, execution_id, keychain."""
    executor_spec: dict[str, Any] = field(default_factory=dict)
    iter: dict[str, Any] | None = None
    iteration_total: int | None = None
    """A loop iteration's: how many items the loop has (``iter._total``, ``loop.length``)."""
    services: WorkerServices | None = None
    scope_id: str = ""
    """``<step_run_id>[.<iteration>]``: makes ids minted by tools (child executions) deterministic."""
    workbook: dict[str, Task] = field(default_factory=dict)
    attachments: dict[str, str] = field(default_factory=dict)
    spec_cache: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Effective task specs, computed once per command (shared by the iterations of a local loop)."""
    checkpoints: CheckpointStore | None = None
    """Where runs save their place at each backward jump (pagination) and resume after a redelivery."""
    resume: bool = False
    """This command was delivered before: look for a checkpoint of this run first."""
    secrets: frozenset[str] = frozenset()
    """Resolved keychain values: redacted from everything the pipeline reports."""
    stop_check: Callable[[], str | None] | None = None
    """Returns a reason when the execution has ended and the pipeline should stop (checked between tasks)."""
    trace_id: str | None = None
    """The execution's trace id (``outcome.meta.trace_id``; the worker always gives one, `CommandRun`)."""

    def for_iteration(self, scope: dict[str, Any], scope_id: str, it: dict[str, Any]) -> PipelineInput:
        """This input for one iteration of a local loop: its scope, scope id and ``iter`` (a copy made
        per iteration: ``dataclasses.replace`` checks every field each time)."""
        new = object.__new__(PipelineInput)
        new.__dict__.update(self.__dict__)
        new.scope, new.scope_id, new.iter = scope, scope_id, it
        return new


def _task_spec(inp: PipelineInput, task: Task) -> dict[str, Any]:
    cached = inp.spec_cache.get(task.name)
    if cached is not None:
        return cached
    info = kind_info(task.kind)
    step = inp.step
    spec = inp.spec_cache[task.name] = merge_layers(
        info.defaults if info else None,
        inp.executor_spec,
        step.spec,
        step.loop.raw_spec if step.loop else None,
        task.spec,
    )
    return spec


async def run_pipeline(
    inp: PipelineInput,
    on_task: TaskEvent | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> PipelineResult:
    """Run the step's tasks in order, each under its policy, and say how the pipeline ended: its result
    (the last result a task handed on), its ctx patches and ``iter`` values, its error. `on_task` hears
    every task run's ``task.started`` and ``task.done``; `sleep` waits out a retry's delay."""
    run = _PipelineRun(inp, on_task)
    if inp.resume and inp.checkpoints is not None:  # an earlier delivery may have checkpointed this run
        await run.resume(inp.checkpoints)
    max_runs = int(inp.executor_spec.get("max_task_runs", DEFAULT_MAX_TASK_RUNS))
    # A loop iteration's pipeline: the children its tasks start read this copy, with its set_iter values,
    # as their iter.parent (the worker set the iteration's own dict around it).
    nested = (
        current_iteration.set(run.iter_scope)
        if inp.iter is not None and current_iteration.get() is inp.iter
        else None
    )
    tasks, out, scope = inp.step.tasks, run.out, run.scope
    try:
        while run.pc < len(tasks):
            task = tasks[run.pc]
            reason = inp.stop_check() if inp.stop_check is not None else None
            if (
                reason is not None or out.task_runs >= max_runs
            ):  # the execution ended, or a jump loop ran away
                run.stop(reason, max_runs)
                break
            out.task_runs += 1  # (what every task run does is inline here: a call costs, per task)
            scope["_prev"] = run.prev
            scope["_task"] = task.name
            scope["_attempt"] = run.attempt
            if on_task is not None:
                on_task("task.started", task, out.task_runs, run.attempt, {})
            ran_with: dict[str, Any] = {}
            outcome = await _run_task(
                inp, task, _task_spec(inp, task), scope, run.attempt, run.prev, run.resources,
                out.task_runs, ran_with,
            )  # fmt: skip
            outcome, view, then, rule, patches, delay = run.apply_policy(task, outcome)
            run.report(task, outcome, then, rule, ran_with)
            run.keep(task, outcome, view, patches)
            if then.do == "retry" and run.attempt < (then.attempts if then.attempts is not None else 3):
                if delay > 0:
                    await sleep(delay)
                run.attempt += 1
                continue
            run.attempt = 1
            if then.do == "continue":  # (the usual case, inline)
                run.prev = outcome.result
                run.pc += 1
                continue
            target = run.next_task(task, outcome, then, rule)
            if target <= run.pc and inp.checkpoints is not None and not (run.secret or outcome.secret):
                await run.save_checkpoint(inp.checkpoints, target)  # a backward jump: a page of a loop
            run.pc = target
        result = run.result()
        if run.checkpointed and inp.checkpoints is not None:
            await inp.checkpoints.clear(inp.scope_id)
        return result
    finally:
        if nested is not None:
            current_iteration.reset(nested)
        if run.resources:  # (what its tasks opened: most open nothing)
            close_resources(run.resources)


class _PipelineRun:
    """One run of a pipeline: the scope its tasks render with and write to, where it stands (the next
    task, the attempt of its run, the result handed on), what is secret, and what it reports (`out`)."""

    __slots__ = (
        "attempt",
        "checkpointed",
        "ctx",
        "extras",
        "hide",
        "index",
        "inp",
        "iter_scope",
        "named",
        "on_task",
        "out",
        "pc",
        "prev",
        "resources",
        "scope",
        "secret",
        "secrets",
    )

    def __init__(self, inp: PipelineInput, on_task: TaskEvent | None) -> None:
        """The task scope: the base scope with ctx as a view (its values bare too), ``iter`` and, in a
        loop iteration, the iterator's names."""
        self.inp = inp
        self.on_task = on_task
        scope = self.scope = dict(inp.scope)
        ctx = self.ctx = CtxView(scope.get("ctx") or {}, scope)
        scope["ctx"] = ctx
        if ctx:  # (the ctx an earlier iteration of a sequential loop wrote, too)
            layer_ctx(scope, ctx, frozenset())
        iter_scope: dict[str, Any] = dict(inp.iter or {})
        self.extras: frozenset[str] = frozenset()
        """Names this iteration binds (the iterator bare, its position): ctx values do not shadow them."""
        loop = inp.step.loop
        if loop is not None and isinstance(index := iter_scope.get("index"), int):
            iterator = loop.iterator
            iter_scope = IterView(iter_scope, index, inp.iteration_total)
            scope.update(iteration_names(iterator, iter_scope.get(iterator), index, inp.iteration_total))
            self.extras = ITERATION_NAMES | {iterator}
        scope["iter"] = self.iter_scope = iter_scope
        self.out = PipelineResult(status="ok", iter=iter_scope)
        self.prev: Any = None
        """The result the last task handed on (``_prev``; the pipeline's result when it ends)."""
        self.secrets = inp.secrets
        """The keychain values it resolved and the strings of secret results: hidden from what it reports."""
        self.hide = redactor(self.secrets) if self.secrets else NOTHING_HIDDEN
        self.pc = 0
        """The index of the task that runs next."""
        self.index: dict[str, int] | None = None
        """The index of each task by name (the first of a name), for jumps: built at the first one."""
        self.attempt = 1
        self.named: set[str] = set()
        """Tasks whose result is in the scope under their name (the last run's, if it was ok)."""
        self.secret: set[str] = set()
        """Those whose result is secret: while there is one, no checkpoint is saved (none is ever written
        to the KV bucket; a redelivery runs the pipeline from its last checkpoint, or its start, again)."""
        self.checkpointed = False
        """A checkpoint of this run is stored: cleared when the pipeline ends."""
        self.resources: dict[str, Any] = {}
        """What its tasks opened for the tasks after them (closed when the pipeline ends)."""

    async def resume(self, checkpoints: CheckpointStore) -> None:
        """Continue a pipeline run that an earlier delivery checkpointed (at a backward jump): at its next
        task, with its task runs counted so far, its ``iter`` values, the results its tasks read by name,
        the result handed on and its ctx patches. Nothing changes when it saved none."""
        saved = await checkpoints.load(self.inp.scope_id)
        if saved is None:
            return
        tasks = self.inp.step.tasks
        scope, out = self.scope, self.out
        self.pc = min(max(0, saved.pc), len(tasks))
        out.task_runs = max(0, saved.task_runs)
        self.iter_scope.update(saved.iter)
        names = {t.name for t in tasks}
        restored = {name: value for name, value in saved.results.items() if name in names}
        scope.update({name: result_view(value) for name, value in restored.items()})
        self.named.update(restored)
        self.prev = saved.prev
        out.ctx_patches.extend(saved.ctx_patches)
        for patch in saved.ctx_patches:
            self.ctx.update(patch)
            layer_ctx(scope, patch, self.extras | self.named)
        self.checkpointed = True

    def stop(self, reason: str | None, max_runs: int) -> None:
        """The pipeline stops before its next task run: the execution ended (`reason`: cancelled, failed,
        past its deadline), or that run would be one more than `max_runs` (a jump loop that never breaks)."""
        out = self.out
        out.status = "error"
        if reason is not None:
            out.error = ErrorInfo(kind="cancelled", retryable=False, message=reason).to_dict()
            return
        out.task_runs += 1
        out.error = ErrorInfo(
            kind="pipeline_limit",
            retryable=False,
            message=f"step '{self.inp.step.name}': more than {max_runs} task runs (a jump loop "
            "that never breaks?)",
        ).to_dict()

    def apply_policy(
        self, task: Task, outcome: Outcome
    ) -> tuple[Outcome, Any, Then, int | None, _Patches, float]:
        """What the task's policy does with its outcome: the outcome (a template that fails to render
        fails the task: ``template_error``), its result as templates read it, the ``then`` chosen and the
        index of its rule, its rendered ``set_iter`` and ``set_ctx``, and a retry's delay. The policy reads
        ``outcome`` and ``output`` (NoETL's envelope), in the scope only while it decides."""
        if task.policy is None:  # (the usual case: nothing renders, nothing reads the scope)
            then, rule = decide(None, outcome.status, self.scope)
            return outcome, result_view(outcome.result), then, rule, _NO_PATCHES, 0.0
        scope = self.scope
        where = f"step '{self.inp.step.name}' task '{task.name}' spec.policy"  # (what its errors name)
        scope["outcome"] = outcome.as_scope()
        view = scope["outcome"]["result"] = result_view(outcome.result)  # (`.data`, an http `.body`)
        shadowed = scope.get("output", _NONE)  # (a task or step named `output`: read again after)
        scope["output"] = outcome.as_output()  # NoETL's envelope, a view (built only where read)
        delay = 0.0
        try:
            then, rule = decide(task.policy, outcome.status, scope, where)
            patches = _render_patches(then, scope, where) if then.set_iter or then.set_ctx else _NO_PATCHES
            if then.do == "retry":  # may read outcome (e.g. Retry-After)
                delay = _delay(then, self.attempt, scope, f"{where}.rules[{rule}].then.delay")
        except RenderError as exc:
            then, rule, patches = Then(do="fail"), None, _NO_PATCHES
            meta, outcome = outcome.meta, Outcome.fail("template_error", str(exc))
            outcome.meta = meta
        scope.pop("outcome", None)
        if shadowed is _NONE:
            del scope["output"]
        else:
            scope["output"] = shadowed
        return outcome, view, then, rule, patches, delay

    def report(
        self, task: Task, outcome: Outcome, then: Then, rule: int | None, ran_with: dict[str, Any]
    ) -> None:
        """The run's ``task.done``: its outcome, what its policy chose, its captured output and the args it
        ran with. A secret result is reported as ``***``, and its strings are hidden from everything the
        pipeline reports from now on."""
        if outcome.secret:
            self.secrets = self.secrets | secret_strings(outcome.result)
            self.hide = redactor(self.secrets)
        if self.on_task is not None:
            meta = outcome.meta
            payload: dict[str, Any] = {
                "status": outcome.status,
                "result": "***" if outcome.secret else outcome.result,
                "error": outcome.error,
                "do": then.do,
                "rule": rule,
            }  # the run's ids and times are the envelope's (task_run_id, trace_id, timestamps)
            if "stdout" in meta or "stderr" in meta:
                payload["output"] = {"stdout": meta.get("stdout", ""), "stderr": meta.get("stderr", "")}
            if ran_with:  # (what it rendered: a task without args has none to record)
                payload.update(recorded_args(ran_with))
            self.on_task("task.done", task, self.out.task_runs, self.attempt, self.hide(payload))

    def keep(self, task: Task, outcome: Outcome, view: Any, patches: _Patches) -> None:
        """What the run leaves for the tasks after it: its ``set_iter`` and ``set_ctx`` (visible at once),
        and its result under its name if it succeeded; after an error the name reads what it read before
        the task ran, not its last run's result."""
        set_iter, set_ctx = patches
        scope = self.scope
        if set_iter:
            self.iter_scope.update(set_iter)
            loop = self.inp.step.loop
            if loop is not None and loop.iterator in set_iter and loop.iterator in self.extras:
                scope[loop.iterator] = set_iter[loop.iterator]
        if set_ctx:  # (in parallel iterations too: the iteration that ends last wins, docs/semantics.md)
            self.ctx.update(set_ctx)
            layer_ctx(scope, set_ctx, self.extras | self.named)  # ({{ page }} after set_ctx: {page: 2})
            self.out.ctx_patches.append(set_ctx)
        name = task.name
        if outcome.status == "ok":  # (the outcome the policy read: a failed render replaced it)
            scope[name] = view
            self.named.add(name)
            if outcome.secret:
                self.secret.add(name)
            else:
                self.secret.discard(name)
        else:
            _forget(scope, self.inp.scope, name)
            self.named.discard(name)
            self.secret.discard(name)

    def next_task(self, task: Task, outcome: Outcome, then: Then, rule: int | None) -> int:
        """Where the pipeline goes after a run it neither retries nor continues from (`run_pipeline` does
        those): the next task after a ``retry`` whose attempts are spent on a success, a ``jump``'s target,
        or past the last task when it stops (``break``; ``fail``, and a ``retry`` whose attempts are spent
        on an error, with `out` saying why). All but a failure hand the run's result on."""
        tasks = self.inp.step.tasks
        do = then.do
        if do == "retry":  # (its attempts spent)
            if outcome.status == "error":
                self.out.status, self.out.error = "error", _error(outcome, task)
                return len(tasks)
            self.prev = outcome.result
            return self.pc + 1
        if do == "jump":
            self.prev = outcome.result
            if self.index is None:  # (the first jump: a loop inside the pipeline jumps again and again)
                self.index = {}
                for i, t in enumerate(tasks):
                    self.index.setdefault(t.name, i)
            return self.index.get(then.to, len(tasks)) if then.to is not None else len(tasks)
        if do == "break":
            self.prev = outcome.result
            return len(tasks)
        self.out.status = "error"  # fail
        self.out.error = (
            _error(outcome, task)
            if outcome.status == "error"
            else ErrorInfo(
                kind="policy_fail",
                retryable=False,
                task=task.name,
                message=f"step '{self.inp.step.name}' task '{task.name}': policy rule {rule} chose 'fail'",
            ).to_dict()
        )
        return len(tasks)

    async def save_checkpoint(self, checkpoints: CheckpointStore, target: int) -> None:
        """A backward jump is a loop inside the pipeline (pagination): remember where it stands, so a
        redelivered command resumes at this page instead of the first, with the results its tasks read by
        name (the store keeps large ones out of the record)."""
        checkpoint = Checkpoint(
            pc=target,
            iter=dict(self.iter_scope),
            prev=self.prev,
            ctx_patches=list(self.out.ctx_patches),
            task_runs=self.out.task_runs,
            results={name: plain(self.scope[name]) for name in self.named},
        )
        await checkpoints.save(self.inp.scope_id, checkpoint)
        self.checkpointed = True

    def result(self) -> PipelineResult:
        """What the pipeline reports: the result handed on last and, of a pipeline of several tasks that
        succeeded, its results by task label; a secret read by a task never leaves it in any of it."""
        out, tasks = self.out, self.inp.step.tasks
        out.result = self.prev
        if out.status == "ok" and len(tasks) > 1:
            out.tasks, out.result_task = _task_results(tasks, self.scope, self.named - self.secret, self.prev)
        hide = self.hide
        if hide:
            out.result = hide(out.result)
            out.error = hide(out.error)
            out.ctx_patches = hide(out.ctx_patches)
            out.iter = hide(out.iter)
            out.tasks = hide(out.tasks)
        return out


_Patches = tuple[dict[str, Any] | None, dict[str, Any] | None]
"""A policy's rendered ``set_iter`` and ``set_ctx`` (None: it sets none)."""
_NO_PATCHES: _Patches = (None, None)

_NONE = object()


def _task_results(
    tasks: tuple[Task, ...], scope: dict[str, Any], named: set[str], result: Any
) -> tuple[dict[str, Any], str | None]:
    """A pipeline's results by task label (the tasks whose last run was ok; a secret's never), for its
    step result's view: the others' in order, and the label of the one whose result is the step's
    (`result_task`, not repeated)."""
    labels = {t.name: plain(scope[t.name]) for t in tasks if t.name in named and t.name in scope}
    own = next((name for name in reversed(labels) if labels[name] is result), None)
    if own is not None:
        del labels[own]
    return labels, own


def _forget(scope: dict[str, Any], base: dict[str, Any], name: str) -> None:
    """Drop a task's result from `scope`: `name` reads what `base` has under it (an earlier step's
    result, a workload key), else it is undefined (a template reading it fails)."""
    if name in base:
        scope[name] = base[name]
    else:
        scope.pop(name, None)


def _error(outcome: Outcome, task: Task) -> dict[str, Any]:
    err = dict(outcome.error or ErrorInfo(kind="error", message="task failed").to_dict())
    err.setdefault("task", task.name)
    return err


def _delay(then: Then, attempt: int, scope: dict[str, Any], where: str) -> float:
    """Seconds to wait before the next run. A template ``delay`` renders to a number of seconds >= 0 (or
    a numeric string, such as a header's value; null: the default delay); one that fails to render or
    renders to anything else is a `RenderError` (the task fails with ``template_error``)."""
    base = then.delay
    if isinstance(base, str):
        value = render_value(base, scope, where)
        base = None if value is None else _seconds(value)
        if base is None and value is not None:
            raise RenderError(f"'delay' must render to a number of seconds >= 0, got {value!r}", where)
    return backoff_delay(then, attempt, base)


def _seconds(value: Any) -> float | None:
    """`value` (a number or a numeric string) as a finite number of seconds >= 0, else None."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _render_patches(then: Then, scope: dict[str, Any], where: str) -> _Patches:
    set_iter = render_value(then.set_iter, scope, f"{where}.set_iter") if then.set_iter else None
    set_ctx = render_value(then.set_ctx, scope, f"{where}.set_ctx") if then.set_ctx else None
    return set_iter, set_ctx


async def _run_task(
    inp: PipelineInput,
    task: Task,
    spec: dict[str, Any],
    scope: dict[str, Any],
    attempt: int,
    prev: Any,
    resources: dict[str, Any],
    run_no: int,
    ran_with: dict[str, Any] | None = None,
) -> Outcome:
    """One task run. `ran_with` gets the task's rendered ``args`` (under ``args``) once they rendered."""
    started = time.monotonic()
    started_at = now_iso()
    label = task.name
    run_id = task_run_id(inp.scope_id, label, run_no)
    caller_args: dict[str, Any] | None = None
    if task.kind == "workbook":
        resolved = resolve_workbook(inp.workbook, inp.step.name, task, spec, scope)
        if isinstance(resolved, Outcome):
            resolved.meta = _meta({}, inp, run_id, attempt, 0.0, started_at, started_at)
            return resolved
        task, spec, scope, caller_args = resolved.task, resolved.spec, resolved.scope, resolved.args
    tool = TOOLS.get(task.kind)
    if tool is None:
        outcome = Outcome.fail("unsupported_kind", f"this worker cannot run tool kind '{task.kind}'")
    else:
        try:
            step_input = scope.get("input") if inp.step.input and caller_args is None else None
            config = render_config(
                task.config,
                scope,
                f"step '{inp.step.name}' task '{label}'",
                step_input if isinstance(step_input, dict) else None,
            )
        except RenderError as exc:
            outcome = Outcome.fail("template_error", str(exc))
        else:
            config = json_inputs(task.config, config)  # a tool's input: '{"a": 1}' from a template is {a: 1}
            if caller_args is not None:
                config = with_caller_args(config, caller_args)
            if ran_with is not None and "args" in config:
                ran_with["args"] = config["args"]
            ctx = ToolContext(
                execution_id=inp.execution_id,
                step=inp.step.name,
                task=label,
                spec=spec,
                attempt=attempt,
                prev=prev,
                resources=resources,
                services=inp.services,
                scope_id=inp.scope_id,
                attachments=inp.attachments,
                stop_check=inp.stop_check,
                scope=scope,
                first=run_no == 1,
            )
            timeout = spec.get("timeout_s")
            try:
                if isinstance(timeout, (int, float)) and timeout > 0:
                    async with asyncio.timeout(timeout):
                        outcome = await tool(config, ctx)
                else:
                    outcome = await tool(config, ctx)
            except TimeoutError:
                outcome = Outcome.fail(
                    "timeout", f"task '{label}' ran longer than {timeout}s", retryable=True
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a tool bug must not kill the worker
                outcome = Outcome.fail(
                    type(exc).__name__, f"tool '{task.kind}' raised {type(exc).__name__}: {exc}"
                )
    if outcome.status == "ok" and type(outcome.result) not in PLAIN_TYPES:
        outcome = _json_result(outcome, task, label)
    outcome.meta = _meta(
        outcome.meta, inp, run_id, attempt, round(time.monotonic() - started, 6), started_at, now_iso()
    )
    return outcome


ARGS_RECORD_LIMIT = 16 * 1024
"""A task's rendered args up to this many bytes (as JSON) are recorded with its ``task.done``."""


def recorded_args(ran_with: dict[str, Any]) -> dict[str, Any]:
    """What ``task.done`` records of the args a task ran with: ``args`` (plain JSON; the pipeline's
    redactor then hides keychain values in them, as in the rest of the payload), or only their size
    (``args_bytes``) when they are larger than `ARGS_RECORD_LIMIT` or are no JSON; nothing for a task
    without args or whose args did not render."""
    if "args" not in ran_with:
        return {}
    args = plain(ran_with["args"])
    try:  # encoded once, at the encoder's speed; the JSON form is what it decodes to (no walk in Python)
        data = _ENCODE(args)
    except (TypeError, ValueError):  # a part the encoder has no form for: to_json may have one
        try:
            data = _ENCODE(to_json(args))
        except (NotJSONError, TypeError, ValueError):
            return {"args_bytes": -1}
    if len(data) > ARGS_RECORD_LIMIT:
        return {"args_bytes": len(data)}
    return {"args": _DECODE(data)}


def _meta(
    base: dict[str, Any],
    inp: PipelineInput,
    run_id: str,
    attempt: int,
    duration_s: float,
    started_at: str,
    ended_at: str,
) -> dict[str, Any]:
    """``outcome.meta`` (001 §11): the tool's own keys, then attempt, duration, timestamps and the ids
    of the run in traces and events, ``trace_id`` and ``task_run_id`` (one new mapping)."""
    meta: dict[str, Any] = {
        **base,
        "attempt": attempt,
        "duration_s": duration_s,
        "started_at": started_at,
        "ended_at": ended_at,
        "task_run_id": run_id,
    }
    if inp.trace_id:
        meta["trace_id"] = inp.trace_id
    return meta


NOTHING_HIDDEN = Redactor(())

JSON_KINDS = frozenset({"noop", "python", "duckdb", "http", "postgres", "secrets", "script", "playbook"})
"""Built-in kinds whose results are JSON by construction (rendered values, ``json_safe`` rows, decoded
bodies): a mapping or list they return is not walked again."""


def _json_result(outcome: Outcome, task: Task, label: str) -> Outcome:
    """The outcome with its result in JSON form (a tuple, set or ``range`` becomes a list, a ``str``
    subclass a ``str``); a result without one is the task's error, which its policy sees (001 §11:
    one final outcome per invocation, never a publish that fails)."""
    result = outcome.result
    if task.kind in JSON_KINDS and type(result) in (dict, list):
        return outcome
    try:
        outcome.result = to_json(result)
    except NotJSONError as exc:
        return Outcome.fail(
            "invalid_result",
            f"task '{label}' ({task.kind}): its result is not JSON: {exc} (a task returns a string, "
            "number, boolean, null, list or mapping)",
        )
    return outcome
