"""Record the golden replay logs: run each case on the local runtime (a controller and one worker on an
embedded nats-server of its own) and write, per execution, every stored event in stream order
(``<name>.jsonl``: one ``{"seq": ..., "event": ...}`` a line, carried events taken out before their
carrier with its sequence, as `read_events` gives them) and the controller's final snapshot
(``<name>.state.json``: the state it folded the execution to, without ``fence``, which records who wrote
the snapshot).

    .venv/bin/python tests/replays/record.py            # every case
    .venv/bin/python tests/replays/record.py cancel     # the named ones

Re-recording replaces what tests/control/test_replay_golden.py holds a reducer to: see README.md.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import follow
from noetl_stream.control.core.state import ExecutionState
from noetl_stream.kv.history import read_events
from noetl_stream.kv.snapshots import SnapshotStore
from noetl_stream.protocol import events as E
from noetl_stream.runtime.local import Runtime, local_runtime

HERE = Path(__file__).resolve().parent
PLAYBOOKS = HERE.parent.parent / "playbooks"

Action = Callable[[Runtime, str], Awaitable[None]]


def book(workflow: str, name: str) -> str:
    return (
        "apiVersion: noetl.io/v2\nkind: Playbook\n"
        f"metadata: {{name: {name}, path: replays/{name}}}\nworkflow:\n{workflow}"
    )


CYCLE = book(
    """\
  - step: start
    tool: {kind: noop}
    next: {arcs: [{step: count}]}
  - step: count
    tool:
      kind: noop
      result: "{{ (ctx.n | default(0)) + 1 }}"
      spec:
        policy:
          rules:
            - else: {then: {do: continue, set_ctx: {n: "{{ outcome.result }}"}}}
    next:
      arcs:
        - {step: count, when: "{{ event.name == 'step.done' and ctx.n < 3 }}"}
        - {step: end, when: "{{ event.name == 'step.done' and ctx.n >= 3 }}"}
  - step: end
    tool: {kind: noop, result: "{{ ctx.n }}"}
""",
    "cycle",
)

SLOW = book(
    """\
  - step: start
    tool:
      kind: python
      code: |
        import time
        time.sleep(1.0)
        result = "slept"
    next: {arcs: [{step: after, when: "{{ event.name == 'step.done' }}"}]}
  - step: after
    tool: {kind: noop, result: after}
""",
    "slow",
)


async def _started(rt: Runtime, eid: str, step: str) -> None:
    """Until a worker has started `step` of `eid`."""
    js = rt.nc.jetstream()
    async with asyncio.timeout(20):
        while True:
            async for _, ev in read_events(js, rt.topology, eid):
                if ev.name == E.STEP_STARTED and ev.step == step:
                    return
            await asyncio.sleep(0.05)


async def pause_resume(rt: Runtime, eid: str) -> None:
    await _started(rt, eid, "start")
    await rt.controller.intake.control(eid, E.EXECUTION_PAUSE_REQUESTED)
    await asyncio.sleep(1.5)  # `start` ends while paused: `after` waits for the resume
    await rt.controller.intake.control(eid, E.EXECUTION_RESUME_REQUESTED)


async def cancel(rt: Runtime, eid: str) -> None:
    await _started(rt, eid, "start")
    await rt.controller.intake.control(eid, E.EXECUTION_CANCEL_REQUESTED, "recorded cancel")


@dataclass(frozen=True)
class Case:
    text: str
    covers: str
    action: Action | None = None


CASES: dict[str, Case] = {
    "chain": Case(
        (PLAYBOOKS / "hello.yaml").read_text(), "a sequential chain of three steps, ctx set by a policy"
    ),
    "loops": Case((PLAYBOOKS / "loops.yaml").read_text(), "a local sequential loop, then a distributed loop"),
    "retry": Case((PLAYBOOKS / "retry.yaml").read_text(), "a task policy retrying a failing task"),
    "failure": Case((PLAYBOOKS / "failure.yaml").read_text(), "a failed step routed to its handler, a join"),
    "cycle": Case(CYCLE, "a cycle re-entering a step until its ctx guard stops it"),
    "pause_resume": Case(SLOW, "a pause while a step runs, then a resume", pause_resume),
    "cancel": Case(SLOW, "a cancel while a step runs", cancel),
}


async def _final_state(rt: Runtime, eid: str) -> ExecutionState:
    """The controller's snapshot once it reflects the execution's last input event."""
    js = rt.nc.jetstream()
    store = await SnapshotStore.open(js, rt.topology, ExecutionState)
    last = 0
    async for seq, _ in read_events(js, rt.topology, eid, names=E.CONTROLLER_INPUT_EVENTS):
        last = seq
    async with asyncio.timeout(20):
        while True:
            state = await store.get(eid, record=False)
            if state is not None and state.terminal and state.last_seq >= last:
                return state
            await asyncio.sleep(0.05)


async def record(rt: Runtime, name: str, case: Case) -> None:
    request = request_for(case.text, f"{name}.yaml", None)
    eid = await submit(rt.nc, rt.topology, request)
    if case.action is not None:
        await case.action(rt, eid)
    summary = await follow(rt.nc, rt.topology, eid, None, 60)
    state = await _final_state(rt, eid)
    js = rt.nc.jetstream()
    lines = [
        json.dumps({"seq": seq, "event": msgspec.to_builtins(ev)}, sort_keys=True)
        async for seq, ev in read_events(js, rt.topology, eid)
    ]
    (HERE / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    folded: dict[str, Any] = msgspec.to_builtins(state)
    folded.pop("fence", None)
    (HERE / f"{name}.state.json").write_text(json.dumps(folded, indent=1, sort_keys=True) + "\n")
    print(f"{name}: {summary.status}, {len(lines)} events ({case.covers})")


async def main(names: list[str]) -> None:
    async with local_runtime(workers=1) as rt:
        for name in names or list(CASES):
            await record(rt, name, CASES[name])


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
