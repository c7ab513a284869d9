"""Probe 67: a child playbook's result above the inline limit is the parent task's result itself,
never the reference to the results store it travels as."""

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
        args: {n: "{{ workload.n }}"}
        code: "result = {'rows': [{'i': i, 's': 'x' * 10} for i in range(n)]}"
    """,
    workload={"n": 1},
    name="bigchild",
)

PARENT = playbook(
    """
    - step: start
      tool:
        - name: child
          kind: playbook
          path: bigchild.yaml
          return_step: start
          args: {n: 30000}
        - name: sum
          kind: python
          args: {rows: "{{ child.rows }}"}
          code: "result = {'count': len(rows), 'last': rows[-1]}"
    """,
    name="bigparent",
)


async def test_a_large_child_result_is_the_task_result(
    nats_server: EmbeddedNats, topology: Topology, tmp_path: Path
) -> None:
    (tmp_path / "bigchild.yaml").write_text(CHILD)
    parent = tmp_path / "bigparent.yaml"
    parent.write_text(PARENT)
    async with local_runtime(nats_server.url, topology=topology) as rt:
        summary = await rt.run_playbook(PARENT, str(parent), timeout=60)
    assert summary.status == "success", summary.error
    assert summary.result == {"count": 30000, "last": {"i": 29999, "s": "x" * 10}}
