"""Reference-first results: large values go to the object store; no message exceeds the server limit."""

from __future__ import annotations

from helpers import playbook

from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import follow
from noetl_stream.kv.history import read_events
from noetl_stream.kv.results import ResultStore
from noetl_stream.protocol import events as E
from noetl_stream.protocol.refs import is_ref
from noetl_stream.runtime.local import Runtime

BIG = """
- step: start
  tool:
    kind: python
    code: |
      result = "x" * (20 * 1024 * 1024)
  next:
    arcs: [{step: measure}]
- step: measure
  tool:
    kind: python
    args: {big: "{{ start }}"}
    code: |
      result = {"length": len(big), "head": big[:3]}
"""


async def test_a_20_mb_result_travels_by_reference_and_later_steps_read_the_value(runtime: Runtime) -> None:
    execution_id = await submit(runtime.nc, runtime.topology, request_for(playbook(BIG), "big.yaml"))
    summary = await follow(runtime.nc, runtime.topology, execution_id, timeout=60)
    assert summary.status == "success", summary.error
    assert summary.result == {"length": 20 * 1024 * 1024, "head": "xxx"}
    done = [
        ev
        async for _, ev in read_events(
            runtime.nc.jetstream(), runtime.topology, execution_id, names=(E.STEP_DONE,)
        )
        if ev.step == "start"
    ]
    ref = done[0].payload["result"]
    assert is_ref(ref)
    info = ref["$ref"]
    assert info["size"] == 20 * 1024 * 1024 + 2 and info["checksum"].startswith("sha256:")
    assert info["key"].startswith(f"{execution_id}/")
    value = await ResultStore(runtime.nc.jetstream(), runtime.topology).get(ref)
    assert len(value) == 20 * 1024 * 1024


async def test_a_large_loop_result_list_is_stored_by_reference(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          loop:
            in: "{{ range(3000) | list }}"
            iterator: i
            spec: {mode: parallel, max_in_flight: 50}
          tool:
            kind: noop
            result: "{{ 'item-%05d-' | format(iter.i) ~ ('y' * 100) }}"
          next:
            arcs: [{step: count}]
        - step: count
          tool:
            kind: python
            args: {items: "{{ start }}"}
            code: |
              result = len(items)
        """
    )
    execution_id = await submit(runtime.nc, runtime.topology, request_for(text, "loop.yaml"))
    summary = await follow(runtime.nc, runtime.topology, execution_id, timeout=60)
    assert summary.status == "success", summary.error
    assert summary.result == 3000
