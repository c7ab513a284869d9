"""What a loop's ``in`` may read is the same whether the loop runs on the worker (``exec: local``) or is
dispatched by the controller (``exec: distributed``): not ``event``, which only routing and admission
see. A distributed loop's ``in`` read the scheduling event and a local one's failed on it, while
`validate` said nothing about either."""

from __future__ import annotations

import pytest
from helpers import playbook, run

from noetl_stream.dsl import compile_playbook
from noetl_stream.runtime.local import Runtime

READS_EVENT = """
    - step: start
      tool: {kind: python, code: "result = [1, 2, 3]"}
      next: {arcs: [{step: L, args: {xs: "{{ event.result }}"}}]}
    - step: L
      loop:
        in: "{{ IN }}"
        iterator: x
        spec: {policy: {exec: EXEC}}
      tool:
        - name: t
          kind: python
          args: {x: "{{ iter.x }}"}
          code: "result = x * 2"
    """


def text(exec_: str, items: str) -> str:
    return playbook(READS_EVENT.replace("EXEC", exec_).replace("IN", items))


@pytest.mark.parametrize("exec_", ["local", "distributed"])
def test_validate_warns_that_a_loops_items_cannot_read_the_event(exec_: str) -> None:
    result = compile_playbook(text(exec_, "event.result"), "t.yaml")
    (warning,) = [d for d in result.diagnostics if d.code == "out-of-scope"]
    assert "a loop's items cannot read 'event'" in warning.message
    assert warning.path is not None and warning.path.endswith("loop.in")


@pytest.mark.parametrize("exec_", ["local", "distributed"])
async def test_a_loops_items_read_the_same_scope_in_either_exec(runtime: Runtime, exec_: str) -> None:
    failed = await run(runtime, text(exec_, "event.result"))
    assert failed.status == "failed"
    assert failed.summary.error is not None
    assert "loop.in: 'event' is undefined" in failed.summary.error["message"]
    passed = await run(runtime, text(exec_, "args.xs"))  # what the arc passes is the way
    assert passed.status == "success", passed.summary.error
    assert passed.result == [2, 4, 6]
