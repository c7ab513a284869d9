"""``outcome.meta`` carries the ids of the task run in traces and events (001 §11): ``trace_id`` (always,
also without a request trace id) and ``task_run_id``; policy rules read them and ``task.done`` carries
them; end to end on a real nats-server."""

from __future__ import annotations

import pytest
from helpers import Run, playbook

from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import follow
from noetl_stream.protocol import events as E
from noetl_stream.protocol.wire import Event
from noetl_stream.runtime.local import Runtime
from noetl_stream.tracing import trace_ids

PIPELINE = """
- step: start
  tool:
    - name: first
      kind: python
      code: |
        print("hello")
        result = 1
      spec:
        policy:
          rules:
            - when: "{{ outcome.meta.trace_id | length == 32 and outcome.meta.task_run_id is defined }}"
              then: {do: continue, set_ctx: {first: "{{ outcome.meta }}"}}
            - else: {then: {do: fail}}
    - name: second
      kind: noop
      spec:
        policy:
          rules:
            - else: {then: {do: continue, set_ctx: {second: "{{ outcome.meta }}"}}}
  next: {arcs: [{step: each}]}
- step: each
  loop: {in: [1, 2], iterator: i}
  tool:
    - name: t
      kind: noop
      spec:
        policy:
          rules:
            - else: {then: {do: continue, set_iter: {run: "{{ outcome.meta.task_run_id }}"}}}
    - name: report
      kind: noop
      result: "{{ iter.run }}"
"""


async def run_as(rt: Runtime, execution_id: str) -> Run:
    events: list[Event] = []
    request = request_for(playbook(PIPELINE), "meta.yaml", execution_id=execution_id)
    await submit(rt.nc, rt.topology, request)
    summary = await follow(rt.nc, rt.topology, execution_id, events.append, timeout=30)
    return Run(summary=summary, events=events)


@pytest.mark.parametrize(
    "execution_id",
    ["0af7651916cd43dd8448eb211c80319c", "probe58-not-hex"],
    ids=["default-id", "own-id"],
)
async def test_outcome_meta_has_the_trace_and_task_run_ids(runtime: Runtime, execution_id: str) -> None:
    r = await run_as(runtime, execution_id)

    assert r.status == "success", r.summary.error
    # No request trace id and tracing off: the id the execution's trace has (its id, if 32 hex digits).
    trace = f"{trace_ids(execution_id)[0]:032x}"
    assert trace == execution_id or execution_id == "probe58-not-hex"
    first, second = r.summary.ctx["first"], r.summary.ctx["second"]
    assert first["trace_id"] == second["trace_id"] == trace
    done = {e.payload["task"]: e for e in r.tasks("start")}
    assert first["task_run_id"] == done["first"].task_run_id == "start-1.first.1"
    assert second["task_run_id"] == done["second"].task_run_id == "start-1.second.2"

    # task.done carries the captured output; the run's ids and times are its envelope's
    assert done["first"].payload["output"]["stdout"] == "hello\n" and "meta" not in done["first"].payload
    assert first["attempt"] == 1 and first["duration_s"] >= 0 and first["started_at"] <= first["ended_at"]
    assert first["stdout"] == "hello\n"  # policies read it in outcome.meta

    # a loop iteration's task runs: the same ids as their events'
    iteration_runs = sorted(e.task_run_id or "" for e in r.tasks("each", "t"))
    assert iteration_runs == ["each-1.0.t.1", "each-1.1.t.1"]
    (loop_done,) = r.named(E.LOOP_DONE, step="each")
    assert sorted(loop_done.payload["result"]) == iteration_runs
