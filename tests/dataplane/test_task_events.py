"""The worker's task events: ``all`` (the default, every task run) and ``informative`` (none for a step
whose one task succeeded at once with nothing to add), end to end on a real nats-server."""

from __future__ import annotations

import asyncio
import datetime
import json
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner
from helpers import Run, playbook, run

from noetl_stream.cli import main
from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import follow
from noetl_stream.control.replay import verify
from noetl_stream.dataplane.worker import Worker
from noetl_stream.kv.history import read_events
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event
from noetl_stream.runtime.local import Runtime

TASK = (E.TASK_STARTED, E.TASK_DONE)


def worker_events(r: Run, step: str) -> list[tuple[str, str | None, int | None]]:
    """(name, task, attempt) of the worker events of `step`, in stream order."""
    return [
        (e.name, e.payload.get("task"), e.payload.get("attempt"))
        for e in r.events
        if e.step == step and e.source == "worker"
    ]


CHAIN = """
    - step: start
      tool: {kind: noop, result: 1}
      next: {arcs: [{step: second}]}
    - step: second
      tool: {kind: noop, result: "{{ start + 1 }}"}
"""


async def test_informative_writes_no_task_events_for_single_task_steps(informative: Runtime) -> None:
    r = await run(informative, playbook(CHAIN))

    assert r.status == "success", r.summary.error
    assert r.result == 2
    for step in ("start", "second"):
        assert worker_events(r, step) == [(E.STEP_STARTED, None, None), (E.STEP_DONE, None, None)]
    assert not r.named(*TASK)
    diffs, _ = await verify(informative.nc.jetstream(), informative.topology, r.summary.execution_id)
    assert diffs == []


async def test_all_is_the_default_and_writes_every_task_run(runtime: Runtime) -> None:
    r = await run(runtime, playbook(CHAIN))

    assert r.status == "success", r.summary.error
    assert worker_events(r, "start") == [
        (E.STEP_STARTED, None, None),
        (E.TASK_STARTED, "start_task", 1),
        (E.TASK_DONE, "start_task", 1),
        (E.STEP_DONE, None, None),
    ]
    assert all(w.task_events == "all" for w in runtime.workers)


async def test_informative_writes_every_task_run_of_a_pipeline_in_order(informative: Runtime) -> None:
    r = await run(
        informative,
        playbook(
            """
            - step: start
              tool:
                - name: first
                  kind: noop
                  result: 1
                - name: second
                  kind: noop
                  result: "{{ _prev + 1 }}"
            """
        ),
    )

    assert r.status == "success", r.summary.error
    assert r.result == 2
    assert worker_events(r, "start") == [
        (E.STEP_STARTED, None, None),
        (E.TASK_STARTED, "first", 1),
        (E.TASK_DONE, "first", 1),
        (E.TASK_STARTED, "second", 1),
        (E.TASK_DONE, "second", 1),
        (E.STEP_DONE, None, None),
    ]


async def test_informative_keeps_the_task_events_of_a_retried_task(informative: Runtime) -> None:
    r = await run(
        informative,
        playbook(
            """
            - step: start
              tool:
                kind: python
                args: {attempt: "{{ _attempt }}"}
                code: |
                  if attempt < 2:
                      raise ConnectionError("not yet")
                  result = attempt
                spec:
                  policy:
                    rules:
                      - when: "{{ outcome.status == 'error' }}"
                        then: {do: retry, attempts: 3}
            """
        ),
    )

    assert r.status == "success", r.summary.error
    assert r.result == 2
    names = [(name, attempt) for name, _, attempt in worker_events(r, "start")]
    assert names == [
        (E.STEP_STARTED, None),
        (E.TASK_STARTED, 1),
        (E.TASK_DONE, 1),
        (E.TASK_STARTED, 2),
        (E.TASK_DONE, 2),
        (E.STEP_DONE, None),
    ]
    assert [e.payload["do"] for e in r.tasks("start")] == ["retry", "continue"]


@pytest.mark.parametrize(
    ("code", "why"),
    [
        ('print("hello")\nresult = 1', "captured output"),
        ('raise ValueError("no")', "a failure"),
    ],
)
async def test_informative_keeps_a_single_task_run_that_has_something_to_say(
    informative: Runtime, code: str, why: str
) -> None:
    text = playbook(
        f"""
        - step: start
          tool:
            kind: python
            code: {json.dumps(code)}
        """
    )
    r = await run(informative, text)

    assert [name for name, _, _ in worker_events(r, "start")][:3] == [
        E.STEP_STARTED,
        E.TASK_STARTED,
        E.TASK_DONE,
    ], why
    (done,) = r.tasks("start")
    if why == "captured output":
        assert r.status == "success", r.summary.error
        assert done.payload["output"]["stdout"] == "hello\n"
        assert r.named(E.STEP_DONE, step="start")
    else:
        assert r.status == "failed"
        assert done.payload["status"] == "error"
        assert r.step_error("start")["kind"] == "python_error"


async def test_informative_keeps_a_task_whose_rule_fired(informative: Runtime) -> None:
    r = await run(
        informative,
        playbook(
            """
            - step: start
              tool:
                kind: noop
                result: 3
                spec:
                  policy:
                    rules:
                      - when: "{{ outcome.status == 'ok' }}"
                        then: {do: break, set_iter: {seen: true}}
            """
        ),
    )

    assert r.status == "success", r.summary.error
    (done,) = r.tasks("start")
    assert done.payload["do"] == "break" and done.payload["rule"] is not None


@pytest.mark.parametrize("exec_", ["local", "distributed"])
async def test_informative_loop_iterations_of_one_task_write_no_task_events(
    informative: Runtime, exec_: str
) -> None:
    r = await run(
        informative,
        playbook(
            f"""
            - step: start
              loop:
                in: "{{{{ workload['items'] }}}}"
                iterator: x
                spec: {{mode: parallel, max_in_flight: 4, policy: {{exec: {exec_}}}}}
              tool: {{kind: noop, result: "{{{{ iter.x * 10 }}}}"}}
            """,
            workload={"items": [1, 2, 3, 4, 5]},
        ),
    )

    assert r.status == "success", r.summary.error
    assert r.result == [10, 20, 30, 40, 50]
    assert len(r.named(E.LOOP_ITERATION_DONE)) == 5
    assert len(r.named(E.LOOP_STARTED)) == 1  # a loop event, never held back
    assert not r.named(*TASK)


def test_worker_refuses_an_unknown_task_events_setting() -> None:
    with pytest.raises(ValueError, match="task_events: 'some'"):
        Worker(None, Topology(), task_events="some")  # type: ignore[arg-type]


def test_worker_cli_refuses_an_unknown_task_events_setting() -> None:
    result = CliRunner().invoke(main, ["worker", "--task-events", "some"])
    assert result.exit_code == 2 and "--task-events" in result.output  # a usage error naming the option


def stamp(e: Event) -> datetime.datetime:
    return datetime.datetime.fromisoformat(e.timestamp.replace("Z", "+00:00"))


async def test_informative_held_events_keep_the_time_they_happened(informative: Runtime) -> None:
    r = await run(
        informative,
        playbook(
            """
            - step: start
              tool:
                - name: slow
                  kind: python
                  code: |
                    import time
                    time.sleep(0.3)
                - name: after
                  kind: noop
            """
        ),
    )

    assert r.status == "success", r.summary.error
    (started,) = r.tasks("start", "slow", name=E.TASK_STARTED)
    (done,) = r.tasks("start", "slow")
    (after,) = r.tasks("start", "after", name=E.TASK_STARTED)
    assert (stamp(done) - stamp(started)).total_seconds() >= 0.25  # not both stamped when written
    assert stamp(done) <= stamp(after)


async def test_informative_writes_the_task_a_timeout_cut_short(informative: Runtime) -> None:
    r = await run(
        informative,
        playbook(
            """
            - step: start
              spec: {policy: {lifecycle: {timeout_s: 0.3}}}
              tool:
                kind: python
                code: |
                  import time
                  time.sleep(1.0)
            """
        ),
    )

    assert r.status == "failed"
    assert r.step_error("start")["kind"] == "timeout"
    assert [name for name, _, _ in worker_events(r, "start")] == [
        E.STEP_STARTED,
        E.TASK_STARTED,
        E.STEP_FAILED,
    ]


async def test_informative_writes_a_plain_task_whose_pipeline_failed_after_it(
    informative: Runtime, tmp_path: Path
) -> None:
    """The one task that ran succeeded plainly, but the step failed (cancelled before its next task):
    its events are written, since step.failed does not carry its result."""
    mark = tmp_path / "mark"
    text = playbook(
        """
        - step: start
          tool:
            - name: one
              kind: python
              args: {mark: "{{ workload.mark }}"}
              code: |
                import time
                open(mark, "w").write("one")
                time.sleep(0.6)
            - name: two
              kind: noop
        """,
        workload={"mark": str(mark)},
    )
    eid = await submit(informative.nc, informative.topology, request_for(text, "t.yaml"))
    async with asyncio.timeout(15):
        while not mark.exists():
            await asyncio.sleep(0.02)
    msg = await informative.nc.request(
        informative.topology.api_subject("cancel"), msgspec.json.encode({"execution_id": eid}), timeout=10
    )
    assert not (msg.headers or {}).get("Nats-Service-Error"), msg.data
    summary = await follow(informative.nc, informative.topology, eid, timeout=15)
    assert summary.status == "cancelled"

    async def worker_names() -> list[str]:
        return [
            ev.name
            async for _, ev in read_events(informative.nc.jetstream(), informative.topology, eid)
            if ev.source == "worker"
        ]

    async with asyncio.timeout(15):  # the worker's events come after the cancellation
        while E.STEP_FAILED not in (names := await worker_names()):
            await asyncio.sleep(0.05)
    assert names == [E.STEP_STARTED, E.TASK_STARTED, E.TASK_DONE, E.STEP_FAILED]
