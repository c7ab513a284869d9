"""Invalid playbooks, the workflow: the steps (names, keys, deprecated step forms, step policy) and the
next routers and their arcs. Each case asserts every diagnostic, complete.

The document around them: test_dsl_invalid.py. Inside a step: test_dsl_invalid_tasks.py, _policies.py
(and admission), _loops.py, _templates.py.
"""

from __future__ import annotations

import pytest
from dsl_support import assert_accepted_with, assert_rejected_with, steps

CASES = [
    pytest.param(
        steps("""\
  - step: begin
    tool: {kind: noop}
"""),
        [
            "bad.yaml:6:1: workflow has no 'start' step (execution begins at the step named 'start') (at workflow)",
        ],
        id="no-start-step",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop}
    next:
      arcs:
        - step: work
  - step: work
    tool: {kind: noop}
  - step: work
    tool: {kind: noop}
"""),
        [
            "bad.yaml:14:11: step 'work' is defined twice (first at line 12) (at workflow[2].step)",
        ],
        id="duplicate-step-names",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop}
  - step: fetch-data
    tool: {kind: noop}
"""),
        [
            "bad.yaml:9:11: step name 'fetch-data' must be an identifier (letters, digits, '_', not starting with a digit) (at workflow[1].step)",
        ],
        id="step-name-not-identifier",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop}
    next:
      arcs:
        - step: workload
  - step: workload
    tool: {kind: noop}
"""),
        [
            "bad.yaml:12:11: step 'workload': the name 'workload' is reserved for a template scope (at workflow[1].step)",
        ],
        id="step-name-reserved",
    ),
    pytest.param(
        steps("""\
  - step: start
    desc: does nothing
"""),
        [
            "bad.yaml:7:5: step 'start': a step needs 'tool' or 'next' (or both); a step with neither ends the branch that reaches it, and 'start' with neither would run nothing (at workflow[0])",
        ],
        id="start-without-tool-or-next",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop}
    next:
      arcs:
        - step: end
  - step: end
  - step: leftover
    desc: nothing leads here
"""),
        [
            "bad.yaml:13:5: step 'leftover': a step needs 'tool' or 'next' (or both); a step with neither ends the branch that reaches it, and 'leftover' is not reachable from 'start' (at workflow[2])",
        ],
        id="unreachable-step-without-tool-or-next",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop}
    next:
      arcs:
        - step: end
  - step: end
    kind: noop
    result: done
"""),
        [
            "bad.yaml:13:5: step 'end': unknown key 'kind': a step's tasks go under 'tool' (tool: {kind: noop, ...}) (at workflow[1].kind)",
            "bad.yaml:14:5: step 'end': unknown key 'result' (allowed: desc, input, loop, next, output, spec, step, tool) (at workflow[1].result)",
        ],
        id="terminal-step-with-task-keys",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop}
    next:
      arcs:
        - step: end
  - step: end
    loop: {in: [1, 2], iterator: x}
"""),
        [
            "bad.yaml:13:5: step 'end': a loop needs a 'tool' pipeline to run for each item (at workflow[1].loop)",
        ],
        id="terminal-step-with-a-loop",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop}
    nxt:
      arcs:
        - step: start
"""),
        [
            "bad.yaml:9:5: step 'start': unknown key 'nxt'; did you mean 'next'? (at workflow[0].nxt)",
        ],
        id="step-unknown-key-did-you-mean",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop}
    retries: 3
"""),
        [
            "bad.yaml:9:5: step 'start': unknown key 'retries'; 'retry' is not part of noetl.io/v2 (v10) either: use task spec.policy.rules with 'do: retry' (at workflow[0].retries)",
        ],
        id="step-unknown-key-close-to-deprecated",
    ),
    pytest.param(
        steps("""\
  - step: start
    when: "{{ workload.enabled }}"
    tool: {kind: noop}
"""),
        [
            "bad.yaml:8:5: step 'start': 'when' is not part of noetl.io/v2 (v10); use spec.policy.admit.rules (enable legacy extensions to translate it): validate or run with --legacy, or declare executor.spec.extensions: [legacy] (at workflow[0].when)",
        ],
        id="step-when-deprecated",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop}
    case:
      - when: "{{ event.name == 'step.done' }}"
        then:
          next:
            - step: start
"""),
        [
            "bad.yaml:9:5: step 'start': 'case' is not part of noetl.io/v2 (v10); use task spec.policy.rules and next.arcs (enable legacy extensions to translate it): validate or run with --legacy, or declare executor.spec.extensions: [legacy] (at workflow[0].case)",
        ],
        id="step-case-deprecated",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop}
    retry:
      max_attempts: 3
"""),
        [
            "bad.yaml:9:5: step 'start': 'retry' is not part of noetl.io/v2 (v10); use task spec.policy.rules with 'do: retry' (enable legacy extensions to translate it): validate or run with --legacy, or declare executor.spec.extensions: [legacy] (at workflow[0].retry)",
        ],
        id="step-retry-deprecated",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop}
    sink:
      tool: {kind: postgres, table: results}
"""),
        [
            "bad.yaml:9:5: step 'start': 'sink' is not part of noetl.io/v2 (v10); store results with a task of a storage kind (e.g. postgres) in the pipeline (enable legacy extensions to translate it): validate or run with --legacy, or declare executor.spec.extensions: [legacy] (at workflow[0].sink)",
        ],
        id="step-sink-deprecated",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop}
    vars:
      user_id: "{{ result.id }}"
"""),
        [
            "bad.yaml:9:5: step 'start': 'vars' is not part of noetl.io/v2 (v10); use set_ctx or set_iter in task spec.policy.rules (enable legacy extensions to translate it): validate or run with --legacy, or declare executor.spec.extensions: [legacy] (at workflow[0].vars)",
        ],
        id="step-vars-deprecated",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop}
    eval:
      - else:
          do: continue
"""),
        [
            "bad.yaml:9:5: step 'start': 'eval' is not part of noetl.io/v2 (v10); use task spec.policy.rules (at workflow[0].eval)",
        ],
        id="step-eval-deprecated",
    ),
    pytest.param(
        steps("""\
  - step: start
    spec:
      next_mode: exclusive
    tool: {kind: noop}
"""),
        [
            "bad.yaml:9:7: step 'start': 'spec.next_mode' is not part of noetl.io/v2 (v10); use next.spec.mode (enable legacy extensions to translate it): validate or run with --legacy, or declare executor.spec.extensions: [legacy] (at workflow[0].spec.next_mode)",
        ],
        id="step-spec-next-mode-deprecated",
    ),
    pytest.param(
        steps("""\
  - step: start
    spec:
      policy:
        retry: {attempts: 3}
        rules: []
    tool: {kind: noop}
"""),
        [
            "bad.yaml:10:9: step 'start': task control 'retry' is not allowed at step scope; put it in a task's spec.policy.rules (003 §5.2) (at workflow[0].spec.policy.retry)",
            "bad.yaml:11:9: step 'start': task control 'rules' is not allowed at step scope; put it in a task's spec.policy.rules (003 §5.2) (at workflow[0].spec.policy.rules)",
        ],
        id="step-policy-with-task-control",
    ),
    pytest.param(
        steps("""\
  - step: start
    spec:
      policy:
        lifecycle: {timeout_s: -5}
        failure: {mode: best_efort}
    tool: {kind: noop}
"""),
        [
            "bad.yaml:10:32: step 'start': lifecycle.timeout_s must be a positive number of seconds, got -5 (at workflow[0].spec.policy.lifecycle.timeout_s)",
            "bad.yaml:11:25: step 'start': failure.mode must be one of 'fail_fast', 'best_effort', got 'best_efort'; did you mean 'best_effort'? (at workflow[0].spec.policy.failure.mode)",
        ],
        id="step-lifecycle-and-failure-mode",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop}
    next: finish
  - step: finish
    tool: {kind: noop}
"""),
        [
            "bad.yaml:9:11: step 'start': 'next' as a string is not part of noetl.io/v2 (v10); use a router object 'next: {spec: {mode: exclusive}, arcs: [{step: finish}]}' (enable legacy extensions to translate it): validate or run with --legacy, or declare executor.spec.extensions: [legacy] (at workflow[0].next)",
        ],
        id="next-as-string",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop}
    next:
      - step: finish
        when: "{{ event.name == 'step.done' }}"
  - step: finish
    tool: {kind: noop}
"""),
        [
            "bad.yaml:10:7: step 'start': 'next' as a list is not part of noetl.io/v2 (v10); use a router object 'next: {spec: {mode: exclusive}, arcs: [{step: ...}]}' (enable legacy extensions to translate it): validate or run with --legacy, or declare executor.spec.extensions: [legacy] (at workflow[0].next)",
        ],
        id="next-as-list",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop}
    next:
      spec: {mode: parallel}
      arcs:
        - step: start
"""),
        [
            "bad.yaml:10:20: step 'start': next.spec.mode must be one of 'exclusive', 'inclusive', got 'parallel' (at workflow[0].next.spec.mode)",
        ],
        id="next-spec-mode",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop}
    next:
      spec: {mode: exclusive}
"""),
        [
            "bad.yaml:9:5: step 'start': 'next' has no arcs; list the steps to go to (arcs: [{step: ...}]) or remove 'next' (at workflow[0].next)",
        ],
        id="next-without-arcs",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop}
    next:
      arcs:
        - step: finnish
  - step: finish
    tool: {kind: noop}
"""),
        [
            "bad.yaml:11:17: step 'start': arc target 'finnish' is not a step of this workflow; did you mean 'finish'? (at workflow[0].next.arcs[0].step)",
        ],
        id="arc-to-missing-step",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop}
    next:
      arcs:
        - step: start
          expr: "{{ ctx.again }}"
"""),
        [
            "bad.yaml:12:11: step 'start': 'expr' is not part of noetl.io/v2 (v10); use 'when' (at workflow[0].next.arcs[0].expr)",
        ],
        id="arc-expr-deprecated",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop}
    next:
      arcs:
        - step: start
          when: ctx.again == true
"""),
        [
            "bad.yaml:12:17: step 'start': arc 'when' is plain text, which would always be true; write it as a template: \"{{ ctx.again == true }}\" (at workflow[0].next.arcs[0].when)",
        ],
        id="arc-when-plain-text",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop}
    next:
      arcs:
        - start
        - when: "{{ true }}"
"""),
        [
            "bad.yaml:11:11: step 'start': arc must be a mapping like '{step: start}' (at workflow[0].next.arcs[0])",
            "bad.yaml:12:11: step 'start': arc needs 'step' (the target step) (at workflow[0].next.arcs[1])",
        ],
        id="arc-as-string-and-missing-step",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop}
    next:
      arcs:
        - step: [start]
"""),
        [
            "bad.yaml:11:17: step 'start': arc 'step' must be a step name, got ['start'] (at workflow[0].next.arcs[0].step)",
        ],
        id="arc-step-not-a-name",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop}
  - name: other
    tool: {kind: noop}
"""),
        [
            "bad.yaml:9:5: step has no 'step' name (a step is named with 'step:', not 'name:') (at workflow[1])",
        ],
        id="step-named-with-name",
    ),
]

WARNING_CASES = [
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: tests/t}
workload:
  report: weekly
workflow:
  - step: start
    tool: {kind: noop}
    next:
      arcs:
        - step: report
  - step: report
    tool: {kind: noop, result: "{{ workload.report }}"}
""",
        [
            "bad.yaml:12:11: warning: step 'report' has the name of a workload key: a bare '{{ report }}' reads the workload value until the step has run and its result after; rename one of them (at workflow[1].step)",
        ],
        id="step-named-like-a-workload-key",
    ),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_invalid_playbook_is_reported_exactly(text: str, expected: list[str]) -> None:
    assert_rejected_with(text, expected)


@pytest.mark.parametrize(("text", "expected"), WARNING_CASES)
def test_warnings_do_not_reject_a_playbook(text: str, expected: list[str]) -> None:
    assert_accepted_with(text, expected)
