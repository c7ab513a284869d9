"""``python`` task code, end to end: an ``async def main`` is awaited, its errors are the task's."""

from __future__ import annotations

import pytest
from helpers import playbook, run

from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import local_runtime


async def test_async_main_is_awaited(nats_server: EmbeddedNats, topology: Topology) -> None:
    text = playbook(
        """
        - step: start
          tool:
            - name: add
              kind: python
              args: {a: 2, b: 3}
              code: |
                import asyncio
                async def main(a, b):
                    await asyncio.sleep(0)
                    return {"sum": a + b}
            - name: boom
              kind: python
              code: |
                async def main():
                    raise LookupError("no such row")
              spec:
                policy:
                  rules:
                    - when: "{{ outcome.status == 'error' }}"
                      then: {do: continue}
            - name: out
              kind: noop
              result: {add: "{{ add }}", kind: "{{ _prev.error.kind | default('none') }}"}
        """
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "success", r.summary
    assert r.step_result("start")["add"] == {"sum": 5}
    [boom] = r.tasks("start", "boom")
    assert boom.payload["error"]["kind"] == "python_error"
    assert "no such row" in boom.payload["error"]["message"]


@pytest.mark.parametrize(
    "task",
    [
        "{kind: python, code: 'import time; time.sleep(3)', spec: {timeout: '0.3'}}",
        "{kind: script, code: 'sleep 3', spec: {timeout: '0.3'}}",
    ],
)
async def test_timeout_given_as_text_still_bounds_the_task(
    nats_server: EmbeddedNats, topology: Topology, task: str
) -> None:
    # `timeout: "0.3"` (quoted in YAML) must not read as "no limit".
    text = playbook(f"- step: start\n  tool: {task}")
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "failed"
    err = r.step_error("start")
    assert err["kind"] == "timeout" and "0.3s" in err["message"], err


@pytest.mark.parametrize("timeout", ["soon", "-1", "'-0.5'"])
@pytest.mark.parametrize("kind, code", [("python", "result = 1"), ("script", "true")])
async def test_timeout_that_is_not_a_number_is_a_config_error(
    nats_server: EmbeddedNats, topology: Topology, kind: str, code: str, timeout: str
) -> None:
    # A negative limit too (it timed the task out at once, without a word about the value).
    text = playbook(f"- step: start\n  tool: {{kind: {kind}, code: '{code}', spec: {{timeout: {timeout}}}}}")
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "failed"
    err = r.step_error("start")
    assert err["kind"] == "config_error" and "spec.timeout" in err["message"], err
