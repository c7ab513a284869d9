"""Invalid playbooks, inside a step: loops (in, iterator, mode, max_in_flight, the policy's place).

Each case asserts every diagnostic, complete with file:line:col, text and YAML path.
"""

from __future__ import annotations

import pytest
from dsl_support import assert_rejected_with, steps

CASES = [
    pytest.param(
        steps("""\
  - step: start
    loop:
      in: "{{ workload.items }}"
    tool: {kind: noop}
"""),
        [
            "bad.yaml:8:5: step 'start': loop needs 'iterator' (the name of the item in iter.<iterator>) (at workflow[0].loop)",
        ],
        id="loop-without-iterator",
    ),
    pytest.param(
        steps("""\
  - step: start
    loop:
      iterator: item
    tool: {kind: noop}
"""),
        [
            "bad.yaml:8:5: step 'start': loop needs 'in' (a list, or a template that renders to one) (at workflow[0].loop)",
        ],
        id="loop-without-in",
    ),
    pytest.param(
        steps("""\
  - step: start
    loop:
      in: [1, 2, 3]
      iterator: item
      spec:
        mode: paralel
    tool: {kind: noop}
"""),
        [
            "bad.yaml:12:15: step 'start': loop mode must be one of 'sequential', 'parallel', 'cursor', got 'paralel'; did you mean 'parallel'? (at workflow[0].loop.spec.mode)",
        ],
        id="loop-bad-mode",
    ),
    pytest.param(
        steps("""\
  - step: start
    loop:
      in: [1, 2, 3]
      iterator: item
      spec:
        mode: parallel
        max_in_flight: 0
    tool: {kind: noop}
  - step: other
    loop:
      in: [1, 2, 3]
      iterator: item
      spec: {mode: parallel, max_in_flight: ten}
    tool: {kind: noop}
"""),
        [
            "bad.yaml:13:24: step 'start': loop max_in_flight must be a positive integer or a template, got 0 (at workflow[0].loop.spec.max_in_flight)",
            "bad.yaml:19:45: step 'other': loop max_in_flight must be a positive integer or a template, got 'ten' (at workflow[1].loop.spec.max_in_flight)",
        ],
        id="loop-bad-max-in-flight",
    ),
    pytest.param(
        steps("""\
  - step: start
    loop:
      in: [1, 2, 3]
      iterator: my-item
    tool: {kind: noop}
"""),
        [
            "bad.yaml:10:17: step 'start': loop iterator 'my-item' must be an identifier (at workflow[0].loop.iterator)",
        ],
        id="loop-iterator-not-identifier",
    ),
    pytest.param(
        steps("""\
  - step: start
    loop:
      in: [1, 2, 3]
      iterator: index
    tool: {kind: noop}
"""),
        [
            "bad.yaml:10:17: step 'start': loop iterator 'index' clashes with iter.index; choose another name (at workflow[0].loop.iterator)",
        ],
        id="loop-iterator-reserved",
    ),
    pytest.param(
        steps("""\
  - step: start
    loop:
      in: [1, 2, 3]
      iterator: item
      mode: parallel
    tool: {kind: noop}
"""),
        [
            "bad.yaml:11:7: step 'start': loop 'mode' belongs under loop.spec.mode (at workflow[0].loop.mode)",
        ],
        id="loop-mode-at-the-wrong-level",
    ),
    pytest.param(
        steps("""\
  - step: start
    loop:
      in: workload.items
      iterator: item
    tool: {kind: noop}
"""),
        [
            "bad.yaml:9:11: step 'start': loop 'in' is a plain string; write a template like '{{ workload.items }}' or a YAML list (at workflow[0].loop.in)",
        ],
        id="loop-in-plain-string",
    ),
    pytest.param(
        steps("""\
  - step: start
    loop:
      in: [1, 2]
      iterator: item
    next:
      arcs:
        - step: start
"""),
        [
            "bad.yaml:8:5: step 'start': a loop needs a 'tool' pipeline to run for each item (at workflow[0].loop)",
        ],
        id="loop-without-tool",
    ),
    pytest.param(
        steps("""\
  - step: start
    loop:
      in: [1, 2]
      iterator: item
      spec:
        policy:
          exec: remote
          retry: 3
    tool: {kind: noop}
"""),
        [
            "bad.yaml:13:17: step 'start': loop.spec.policy.exec must be one of 'local', 'distributed', got 'remote' (at workflow[0].loop.spec.policy.exec)",
            "bad.yaml:14:11: step 'start': task control 'retry' is not allowed at loop scope; put it in a task's spec.policy.rules (at workflow[0].loop.spec.policy.retry)",
        ],
        id="loop-policy-control",
    ),
    pytest.param(
        steps("""\
  - step: start
    loop:
      in: [1, 2]
      iterator: item
      spec:
        mode: parallel
        policy: {mode: sequential}
    tool: {kind: noop}
"""),
        [
            "bad.yaml:13:18: step 'start': loop mode is given twice with different values (loop.spec.mode and loop.spec.policy.mode); keep one (at workflow[0].loop.spec.policy.mode)",
        ],
        id="loop-mode-given-twice",
    ),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_invalid_playbook_is_reported_exactly(text: str, expected: list[str]) -> None:
    assert_rejected_with(text, expected)
