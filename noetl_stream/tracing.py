"""Optional OpenTelemetry traces: the worker makes one span per step run and one per task.

Off unless OpenTelemetry is installed (``pip install 'noetl-stream[otel]'``) and enabled, by
``NOETL_OTEL=1`` or by the standard variables (``OTEL_TRACES_EXPORTER`` other than ``none``,
``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``); ``NOETL_OTEL=0`` keeps it off.
Off, a command costs one global read (`step_run` returns None).

Trace ids. One execution is one trace, whichever workers run its steps: the request's ``trace_id``
when it is a W3C trace id (32 hex digits) or a ``traceparent`` (``00-<trace id>-<span id>-<flags>``,
then step spans are children of that span); otherwise the execution id when it is 32 hex digits
(the default ids are), else a hash of it. Without a ``traceparent`` the step spans' parent is a span
id derived from the execution id that no process exports (backends show the step spans as roots of
the trace). Worker events carry the trace id (``trace_id``, 32 hex digits).

The process that exports the spans configures a tracer provider: ``setup_from_env`` at the edge
(``noetl-stream worker``), or the embedding application, or `enable` with a given provider (tests).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import re
from typing import TYPE_CHECKING, Any

import structlog

from noetl_stream.protocol import events as E

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from noetl_stream.protocol.wire import Command

__all__ = ["StepTrace", "disable", "enable", "enabled_by_env", "setup_from_env", "step_run", "trace_ids"]

log = structlog.get_logger(__name__)

_tracer: Tracer | None = None
_decided = False

_HEX32 = re.compile(r"[0-9a-f]{32}")
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
_STEP_END = frozenset({E.STEP_DONE, E.STEP_FAILED, E.LOOP_DONE})
_ITERATION_END = frozenset({E.LOOP_ITERATION_DONE, E.LOOP_ITERATION_FAILED})


def enabled_by_env(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    flag = env.get("NOETL_OTEL", "").strip().lower()
    if flag:
        return flag not in ("0", "false", "no", "off")
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def enable(provider: TracerProvider | None = None) -> bool:
    """Trace from now on, with `provider` (default: OpenTelemetry's global one). False if not installed."""
    global _tracer, _decided
    try:
        from opentelemetry import trace
    except ImportError:
        _tracer, _decided = None, True
        return False
    _tracer = (provider or trace.get_tracer_provider()).get_tracer("noetl_stream")
    _decided = True
    return True


def disable() -> None:
    global _tracer, _decided
    _tracer, _decided = None, True


def setup_from_env(service_name: str) -> bool:
    """At the edge: when the environment enables tracing, install an SDK tracer provider (unless the
    application has one) exporting as ``OTEL_TRACES_EXPORTER`` says (``otlp``, the default, needs
    ``opentelemetry-exporter-otlp``; ``console`` prints spans). Returns whether tracing is on."""
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
        provider = SdkProvider(resource=_resource(service_name))
        for name in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(","):
            exporter: SpanExporter | None = None
            name = name.strip().lower()
            if name == "console":
                exporter = ConsoleSpanExporter()
            elif name == "otlp":
                exporter = _otlp_exporter()
            if exporter is not None:
                provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
    return enable()


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
    """``(trace id, parent span id)`` of an execution's spans (see the module docstring)."""
    parent = _hash(f"noetl-execution:{execution_id}", 16)
    if carried:
        value = carried.strip().lower()
        m = _TRACEPARENT.fullmatch(value)
        if m and int(m.group(1), 16) and int(m.group(2), 16):
            return int(m.group(1), 16), int(m.group(2), 16)
        if _HEX32.fullmatch(value) and int(value, 16):
            return int(value, 16), parent
    if _HEX32.fullmatch(execution_id) and int(execution_id, 16):
        return int(execution_id, 16), parent
    return _hash(f"noetl-trace:{execution_id}", 32), parent


def step_run(cmd: Command, worker: str) -> StepTrace | None:
    """The spans of one command, or None when tracing is off (the hot path)."""
    if not _decided:
        if enabled_by_env():
            enable()
        else:
            disable()
    return None if _tracer is None else StepTrace(_tracer, cmd, worker)


def _error(span: Span, payload: dict[str, Any]) -> None:
    from opentelemetry.trace import Status, StatusCode

    error = payload.get("error")
    if isinstance(error, dict):
        kind = str(error.get("kind") or "error")
        span.set_attribute("noetl.error.kind", kind)
        span.set_status(Status(StatusCode.ERROR, f"{kind}: {error.get('message', '')}"))
    else:
        span.set_status(Status(StatusCode.ERROR, str(error or "error")))


class StepTrace:
    """The span of one step run (or one distributed-loop iteration) and its task (and local iteration)
    spans, driven by the events the worker emits."""

    def __init__(self, tracer: Tracer, cmd: Command, worker: str) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

        trace_id, parent_id = trace_ids(cmd.execution_id, cmd.trace_id)
        self.trace_id = f"{trace_id:032x}"
        parent = SpanContext(trace_id, parent_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        attributes: dict[str, Any] = {
            "noetl.execution_id": cmd.execution_id,
            "noetl.step": cmd.step,
            "noetl.step_run_id": cmd.step_run_id,
            "noetl.pool": cmd.pool,
            "noetl.worker": worker,
        }
        name = f"step {cmd.step}"
        self._distributed = cmd.iteration is not None
        if cmd.iteration is not None:
            attributes["noetl.iteration"] = cmd.iteration.index
            name += f" [{cmd.iteration.index}]"
        self._tracer = tracer
        self.span = tracer.start_span(
            name,
            context=trace.set_span_in_context(NonRecordingSpan(parent)),
            kind=SpanKind.CONSUMER,
            attributes=attributes,
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
