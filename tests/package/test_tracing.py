"""Optional OpenTelemetry traces: one trace per execution, its root exported by the controller, the
controller's intake, route and schedule spans, the worker's queued, step and task spans, the trace id in
the worker's events; ``noetl-stream run`` exporting them as the environment says.

In-process runtime, spans collected by the SDK's in-memory exporter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

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
    provider = TracerProvider(id_generator=tracing.id_generator())
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


Eventually = Callable[..., Awaitable[None]]


async def root_of(exporter: InMemorySpanExporter, eventually: Eventually) -> ReadableSpan:
    """The execution's root span, once exported: the controller makes it after the end is stored, which
    a client following the execution may see first."""
    await eventually(lambda: any(s.name.startswith("execution ") for s in exporter.get_finished_spans()))
    (root,) = [s for s in exporter.get_finished_spans() if s.name.startswith("execution ")]
    return root


def inside(span: ReadableSpan, outer: ReadableSpan) -> bool:
    assert span.start_time is not None and span.end_time is not None
    assert outer.start_time is not None and outer.end_time is not None
    return outer.start_time <= span.start_time <= span.end_time <= outer.end_time


async def test_one_span_per_step_run_and_task_in_one_trace_per_execution(
    runtime: Runtime, exporter: InMemorySpanExporter, eventually: Eventually
) -> None:
    result = await run(runtime, TEXT)
    assert result.status == "failed"
    execution_id = result.summary.execution_id
    await root_of(exporter, eventually)
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

    # A failure is an error status, with the error kind and message, the exception's type said once.
    (divide,) = spans["task divide"]
    (boom,) = spans["step boom"]
    (execution,) = spans["execution traced"]
    for span in (divide, boom, execution):
        assert span.status.status_code == StatusCode.ERROR
        assert (span.status.description or "").startswith("python_error: ZeroDivisionError: ")
        assert (span.status.description or "").count("ZeroDivisionError") == 1
    assert start.status.status_code != StatusCode.ERROR
    assert all(s.end_time is not None and s.start_time is not None for s in exporter.get_finished_spans())


async def test_a_traceparent_in_the_request_parents_the_root_span(
    runtime: Runtime, exporter: InMemorySpanExporter, eventually: Eventually
) -> None:
    """The caller's span is the root's parent; the step spans stay the root's children."""
    trace_hex, parent_hex = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    text = playbook("- step: start\n  tool: {kind: noop}", name="parented")
    request = request_for(text, "t.yaml")
    request.trace_id = f"00-{trace_hex}-{parent_hex}-01"
    events: list[Event] = []
    execution_id = await submit(runtime.nc, runtime.topology, request)
    await follow(runtime.nc, runtime.topology, execution_id, events.append, timeout=30)

    root = await root_of(exporter, eventually)
    assert root.name == "execution parented"
    assert root.context is not None and root.context.trace_id == int(trace_hex, 16)
    assert span_id(root) == tracing.trace_ids(execution_id, request.trace_id)[1]
    assert parent_id(root) == int(parent_hex, 16)
    (step,) = by_name(exporter.get_finished_spans())["step start"]
    assert step.context is not None and step.context.trace_id == int(trace_hex, 16)
    assert parent_id(step) == span_id(root)
    assert {s.context.trace_id for s in exporter.get_finished_spans() if s.context} == {int(trace_hex, 16)}
    assert {e.trace_id for e in worker_events(events)} == {trace_hex}


THREE = playbook(
    """
    - step: start
      tool: {name: one, kind: python, code: "result = 1"}
      next: {arcs: [{step: middle}]}
    - step: middle
      tool: {name: pass, kind: noop}
      next: {arcs: [{step: boom}]}
    - step: boom
      tool: {name: divide, kind: python, code: "result = 1 / 0"}
    """,
    name="three",
)


async def test_one_trace_per_execution_with_its_root_and_the_controllers_spans(
    runtime: Runtime, exporter: InMemorySpanExporter, eventually: Eventually
) -> None:
    result = await run(runtime, THREE)
    assert result.status == "failed"
    execution_id = result.summary.execution_id
    root = await root_of(exporter, eventually)
    finished = exporter.get_finished_spans()
    spans = by_name(finished)

    # One trace; the root is exported (by the controller, at the end) with the id the others point at.
    trace_id, root_id = tracing.trace_ids(execution_id)
    assert {s.context.trace_id for s in finished if s.context} == {trace_id}
    assert root.name == "execution three"
    assert span_id(root) == root_id and root.parent is None
    assert root.attributes is not None
    assert root.attributes["noetl.execution_id"] == execution_id
    assert root.attributes["noetl.status"] == "failed"
    assert root.attributes["noetl.controller"] == runtime.controller.controller_id
    assert root.status.status_code == StatusCode.ERROR
    assert (root.status.description or "").count("ZeroDivisionError") == 1
    assert all(inside(s, root) for s in finished if s is not root)
    assert all(parent_id(s) is not None for s in finished if s is not root)

    # The controller: the intake, a route per step boundary, a schedule per command under the fold
    # that issued it; the worker: the wait of each command, then its step run, under the root.
    (intake,) = spans["intake"]
    assert parent_id(intake) == root_id
    routes = {name: ss for name, ss in spans.items() if name.startswith("route ")}
    assert sorted(routes) == ["route boom", "route middle", "route start"]
    assert all(len(ss) == 1 and parent_id(ss[0]) == root_id for ss in routes.values())
    (route_start,) = routes["route start"]
    (route_middle,) = routes["route middle"]
    (route_boom,) = routes["route boom"]
    assert route_start.attributes is not None and route_boom.attributes is not None
    assert route_start.attributes["noetl.event"] == "step.done"
    assert route_start.attributes["noetl.next"] == ("middle",)
    assert route_boom.attributes["noetl.event"] == "step.failed"
    assert route_boom.attributes["noetl.next"] == ()
    issued_by = {"start": intake, "middle": route_start, "boom": route_middle}
    for step, fold in issued_by.items():
        (schedule,) = spans[f"schedule {step}"]
        (queued,) = spans[f"queued {step}"]
        (run_span,) = spans[f"step {step}"]
        assert schedule.attributes is not None
        assert schedule.attributes["noetl.step_run_id"] == f"{step}-1"
        assert parent_id(schedule) == span_id(fold) and inside(schedule, fold)
        assert parent_id(queued) == root_id and parent_id(run_span) == root_id
        assert schedule.start_time == queued.start_time  # the command's issued_at
        assert queued.end_time == run_span.start_time  # the worker took it
    assert intake.start_time == root.start_time  # the request's time
    assert route_boom.end_time == root.end_time  # the fold that ended it


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
    assert tracing.caller_span(invalid) is None and tracing.caller_span(given) is None
    # A traceparent gives the trace and the root's parent; the root's id is the execution's all the same.
    traceparent = f"00-{given}-00f067aa0ba902b7-01"
    assert tracing.trace_ids("my-run-1", traceparent) == (int(given, 16), tracing.trace_ids("my-run-1")[1])
    assert tracing.caller_span(traceparent) == 0x00F067AA0BA902B7


@pytest.mark.parametrize("ours", [True, False], ids=["id_generator", "any SDK provider"])
def test_the_root_gets_its_derived_id(ours: bool) -> None:
    """`export_execution` gives the root the id every other span's parent is: with a provider built with
    `tracing.id_generator()`, and with any other SDK provider (`enable` puts ours in front of its
    tracer's), whose other tracers keep their own ids."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(id_generator=tracing.id_generator()) if ours else TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        assert tracing.enable(provider)
        tracer = tracing.active()
        assert tracer is not None
        trace_id, root_id = tracing.trace_ids("my-run-1")
        tracing.export_execution(
            tracer, "my-run-1", None, "execution x", 1_000, 2_000, {"noetl.status": "success"}
        )
        with tracer.start_as_current_span("other"):  # random ids, as before
            pass
        root, other = exporter.get_finished_spans()
        assert root.context is not None and other.context is not None
        assert (root.context.trace_id, root.context.span_id) == (trace_id, root_id)
        assert root.parent is None and (root.start_time, root.end_time) == (1_000, 2_000)
        assert root.status.status_code != StatusCode.ERROR
        assert other.context.span_id != root_id and other.context.trace_id != trace_id
    finally:
        tracing.disable()
        provider.shutdown()


@pytest.mark.parametrize(
    ("error", "text"),
    [
        (
            {"kind": "ZeroDivisionError", "message": "ZeroDivisionError: division by zero"},
            "ZeroDivisionError: division by zero",
        ),
        (
            {"kind": "python_error", "message": "ZeroDivisionError: division by zero (line 1)"},
            "python_error: ZeroDivisionError: division by zero (line 1)",
        ),
        ({"kind": "timeout", "message": "timeout"}, "timeout"),
        ({"kind": "cancelled"}, "cancelled"),
        ("cancelled", "cancelled"),
    ],
)
def test_an_error_status_names_its_kind_once(error: Any, text: str) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    span = provider.get_tracer("t").start_span("s")
    tracing.set_error(span, error)
    span.end()
    (done,) = exporter.get_finished_spans()
    assert done.status.status_code == StatusCode.ERROR
    assert done.status.description == text
    provider.shutdown()


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


ROOT = Path(__file__).resolve().parents[2]


def console_spans(text: str) -> list[dict[str, Any]]:
    """The spans the SDK's console exporter printed (indented JSON objects) among the other lines."""
    decoder, spans, i = json.JSONDecoder(), [], 0
    while (i := text.find("{", i)) != -1:
        try:
            value, i = decoder.raw_decode(text, i)
        except ValueError:
            i += 1
            continue
        if isinstance(value, dict) and "context" in value and "name" in value:
            spans.append(value)
    return spans


def test_run_exports_the_traces_the_environment_asks_for() -> None:
    """``noetl-stream run`` sets tracing up from the environment (service ``noetl-stream``), prints the
    console exporter's spans on stderr (stdout stays the outcome) and exports them all before it exits,
    the root too."""
    cli = Path(sys.executable).parent / "noetl-stream"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NOETL_OTEL", "NOETL_NATS_URL"))}
    env["OTEL_TRACES_EXPORTER"] = "console"
    proc = subprocess.run(
        [str(cli), "run", "playbooks/hello.yaml", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    outcome = json.loads(proc.stdout)
    execution_id = outcome["execution_id"]
    spans = console_spans(proc.stderr)
    names = sorted(s["name"] for s in spans)
    for name in (
        "execution hello",
        "intake",
        "route start",
        "schedule stats",
        "queued report",
        "step report",
    ):
        assert name in names, names
    trace_id, root_id = tracing.trace_ids(execution_id)
    assert {s["context"]["trace_id"] for s in spans} == {f"0x{trace_id:032x}"}
    (root,) = [s for s in spans if s["name"] == "execution hello"]
    assert root["context"]["span_id"] == f"0x{root_id:016x}" and root["parent_id"] is None
    assert root["attributes"]["noetl.status"] == "success"
    assert {s["resource"]["attributes"]["service.name"] for s in spans} == {"noetl-stream"}
    assert all(s["parent_id"] is not None for s in spans if s is not root)
