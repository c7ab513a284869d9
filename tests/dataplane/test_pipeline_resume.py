"""A paginating pipeline resumed from its checkpoint (a redelivered command), on a real nats-server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from nats.js.client import JetStreamContext

from noetl_stream.dataplane.pipeline import PipelineInput, run_pipeline
from noetl_stream.dsl.compiler import load_playbook
from noetl_stream.dsl.model import Task
from noetl_stream.kv.checkpoints import KvCheckpoints
from noetl_stream.kv.provision import provision
from noetl_stream.protocol.subjects import Topology

# Pages 1..5, one task run each (a backward jump per page: a checkpoint each time). Page 3 hangs until
# the marker file exists: the first delivery dies there (cancelled, as a killed worker's run ends), the
# redelivery resumes at page 3.
PAGES = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: pages, path: tests/pages}
workflow:
  - step: start
    tool:
      - name: page
        kind: python
        args: {n: "{{ iter.page | default(1) }}", marker: "{{ workload.marker }}"}
        code: |
          import os, time
          if n == 3 and not os.path.exists(marker):
              time.sleep(1.5)
          result = {"page": n}
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'ok' and outcome.result.page < 5 }}"
                then: {do: jump, to: page, set_iter: {page: "{{ outcome.result.page + 1 }}"}}
              - when: "{{ outcome.status == 'ok' }}"
                then: {do: break}
              - else:
                  then: {do: fail}
"""


async def test_a_resumed_pipeline_goes_on_numbering_its_task_runs(
    js: JetStreamContext, topology: Topology, tmp_path: Path
) -> None:
    await provision(js, topology)
    marker = tmp_path / "marker"
    book = load_playbook(PAGES)
    step = book.step("start")
    seen: list[tuple[str, int, Any]] = []

    def on_task(name: str, task: Task, run_no: int, attempt: int, payload: dict[str, Any]) -> None:
        seen.append(
            (name, run_no, (payload.get("result") or {}).get("page") if name == "task.done" else None)
        )

    def inp(resume: bool) -> PipelineInput:
        return PipelineInput(
            execution_id="e1",
            step=step,
            scope={"workload": {"marker": str(marker)}},
            scope_id="e1-start-1",
            checkpoints=KvCheckpoints(js, topology, "e1"),
            resume=resume,
        )

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(run_pipeline(inp(False), on_task), 0.8)
    assert [run_no for name, run_no, _ in seen if name == "task.started"] == [1, 2, 3]
    marker.touch()
    seen.clear()
    second = await run_pipeline(inp(True), on_task)  # as a redelivered command does

    assert second.status == "ok", second.error
    assert second.result == {"page": 5}
    # Resumed at page 3, the third task run: numbered 3, 4, 5 (the same task run ids as the first
    # delivery's for page 3, whose events JetStream then drops as duplicates), not 1, 2, 3.
    assert [(run_no, page) for name, run_no, page in seen if name == "task.done"] == [(3, 3), (4, 4), (5, 5)]
    assert second.task_runs == 5
