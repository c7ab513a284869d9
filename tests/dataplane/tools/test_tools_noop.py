"""``noop``, end to end: its ``result:`` is rendered at any depth and is the task's result; without one
it hands on the previous task's result."""

from __future__ import annotations

from helpers import playbook, run

from noetl_stream.runtime.local import Runtime


async def test_noop_returns_its_rendered_result(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            - name: first
              kind: python
              code: "result = {'rows': [1, 2, 3]}"
            - name: summary
              kind: noop
              result:
                city: "{{ workload.city }}"
                count: "{{ first.rows | length }}"
                nested: {items: ["{{ workload.city | upper }}", plain, 7]}
        """,
        workload={"city": "Oslo"},
    )
    r = await run(runtime, text)
    assert r.status == "success", r.summary.error
    assert r.result == {"city": "Oslo", "count": 3, "nested": {"items": ["OSLO", "plain", 7]}}


async def test_noop_without_a_result_hands_on_the_previous_one(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            - {name: first, kind: noop, result: {n: 1}}
            - {name: second, kind: noop}
        """
    )
    r = await run(runtime, text)
    assert r.status == "success", r.summary.error
    assert r.result == {"n": 1}
