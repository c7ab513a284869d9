"""Results stored by reference (above the step's inline limit) in the controller's templates: passed on
whole they stay references (the next step's worker resolves them); a read into one (arcs, admission, a
distributed loop's ``in``) is an error that says so, never a condition quietly false (real server)."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import run

from noetl_stream.runtime.local import Runtime

LIMIT = 1024  # executor.spec.policy.limits.max_payload_bytes: a 2 KB result is stored by reference


def small_limit(workflow: str) -> str:
    return (
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: byref, path: tests/byref}\n"
        f"executor: {{spec: {{policy: {{limits: {{max_payload_bytes: {LIMIT}}}}}}}}}\n"
        "workflow:\n" + workflow
    )


BIG = "{kind: noop, result: {has_more: false, pad: \"{{ 'x' * 2000 }}\"}}"


@pytest.mark.parametrize(
    ("where", "workflow", "read"),
    [
        (
            "arc",
            f"""
  - step: start
    tool: {BIG}
    next:
      arcs:
        - {{step: done, when: "{{{{ not event.result.has_more }}}}"}}
        - {{step: more}}
  - step: done
    tool: {{kind: noop}}
  - step: more
    tool: {{kind: noop}}
""",
            "event.result",
        ),
        (
            "arc, an item: no longer quietly false",
            """
  - step: start
    tool: {kind: noop, result: ["{{ 'x' * 2000 }}"]}
    next:
      arcs:
        - {step: long, when: "{{ event.result[0] | length > 1000 }}"}
        - {step: short}
  - step: long
    tool: {kind: noop}
  - step: short
    tool: {kind: noop}
""",
            "event.result",
        ),
        (
            "admission",
            f"""
  - step: start
    tool: {BIG}
    next:
      arcs: [{{step: gated}}]
  - step: gated
    spec:
      policy:
        admit:
          rules:
            - when: "{{{{ start.has_more }}}}"
              then: {{allow: false}}
            - else:
                then: {{allow: true}}
    tool: {{kind: noop}}
""",
            "the result of step 'start'",
        ),
        (
            "distributed loop in",
            f"""
  - step: start
    tool: {BIG}
    next:
      arcs: [{{step: each}}]
  - step: each
    loop:
      in: "{{{{ start.pad | list }}}}"
      iterator: c
      spec: {{mode: parallel, policy: {{exec: distributed}}}}
    tool: {{kind: noop}}
""",
            "the result of step 'start'",
        ),
    ],
)
async def test_reading_into_a_result_stored_by_reference_on_the_controller_is_a_clear_error(
    runtime: Runtime, where: str, workflow: str, read: str
) -> None:
    r = await run(runtime, small_limit(workflow))
    assert r.status == "failed", where
    error: dict[str, Any] = r.summary.error or {}
    assert error.get("kind") == "template_error", error
    message = str(error.get("message"))
    assert f"{read} is stored by reference" in message, message
    assert "set_ctx" in message and "max_payload_bytes" in message


async def test_a_result_stored_by_reference_passed_on_whole_is_resolved_by_the_next_worker(
    runtime: Runtime,
) -> None:
    """The controller only passes the reference along (arc args, a bare name): the next step's tasks read
    the value, and routing on a small ctx value the task set works as usual."""
    workflow = """
  - step: start
    tool:
      kind: noop
      result: {has_more: false, pad: "{{ 'x' * 2000 }}"}
      spec:
        policy:
          rules:
            - else:
                then: {do: continue, set_ctx: {more: "{{ outcome.result.has_more }}"}}
    next:
      arcs:
        - {step: use, when: "{{ not ctx.more }}", args: {page: "{{ start }}"}}
        - {step: wrong}
  - step: use
    tool: {kind: noop, result: "{{ args.page.pad | length }} {{ start.has_more }}"}
  - step: wrong
    tool: {kind: noop}
"""
    r = await run(runtime, small_limit(workflow))
    assert r.status == "success", r.summary.error
    assert r.ran() == ["start", "use"]
    assert r.step_result("use") == "2000 False"
