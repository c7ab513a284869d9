"""Rendered values and task results travel as JSON: converted when they have a JSON form, a clear
failure of the step (never a publish that fails and is redelivered forever) when they have none."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Runtime
from helpers import playbook, run

from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.dataplane.tools import TOOLS, ToolContext
from noetl_stream.dsl import kinds
from noetl_stream.runtime.plugins import ToolPlugin, register_plugin


async def test_arc_args_that_render_python_values_arrive_as_json(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: noop}
          next:
            arcs:
              - step: after
                args:
                  ev: "{{ event.name }}"
                  event: "{{ event }}"
                  numbers: "{{ range(3) }}"
                  pair: "{{ (1, 'a') }}"
                  upper: "{{ ['a', 'b'] | map('upper') }}"
        - step: after
          tool: {kind: noop, result: "{{ args }}"}
        """
    )

    r = await run(runtime, text, timeout=20)

    assert r.status == "success", r.summary.error
    assert r.result["ev"] == "step.done"
    assert r.result["event"]["name"] == "step.done"
    assert r.result["numbers"] == [0, 1, 2]
    assert r.result["pair"] == [1, "a"]
    assert r.result["upper"] == ["A", "B"]


async def test_arc_args_without_a_json_form_fail_the_step_naming_the_arc_and_type(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: noop}
          next: {arcs: [{step: after, args: {f: "{{ cycler }}"}}]}
        - step: after
          tool: {kind: noop}
        """
    )

    r = await run(runtime, text, timeout=20)

    assert r.status == "failed"
    error = r.summary.error or {}
    assert error["kind"] == "template_error"
    assert "step 'start' arc 'after' args.f" in error["message"]
    assert "type 'type' is not JSON" in error["message"]
    assert r.started("after") == 0


async def test_a_noop_result_that_renders_a_range_is_a_list(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: noop, result: "{{ range(3) }}"}
        """
    )

    r = await run(runtime, text, timeout=20)

    assert r.status == "success", r.summary.error
    assert r.result == [0, 1, 2]
    assert len(r.tasks("start", name="task.started")) == 1
    assert [e.payload["result"] for e in r.tasks("start")] == [[0, 1, 2]]


class Label(str):
    """A ``str`` subclass (which the encoder cannot write as it is)."""


async def opaque(config: dict[str, Any], ctx: ToolContext) -> Outcome:
    """A third-party tool returning what its config asks for."""
    values: dict[str, Any] = {
        "range": {"r": range(2), "s": {3}},
        "name": [Label("a")],
        "object": {"o": object()},
    }
    return Outcome.ok(values[str(config["give"])])


@pytest.fixture
def opaque_kind() -> Iterator[None]:
    register_plugin(ToolPlugin(kind="opaque", run=opaque, keys={"give"}))
    try:
        yield
    finally:
        TOOLS.pop("opaque", None)
        kinds._REGISTRY.pop("opaque", None)


def _opaque(give: str) -> str:
    return playbook(
        f"""
        - step: start
          tool:
            - name: make
              kind: opaque
              give: {give}
              spec:
                policy:
                  rules:
                    - when: "{{{{ outcome.error.kind == 'invalid_result' }}}}"
                      then: {{do: break, set_ctx: {{why: "{{{{ outcome.error.message }}}}"}}}}
        """
    )


@pytest.mark.parametrize(("give", "result"), [("range", {"r": [0, 1], "s": [3]}), ("name", ["a"])])
async def test_a_plugin_result_with_a_json_form_is_converted(
    runtime: Runtime, opaque_kind: None, give: str, result: Any
) -> None:
    r = await run(runtime, _opaque(give), timeout=20)

    assert r.status == "success", r.summary.error
    assert r.result == result
    assert [e.payload["status"] for e in r.tasks("start")] == ["ok"]


async def test_a_plugin_result_without_a_json_form_is_the_tasks_error_outcome(
    runtime: Runtime, opaque_kind: None
) -> None:
    r = await run(runtime, _opaque("object"), timeout=20)

    assert r.status == "success", r.summary.error  # the policy acted on the error outcome
    assert len(r.tasks("start", name="task.started")) == 1
    (done,) = r.tasks("start")
    assert done.payload["status"] == "error"
    assert done.payload["error"]["kind"] == "invalid_result"
    why = done.payload["error"]["message"]
    assert "task 'make' (opaque): its result is not JSON" in why
    assert "type 'object' at o is not JSON" in why
    assert r.named("ctx.patched")[0].payload["patches"] == [{"why": why}]
