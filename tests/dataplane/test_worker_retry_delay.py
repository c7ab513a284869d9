"""A retry ``delay`` template that fails to render or renders to no number of seconds >= 0 fails its task
with a ``template_error`` naming step, task, rule and field (never a silent 1 s); end to end on a real
nats-server."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import playbook, run

from noetl_stream.runtime.local import Runtime

RETRY = """
- step: start
  tool:
    - name: ok
      kind: noop
    - name: a
      kind: python
      args: {attempt: "{{ _attempt }}"}
      code: |
        if attempt < 2:
            raise ValueError("x")
        result = attempt
      spec:
        policy:
          rules:
            - when: "{{ outcome.status == 'ok' }}"
              then: {do: continue}
            - when: "{{ _attempt < 5 }}"
              then: {do: retry, attempts: 2, delay: "DELAY"}
"""


def retrying(delay: str, value: Any) -> str:
    return playbook(RETRY.replace("DELAY", delay), workload={"d": value})


@pytest.mark.parametrize(
    ("delay", "value", "detail"),
    [
        ("{{ workload.d }}", "abc", "got 'abc'"),
        ("{{ workload.d }}", -2, "got -2"),
        ("{{ workload.d }}", True, "got True"),
        ("{{ workload.d }}", [1], "got [1]"),
        ("{{ workload.nosuch }}", 1, "no key 'nosuch' in the mapping"),
        ("{{ nosuch }}", 1, "'nosuch' is undefined"),
    ],
    ids=["text", "negative", "boolean", "list", "missing-key", "undefined-name"],
)
async def test_a_bad_retry_delay_fails_the_task_with_a_template_error(
    runtime: Runtime, delay: str, value: Any, detail: str
) -> None:
    r = await run(runtime, retrying(delay, value))

    assert r.status == "failed"
    error = r.step_error("start")
    assert error["kind"] == "template_error" and error["task"] == "a"
    where = "step 'start' task 'a' spec.policy.rules[1].then.delay: "
    assert error["message"].startswith(where) and detail in error["message"], error["message"]
    assert len(r.tasks("start", "a", name="task.started")) == 1  # no retry was run
    (done,) = r.tasks("start", "a")
    assert done.payload["error"]["kind"] == "template_error" and done.payload["do"] == "fail"
    assert done.payload["attempt"] == 1


@pytest.mark.parametrize(
    "value", [0, 0.0, "0", " 0.0 ", None], ids=["int", "float", "text", "padded", "null"]
)
async def test_a_retry_delay_that_renders_to_seconds_or_null_retries(runtime: Runtime, value: Any) -> None:
    """A number, a numeric string (a header's value) and null (the default delay, 1 s) are delays."""
    r = await run(runtime, retrying("{{ workload.d }}", value))

    assert r.status == "success", r.summary.error
    assert r.result == 2
    assert [e.payload["do"] for e in r.tasks("start", "a")] == ["retry", "continue"]
