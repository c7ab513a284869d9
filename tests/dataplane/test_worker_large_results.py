"""A task result above the inline limit: ``task.done`` carries its reference (001 §15.2, "includes outcome
or references"), stored once when it is also its step's result; end to end on a real nats-server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from helpers import Run, playbook, run

from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.results import ResultStore
from noetl_stream.protocol import events as E
from noetl_stream.protocol.refs import REF, is_ref
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import Runtime, local_runtime

BLOB = 300_000  # above the default inline limit (256 KiB)

BIG = f"""
name: big
kind: python
code: "result = {{'blob': 'x' * {BLOB}}}"
"""

SMALL = """
name: small
kind: noop
result: {n: 1}
"""


def pipeline(*tasks: str) -> str:
    items = "\n".join("    - " + task.strip().replace("\n", "\n      ") for task in tasks)
    return playbook(f"- step: start\n  tool:\n{items}\n")


@pytest.fixture
async def informative(nats_server: EmbeddedNats, topology: Topology) -> AsyncIterator[Runtime]:
    async with local_runtime(nats_server.url, topology=topology, task_events="informative") as rt:
        yield rt


def task_result(r: Run, task: str) -> Any:
    (done,) = r.tasks("start", task)
    return done.payload["result"]


async def stored_keys(rt: Runtime, execution_id: str) -> list[str]:
    store = await rt.nc.jetstream().object_store(rt.topology.results_store)
    return sorted(o.name for o in await store.list() if o.name and o.name.startswith(f"{execution_id}/"))


async def test_task_done_carries_a_reference_to_a_large_result(runtime: Runtime) -> None:
    r = await run(runtime, pipeline(BIG, SMALL))

    assert r.status == "success", r.summary.error
    ref = task_result(r, "big")
    assert is_ref(ref), ref
    (done,) = r.tasks("start", "big")
    assert ref[REF]["key"] == f"{done.execution_id}/{done.task_run_id}/result"
    value = await ResultStore(runtime.nc.jetstream(), runtime.topology).get(ref)
    assert value == {"blob": "x" * BLOB}
    assert task_result(r, "small") == {"n": 1}  # small results stay inline
    assert r.step_result("start") == {"n": 1}


async def test_a_large_result_that_is_also_the_steps_is_stored_once(runtime: Runtime) -> None:
    r = await run(runtime, pipeline(SMALL, BIG))

    assert r.status == "success", r.summary.error
    ref = task_result(r, "big")
    assert is_ref(ref), ref
    assert r.step_result("start") == ref
    execution_id = r.events[0].execution_id
    assert await stored_keys(runtime, execution_id) == [ref[REF]["key"]]


async def test_a_local_loop_iterations_large_result_is_stored_once_per_iteration(runtime: Runtime) -> None:
    text = playbook(
        f"""
        - step: start
          loop: {{in: [1, 2], iterator: i}}
          tool:
            kind: python
            args: {{i: "{{{{ iter.i }}}}"}}
            code: "result = {{'i': i, 'blob': 'x' * {BLOB}}}"
        """
    )
    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    refs = [e.payload["result"] for e in r.tasks("start")]
    iterations = [e.payload["result"] for e in r.named(E.LOOP_ITERATION_DONE, step="start")]
    assert all(is_ref(ref) for ref in refs) and sorted(map(str, iterations)) == sorted(map(str, refs))
    store = ResultStore(runtime.nc.jetstream(), runtime.topology)
    assert sorted([(await store.get(ref))["i"] for ref in refs]) == [1, 2]
    loop_ref = r.step_result("start")
    keys = {ref[REF]["key"] for ref in refs} | {loop_ref[REF]["key"]}
    assert await stored_keys(runtime, r.events[0].execution_id) == sorted(keys)


async def test_informative_task_events_carry_large_results_by_reference_too(informative: Runtime) -> None:
    two = await run(informative, pipeline(BIG, SMALL))  # a second task run: the held events are written
    assert two.status == "success", two.summary.error
    ref = task_result(two, "big")
    assert is_ref(ref), ref
    store = ResultStore(informative.nc.jetstream(), informative.topology)
    assert await store.get(ref) == {"blob": "x" * BLOB}

    one = await run(informative, pipeline(BIG))  # one plain task run: only the step's events
    assert one.status == "success", one.summary.error
    assert one.tasks("start") == []
    step_ref = one.step_result("start")
    assert is_ref(step_ref) and await store.get(step_ref) == {"blob": "x" * BLOB}
    assert await stored_keys(informative, one.events[0].execution_id) == [step_ref[REF]["key"]]
