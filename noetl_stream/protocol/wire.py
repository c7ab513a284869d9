"""Wire types: what travels on JetStream subjects. msgspec Structs, JSON-encoded.

Published JSON Schemas in ``schemas/`` are generated from these types.
"""

from __future__ import annotations

import datetime
import hashlib
import time
import uuid
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from noetl_stream.dsl.model import Step, Task
from noetl_stream.protocol import events as E
from noetl_stream.protocol.decoding import explain
from noetl_stream.protocol.jsonvalue import enc_hook

Source = Literal["server", "worker"]
EntityType = Literal["playbook", "workflow", "step", "task", "loop", "next", "execution"]
"""001 §15.1's entity types. ``execution`` is read, not written: histories stored before the execution-wide
events (``ctx.patched``, ``execution.*``) became ``workflow`` ones carry it."""
Status = Literal["in_progress", "success", "error", "skipped"]

WIRE_VERSION = 1


class ResumeToken(msgspec.Struct, forbid_unknown_fields=True):
    step: str
    args: dict[str, Any] = {}


class ResumeFrom(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """Start from recorded work of an earlier execution (``noetl-stream retry``): its results and ctx
    are taken as they were, and only the ``tokens`` run again."""

    execution_id: str
    tokens: list[ResumeToken]
    results: dict[str, Any] = {}
    result_meta: dict[str, Any] = {}
    """What the views of `results` need beyond the values (`ExecutionState.result_meta`)."""
    ctx: dict[str, Any] = {}
    step_status: dict[str, str] = {}


class ExecutionRequest(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """A request to run a playbook. Give the playbook text (``playbook``) or a catalog ``path``."""

    playbook: str | None = None
    path: str | None = None
    version: str | None = None
    payload: dict[str, Any] = {}
    execution_id: str | None = None
    file: str | None = None
    parent_execution_id: str | None = None
    parent_step_run_id: str | None = None
    pool: str | None = None
    trace_id: str | None = None
    return_step: str | None = None
    """Make this step's result the execution's result (default: the last step that finished)."""
    attachments: dict[str, str] = {}
    """Texts of child playbooks referenced by file path (``kind: playbook`` tasks), by their path relative
    to the directory of the playbook that runs (for a child, its intake re-keys its parent's)."""
    deadline_s: float | None = None
    """Fail the execution if it has not finished this many seconds after it was requested."""
    resume: ResumeFrom | None = None
    parent_iter: dict[str, Any] | None = None
    """The ``iter`` of the loop iteration whose ``kind: playbook`` task started this child (itself with
    ``parent`` for deeper nesting): its steps read it as ``iter.parent``. Inline, or a result reference
    when large (the child's worker fetches it)."""
    extensions: list[str] = []
    """DSL extensions to compile the playbook with (``legacy``), besides those it declares itself. The
    controller records the ones it used (its own default included) with the request, so a resumed
    controller or a replay compiles the playbook the same way."""
    depth: int = 0
    """How deep in a tree of child playbooks this execution is: 0 for a request naming no parent. The
    controller's intake records its parent's depth + 1 (whatever the request says) and refuses a child
    past its limit (``NOETL_MAX_CHILD_DEPTH``, default 32)."""


class Event(msgspec.Struct, omit_defaults=True):
    """The event envelope (001 §15.1 plus run ids of 002 §9.3)."""

    event_id: str
    execution_id: str
    name: str
    source: Source
    entity_type: EntityType
    entity_id: str
    status: Status
    timestamp: str
    payload: dict[str, Any] = {}
    step: str | None = None
    step_run_id: str | None = None
    task_run_id: str | None = None
    trace_id: str | None = None
    parent_id: str | None = None
    worker: str | None = None
    controller: str | None = None
    """The controller that wrote a server event, and the partition lease it held (fencing token)."""
    fence: int | None = None
    carried: Annotated[
        list[msgspec.Raw],
        msgspec.Meta(
            description="Whole events (each an Event) written just before this one, stored in its message "
            "(carried.py).",
        ),
    ] = []
    """Events the worker wrote just before this one (a boundary), travelling in its message: ``step.started``,
    ``task.started`` and ``task.done`` of a step run that ended before they were published. Each is a whole
    event of the same execution; readers take them out in order, before this one (`carried.expand`)."""
    v: int = WIRE_VERSION


class KeychainDecl(msgspec.Struct, omit_defaults=True):
    """A root keychain declaration (no secret in it): resolved by the worker that needs it."""

    name: str
    kind: str
    config: dict[str, Any] = {}


class Iteration(msgspec.Struct, omit_defaults=True):
    """One item of a distributed loop, carried by its command."""

    index: int
    item: Any = None
    total: int = 0


class Command(msgspec.Struct, omit_defaults=True):
    """A token for a worker: run one step (or one iteration of a distributed loop).

    The full step definition and the scope it needs travel in the message, so a
    worker never has to look anything up to run it.
    """

    command_id: str
    execution_id: str
    step: str
    step_run_id: str
    pool: str
    step_def: Step
    workload: dict[str, Any] = {}
    ctx: dict[str, Any] = {}
    args: dict[str, Any] = {}
    results: dict[str, Any] = {}
    result_meta: dict[str, Any] = {}
    """What the step's views of `results` need beyond the values, by step name: a loop's counts
    (``stats``), a pipeline's task results (``tasks``, ``result_task``) (`noetl_stream.dsl.views`)."""
    executor_spec: dict[str, Any] = {}
    iteration: Iteration | None = None
    trace_id: str | None = None
    issued_at: str = ""
    workbook: dict[str, Task] = {}
    """The root workbook templates this step's tasks use (``kind: workbook``)."""
    timeout_s: float | None = None
    """The step's ``spec.policy.lifecycle.timeout_s``: the worker fails the run when it is exceeded."""
    keychain: list[KeychainDecl] = []
    """The playbook's keychain declarations, when the step's templates read ``keychain``."""
    keychain_check: bool = False
    """Not a step to run: resolve every declaration of ``keychain`` and answer with ``keychain.resolved``
    or ``keychain.failed`` (the controller's check before the workflow starts). Such a command carries the
    ``start`` step (``step``, ``step_def``) and the reserved run id ``keychain-check``; no task runs."""
    attachments: dict[str, str] = {}
    """Child playbook texts this step's ``kind: playbook`` tasks run, by path."""
    parent_iter: dict[str, Any] | None = None
    """The execution's ``parent_iter`` (its request's): ``iter.parent`` of this step's pipelines."""
    v: int = WIRE_VERSION


class Checkpoint(msgspec.Struct):
    """KV record (``noetl_loops``): where a pipeline run stands — the next task, its ``iter``, ``_prev``,
    the ctx patches so far and its tasks' results."""

    pc: int
    iter: dict[str, Any] = {}
    prev: Any = None
    ctx_patches: list[dict[str, Any]] = []
    task_runs: int = 0
    """Task runs made before it: a resumed run goes on numbering them (the same task run ids, and so
    event ids, as the delivery it repeats)."""
    results: dict[str, Any] = {}
    """The results of the run's tasks by name, as its later tasks read them; large ones (above the
    record's budget) as references to the results object store (dataplane/checkpoints.py). Empty in a
    record written before the field existed."""


# -- codecs ---------------------------------------------------------------------------------------

T = TypeVar("T")


def guarded(decoder: msgspec.json.Decoder[T]) -> Callable[[bytes], T]:
    """`decoder`'s ``decode`` made safe for bytes from anyone: whatever it raises becomes a
    `decoding.DecodingError` saying why in our own words (`decoding.explain`), a ``msgspec.DecodeError``
    (a ``msgspec.ValidationError`` too for JSON of the wrong shape), so the one
    ``except msgspec.DecodeError`` of a consumer settles every bad message. Uncaught, msgspec's others
    (``RecursionError``) made a handler fail on the message at each redelivery, for ever."""
    decode, type_ = decoder.decode, decoder.type

    def run(data: bytes) -> T:
        try:
            return decode(data)
        except Exception as exc:  # nothing a message's bytes cause escapes as something else
            raise explain(data, exc, type_) from None

    return run


def decode_json(data: bytes, type_: type[T]) -> T:
    """Bytes from outside (a request body, a KV value) as a `type_`; a `decoding.DecodingError` saying
    why if they are not one, whatever is wrong with them."""
    try:
        return msgspec.json.decode(data, type=type_)
    except Exception as exc:
        raise explain(data, exc, type_) from None


_encoder = msgspec.json.Encoder(enc_hook=enc_hook)
"""``enc_hook`` converts what has a JSON form (a ``str`` subclass, a tuple, a ``range``); msgspec calls it
only for values it cannot encode itself."""
decode_event: Callable[[bytes], Event] = guarded(msgspec.json.Decoder(Event))
decode_command: Callable[[bytes], Command] = guarded(msgspec.json.Decoder(Command))
decode_request: Callable[[bytes], ExecutionRequest] = guarded(msgspec.json.Decoder(ExecutionRequest))


def encode(value: Any) -> bytes:
    return _encoder.encode(value)


# -- ids and time ---------------------------------------------------------------------------------

_NS = uuid.UUID("6f1c2b8e-51a8-4b8a-9c55-8f3f3f6c9d10")


_last_ms = -1
_last_iso = ""
_last_s = -1
_last_prefix = ""


def iso_at(epoch_s: float) -> str:
    """`epoch_s` as UTC ISO-8601 with milliseconds, in `now_iso`'s format: the two compare as text."""
    ms = int(epoch_s * 1000)
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S.', time.gmtime(ms // 1000))}{ms % 1000:03d}Z"


def epoch_of(iso: str | None) -> float | None:
    """An ISO-8601 time (``...Z`` or with an offset; one without is UTC) as epoch seconds; None for no
    time or text that is not one."""
    if not iso:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)).timestamp()


def seconds_between(start: str | None, end: str | None) -> float | None:
    """Seconds from `start` to `end` (ISO-8601), rounded to milliseconds, never negative; None unless
    both are times."""
    a, b = epoch_of(start), epoch_of(end)
    return None if a is None or b is None else round(max(b - a, 0.0), 3)


def now_iso() -> str:
    """UTC now as ISO-8601 with milliseconds (``2026-11-22T02:23:54.185Z``); cached per millisecond, and
    the part up to the second cached per second (formatting a datetime costs more than the rest)."""
    global _last_ms, _last_iso, _last_s, _last_prefix
    ms = int(time.time() * 1000)
    if ms != _last_ms:
        s = ms // 1000
        if s != _last_s:
            _last_prefix = time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(s))
            _last_s = s
        _last_iso = f"{_last_prefix}{ms % 1000:03d}Z"
        _last_ms = ms
    return _last_iso


def new_execution_id() -> str:
    return uuid.uuid4().hex


def derived_execution_id(*parts: object) -> str:
    """A stable id from stable inputs (e.g. the request's stream and sequence), for idempotent intake."""
    return uuid.uuid5(_NS, ":".join(str(p) for p in parts)).hex


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def request_msg_id(execution_id: str) -> str:
    """The ``Nats-Msg-Id`` of an execution request on the requests stream: one per execution id, so a
    client's (or a parent step's) retry of the same request is dropped by the server as a duplicate."""
    return f"request:{execution_id}"


def event_id(execution_id: str, scope: str, name: str) -> str:
    """Deterministic id: ``<execution_id>:<scope>:<name>``; also the ``Nats-Msg-Id``."""
    return f"{execution_id}:{scope}:{name}"


def make_event(
    execution_id: str,
    name: str,
    *,
    source: Source,
    entity_type: str,
    entity_id: str,
    status: str,
    scope: str,
    payload: dict[str, Any],
    timestamp: str | None = None,
    step: str | None = None,
    step_run_id: str | None = None,
    task_run_id: str | None = None,
    trace_id: str | None = None,
    worker: str | None = None,
) -> Event:
    """The one factory of events: its id deterministic from its `scope` (`event_id`), its timestamp now
    unless `timestamp` says when it happened. The controller's (`server_event`), a worker's
    (``CommandRun.event``) and the control actions (`control_event`) are made here."""
    return Event(
        event_id=event_id(execution_id, scope, name),
        execution_id=execution_id,
        name=name,
        source=source,
        entity_type=entity_type,  # type: ignore[arg-type]
        entity_id=entity_id,
        status=status,  # type: ignore[arg-type]
        timestamp=now_iso() if timestamp is None else timestamp,
        payload=payload,
        step=step,
        step_run_id=step_run_id,
        task_run_id=task_run_id,
        trace_id=trace_id,
        worker=worker,
    )


def control_event(
    execution_id: str,
    name: str,
    reason: str | None = None,
    *,
    source: Source = "server",
    scope: str | None = None,
) -> Event:
    """An action on an execution (``execution.cancel.requested``, ...) as an input event for the
    controller's reducer: an operator's through the intake, or a worker's cancelling a child execution.
    Each request has a scope of its own, so each is recorded (none is dropped as a duplicate), unless
    `scope` names one (`parent_ended_cancel`)."""
    return make_event(
        execution_id,
        name,
        source=source,
        entity_type="workflow",
        entity_id=execution_id,
        status="in_progress",
        scope=scope or f"control-{new_execution_id()}",
        payload={"reason": reason} if reason else {},
    )


PARENT_ENDED_SCOPE = "parent-ended"


def parent_ended_cancel(child_id: str, reason: str, *, source: Source = "server") -> Event:
    """``execution.cancel.requested`` for a child execution whose parent ended otherwise than with
    success. Its id is the same whoever writes it (the controller holding the child, a worker whose task
    waited for it), so the child's history records one such cancel."""
    return control_event(
        child_id, E.EXECUTION_CANCEL_REQUESTED, reason, source=source, scope=PARENT_ENDED_SCOPE
    )
