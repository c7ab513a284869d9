"""`retry` of an execution its deadline or a cancel ended: the interrupted steps run again."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from helpers import playbook

from noetl_stream.client.submit import request_for, retry_request, submit
from noetl_stream.client.tracking import follow
from noetl_stream.protocol import events as E
from noetl_stream.runtime.local import Runtime

# `start` waits for a flag file (up to 20 s); `second` follows it with its result
WAITS = """
- step: start
  tool:
    kind: python
    args: {flag: "{{ workload.flag }}", mark: "{{ workload.mark }}", tag: "{{ workload.tag }}"}
    code: |
      import os, time
      open(mark, "a").write("start\\n")
      t0 = time.time()
      while not os.path.exists(flag) and time.time() < t0 + 20:
          time.sleep(0.05)
      result = tag
  next:
    arcs: [{step: second, args: {got: "{{ start }}"}}]
- step: second
  tool: {kind: python, args: {got: "{{ args.got }}"}, code: "result = got + '!'"}
"""


def _text(tmp_path: Path, deadline_s: float | None = None) -> str:
    text = playbook(
        WAITS, workload={"flag": str(tmp_path / "flag"), "mark": str(tmp_path / "mark"), "tag": "t"}
    )
    if deadline_s is not None:
        text = text.replace("workflow:", f"executor:\n  spec: {{deadline_s: {deadline_s}}}\nworkflow:", 1)
    return text


async def _retried(runtime: Runtime, ended: str, tmp_path: Path) -> None:
    (tmp_path / "flag").write_text("ok")
    request = await retry_request(runtime.nc, runtime.topology, ended)
    assert request.resume is not None and [t.step for t in request.resume.tokens] == ["start"]
    again = await follow(
        runtime.nc, runtime.topology, await submit(runtime.nc, runtime.topology, request), timeout=20
    )
    assert again.status == "success", again.error
    assert again.result == "t!"


async def test_retry_of_an_execution_that_failed_on_its_deadline_reruns_the_interrupted_step(
    runtime: Runtime, tmp_path: Path
) -> None:
    eid = await submit(runtime.nc, runtime.topology, request_for(_text(tmp_path, 1.5), "dl.yaml"))
    ended = await follow(runtime.nc, runtime.topology, eid, timeout=20)
    assert ended.status == "failed" and ended.error is not None
    assert ended.error["kind"] == "deadline_exceeded"
    await _retried(runtime, eid, tmp_path)


async def test_retry_of_a_cancelled_execution_reruns_the_interrupted_step(
    runtime: Runtime, tmp_path: Path, eventually: Callable[..., Awaitable[None]]
) -> None:
    eid = await submit(runtime.nc, runtime.topology, request_for(_text(tmp_path), "c.yaml"))
    mark = tmp_path / "mark"

    def started() -> bool:
        return mark.exists()

    await eventually(started)
    await runtime.controller.intake.control(eid, E.EXECUTION_CANCEL_REQUESTED, "operator")
    assert (await follow(runtime.nc, runtime.topology, eid, timeout=20)).status == "cancelled"
    await _retried(runtime, eid, tmp_path)
