"""Playbooks for the fault tests: tasks with countable side effects, chains, loops, failures.

Python tasks here write to files the tests read back (one line per run), so that a task that ran
twice is visible even when the server dropped the rerun's events as duplicates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from helpers import playbook
from nats.aio.client import Client as NATS

from noetl_stream.client.submit import request_for, submit
from noetl_stream.protocol.subjects import Topology


async def submit_many(
    nc: NATS, topology: Topology, jobs: list[tuple[str, dict[str, Any]]], file: str = "faults.yaml"
) -> list[str]:
    return [await submit(nc, topology, request_for(text, file, payload)) for text, payload in jobs]


# A task that appends "+<pid>" (the worker's PID) when it starts, holds its slot, and "-<pid>" at its end.
HOLD = playbook(
    r"""
    - step: start
      tool:
        - name: hold
          kind: python
          args: {path: "{{ workload.path }}", hold: "{{ workload.hold }}"}
          code: |
            import os, time
            def main(path, hold):
                with open(path, "a") as f:
                    f.write(f"+{os.getpid()}\n")
                time.sleep(hold)
                with open(path, "a") as f:
                    f.write(f"-{os.getpid()}\n")
                return os.getpid()
    """,
    name="hold",
)


def hold_starts(path: Path) -> list[int]:
    """PIDs of the workers that started a HOLD task writing to ``path``, in the order they started."""
    lines = path.read_text().split() if path.exists() else []
    return [int(line[1:]) for line in lines if line.startswith("+")]


def chain(steps: int, hold: float) -> str:
    """`steps` python steps in a row (``start``, ``s1``, ...), each holding its slot `hold` seconds."""
    names = ["start"] + [f"s{i}" for i in range(1, steps)]
    body = []
    for i, name in enumerate(names):
        body.append(
            f"""
- step: {name}
  tool:
    kind: python
    args: {{n: {i}, hold: {hold}}}
    code: |
      import time
      time.sleep(hold)
      result = n"""
        )
        if i + 1 < len(names):
            body.append(f"  next: {{arcs: [{{step: {names[i + 1]}}}]}}")
    return playbook("\n".join(body), name=f"chain{steps}")


# A distributed loop of three iterations, two at a time: iteration 0 is quick, 1 takes a while, and
# iteration 2 is scheduled only when the controller folds iteration 0's result.
FAN = playbook(
    r"""
    - step: start
      loop:
        in: "{{ [0.1, 2.0, 0.1] }}"
        iterator: hold
        spec: {mode: parallel, max_in_flight: 2, policy: {exec: distributed}}
      tool:
        kind: python
        args: {hold: "{{ iter.hold }}"}
        code: |
          import time
          time.sleep(hold)
          result = hold
    """,
    name="fan",
)

LOOP_ITEMS, LOOP_IN_FLIGHT = 1000, 4
LOOP = playbook(
    r"""
    - step: start
      loop:
        in: "{{ range(workload.items) | list }}"
        iterator: i
        spec: {mode: parallel, max_in_flight: "{{ workload.in_flight }}"}
      tool:
        kind: python
        args: {path: "{{ workload.path }}", i: "{{ iter.i }}"}
        code: |
          import os, time
          def main(path, i):
              fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
              try:
                  os.write(fd, f"{i}\n".encode())
              finally:
                  os.close(fd)
              time.sleep(0.004)
              return i
    """,
    workload={"items": LOOP_ITEMS, "in_flight": LOOP_IN_FLIGHT},
    name="loop1000",
)

POISON_MAX_DELIVER = 3
POISON = playbook(
    r"""
    - step: start
      tool:
        - name: crash
          kind: python
          args: {path: "{{ workload.path }}"}
          code: |
            import os, signal
            with open(path, "a") as f:
                f.write(f"{os.getpid()}\n")
            os.kill(os.getpid(), signal.SIGKILL)
    """,
    name="poison",
)


# --- the stress mix (faults/test_stress.py) -------------------------------------------------------------


def _loop(exec_: str, failure: str, items: list[int], in_flight: int) -> str:
    """A loop of ``10 // x`` (x == 0 fails its iteration); a best-effort loop with failures takes ``partial``."""
    return playbook(
        f"""
        - step: start
          spec: {{policy: {{failure: {{mode: {failure}}}}}}}
          loop:
            in: "{{{{ {items} }}}}"
            iterator: x
            spec: {{mode: parallel, max_in_flight: {in_flight}, policy: {{exec: {exec_}}}}}
          tool:
            kind: python
            args: {{x: "{{{{ iter.x }}}}"}}
            code: |
              import time
              time.sleep(0.02)
              result = 10 // x
          next:
            arcs:
              - step: partial
                when: "{{{{ event.name == 'loop.done' and event.failed > 0 }}}}"
              - step: complete
                when: "{{{{ event.name == 'loop.done' }}}}"
        - step: partial
          tool: {{kind: noop, result: partial}}
        - step: complete
          tool: {{kind: noop, result: complete}}
        """,
        name=f"loop-{exec_}-{failure}",
    )


FLAKY = playbook(
    """
    - step: start
      tool:
        - name: flaky
          kind: python
          args: {attempt: "{{ _attempt }}"}
          code: |
            import time
            time.sleep(0.02)
            if attempt < 3:
                raise ConnectionError(f"attempt {attempt} failed")
            result = attempt
          spec:
            policy:
              rules:
                - when: "{{ outcome.status == 'error' }}"
                  then: {do: retry, attempts: 3, backoff: none, delay: 0.05}
      next: {arcs: [{step: after}]}
    - step: after
      tool: {kind: noop, result: "{{ start }}"}
    """,
    name="flaky",
)


def _failing(handled: bool) -> str:
    arcs = "next: {arcs: [{step: recover, when: \"{{ event.name == 'step.failed' }}\"}]}" if handled else ""
    return playbook(
        f"""
        - step: start
          tool: {{kind: noop, result: 1}}
          next: {{arcs: [{{step: boom}}]}}
        - step: boom
          tool:
            kind: python
            code: |
              import time
              time.sleep(0.02)
              raise ValueError("boom")
          {arcs}
        - step: recover
          tool: {{kind: noop, result: recovered}}
        """,
        name="handled" if handled else "unhandled",
    )


# (playbook, expected final status)
STRESS_MIX: dict[str, tuple[str, str]] = {
    "chain": (chain(4, 0.05), "success"),
    "local_best_effort": (_loop("local", "best_effort", [1, 0, 2, 5, 0, 3, 4, 6, 7, 8, 9, 10], 3), "success"),
    "local_ok": (_loop("local", "fail_fast", list(range(1, 13)), 4), "success"),
    "distributed_ok": (_loop("distributed", "fail_fast", list(range(1, 9)), 3), "success"),
    "distributed_fail_fast": (_loop("distributed", "fail_fast", [1, 2, 3, 0, 5, 6], 2), "failed"),
    "retry": (FLAKY, "success"),
    "unhandled_failure": (_failing(False), "failed"),
    "handled_failure": (_failing(True), "success"),
}
