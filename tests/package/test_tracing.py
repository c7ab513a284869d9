"""Optional OpenTelemetry traces: one span per step run and task, the trace id in the worker's events.

In-process runtime, spans collected by the SDK's in-memory exporter.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers import playbook, run
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from noetl_stream import tracing
from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import follow
from noetl_stream.protocol.wire import Event
from noetl_stream.runtime.local import Runtime

TEXT = playbook(
    """
    - step: start
      tool:
        - {name: a, kind: python, code: "result = 1"}
        - {name: b, kind: noop}
      next: {arcs: [{step: local}]}
    - step: local
      loop: {in: "{{ [1, 2] }}", iterator: n}
      tool: {name: touch, kind: noop}
      next: {arcs: [{step: spread}]}
    - step: spread
      loop:
        in: "{{ [1, 2] }}"
        iterator: n
        spec: {mode: parallel, policy: {exec: distributed}}
      tool: {name: touch, kind: noop}
      next: {arcs: [{step: boom}]}
    - step: boom
      tool:
        - name: divide
          kind: python
          code: "result = 1 / 0"
    """,
    name="traced",
)


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    assert tracing.enable(provider)
    yield exporter
    tracing.disable()
    provider.shutdown()


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        out.setdefault(span.name, []).append(span)
    return out


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def worker_events(events: list[Event]) -> list[Event]:
    return [e for e in events if e.source == "worker"]


async def test_one_span_per_step_run_and_task_in_one_trace_per_execution(
    runtime: Runtime, exporter: InMemorySpanExporter
) -> None:
    result = await run(runtime, TEXT)
    assert result.status == "failed"
    execution_id = result.summary.execution_id
    spans = by_name(exporter.get_finished_spans())

    # One trace: the execution id is the trace id, and the worker's events say so.
    trace_id, root = tracing.trace_ids(execution_id)
    assert trace_id == int(execution_id, 16)
    assert {s.context.trace_id for ss in spans.values() for s in ss if s.context} == {trace_id}
    assert {e.trace_id for e in worker_events(result.events)} == {execution_id}

    # Steps with a tool: one span per step run (a distributed loop: one per iteration), under the root.
    steps = {name: ss for name, ss in spans.items() if name.startswith("step ")}
    assert sorted(steps) == ["step boom", "step local", "step spread [0]", "step spread [1]", "step start"]
    assert all(len(ss) == 1 and parent_id(ss[0]) == root for ss in steps.values())
    (start,) = spans["step start"]
    assert start.attributes is not None
    assert start.attributes["noetl.execution_id"] == execution_id
    assert start.attributes["noetl.step_run_id"] == "start-1"
    assert start.attributes["noetl.worker"] == "local-0"

    # Tasks are children of their step run (or of their local-loop iteration).
    assert {parent_id(s) for s in spans["task a"] + spans["task b"]} == {span_id(start)}
    (local,) = spans["step local"]
    iterations = spans["iteration 0"] + spans["iteration 1"]
    assert {parent_id(s) for s in iterations} == {span_id(local)}
    touches = {parent_id(s) for s in spans["task touch"]}
    spread = {span_id(steps[f"step spread [{i}]"][0]) for i in (0, 1)}
    assert touches == {span_id(s) for s in iterations} | spread

    # A failure is an error status, with the error kind and message.
    (divide,) = spans["task divide"]
    (boom,) = spans["step boom"]
    for span in (divide, boom):
        assert span.status.status_code == StatusCode.ERROR
        assert (span.status.description or "").startswith("python_error: ZeroDivisionError: ")
    assert start.status.status_code != StatusCode.ERROR
    assert all(s.end_time is not None and s.start_time is not None for s in exporter.get_finished_spans())


async def test_a_traceparent_in_the_request_parents_the_step_spans(
    runtime: Runtime, exporter: InMemorySpanExporter
) -> None:
    trace_hex, parent_hex = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    text = playbook("- step: start\n  tool: {kind: noop}", name="parented")
    request = request_for(text, "t.yaml")
    request.trace_id = f"00-{trace_hex}-{parent_hex}-01"
    events: list[Event] = []
    execution_id = await submit(runtime.nc, runtime.topology, request)
    await follow(runtime.nc, runtime.topology, execution_id, events.append, timeout=30)

    (step,) = by_name(exporter.get_finished_spans())["step start"]
    assert step.context is not None and step.context.trace_id == int(trace_hex, 16)
    assert parent_id(step) == int(parent_hex, 16)
    assert {e.trace_id for e in worker_events(events)} == {trace_hex}


async def test_off_by_default_no_spans_and_events_unchanged(
    runtime: Runtime, exporter: InMemorySpanExporter
) -> None:
    tracing.disable()
    result = await run(runtime, TEXT)
    assert result.status == "failed"
    assert exporter.get_finished_spans() == ()
    assert {e.trace_id for e in worker_events(result.events)} == {None}


@pytest.mark.parametrize(
    ("env", "enabled"),
    [
        ({}, False),
        ({"NOETL_OTEL": "1"}, True),
        ({"NOETL_OTEL": "0", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
    ],
)
def test_enabled_by_the_environment(env: dict[str, str], enabled: bool) -> None:
    assert tracing.enabled_by_env(env) is enabled


def test_trace_ids_are_deterministic_per_execution() -> None:
    assert tracing.trace_ids("my-run-1") == tracing.trace_ids("my-run-1")
    assert tracing.trace_ids("my-run-1")[0] != tracing.trace_ids("my-run-2")[0]
    given = "0af7651916cd43dd8448eb211c80319c"
    assert tracing.trace_ids("my-run-1", given)[0] == int(given, 16)
    invalid = "00-00000000000000000000000000000000-00f067aa0ba902b7-01"
    assert tracing.trace_ids("my-run-1", invalid) == tracing.trace_ids("my-run-1")


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({}, "noetl-stream-worker"),
        ({"OTEL_SERVICE_NAME": "etl-workers-eu"}, "etl-workers-eu"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attrs,deployment.environment=prod"}, "from-attrs"),
    ],
)
def test_the_environment_names_the_service(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], name: str
) -> None:
    """``OTEL_SERVICE_NAME`` (or ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES``) names the spans' service,
    as the OpenTelemetry SDK documents; the worker's own name is only the default."""
    for var in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert tracing._resource("noetl-stream-worker").attributes["service.name"] == name
