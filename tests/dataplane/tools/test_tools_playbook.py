"""`kind: playbook` (child executions) and `kind: workbook` (root templates), end to end."""

from __future__ import annotations

from pathlib import Path

from helpers import playbook

from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import local_runtime

CHILD = playbook(
    """
    - step: start
      tool:
        kind: python
        args: {base: "{{ workload.base }}"}
        code: |
          if base < 0:
              raise ValueError("negative base")
          result = base + 100
      next:
        arcs: [{step: twice, when: "{{ event.name == 'step.done' }}"}]
    - step: twice
      tool:
        kind: python
        args: {v: "{{ start }}"}
        code: "result = v * 2"
    """,
    workload={"base": 0},
    name="child",
)

PARENT = """apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: parent, path: tests/parent}
workload: {n: 4}
workbook:
  - name: double
    tool:
      kind: python
      args: {x: "{{ args.x }}"}
      code: "result = x * 2"
workflow:
  - step: start
    tool:
      - name: doubled
        kind: workbook
        task: double
        args: {x: "{{ workload.n }}"}
      - name: last
        kind: playbook
        path: children/child.yaml
        return_step: twice
        args: {base: "{{ doubled }}"}
      - name: first
        kind: playbook
        path: children/child.yaml
        return_step: start
        args: {base: "{{ doubled }}"}
      - name: both
        kind: noop
        result: {last: "{{ last.data }}", first: "{{ first.data }}"}
"""


def _files(tmp_path: Path) -> Path:
    (tmp_path / "children").mkdir()
    (tmp_path / "children" / "child.yaml").write_text(CHILD)
    parent = tmp_path / "parent.yaml"
    parent.write_text(PARENT)
    return parent


async def test_child_playbooks_and_workbook_templates_on_a_single_worker_slot(
    nats_server: EmbeddedNats, topology: Topology, tmp_path: Path
) -> None:
    parent = _files(tmp_path)
    # one worker with ONE slot: the parent task waits for its child, which needs that slot
    async with local_runtime(nats_server.url, topology=topology, workers=1, concurrency=1) as rt:
        summary = await rt.run_playbook(parent.read_text(), str(parent), timeout=30)
    assert summary.status == "success", summary.error
    assert summary.result == {"last": (8 + 100) * 2, "first": 108}


async def test_a_failing_child_is_the_task_error(
    nats_server: EmbeddedNats, topology: Topology, tmp_path: Path
) -> None:
    parent = _files(tmp_path)
    async with local_runtime(nats_server.url, topology=topology) as rt:
        summary = await rt.run_playbook(parent.read_text(), str(parent), payload={"n": -10}, timeout=30)
    assert summary.status == "failed"
    assert summary.error is not None and summary.error["kind"] == "child_failed"
    assert "children/child.yaml" in summary.error["message"] and "negative base" in summary.error["message"]


MODULE = """
import asyncio


def add(a, b):
    print("adding", a, b)
    return a + b


async def slow(seconds):
    await asyncio.sleep(seconds)
    return "late"
"""


async def test_python_module_tasks_stdout_capture_and_timeout(
    nats_server: EmbeddedNats, topology: Topology, tmp_path: Path, monkeypatch: object
) -> None:
    import sys

    (tmp_path / "mytools_for_test.py").write_text(MODULE)
    sys.path.insert(0, str(tmp_path))
    try:
        text = playbook(
            """
            - step: start
              tool:
                - name: sum
                  kind: python
                  module: mytools_for_test:add
                  args: {a: 2, b: 3, unused: 1}
                - name: shout
                  kind: python
                  args: {v: "{{ sum }}"}
                  code: |
                    import sys
                    print("value is", v)
                    print("careful", file=sys.stderr)
                    result = v
                  spec:
                    policy:
                      rules:
                        - else:
                            then: {do: continue, set_ctx: {out: "{{ outcome.meta.stdout }}"}}
                - name: too_slow
                  kind: python
                  module: mytools_for_test:slow
                  args: {seconds: 5}
                  spec:
                    timeout: 0.2
                    policy:
                      rules:
                        - when: "{{ outcome.error.kind == 'timeout' }}"
                          then: {do: break}
            """
        )
        async with local_runtime(nats_server.url, topology=topology) as rt:
            summary = await rt.run_playbook(text, "py.yaml", timeout=30)
    finally:
        sys.path.remove(str(tmp_path))
    assert summary.status == "success", summary.error
    assert summary.ctx == {"out": "value is 5\n"}


async def test_step_input_is_rendered_before_the_tasks_and_merged_over_args(
    nats_server: EmbeddedNats, topology: Topology
) -> None:
    text = playbook(
        """
        - step: start
          next: {arcs: [{step: work, args: {base: 1}}]}
        - step: work
          input:
            doubled: "{{ workload.n * 2 }}"
          tool:
            kind: python
            args: {x: "{{ input.doubled }}", y: "{{ args.doubled }}", b: "{{ args.base }}"}
            code: "result = x + y + b"
        """,
        workload={"n": 5},
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        summary = await rt.run_playbook(text, "input.yaml", timeout=20)
    assert summary.status == "success", summary.error
    assert summary.result == 21


async def test_a_child_playbook_from_the_catalog(nats_server: EmbeddedNats, topology: Topology) -> None:
    from noetl_stream.kv.catalog import Catalog

    child = CHILD.replace("path: tests/child", "path: lib/child")
    parent = playbook(
        """
        - step: start
          tool:
            kind: playbook
            path: lib/child
            return_step: twice
            args: {base: 1}
        """,
        name="cat_parent",
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        await Catalog(rt.nc.jetstream(), topology).register(child, "child.yaml")
        ok = await rt.run_playbook(parent, "parent.yaml", timeout=30)
        missing = await rt.run_playbook(parent.replace("lib/child", "lib/nope"), "parent.yaml", timeout=30)
    assert ok.status == "success", ok.error
    assert ok.result["data"] == 202
    assert missing.status == "failed" and missing.error is not None
    assert missing.error["kind"] == "child_failed" and "lib/nope" in missing.error["message"]
