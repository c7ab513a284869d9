"""The context of the reducer's work on one event of one execution, and what that work mints: events
(`RunContext.emit`), step run ids, commands (`RunContext.command`), the scope admission rules and arcs
render with, and ctx writes (a run's patches, an arc's ``set:``), which refuse a write that would lose
another run's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from noetl_stream.control.core.byref import guard
from noetl_stream.control.core.effects import Effects, _epoch, server_event
from noetl_stream.control.core.plan import Plan
from noetl_stream.control.core.state import ExecutionState, StepRun
from noetl_stream.dsl.model import Step
from noetl_stream.dsl.scope import build_scope
from noetl_stream.protocol import events as E
from noetl_stream.protocol.errorinfo import ErrorInfo
from noetl_stream.protocol.wire import Command, Event, Iteration, KeychainDecl

if TYPE_CHECKING:
    from noetl_stream.control.core.reducer import Reducer


class RunContext:
    """The reducer's work on one event of one execution (keeps signatures short): the state it changes,
    the plan it follows, the effects it adds to; `transitions.Run` is the whole of it."""

    def __init__(self, reducer: Reducer, state: ExecutionState, plan: Plan, fx: Effects) -> None:
        self.reducer = reducer
        self.state = state
        self.plan = plan
        self.fx = fx
        self.timestamp = ""
        """The timestamp of the event being folded: the reducer's clock, the same in replay (`at`)."""

    def now(self) -> str:
        """The time of what this fold mints: the reducer's clock, else the folded event's `timestamp`."""
        clock = self.reducer.clock
        return clock() if clock is not None else self.timestamp

    @property
    def at(self) -> float:
        """`timestamp` in epoch seconds (0.0 when there is none). Parsed only where a deadline needs it:
        not on every event of the fold."""
        return _epoch(self.timestamp) if self.timestamp else 0.0

    def emit(
        self,
        name: str,
        entity_type: str,
        entity_id: str,
        status: str,
        scope: str,
        payload: dict[str, Any],
        step: str | None = None,
        run_id: str | None = None,
    ) -> None:
        self.fx.events.append(
            server_event(
                self.state.execution_id,
                name,
                entity_type,
                entity_id,
                status,
                scope,
                payload,
                step,
                run_id,
                self.state.trace_id,
                self.now(),
            )
        )

    def scope(
        self,
        args: dict[str, Any] | None = None,
        event: dict[str, Any] | None = None,
        output: str | None = None,
        failed: bool = False,
    ) -> dict[str, Any]:
        """The scope of admission rules and arcs (with the boundary `event`), and of a distributed loop's
        ``in``. `output`: the step whose boundary is routed, whose result arcs also read as ``output``
        and ``result`` (NoETL's names; the same value as ``{{ <step> }}``)."""
        s = self.state
        # A result stored by reference: reading into it is a clear error (byref.py).
        extra = {"event": guard(event, "event.%s")} if event is not None else None
        scope = build_scope(
            workload=s.workload,
            ctx=s.ctx,
            execution_id=s.execution_id,
            args=guard(args, "args.%s"),
            results=guard(s.results, "the result of step '%s'"),
            result_meta=_guard_tasks(s.result_meta),
            extra=extra,
        )
        if output is not None:
            scope["output"] = scope["result"] = (
                scope.get(output) if output in s.results and not failed else None
            )
        return scope

    def new_run_id(self, step: str) -> str:
        n = self.state.step_runs.get(step, 0) + 1
        self.state.step_runs[step] = n
        return f"{step}-{n}"

    def pool(self, step: Step) -> str:
        """The step's own ``spec.pool``, else the request's, else the playbook's (``executor.spec.pool``,
        else the controller's default)."""
        return self.plan.pool_of(step, self.state.pool)

    def command(self, step: Step, run: StepRun, iteration: Iteration | None) -> Command:
        s = self.state
        run.ctx_base = s.ctx_revision
        reads = self.plan.reads.get(step.name, frozenset())
        suffix = f".{iteration.index}" if iteration is not None else ""
        return Command(
            command_id=f"{s.execution_id}:{run.run_id}{suffix}",
            execution_id=s.execution_id,
            step=step.name,
            step_run_id=run.run_id,
            pool=self.pool(step),
            step_def=step,
            workload=s.workload,
            ctx=s.ctx,
            args=run.args,
            results={k: s.results[k] for k in reads if k in s.results},
            result_meta={k: s.result_meta[k] for k in reads if k in s.result_meta},
            executor_spec=self.plan.playbook.executor.spec,
            iteration=iteration,
            trace_id=s.trace_id,
            issued_at=self.now(),
            workbook={n: self.plan.playbook.workbook[n] for n in self.plan.workbook_refs.get(step.name, ())},
            timeout_s=self.iteration_timeout(step, run) if iteration is not None else step.timeout_s,
            keychain=[
                KeychainDecl(name=k.name, kind=k.kind, config=k.config) for k in self.plan.playbook.keychain
            ]
            if step.name in self.plan.keychain_readers
            else [],
            attachments=s.attachments if self.plan.playbook_refs.get(step.name) else {},
        )

    def iteration_timeout(self, step: Step, run: StepRun) -> float | None:
        """An iteration's command may run for what is left of its loop's time (`LoopRun.deadline_at`)."""
        deadline = run.loop.deadline_at if run.loop is not None else None
        if deadline is None:
            return step.timeout_s
        left = max(deadline - self.at, 0.001)
        return left if step.timeout_s is None else min(step.timeout_s, left)

    # -- ctx writes -------------------------------------------------------------------------------
    def apply_ctx_patches(self, event: Event, run: StepRun) -> dict[str, Any] | None:
        """Apply the ``set_ctx`` patches a run's boundary or iteration carries, in order, and record
        ``ctx.patched``; or refuse them all, returning the ``ctx_conflict`` error, when one sets a key
        that another step run wrote after this run's command was issued, to a different value. The run
        read the older value, so its write would silently undo the other's (two parallel branches
        appending to one list: one append lost). 003 §6.2: conflicting parallel writes are rejected."""
        patches = event.payload.get("ctx_patches")
        if not patches:
            return None
        if not isinstance(patches, list) or not all(isinstance(p, dict) for p in patches):
            self.fx.ignored = (
                f"its ctx_patches are not a list of mappings ({type(patches).__name__}): not applied"
            )
            return None
        s = self.state
        final: dict[str, Any] = {}
        for patch in patches:
            final.update(patch)
        for key, value in final.items():
            written = s.ctx_written.get(key)
            if written is None or written[0] <= run.ctx_base or written[1] == run.run_id:
                continue
            if key in s.ctx and s.ctx[key] == value:
                continue  # the same value: nothing is lost
            return ErrorInfo(
                kind="ctx_conflict",
                message=(
                    f"step '{run.step}' (run '{run.run_id}') sets ctx.{key}, which step run '{written[1]}' "
                    "changed after this run started from the older value: applying it would lose that "
                    "change, so none of this run's ctx patches is applied. Steps that run in parallel "
                    "must set different ctx keys (each branch its own key; combine them in a step after "
                    "the join)"
                ),
                key=key,
                step_run_id=run.run_id,
                other_step_run_id=written[1],
            ).to_dict()
        suffix = f".{event.payload['index']}" if "index" in event.payload else ""
        self._patch_ctx(run, patches, f"{run.run_id}{suffix}", event.step, event.step_run_id)
        return None

    def write_ctx(self, run: StepRun, patches: list[dict[str, Any]]) -> None:
        """The controller's own ctx writes for `run` (the ``set:`` of the arcs its boundary took),
        recorded like a run's patches (``ctx.patched``). They render against the ctx as it is now, so
        they cannot lose another run's write; a run that read an older value and writes the key later
        conflicts with them as with any write (`apply_ctx_patches`). A replay renders them again from
        the same state: the same values."""
        self._patch_ctx(run, patches, f"{run.run_id}.next", run.step, run.run_id)

    def _patch_ctx(
        self,
        run: StepRun,
        patches: list[dict[str, Any]],
        scope: str,
        step: str | None,
        step_run_id: str | None,
    ) -> None:
        """Write `patches` to ctx in order, each a revision of its own, noting `run` as the writer of
        their keys (what a later run's write is checked against), and record ``ctx.patched``."""
        s = self.state
        for patch in patches:
            s.ctx.update(patch)
            s.ctx_revision += 1
            for key in patch:
                s.ctx_written[key] = (s.ctx_revision, run.run_id)
        self.emit(
            E.CTX_PATCHED,
            "workflow",  # ctx is the workflow run's (001 §15.1's entity types)
            s.execution_id,
            "success",
            scope,
            {"patches": patches, "revision": s.ctx_revision},
            step,
            step_run_id,
        )


def _guard_tasks(meta: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`meta` with a pipeline's task results stored by reference wrapped (`guard`): reading a label's
    fields in an arc is then the clear error, not an undefined value."""
    if not any("tasks" in m for m in meta.values()):
        return meta
    return {
        step: {**m, "tasks": guard(tasks, f"the result of task '%s' of step '{step}'")}
        if isinstance(tasks := m.get("tasks"), dict)
        else m
        for step, m in meta.items()
    }
