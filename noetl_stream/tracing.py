"""Optional OpenTelemetry traces: one trace per execution, across the controller and the workers.

Off unless OpenTelemetry is installed (``pip install 'noetl-stream[otel]'``) and enabled, by
``NOETL_OTEL=1`` or by the standard variables (``OTEL_TRACES_EXPORTER`` other than ``none``,
``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``); ``NOETL_OTEL=0`` keeps it off.
Off, a command or a commit costs one global read (`active` returns None).

The spans of one execution (``docs/operations.md``, "OpenTelemetry traces"):

* ``execution <playbook>``, the root: exported by the controller whose fold ends the execution, from
  the request's time to the end (`export_execution`). Its id is derived from the execution id
  (`trace_ids`), so every process computes it, whichever controller ends the execution.
* the controller's ``intake``, ``route <step>`` and ``schedule <step>``, children of the root, made
  from the events it folds once their effects are stored (`noetl_stream.control.tracespans`).
* the worker's ``queued <step>`` (the command issued → the worker starts it) and ``step <step>``
  (one per step run or distributed-loop iteration), children of the root; under a step span its
  ``task <name>`` and local-loop ``iteration <n>`` spans (`StepTrace`).

Trace ids: the request's ``trace_id`` when it is a W3C trace id (32 hex digits) or a ``traceparent``
(``00-<trace id>-<span id>-<flags>``, then the root is a child of that span); otherwise the execution
id when it is 32 hex digits (the default ids are), else a hash of it. Worker events carry the trace id
(``trace_id``, 32 hex digits).

The process that exports the spans configures a tracer provider: ``setup_from_env`` at the edge
(``noetl-stream controller``, ``worker``, ``run``), or the embedding application, or `enable` with a
given provider (tests). The root gets its chosen id from `id_generator`, which `setup_from_env`'s
provider uses; `enable` puts it in front of the id generator of any other SDK provider's tracer.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import importlib
import os
import re
import time
from typing import TYPE_CHECKING, Any, TextIO

import structlog

from noetl_stream.protocol import events as E
from noetl_stream.protocol.errorinfo import error_text
from noetl_stream.protocol.wire import epoch_of

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace.id_generator import IdGenerator
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from noetl_stream.protocol.wire import Command

__all__ = [
    "StepTrace",
    "active",
    "caller_span",
    "disable",
    "enable",
    "enabled_by_env",
    "export_execution",
    "flush",
    "id_generator",
    "ns_of",
    "root_context",
    "set_error",
    "setup_from_env",
    "step_run",
    "trace_ids",
]

log = structlog.get_logger(__name__)

_tracer: Tracer | None = None
_decided = False

_HEX32 = re.compile(r"[0-9a-f]{32}")
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
_STEP_END = frozenset({E.STEP_DONE, E.STEP_FAILED, E.LOOP_DONE})
_ITERATION_END = frozenset({E.LOOP_ITERATION_DONE, E.LOOP_ITERATION_FAILED})

_warned = False
"""Whether a root span that could not get its id was logged (once)."""

_FORCED: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "noetl_forced_ids", default=None
)
"""The (trace id, span id) the next span started in this context gets (`export_execution`)."""


def enabled_by_env(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    flag = env.get("NOETL_OTEL", "").strip().lower()
    if flag:
        return flag not in ("0", "false", "no", "off")
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


@functools.cache
def _forced_ids_class() -> type[IdGenerator]:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class ForcedIds(RandomIdGenerator):
        """Random ids (or those of `inner`), except for a span started while `_FORCED` holds ids."""

        def __init__(self, inner: IdGenerator | None = None) -> None:
            self.inner = inner

        def generate_span_id(self) -> int:
            forced = _FORCED.get()
            if forced is not None:
                return forced[1]
            return self.inner.generate_span_id() if self.inner is not None else super().generate_span_id()

        def generate_trace_id(self) -> int:
            forced = _FORCED.get()
            if forced is not None:
                return forced[0]
            return self.inner.generate_trace_id() if self.inner is not None else super().generate_trace_id()

        def is_trace_id_random(self) -> bool:
            if _FORCED.get() is not None:  # an execution's: derived, not drawn
                return False
            return self.inner.is_trace_id_random() if self.inner is not None else True

    return ForcedIds


def id_generator(inner: IdGenerator | None = None) -> IdGenerator:
    """The id generator an execution's root span needs to get its derived id (`export_execution`):
    random ids (or `inner`'s) for every other span. For a provider of one's own::

        TracerProvider(resource=..., id_generator=tracing.id_generator())
    """
    return _forced_ids_class()(inner)  # type: ignore[call-arg]


def enable(provider: TracerProvider | None = None) -> bool:
    """Trace from now on, with `provider` (default: OpenTelemetry's global one). False if not installed.

    The tracer of an SDK provider built without `id_generator` gets one in front of its own (only ours:
    the provider's other tracers keep theirs)."""
    global _tracer, _decided
    try:
        from opentelemetry import trace
    except ImportError:
        _tracer, _decided = None, True
        return False
    tracer = (provider or trace.get_tracer_provider()).get_tracer("noetl_stream")
    own = getattr(tracer, "id_generator", None)
    if own is not None and not isinstance(own, _forced_ids_class()):
        tracer.id_generator = id_generator(own)  # type: ignore[attr-defined]
    _tracer, _decided = tracer, True
    return True


def disable() -> None:
    global _tracer, _decided
    _tracer, _decided = None, True


def active() -> Tracer | None:
    """The tracer when tracing is on, else None (the hot path: decided from the environment once)."""
    if not _decided:
        if enabled_by_env():
            enable()
        else:
            disable()
    return _tracer


def setup_from_env(service_name: str, console: TextIO | None = None) -> bool:
    """At the edge: when the environment enables tracing, install an SDK tracer provider (unless the
    application has one) exporting as ``OTEL_TRACES_EXPORTER`` says (``otlp``, the default, needs
    ``opentelemetry-exporter-otlp``; ``console`` prints spans, on `console` when given, else stdout).
    Returns whether tracing is on."""
    if not enabled_by_env():
        disable()
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider as SdkProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
    except ImportError:
        log.warning("tracing.unavailable", hint="pip install 'noetl-stream[otel]'")
        disable()
        return False
    if not isinstance(trace.get_tracer_provider(), SdkProvider):
        provider = SdkProvider(resource=_resource(service_name), id_generator=id_generator())
        for name in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(","):
            exporter: SpanExporter | None = None
            name = name.strip().lower()
            if name == "console":
                exporter = ConsoleSpanExporter() if console is None else ConsoleSpanExporter(out=console)
            elif name == "otlp":
                exporter = _otlp_exporter()
            if exporter is not None:
                provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
    return enable()


def flush(timeout_ms: int = 5000) -> None:
    """Export the spans still buffered (a short-lived process, before it exits: ``run``)."""
    if _tracer is None:
        return
    from opentelemetry import trace

    force_flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    if force_flush is not None:
        force_flush(timeout_ms)


def _resource(default_name: str) -> Any:
    """The tracer provider's resource: what ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` say, as
    the SDK reads them, with `default_name` as the service's name when neither names it."""
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource

    return Resource.create({"service.name": default_name}).merge(OTELResourceDetector().detect())


def _otlp_exporter() -> Any:
    """The OTLP exporter of ``opentelemetry-exporter-otlp`` (HTTP, else gRPC), if it is installed."""
    for module in (
        "opentelemetry.exporter.otlp.proto.http.trace_exporter",
        "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
    ):
        try:
            return importlib.import_module(module).OTLPSpanExporter()
        except ImportError:
            continue
    log.warning("tracing.no_otlp_exporter", hint="pip install opentelemetry-exporter-otlp")
    return None


def _hash(text: str, digits: int) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:digits], 16) or 1


@functools.lru_cache(maxsize=4096)
def execution_trace_id(execution_id: str) -> str:
    """The trace id (32 hex digits) an execution's spans get when nothing carries one: a worker puts it
    in ``outcome.meta.trace_id`` with tracing off. Cached: it is asked for on every command."""
    return f"{trace_ids(execution_id)[0]:032x}"


def trace_ids(execution_id: str, carried: str | None = None) -> tuple[int, int]:
    """``(trace id, root span id)`` of an execution (see the module docstring): the same in every
    process, from the execution id and the request's ``trace_id`` alone."""
    root = _hash(f"noetl-execution:{execution_id}", 16)
    if carried:
        value = carried.strip().lower()
        m = _TRACEPARENT.fullmatch(value)
        if m and int(m.group(1), 16) and int(m.group(2), 16):
            return int(m.group(1), 16), root
        if _HEX32.fullmatch(value) and int(value, 16):
            return int(value, 16), root
    if _HEX32.fullmatch(execution_id) and int(execution_id, 16):
        return int(execution_id, 16), root
    return _hash(f"noetl-trace:{execution_id}", 32), root


def caller_span(carried: str | None) -> int | None:
    """The span id of a request's ``traceparent`` (the root's parent), None without one."""
    if not carried:
        return None
    m = _TRACEPARENT.fullmatch(carried.strip().lower())
    if m and int(m.group(1), 16) and int(m.group(2), 16):
        return int(m.group(2), 16)
    return None


def _remote(trace_id: int, span_id: int) -> Context:
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    parent = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace.set_span_in_context(NonRecordingSpan(parent))


def root_context(execution_id: str, carried: str | None = None) -> Context:
    """A context whose span is the execution's root (not started here): the parent of its spans."""
    return _remote(*trace_ids(execution_id, carried))


def ns_of(iso: str | None) -> int | None:
    """An event's time (ISO-8601, milliseconds) as epoch nanoseconds, None if it is none."""
    epoch = epoch_of(iso)
    return None if epoch is None else round(epoch * 1000) * 1_000_000


def export_execution(
    tracer: Tracer,
    execution_id: str,
    carried: str | None,
    name: str,
    start_ns: int,
    end_ns: int,
    attributes: dict[str, Any],
    error: Any = None,
) -> Span:
    """Make the execution's root span, with its derived id (`trace_ids`; a child of the request's
    ``traceparent`` span, if any), from `start_ns` to `end_ns`; with an error status when `error`."""
    global _warned
    from opentelemetry.context import Context
    from opentelemetry.trace import SpanKind

    trace_id, root = trace_ids(execution_id, carried)
    caller = caller_span(carried)
    token = _FORCED.set((trace_id, root))
    try:
        span = tracer.start_span(
            name,
            context=_remote(trace_id, caller) if caller is not None else Context(),
            kind=SpanKind.SERVER,
            attributes=attributes,
            start_time=start_ns,
        )
    finally:
        _FORCED.reset(token)
    if span.get_span_context().span_id != root and not _warned:
        _warned = True  # once: a tracer whose ids are not ours (not the SDK's, or a no-op one)
        log.warning(
            "tracing.root_id_not_forced", hint="build the tracer provider with tracing.id_generator()"
        )
    if error is not None:
        set_error(span, error)
    span.end(end_time=max(start_ns, end_ns))
    return span


def step_run(cmd: Command, worker: str) -> StepTrace | None:
    """The spans of one command, or None when tracing is off (the hot path)."""
    tracer = _tracer if _decided else active()
    return None if tracer is None else StepTrace(tracer, cmd, worker)


def set_error(span: Span, error: Any) -> None:
    """An error status on `span`: one text naming the error's kind once (`error_text`), and the kind as
    ``noetl.error.kind``."""
    from opentelemetry.trace import Status, StatusCode

    if isinstance(error, dict):
        span.set_attribute("noetl.error.kind", str(error.get("kind") or "error"))
    span.set_status(Status(StatusCode.ERROR, error_text(error or "error")))


def _error(span: Span, payload: dict[str, Any]) -> None:
    set_error(span, payload.get("error"))


class StepTrace:
    """The span of one step run (or one distributed-loop iteration), the time its command waited for a
    worker, and its task (and local iteration) spans, driven by the events the worker emits."""

    def __init__(self, tracer: Tracer, cmd: Command, worker: str) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind

        trace_id, root = trace_ids(cmd.execution_id, cmd.trace_id)
        self.trace_id = f"{trace_id:032x}"
        attributes: dict[str, Any] = {
            "noetl.execution_id": cmd.execution_id,
            "noetl.step": cmd.step,
            "noetl.step_run_id": cmd.step_run_id,
            "noetl.pool": cmd.pool,
            "noetl.worker": worker,
        }
        name = cmd.step
        self._distributed = cmd.iteration is not None
        if cmd.iteration is not None:
            attributes["noetl.iteration"] = cmd.iteration.index
            name += f" [{cmd.iteration.index}]"
        self._tracer = tracer
        parent = _remote(trace_id, root)
        started = time.time_ns()
        issued = ns_of(cmd.issued_at)
        if issued is not None:  # the command's wait: issued by the controller → taken by this worker
            tracer.start_span(
                f"queued {name}", context=parent, attributes=attributes, start_time=min(issued, started)
            ).end(end_time=started)
        self.span = tracer.start_span(
            f"step {name}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes, start_time=started
        )
        self._context = trace.set_span_in_context(self.span)
        self._open: dict[str, Span] = {}
        self._ended = False

    def on_event(
        self, name: str, status: str, entity_id: str, payload: dict[str, Any], at_ns: int | None = None
    ) -> None:
        """One worker event; `at_ns`: when it happened (epoch ns), if not now (a held task event)."""
        from opentelemetry import trace

        if name == E.TASK_STARTED:
            scope = self._open.get("iter:" + entity_id.rsplit(".", 2)[0])
            self._open["task:" + entity_id] = self._tracer.start_span(
                f"task {payload.get('task')}",
                context=trace.set_span_in_context(scope) if scope is not None else self._context,
                attributes={
                    "noetl.task": str(payload.get("task")),
                    "noetl.task.kind": str(payload.get("kind")),
                    "noetl.task.attempt": int(payload.get("attempt") or 1),
                    "noetl.task_run_id": entity_id,
                },
                start_time=at_ns,
            )
        elif name == E.TASK_DONE:
            self._close("task:" + entity_id, status, payload, at_ns)
        elif name == E.LOOP_ITERATION_STARTED and not self._distributed:
            self._open["iter:" + entity_id] = self._tracer.start_span(
                f"iteration {payload.get('index')}",
                context=self._context,
                attributes={"noetl.iteration": int(payload.get("index") or 0)},
            )
        elif name in _ITERATION_END and not self._distributed:
            self._close("iter:" + entity_id, status, payload)
        elif (name in _STEP_END or name in _ITERATION_END) and status == "error":
            _error(self.span, payload)

    def _close(self, key: str, status: str, payload: dict[str, Any], at_ns: int | None = None) -> None:
        span = self._open.pop(key, None)
        if span is not None:
            if status == "error":
                _error(span, payload)
            span.end(end_time=at_ns)

    def end(self) -> None:
        """End every open span (idempotent)."""
        if self._ended:
            return
        self._ended = True
        for span in reversed(self._open.values()):
            span.end()
        self._open.clear()
        self.span.end()
