"""Operator controls end to end: cancel, pause/resume, execution deadlines, step timeouts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
from helpers import playbook
from nats.aio.msg import Msg

from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import follow
from noetl_stream.dataplane.worker import Worker
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.history import read_events
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event
from noetl_stream.runtime.local import Runtime, local_runtime


async def _request(rt: Runtime, action: str, body: dict[str, object]) -> tuple[dict[str, object], str | None]:
    msg = await rt.nc.request(rt.topology.api_subject(action), msgspec.json.encode(body), timeout=10)
    error = msg.headers.get("Nats-Service-Error") if msg.headers else None
    return msgspec.json.decode(msg.data), error


async def _wait_for(rt: Runtime, execution_id: str, name: str, timeout: float = 15.0) -> Event:
    async with asyncio.timeout(timeout):
        while True:
            async for _, ev in read_events(rt.nc.jetstream(), rt.topology, execution_id, names=(name,)):
                return ev
            await asyncio.sleep(0.05)


SLOW_STEPS = """
- step: start
  tool:
    - name: one
      kind: python
      args: {mark: "{{ workload.mark }}"}
      code: |
        import time
        open(mark, "a").write("one\\n")
        time.sleep(0.6)
    - name: two
      kind: python
      args: {mark: "{{ workload.mark }}"}
      code: |
        open(mark, "a").write("two\\n")
  next:
    arcs: [{step: after}]
- step: after
  tool:
    kind: python
    args: {mark: "{{ workload.mark }}"}
    code: |
      open(mark, "a").write("after\\n")
"""


async def test_cancel_stops_the_running_step_at_its_next_task_and_schedules_nothing(
    runtime: Runtime, tmp_path: Path
) -> None:
    mark = tmp_path / "mark.txt"
    text = playbook(SLOW_STEPS, workload={"mark": str(mark)})
    execution_id = await submit(runtime.nc, runtime.topology, request_for(text, "slow.yaml"))
    await _wait_for(runtime, execution_id, E.TASK_STARTED)
    reply, error = await _request(runtime, "cancel", {"execution_id": execution_id, "reason": "operator"})
    assert error is None and reply["execution_id"] == execution_id
    summary = await follow(runtime.nc, runtime.topology, execution_id, timeout=15)
    assert summary.status == "cancelled"
    assert summary.error == {"kind": "cancelled", "message": "operator"}
    await asyncio.sleep(1.0)  # the running task finishes its sleep; task `two` must not start
    assert mark.read_text().split() == ["one"]


async def test_cancel_of_an_unknown_execution_is_a_404(runtime: Runtime) -> None:
    reply, error = await _request(runtime, "cancel", {"execution_id": "no-such-run"})
    assert "error" in reply
    assert error is not None and "no execution no-such-run" in error
    _, error = await _request(runtime, "cancel", {"execution": "x"})
    assert error is not None and error.startswith("bad request")


async def test_a_control_of_a_finished_execution_is_refused_and_writes_nothing(runtime: Runtime) -> None:
    """Nothing reads a cancel, pause or resume after ``playbook.processed``: it is refused with a 409
    that names the outcome, and the history still ends at ``playbook.processed``."""
    text = playbook("- step: start\n  tool: {kind: noop}")
    execution_id = await submit(runtime.nc, runtime.topology, request_for(text, "done.yaml"))
    assert (await follow(runtime.nc, runtime.topology, execution_id, timeout=15)).status == "success"
    for action in ("cancel", "pause", "resume"):
        reply, error = await _request(runtime, action, {"execution_id": execution_id})
        assert error == f"execution {execution_id} has finished (success): nothing to {action}"
        assert reply["error"] == "conflict"
    names = [ev.name async for _, ev in read_events(runtime.nc.jetstream(), runtime.topology, execution_id)]
    assert names[-1] == E.PLAYBOOK_PROCESSED


ENTITY_TYPES = {"playbook", "workflow", "step", "task", "loop", "next"}  # 001 §15.1


async def test_execution_wide_events_use_the_specs_entity_types(runtime: Runtime) -> None:
    """``ctx.patched`` and the operator's requests concern the workflow run: ``workflow``, one of 001
    §15.1's entity types (they were ``execution``)."""
    text = playbook(
        """
        - step: start
          tool:
            kind: noop
            spec:
              policy:
                rules:
                  - else: {then: {do: continue, set_ctx: {seen: one}}}
          next: {arcs: [{step: slow}]}
        - step: slow
          tool:
            kind: python
            code: |
              import time
              time.sleep(2)
        """
    )
    execution_id = await submit(runtime.nc, runtime.topology, request_for(text, "slow.yaml"))
    await _wait_for(runtime, execution_id, E.CTX_PATCHED)
    _, error = await _request(runtime, "cancel", {"execution_id": execution_id})
    assert error is None
    assert (await follow(runtime.nc, runtime.topology, execution_id, timeout=15)).status == "cancelled"
    events = [ev async for _, ev in read_events(runtime.nc.jetstream(), runtime.topology, execution_id)]
    by_name = {ev.name: ev.entity_type for ev in events}
    assert by_name[E.CTX_PATCHED] == by_name[E.EXECUTION_CANCEL_REQUESTED] == "workflow"
    assert {ev.entity_type for ev in events} <= ENTITY_TYPES


async def test_pause_defers_new_steps_and_resume_continues_where_it_was(
    runtime: Runtime, tmp_path: Path
) -> None:
    mark = tmp_path / "mark.txt"
    text = playbook(SLOW_STEPS, workload={"mark": str(mark)})
    execution_id = await submit(runtime.nc, runtime.topology, request_for(text, "slow.yaml"))
    await _wait_for(runtime, execution_id, E.TASK_STARTED)
    _, error = await _request(runtime, "pause", {"execution_id": execution_id})
    assert error is None
    await _wait_for(runtime, execution_id, E.STEP_DONE)  # the running step finishes ...
    await asyncio.sleep(0.5)
    assert mark.read_text().split() == ["one", "two"]  # ... but `after` is not scheduled
    _, error = await _request(runtime, "resume", {"execution_id": execution_id})
    assert error is None
    summary = await follow(runtime.nc, runtime.topology, execution_id, timeout=15)
    assert summary.status == "success"
    assert mark.read_text().split() == ["one", "two", "after"]
    names = [
        ev.name
        for _, ev in [x async for x in read_events(runtime.nc.jetstream(), runtime.topology, execution_id)]
    ]
    assert names.index(E.WORKFLOW_PAUSED) < names.index(E.WORKFLOW_RESUMED)


async def test_an_execution_past_its_deadline_fails(runtime: Runtime, tmp_path: Path) -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: python
            code: |
              import time
              time.sleep(2)
        """
    ).replace("workflow:", "executor: {spec: {deadline_s: 0.5}}\nworkflow:")
    execution_id = await submit(runtime.nc, runtime.topology, request_for(text, "deadline.yaml"))
    summary = await follow(runtime.nc, runtime.topology, execution_id, timeout=15)
    assert summary.status == "failed"
    assert summary.error is not None and summary.error["kind"] == "deadline_exceeded"


async def test_a_step_that_exceeds_its_lifecycle_timeout_fails_with_kind_timeout(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          spec: {policy: {lifecycle: {timeout_s: 0.3}}}
          tool:
            kind: noop
          next:
            arcs: [{step: slow}]
        - step: slow
          spec: {policy: {lifecycle: {timeout_s: 0.3}}}
          tool:
            - name: wait
              kind: python
              code: |
                import time
                time.sleep(0.1)
            - name: again
              kind: python
              code: |
                import time
                time.sleep(0.5)
        """
    )
    execution_id = await submit(runtime.nc, runtime.topology, request_for(text, "timeout.yaml"))
    summary = await follow(runtime.nc, runtime.topology, execution_id, timeout=15)
    assert summary.status == "failed"
    assert summary.error is not None and summary.error["kind"] == "timeout"
    assert summary.error["step"] == "slow"
    assert summary.steps["start"].status == "done"


async def test_cancelling_a_parent_cancels_its_running_child(runtime: Runtime, tmp_path: Path) -> None:
    child = tmp_path / "child.yaml"
    child.write_text(
        playbook(
            """
            - step: start
              tool:
                - name: nap
                  kind: python
                  code: |
                    import time
                    time.sleep(0.5)
                - name: more
                  kind: python
                  code: |
                    import time
                    time.sleep(0.5)
            """,
            name="child",
        )
    )
    parent = tmp_path / "parent.yaml"
    parent.write_text(
        playbook(
            """
            - step: start
              tool:
                kind: playbook
                path: child.yaml
                return_step: start
            """,
            name="parent",
        )
    )
    execution_id = await submit(runtime.nc, runtime.topology, request_for(parent.read_text(), str(parent)))
    started = await _wait_for(runtime, execution_id, E.TASK_STARTED)
    assert started.step == "start"
    _, error = await _request(runtime, "cancel", {"execution_id": execution_id})
    assert error is None
    assert (await follow(runtime.nc, runtime.topology, execution_id, timeout=15)).status == "cancelled"
    requested = [ev async for _, ev in _child_requests(runtime, execution_id)]
    assert len(requested) == 1
    child_summary = await follow(runtime.nc, runtime.topology, requested[0].execution_id, timeout=15)
    assert child_summary.status == "cancelled"
    # (cancelled by the waiting worker or the controller holding the child, whichever is first)
    assert child_summary.error is not None
    assert child_summary.error["message"].startswith(f"parent execution {execution_id} ended")
    assert "(cancelled)" in child_summary.error["message"]
    # Both may write it; the child's history records one (the same event id, whoever writes it).
    names = [
        ev.name
        async for _, ev in read_events(runtime.nc.jetstream(), runtime.topology, requested[0].execution_id)
    ]
    assert names.count(E.EXECUTION_CANCEL_REQUESTED) == 1, names


async def _child_requests(rt: Runtime, parent_id: str):  # type: ignore[no-untyped-def]
    """``playbook.execution.requested`` events whose request names ``parent_id`` as parent."""
    from noetl_stream.protocol.wire import decode_event

    sub = await rt.nc.jetstream().subscribe(
        rt.topology.stored_any_execution_filter(E.EXECUTION_REQUESTED),
        stream=rt.topology.events_stream,
        ordered_consumer=True,
    )
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=1)
            except TimeoutError:
                return
            ev = decode_event(msg.data)
            if (ev.payload.get("request") or {}).get("parent_execution_id") == parent_id:
                yield 0, ev
    finally:
        await sub.unsubscribe()


async def test_a_command_queued_while_no_worker_ran_is_not_run_once_its_execution_was_cancelled(
    nats_server: EmbeddedNats, topology: Topology, tmp_path: Path
) -> None:
    """No worker of the pool is up (scaled to zero, all restarting) when the execution is cancelled, so
    none hears of it. The worker that starts later must not run the queued step: it looks up the end of
    the execution of a command issued before it listened, and stops it before its first task."""
    mark = tmp_path / "mark.txt"
    text = playbook(SLOW_STEPS, workload={"mark": str(mark)})
    async with local_runtime(nats_server.url, topology=topology, workers=0) as rt:
        eid = await submit(rt.nc, topology, request_for(text, "slow.yaml"))
        await _wait_for(rt, eid, E.STEP_SCHEDULED)
        reply, error = await _request(rt, "cancel", {"execution_id": eid, "reason": "do not charge"})
        assert error is None, reply
        assert (await follow(rt.nc, topology, eid, timeout=15)).status == "cancelled"
        async with Worker(rt.nc, topology, name="late") as late:
            failed = await _wait_for(rt, eid, E.STEP_FAILED)
            assert late.ended[eid] == "the execution ended (cancelled) before this step started"
    assert failed.worker == "late" and failed.payload["error"]["kind"] == "cancelled", failed.payload
    assert "before this step started" in failed.payload["error"]["message"]
    assert not mark.exists()  # nothing of the step ran


BACKLOG = """
- step: start
  loop:
    in: "{{ range(6) | list }}"
    iterator: i
    spec: {mode: parallel, max_in_flight: 6, policy: {exec: distributed}}
  tool: {kind: noop}
"""


async def test_a_backlog_of_one_execution_is_looked_up_once_not_once_per_command(
    nats_server: EmbeddedNats, topology: Topology
) -> None:
    """Six iteration commands of one running execution wait for a worker; the worker that starts looks
    up whether the execution ended once: found running, its later end reaches the worker's
    subscription (every command looked it up: a request each, for the first seconds after any start)."""
    text = playbook(BACKLOG)
    async with local_runtime(nats_server.url, topology=topology, workers=0) as rt:
        eid = await submit(rt.nc, topology, request_for(text, "backlog.yaml"))
        await _wait_for(rt, eid, E.LOOP_STARTED)
        lookups: list[bytes] = []

        async def seen(msg: Msg) -> None:
            if eid.encode() in msg.data:
                lookups.append(msg.data)

        sub = await rt.nc.subscribe(f"$JS.API.STREAM.MSG.GET.{topology.events_stream}", cb=seen)
        try:
            async with Worker(rt.nc, topology, name="late"):
                summary = await follow(rt.nc, topology, eid, timeout=15)
        finally:
            await sub.unsubscribe()
    assert summary.status == "success", summary.error
    assert len(lookups) == 1, lookups


SLOW_LOOP = """
- step: start
  loop: {in: "{{ range(6) | list }}", iterator: i}
  tool:
    kind: python
    args: {i: "{{ iter.i }}", mark: "{{ workload.mark }}"}
    code: |
      import time
      time.sleep(0.3)
      open(mark, "a").write(f"{i}\\n")
      result = i
"""


async def test_a_worker_shutting_down_mid_loop_hands_the_rest_of_the_loop_back(
    nats_server: EmbeddedNats, topology: Topology, tmp_path: Path
) -> None:
    """It finishes the iteration it runs and starts no other (a grace spent on new iterations is work
    thrown away, or run twice, at its end); the command goes back to the pool and the next worker runs
    only the iterations not recorded as done: each ran once, the loop's result is whole."""
    mark = tmp_path / "mark.txt"
    text = playbook(SLOW_LOOP, workload={"mark": str(mark)})
    async with local_runtime(nats_server.url, topology=topology) as rt:
        eid = await submit(rt.nc, topology, request_for(text, "loop.yaml"))
        await _wait_for(rt, eid, E.LOOP_ITERATION_DONE)
        (first,) = rt.workers
        await first.shutdown(grace_s=10)
        rt.workers.clear()
        ran_first = mark.read_text().split()
        async with Worker(rt.nc, topology, name="next"):
            summary = await follow(rt.nc, topology, eid, timeout=30)
        started = [
            ev.worker
            async for _, ev in read_events(
                rt.nc.jetstream(), topology, eid, names=(E.LOOP_ITERATION_STARTED,)
            )
        ]
    assert summary.status == "success" and summary.result == list(range(6)), summary
    assert 1 <= len(ran_first) < 6, ran_first  # the first worker stopped early, not at the loop's end
    assert sorted(mark.read_text().split()) == [str(i) for i in range(6)]  # each iteration ran once
    assert started == ["local-0"] * len(ran_first) + ["next"] * (6 - len(ran_first))
