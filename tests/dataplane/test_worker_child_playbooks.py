"""Probe 80: a worker's child playbooks (`kind: playbook`).

Parents waiting for their children do not stop the worker pulling (a distributed loop of children wider
than the worker's concurrency finishes); a timeout of the waiting task cancels its child, a worker's
shutdown does not (the redelivered command waits for the same child); a task of an ended execution
starts no child; child args too large for a message fail the task with a clear error.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
from helpers import playbook, run

from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import follow
from noetl_stream.dataplane.tools.base import ToolContext
from noetl_stream.dataplane.tools.playbook import run_playbook
from noetl_stream.dataplane.worker import Worker
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import decode_event
from noetl_stream.runtime.local import Runtime, local_runtime

QUICK = playbook(
    """
    - step: start
      tool: {kind: python, args: {p: "{{ iter.parent.n }}"}, code: "result = p"}
    """,
    name="quick",
)

FAN = playbook(
    """
    - step: start
      loop:
        in: "{{ range(12) | list }}"
        iterator: n
        spec: {mode: parallel, max_in_flight: 8, policy: {exec: distributed}}
      tool: {kind: playbook, path: quick.yaml, return_step: start}
      next: {arcs: [{step: fin, when: "{{ event.name == 'loop.done' }}"}]}
    - step: fin
      tool: {kind: python, args: {r: "{{ start }}"}, code: "result = sum(x['data'] for x in r)"}
    """,
    name="fan",
)

SLOW_CHILD = playbook(
    """
    - step: start
      loop:
        in: "{{ range(workload.naps) | list }}"
        iterator: n
      tool:
        kind: python
        code: |
          import time
          time.sleep(0.25)
          result = 1
    """,
    workload={"naps": 40},
    name="slowkid",
)


async def _children(rt: Runtime, parent_id: str) -> list[str]:
    """The ids of the executions requested with `parent_id` as their parent, in request order."""
    sub = await rt.nc.jetstream().subscribe(
        rt.topology.stored_any_execution_filter(E.EXECUTION_REQUESTED),
        stream=rt.topology.events_stream,
        ordered_consumer=True,
    )
    found: list[str] = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=1)
            except TimeoutError:
                return found
            ev = decode_event(msg.data)
            if (ev.payload.get("request") or {}).get("parent_execution_id") == parent_id:
                found.append(ev.execution_id)
    finally:
        await sub.unsubscribe()


async def test_a_distributed_loop_of_children_wider_than_the_worker_finishes(
    nats_server: EmbeddedNats, topology: Topology, tmp_path: Path
) -> None:
    """8 parents wait for their children on a worker with 4 slots: the children are still pulled."""
    (tmp_path / "quick.yaml").write_text(QUICK)
    async with local_runtime(nats_server.url, topology=topology, workers=1, concurrency=4) as rt:
        result = await run(rt, FAN, file=str(tmp_path / "fan.yaml"), timeout=30)
    assert result.status == "success", result.summary.error
    assert result.result == sum(range(12))


async def test_a_step_timeout_cancels_the_child_it_waits_for(runtime: Runtime, tmp_path: Path) -> None:
    (tmp_path / "slowkid.yaml").write_text(SLOW_CHILD)
    parent = playbook(
        """
        - step: start
          spec: {policy: {lifecycle: {timeout_s: 1}}}
          tool: {kind: playbook, path: slowkid.yaml, return_step: start}
        """,
        name="steptimeout",
    )
    eid = await submit(runtime.nc, runtime.topology, request_for(parent, str(tmp_path / "p.yaml")))
    summary = await follow(runtime.nc, runtime.topology, eid, timeout=30)
    assert summary.status == "failed" and summary.error is not None
    assert summary.error["kind"] == "timeout", summary.error
    (child,) = await _children(runtime, eid)
    kid = await follow(runtime.nc, runtime.topology, child, timeout=30)
    assert kid.status == "cancelled", kid
    assert kid.error is not None and "timeout" in kid.error["message"], kid.error


async def test_a_task_timeout_with_retries_leaves_no_child_running(runtime: Runtime, tmp_path: Path) -> None:
    (tmp_path / "slowkid.yaml").write_text(SLOW_CHILD)
    parent = playbook(
        """
        - step: start
          tool:
            kind: playbook
            path: slowkid.yaml
            return_step: start
            spec:
              timeout_s: 1
              policy:
                rules:
                  - when: "{{ outcome.status == 'error' }}"
                    then: {do: retry, attempts: 3, delay: 0.1}
        """,
        name="tasktimeout",
    )
    eid = await submit(runtime.nc, runtime.topology, request_for(parent, str(tmp_path / "p.yaml")))
    summary = await follow(runtime.nc, runtime.topology, eid, timeout=30)
    assert summary.status == "failed", summary
    children = await _children(runtime, eid)
    assert len(children) == 3  # one per attempt (the attempt is part of the child's id)
    for child in children:
        kid = await follow(runtime.nc, runtime.topology, child, timeout=30)
        assert kid.status == "cancelled", (child, kid)


async def test_a_worker_shutdown_leaves_the_child_and_the_redelivered_command_waits_for_it(
    nats_server: EmbeddedNats, topology: Topology, tmp_path: Path
) -> None:
    """The parent's worker stops while the child (on another pool) runs: the child is not cancelled, and
    the parent's command, redelivered to a new worker, finds the same child and takes its result."""
    topo = msgspec.structs.replace(topology, command_ack_wait_s=2.0)
    kid = SLOW_CHILD.replace("workflow:", "executor: {spec: {pool: kids}}\nworkflow:", 1)
    (tmp_path / "slowkid.yaml").write_text(kid)
    parent = playbook(
        """
        - step: start
          tool: {kind: playbook, path: slowkid.yaml, return_step: start, args: {naps: 16}}
        """,
        name="parent",
    )
    async with (
        local_runtime(
            nats_server.url, topology=topo, workers=1, concurrency=4, pools=("default", "kids")
        ) as rt,
        Worker(rt.nc, topo, pool="kids", name="kids") as _,
    ):
        eid = await submit(rt.nc, topo, request_for(parent, str(tmp_path / "p.yaml")))
        while not (children := await _children(rt, eid)):
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
        await rt.workers[0].shutdown(grace_s=0.2)  # the waiting parent task is stopped unfinished
        async with Worker(rt.nc, topo, pool="default", name="again"):
            summary = await follow(rt.nc, topo, eid, timeout=40)
        assert summary.status == "success", summary.error
        assert summary.result["data"] == [1] * 16
        assert await _children(rt, eid) == children  # the same child, not a second one
        assert (await follow(rt.nc, topo, children[0], timeout=10)).status == "success"


async def test_a_task_of_an_ended_execution_starts_no_child(runtime: Runtime) -> None:
    worker = runtime.workers[0]
    ctx = ToolContext(
        execution_id="ended-parent",
        step="start",
        task="kid",
        spec={},
        services=worker.services,
        scope_id="ended-parent-run",
        attachments={"kid.yaml": QUICK},
        stop_check=lambda: "the execution ended (cancelled) while this step was running",
    )
    async with asyncio.timeout(20):
        outcome = await run_playbook({"path": "kid.yaml"}, ctx)
    assert outcome.status == "error" and outcome.error is not None
    assert outcome.error["kind"] == "cancelled", outcome.error
    assert "not started" in outcome.error["message"]
    info = await runtime.nc.jetstream().stream_info(runtime.topology.requests_stream)
    assert info.state.messages == 0  # no child request was sent


async def test_child_args_too_large_for_a_message_fail_the_task_clearly(
    runtime: Runtime, tmp_path: Path
) -> None:
    (tmp_path / "lenkid.yaml").write_text(
        playbook(
            """
            - step: start
              tool: {kind: python, args: {s: "{{ workload.s }}"}, code: "result = len(s)"}
            """,
            workload={"s": ""},
            name="lenkid",
        )
    )
    parent = playbook(
        """
        - step: start
          tool: {kind: python, code: "result = 'x' * 2000000"}
          next: {arcs: [{step: kid}]}
        - step: kid
          tool: {kind: playbook, path: lenkid.yaml, args: {s: "{{ start }}"}}
        """,
        name="bigargs",
    )
    result = await run(runtime, parent, file=str(tmp_path / "bigargs.yaml"))
    assert result.status == "failed"
    error = result.step_error("kid")
    assert error["kind"] == "payload_too_large", error
    limit = runtime.nc.max_payload
    assert "MaxPayloadError" not in error["message"]
    assert f"{limit}" in error["message"] or "bytes" in error["message"], error
    assert "args" in error["message"], error
