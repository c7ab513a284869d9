"""The normalized playbook model: what the compiler produces and the runtime reads.

Authoring shapes (task lists with or without names, the label-as-key form, a
single tool object) are gone by the time a ``Playbook`` exists: every step has a
tuple of named ``Task``s, every router is a ``Next`` with ``mode`` and ``arcs``.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

Do = Literal["continue", "retry", "jump", "break", "fail"]
Backoff = Literal["none", "linear", "exponential"]
RouteMode = Literal["exclusive", "inclusive"]
LoopMode = Literal["sequential", "parallel", "cursor"]
LoopExec = Literal["local", "distributed"]
FailureMode = Literal["fail_fast", "best_effort"]


class Then(msgspec.Struct, frozen=True, omit_defaults=True):
    """The action of a task policy rule."""

    do: Do = "continue"
    attempts: int | None = None
    backoff: Backoff = "none"
    delay: float | str | None = None
    to: str | None = None
    set_iter: dict[str, Any] | None = None
    set_ctx: dict[str, Any] | None = None


class Rule(msgspec.Struct, frozen=True, omit_defaults=True):
    """``when`` + ``then``; ``when is None`` marks the ``else`` rule."""

    then: Then
    when: Any = None
    is_else: bool = False


class TaskPolicy(msgspec.Struct, frozen=True, omit_defaults=True):
    rules: tuple[Rule, ...] = ()
    on_unmatched: Literal["continue"] | None = None
    """``continue`` when written: an outcome no rule matches continues, an error too (001 §12.2). When
    omitted, an error no rule matches fails the task and an ok outcome continues (`policy.decide`)."""


class AdmitRule(msgspec.Struct, frozen=True, omit_defaults=True):
    allow: bool
    when: Any = None
    is_else: bool = False


class Admit(msgspec.Struct, frozen=True, omit_defaults=True):
    rules: tuple[AdmitRule, ...] = ()
    mode: RouteMode = "exclusive"


class Task(msgspec.Struct, frozen=True, omit_defaults=True):
    """One labeled task of a step's pipeline. ``config`` holds the kind's own fields."""

    name: str
    kind: str
    config: dict[str, Any] = {}
    spec: dict[str, Any] = {}
    policy: TaskPolicy | None = None
    line: int = 0
    col: int = 0


class LoopSpec(msgspec.Struct, frozen=True, omit_defaults=True):
    mode: LoopMode = "sequential"
    max_in_flight: int | str | None = None
    exec: LoopExec = "local"
    frame_max_rows: int | None = None
    """``spec.frame.max_rows`` of a cursor loop: the rows one claim asks for (``{{ __frame_max_rows }}``)."""


class Loop(msgspec.Struct, frozen=True, omit_defaults=True):
    in_: Any = msgspec.field(name="in", default=None)
    iterator: str = "item"
    spec: LoopSpec = LoopSpec()
    raw_spec: dict[str, Any] = {}
    cursor: dict[str, Any] | None = None
    """A cursor loop's claim (``spec.mode: cursor``): ``{kind: postgres, auth, claim}``, run by the worker
    that runs the loop until a claim returns no row (dataplane/cursor.py)."""


class Arc(msgspec.Struct, frozen=True, omit_defaults=True):
    step: str
    when: Any = None
    args: dict[str, Any] | None = None
    spec: dict[str, Any] = {}
    set_ctx: dict[str, Any] | None = None
    """NoETL's arc ``set:`` (its keys as ctx names): rendered like ``args`` when the arc is taken and
    written to ctx by the controller before the target is scheduled (control/core/routing.py)."""


class Next(msgspec.Struct, frozen=True, omit_defaults=True):
    arcs: tuple[Arc, ...] = ()
    mode: RouteMode = "exclusive"
    spec: dict[str, Any] = {}


class Step(msgspec.Struct, frozen=True, omit_defaults=True):
    name: str
    desc: str | None = None
    spec: dict[str, Any] = {}
    admit: Admit | None = None
    loop: Loop | None = None
    tasks: tuple[Task, ...] = ()
    next: Next | None = None
    failure_mode: FailureMode = "fail_fast"
    timeout_s: float | None = None
    """``spec.policy.lifecycle.timeout_s``: bounds one run of the step's command (each delivery)."""
    deadline_s: float | None = None
    """``spec.policy.lifecycle.deadline_s``: bounds the step run from the moment it was scheduled to its
    end, across every delivery of its command (docs/semantics.md, Step lifecycle)."""
    input: dict[str, Any] | None = None
    """The step's own inputs (dialect ``input:``): rendered before its tasks run, readable as
    ``input.<name>``, merged over the token's ``args`` and over each task's own inputs (its keys win)."""
    result_store: str | None = None
    """NoETL's ``output: {store: {kind}}``: the kind of store it names. The result stays inline and gets
    a ``_ref`` (dataplane/command.py)."""
    line: int = 0
    col: int = 0

    @property
    def is_router(self) -> bool:
        """A step without tasks is routed by the controller alone (no worker round trip)."""
        return not self.tasks


class Metadata(msgspec.Struct, frozen=True, omit_defaults=True):
    name: str
    path: str
    version: str | None = None
    description: str | None = None
    labels: dict[str, str] = {}


class KeychainEntry(msgspec.Struct, frozen=True, omit_defaults=True):
    name: str
    kind: str
    config: dict[str, Any] = {}


class Executor(msgspec.Struct, frozen=True, omit_defaults=True):
    kind: str | None = None
    spec: dict[str, Any] = {}


class Playbook(msgspec.Struct, frozen=True, omit_defaults=True):
    metadata: Metadata
    workflow: tuple[Step, ...]
    api_version: str = "noetl.io/v2"
    kind: str = "Playbook"
    keychain: tuple[KeychainEntry, ...] = ()
    executor: Executor = Executor()
    workload: dict[str, Any] = {}
    workbook: dict[str, Task] = {}
    file: str = "<playbook>"

    def step(self, name: str) -> Step:
        for s in self.workflow:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def steps(self) -> dict[str, Step]:
        return {s.name: s for s in self.workflow}
