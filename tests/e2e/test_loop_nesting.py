"""Nested loops (003 §6.4) end to end: a loop iteration that runs a child playbook (``kind: playbook``)
whose steps loop again; the child's iterations read the outer one as ``iter.parent``, and deeper
``iter.parent.parent``. The parent iteration travels in the child's request, recorded with
``playbook.execution.requested``, so a replay of the child gives the same state."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import playbook, run

from noetl_stream.control.replay import verify
from noetl_stream.dataplane.children import PARENT_ITER_INLINE
from noetl_stream.kv.history import read_events
from noetl_stream.protocol import events as E
from noetl_stream.protocol.refs import is_ref
from noetl_stream.protocol.wire import Event, derived_execution_id
from noetl_stream.runtime.local import Runtime

EXECS = ["local", "distributed"]


def write(tmp_path: Path, files: dict[str, str]) -> Path:
    """Write the playbooks (``parent.yaml`` first); returns the parent's path."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path / "parent.yaml"


def child_id(parent_id: str, run_id: str, index: int, step: str = "start") -> str:
    """The id the playbook tool gives the child of iteration `index` (its single task: ``<step>_task``)."""
    return derived_execution_id(parent_id, f"{run_id}.{index}", f"{step}_task", 1)


async def events_of(rt: Runtime, execution_id: str) -> list[Event]:
    return [ev async for _, ev in read_events(rt.nc.jetstream(), rt.topology, execution_id)]


@pytest.mark.parametrize("child_exec", EXECS)
@pytest.mark.parametrize("parent_exec", EXECS)
async def test_a_child_loop_reads_the_outer_iteration_as_iter_parent(
    runtime: Runtime,
    tmp_path: Path,
    parent_exec: str,
    child_exec: str,
    eventually: Callable[..., Awaitable[None]],
) -> None:
    parent = write(
        tmp_path,
        {
            "parent.yaml": playbook(
                f"""
                - step: start
                  loop:
                    in: "{{{{ workload.cities }}}}"
                    iterator: city
                    spec: {{mode: parallel, policy: {{exec: {parent_exec}}}}}
                  tool:
                    kind: playbook
                    path: child.yaml
                    return_step: start
                    args: {{hotels: "{{{{ ['h1', 'h2'] }}}}"}}
                """,
                workload={"cities": ["A", "B"]},
                name="parent",
            ),
            "child.yaml": playbook(
                f"""
                - step: start
                  loop:
                    in: "{{{{ workload.hotels }}}}"
                    iterator: h
                    spec: {{policy: {{exec: {child_exec}}}}}
                  tool:
                    kind: noop
                    result: "{{{{ iter.parent.city }}}}/{{{{ iter.h }}}} #{{{{ iter.parent.index }}}}.{{{{ iter.index }}}}"
                """,
                workload={"hotels": []},
                name="child",
            ),
        },
    )

    r = await run(runtime, parent.read_text(), file=str(parent))

    assert r.status == "success", r.summary.error
    assert [x["data"] for x in r.result] == [["A/h1 #0.0", "A/h2 #0.1"], ["B/h1 #1.0", "B/h2 #1.1"]]
    # The outer iteration is part of the child's request: recorded, so a replay folds the same state.
    (run_id,) = {e.step_run_id for e in r.named(E.LOOP_DONE)}
    assert run_id is not None
    for index, city in enumerate(["A", "B"]):
        cid = child_id(r.summary.execution_id, run_id, index)
        (requested,) = [e for e in await events_of(runtime, cid) if e.name == E.EXECUTION_REQUESTED]
        assert requested.payload["request"]["parent_iter"] == {"city": city, "index": index}

        async def same(cid: str = cid) -> bool:
            diffs, _ = await verify(runtime.nc.jetstream(), runtime.topology, cid)
            return diffs == []

        await eventually(same)


GRANDCHILD = playbook(
    """
    - step: start
      loop:
        in: "{{ [1, 2] }}"
        iterator: n
        spec: {policy: {exec: distributed}}
      tool:
        kind: noop
        result: "{{ iter.parent.parent.region }}/{{ iter.parent.city }}/{{ iter.n }}"
    """,
    name="grandchild",
)


async def test_iter_parent_parent_reaches_a_grandchild_and_steps_without_a_loop_see_iter_parent(
    runtime: Runtime, tmp_path: Path
) -> None:
    parent = write(
        tmp_path,
        {
            "parent.yaml": playbook(
                """
                - step: start
                  loop: {in: "{{ ['north', 'south'] }}", iterator: region}
                  tool: {kind: playbook, path: child.yaml, return_step: cities}
                """,
                name="parent",
            ),
            # `start` has no loop: its iter.parent is still the outer iteration, and the children of
            # its loop step `cities` nest in that same outer iteration (iter.parent.parent).
            "child.yaml": playbook(
                """
                - step: start
                  tool:
                    kind: python
                    args: {region: "{{ iter.parent.region }}", deeper: "{{ iter.parent.parent is defined }}"}
                    code: "result = region if not deeper else 'wrong'"
                  next:
                    arcs: [{step: cities}]
                - step: cities
                  loop:
                    in: "{{ [start ~ '-a', start ~ '-b'] }}"
                    iterator: city
                  tool: {kind: playbook, path: grandchild.yaml, return_step: start}
                """,
                name="child",
            ),
            "grandchild.yaml": GRANDCHILD,
        },
    )

    r = await run(runtime, parent.read_text(), file=str(parent))

    assert r.status == "success", r.summary.error
    assert [[kid["data"] for kid in x["data"]] for x in r.result] == [
        [["north/north-a/1", "north/north-a/2"], ["north/north-b/1", "north/north-b/2"]],
        [["south/south-a/1", "south/south-a/2"], ["south/south-b/1", "south/south-b/2"]],
    ]


async def test_without_an_outer_iteration_iter_has_no_parent(runtime: Runtime, tmp_path: Path) -> None:
    parent = write(
        tmp_path,
        {
            "parent.yaml": playbook(
                """
                - step: start
                  tool: {kind: playbook, path: child.yaml, return_step: start}
                """,
                name="parent",
            ),
            "child.yaml": playbook(
                """
                - step: start
                  loop: {in: "{{ [1] }}", iterator: n}
                  tool: {kind: noop, result: "{{ iter.parent is defined }}"}
                """,
                name="child",
            ),
        },
    )

    r = await run(runtime, parent.read_text(), file=str(parent))

    assert r.status == "success", r.summary.error
    assert r.result["data"] == [False]


async def test_a_large_outer_iteration_travels_by_reference(runtime: Runtime, tmp_path: Path) -> None:
    big = "x" * (PARENT_ITER_INLINE + 1000)
    parent = write(
        tmp_path,
        {
            "parent.yaml": playbook(
                """
                - step: start
                  loop: {in: "{{ workload.records }}", iterator: record}
                  tool: {kind: playbook, path: child.yaml, return_step: start}
                """,
                workload={"records": [{"id": 7, "blob": big}]},
                name="parent",
            ),
            "child.yaml": playbook(
                """
                - step: start
                  loop: {in: "{{ [1, 2] }}", iterator: n, spec: {policy: {exec: distributed}}}
                  tool:
                    kind: noop
                    result: {id: "{{ iter.parent.record.id }}", size: "{{ iter.parent.record.blob | length }}"}
                """,
                name="child",
            ),
        },
    )

    r = await run(runtime, parent.read_text(), file=str(parent))

    assert r.status == "success", r.summary.error
    assert [x["data"] for x in r.result] == [[{"id": 7, "size": len(big)}] * 2]
    (done,) = r.named(E.LOOP_DONE)
    assert done.step_run_id is not None
    cid = child_id(r.summary.execution_id, done.step_run_id, 0)
    (requested,) = [e for e in await events_of(runtime, cid) if e.name == E.EXECUTION_REQUESTED]
    recorded: Any = requested.payload["request"]["parent_iter"]
    assert is_ref(recorded) and recorded["$ref"]["size"] > PARENT_ITER_INLINE  # not the value itself


async def test_a_workbook_task_sees_the_callers_iter_including_its_parent(
    runtime: Runtime, tmp_path: Path
) -> None:
    parent = write(
        tmp_path,
        {
            "parent.yaml": playbook(
                """
                - step: start
                  loop: {in: "{{ ['A', 'B'] }}", iterator: city}
                  tool: {kind: playbook, path: child.yaml, return_step: start}
                """,
                name="parent",
            ),
            # A workbook template is not a nesting level: it runs in the calling iteration, as it is.
            "child.yaml": """apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: child, path: tests/child}
workbook:
  - name: label
    tool: {kind: noop, result: "{{ iter.parent.city }}-{{ iter.h }}-{{ args.n }}"}
workflow:
  - step: start
    loop: {in: "{{ ['x', 'y'] }}", iterator: h}
    tool: {kind: workbook, task: label, args: {n: "{{ iter.index }}"}}
""",
        },
    )

    r = await run(runtime, parent.read_text(), file=str(parent))

    assert r.status == "success", r.summary.error
    assert [x["data"] for x in r.result] == [["A-x-0", "A-y-1"], ["B-x-0", "B-y-1"]]


@pytest.mark.parametrize("parent_exec", EXECS)
async def test_set_iter_values_of_the_outer_iteration_reach_the_child(
    runtime: Runtime, tmp_path: Path, parent_exec: str
) -> None:
    """What an earlier task of the iteration wrote with ``set_iter`` is part of the child's
    ``iter.parent``, as it is of the iteration's own ``iter``."""
    parent = write(
        tmp_path,
        {
            "parent.yaml": playbook(
                f"""
                - step: start
                  loop:
                    in: "{{{{ workload.cities }}}}"
                    iterator: city
                    spec: {{mode: parallel, policy: {{exec: {parent_exec}}}}}
                  tool:
                    - name: tag
                      kind: noop
                      spec:
                        policy:
                          rules:
                            - else: {{then: {{do: continue, set_iter: {{tag: "T-{{{{ iter.city }}}}"}}}}}}
                    - name: child
                      kind: playbook
                      path: child.yaml
                      return_step: start
                """,
                workload={"cities": ["A", "B"]},
                name="parent",
            ),
            "child.yaml": playbook(
                """
                - step: start
                  tool:
                    kind: noop
                    result: "{{ iter.parent.tag }}:{{ iter.parent.city }}"
                """,
                name="child",
            ),
        },
    )

    r = await run(runtime, parent.read_text(), file=str(parent))

    assert r.status == "success", r.summary.error
    assert [x["data"] for x in r.result] == ["T-A:A", "T-B:B"]
