"""Playbooks the viewer tests run: a loop, a retried task and a failure routed to a handler; a gate."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from apiserver import Api
from helpers import playbook


def pipeline_book(exec_: str = "local") -> str:
    """start -> each (a best-effort loop over workload.items, one of which fails) -> flaky (a task
    retried once) -> boom (fails) -> handle (its failure arc); ``never`` is the arc not taken."""
    return playbook(
        f"""
        - step: start
          next: {{arcs: [{{step: each}}]}}
        - step: each
          spec: {{policy: {{failure: {{mode: best_effort}}}}}}
          loop:
            in: "{{{{ workload['items'] }}}}"
            iterator: x
            spec: {{mode: parallel, max_in_flight: 2, policy: {{exec: {exec_}}}}}
          tool:
            - name: divide
              kind: python
              args: {{x: "{{{{ iter.x }}}}"}}
              code: |
                result = 12 // x
          next:
            arcs: [{{step: flaky, when: "{{{{ event.name == 'loop.done' }}}}"}}]
        - step: flaky
          tool:
            - name: call
              kind: python
              args: {{attempt: "{{{{ _attempt }}}}"}}
              code: |
                if attempt < 2:
                    raise ConnectionError(f"attempt {{attempt}}")
                result = attempt
              spec:
                policy:
                  rules:
                    - when: "{{{{ outcome.status == 'error' }}}}"
                      then: {{do: retry, attempts: 3, delay: 0}}
          next: {{arcs: [{{step: boom}}]}}
        - step: boom
          tool: {{kind: python, code: "raise ValueError('no luck')"}}
          next:
            arcs:
              - step: handle
                when: "{{{{ event.name == 'step.failed' }}}}"
              - step: never
        - step: handle
          tool: {{kind: noop, result: handled}}
        - step: never
          tool: {{kind: noop, result: unexpected}}
        """,
        workload={"items": [1, 2, 0, 3, 4]},
        name="viewer",
    )


GATE_BOOK = playbook(
    """
    - step: start
      next: {arcs: [{step: wait}]}
    - step: wait
      tool:
        - name: gate
          kind: python
          args: {gate: "{{ workload.gate }}"}
          code: |
            import os, time
            deadline = time.monotonic() + 60
            while not os.path.exists(gate) and time.monotonic() < deadline:
                time.sleep(0.02)
            result = os.path.exists(gate)
      next: {arcs: [{step: after}]}
    - step: after
      tool: {kind: noop, result: done}
    """,
    name="gated",
)


async def start(api: Api, text: str, payload: dict[str, Any] | None = None) -> str:
    reply = await api.json("POST", "/api/executions", 201, json={"playbook": text, "payload": payload or {}})
    return str(reply["execution_id"])


async def graph_when(api: Api, execution_id: str, check: Any, timeout: float = 30.0) -> dict[str, Any]:
    """Poll the graph route until ``check(graph)`` holds; the last graph otherwise (in the error)."""
    graph: dict[str, Any] = {}
    try:
        async with asyncio.timeout(timeout):
            while True:
                graph = await api.json("GET", f"/api/executions/{execution_id}/graph")
                if check(graph):
                    return graph
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"the graph of {execution_id} never matched: {graph}") from None


def steps(graph: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in graph["steps"]}


def open_gate(path: Path) -> None:
    path.write_text("open")
