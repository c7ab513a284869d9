"""A step's ``lifecycle.deadline_s`` bounds its run from the moment the controller scheduled it, across
every delivery of its command: past it the step fails with ``deadline``. ``timeout_s`` bounds one
delivery (it starts again when a command is redelivered). Real server, controller and workers."""

from __future__ import annotations

import asyncio
import datetime

import pytest
from helpers import playbook, run

from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import follow
from noetl_stream.dataplane.worker import Worker
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.history import read_events
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import Runtime, local_runtime

SLOW = """
- step: start
  spec: {policy: {lifecycle: LIFECYCLE}}
  tool:
    - name: wait
      kind: python
      args: {s: "{{ workload.sleep }}"}
      code: |
        import time
        time.sleep(s)
        result = "finished"
"""


def slow(lifecycle: str, sleep: float) -> str:
    return playbook(SLOW.replace("LIFECYCLE", lifecycle), workload={"sleep": sleep})


async def test_a_step_past_its_deadline_fails_with_deadline(runtime: Runtime) -> None:
    """The shorter bound wins: a 30 s timeout_s does not let a step run past its 0.5 s deadline."""
    r = await run(runtime, slow("{timeout_s: 30, deadline_s: 0.5}", 5))

    assert r.status == "failed"
    error = r.step_error("start")
    assert error["kind"] == "deadline" and error["retryable"] is False
    assert "did not finish within its lifecycle.deadline_s (0.5 s)" in error["message"]


async def test_a_step_within_its_deadline_succeeds(runtime: Runtime) -> None:
    r = await run(runtime, slow("{deadline_s: 30}", 0))

    assert r.status == "success", r.summary.error
    assert r.result == "finished"


async def test_a_timeout_shorter_than_the_deadline_is_still_a_timeout(runtime: Runtime) -> None:
    r = await run(runtime, slow("{timeout_s: 0.5, deadline_s: 30}", 5))

    assert r.status == "failed"
    assert r.step_error("start")["kind"] == "timeout"


async def test_the_deadline_counts_from_when_the_step_was_scheduled(
    nats_server: EmbeddedNats, topology: Topology
) -> None:
    """No worker serves the step's pool until its deadline has passed: the worker that finally takes the
    command fails the step at once, without running its task (a redelivery late past the deadline
    does the same)."""
    text = playbook(
        """
        - step: start
          spec: {pool: late, policy: {lifecycle: {deadline_s: 0.3}}}
          tool: {kind: noop, result: ran}
        """
    )
    async with local_runtime(nats_server.url, topology=topology, pools=("default", "late")) as rt:
        js = rt.nc.jetstream()
        eid = await submit(rt.nc, topology, request_for(text, "late.yaml"))
        scheduled = None
        async with asyncio.timeout(10):
            while scheduled is None:
                async for _, ev in read_events(js, topology, eid, names={E.STEP_SCHEDULED}):
                    scheduled = ev
                await asyncio.sleep(0.02)
        at = datetime.datetime.fromisoformat(scheduled.timestamp.replace("Z", "+00:00"))
        while datetime.datetime.now(datetime.UTC) < at + datetime.timedelta(seconds=0.5):
            await asyncio.sleep(0.05)
        late = Worker(rt.nc, topology, pool="late", name="late-worker")
        await late.start()
        try:
            summary = await follow(rt.nc, topology, eid, timeout=30)
        finally:
            await late.shutdown(grace_s=1.0)
        events = [ev async for _, ev in read_events(js, topology, eid)]

    assert summary.status == "failed"
    assert summary.error is not None and summary.error["kind"] == "deadline"
    assert [e.name for e in events if e.name in (E.STEP_STARTED, E.TASK_STARTED)] == []


LOOP = """
- step: start
  spec: {policy: {lifecycle: {deadline_s: 1.0}}}
  loop:
    in: [0.4, 0.4, 0.4, 0.4, 0.4, 0.4]
    iterator: x
    spec: {mode: sequential, policy: {exec: EXEC}}
  tool:
    kind: python
    args: {x: "{{ iter.x }}"}
    code: |
      import time
      time.sleep(x)
      result = x
"""


@pytest.mark.parametrize("exec_", ["local", "distributed"])
async def test_a_loop_past_its_deadline_fails_with_deadline(runtime: Runtime, exec_: str) -> None:
    """The deadline bounds the whole loop: six 0.4 s iterations do not fit in 1 s."""
    r = await run(runtime, playbook(LOOP.replace("EXEC", exec_)))

    assert r.status == "failed"
    error = r.summary.error
    assert error is not None and error["kind"] == "deadline", error
    assert len(r.named(E.LOOP_ITERATION_DONE)) < 6
