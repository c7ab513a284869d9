"""Invalid playbooks, document to router: each case asserts every diagnostic, complete.

YAML syntax, the root document, metadata, the workflow and its steps, next routers. Inside a step:
test_dsl_invalid_tasks.py, _policies.py (and admission), _loops.py, _templates.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from dsl_support import assert_accepted_with, assert_rejected_with, steps

from noetl_stream.cli import main
from noetl_stream.dsl import PlaybookError, load_playbook

CASES = [
    pytest.param(
        """\
apiVersion: noetl.io/v2
workload:
  ids: [1, 2
workflow: []
""",
        [
            "bad.yaml:4:9: YAML syntax error: expected ',' or ']', but got ':' (in a flow sequence that starts at 3:8) (at <root>)",
        ],
        id="yaml-unclosed-flow-sequence",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: t
  path: tests/t
  name: u
""",
        [
            "bad.yaml:6:3: YAML syntax error: duplicate key 'name' (first at line 4) (at <root>)",
        ],
        id="yaml-duplicate-key",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop, kind: python}
"""),
        [
            "bad.yaml:8:24: YAML syntax error: duplicate key 'kind' (first at line 8) (at <root>)",
        ],
        id="yaml-duplicate-key-in-flow-mapping",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
metadata:
\tname: t
""",
        [
            "bad.yaml:3:1: YAML syntax error: found character '\\t' that cannot start any token; indent with spaces, not tabs (at <root>)",
        ],
        id="yaml-tab-indentation",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop}
    next:
      arcs:
        - step: start
          when: {{ ctx.again }}
"""),
        [
            'bad.yaml:12:17: unquoted template: YAML reads {{ ctx.again }} as a mapping; quote it: "{{ ctx.again }}" (at workflow[0].next.arcs[0].when)',
        ],
        id="yaml-unquoted-template",
    ),
    pytest.param(
        steps("""\
  - step: start
    desc: note: this breaks
    tool: {kind: noop}
"""),
        [
            "bad.yaml:8:15: YAML syntax error: mapping values are not allowed here; quote a value that contains ': ', or check the indentation (at <root>)",
        ],
        id="yaml-colon-in-plain-value",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
---
kind: Playbook
""",
        [
            "bad.yaml:1:1: expected one playbook document, found 2 YAML documents (at <root>)",
        ],
        id="yaml-several-documents",
    ),
    pytest.param(
        """\
# nothing here
""",
        [
            "bad.yaml:1:1: expected one playbook document, found no YAML document (at <root>)",
        ],
        id="yaml-empty-document",
    ),
    pytest.param(
        """\
a: &a [x, x, x, x, x, x, x, x, x, x]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
""",
        [
            "bad.yaml:1:1: document is too large (more than 200000 nodes after alias expansion) (at <root>)",
        ],
        id="yaml-alias-bomb",
    ),
    pytest.param(
        """\
- step: start
  tool: {kind: noop}
""",
        [
            "bad.yaml:1:1: this document is a list of steps, not a playbook: a playbook is a mapping with apiVersion, kind, metadata and workflow (put the steps under 'workflow:') (at <root>)",
        ],
        id="root-is-a-list",
    ),
    pytest.param(
        """\
just text
""",
        [
            "bad.yaml:1:1: this document is a string, not a playbook: a playbook is a mapping with apiVersion, kind, metadata and workflow (at <root>)",
        ],
        id="root-is-a-scalar",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v1
kind: playbook
metadata: {name: t, path: tests/t}
workflow:
  - step: start
    tool: {kind: noop}
""",
        [
            "bad.yaml:1:13: apiVersion must be 'noetl.io/v2', got 'noetl.io/v1' (at apiVersion)",
            "bad.yaml:2:7: kind must be 'Playbook', got 'playbook' (at kind)",
        ],
        id="root-bad-api-version-and-kind",
    ),
    pytest.param(
        """\
# a playbook without its header
metadata: {name: t, path: tests/t}
workflow:
  - step: start
    tool: {kind: noop}
""",
        [
            "bad.yaml:2:1: missing 'apiVersion' (must be 'noetl.io/v2') (at <root>)",
            "bad.yaml:2:1: missing 'kind' (must be 'Playbook') (at <root>)",
        ],
        id="root-missing-api-version-and-kind",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: tests/t}
workflows:
  - step: start
    tool: {kind: noop}
""",
        [
            "bad.yaml:1:1: missing 'workflow' (a list of steps with a 'start' step) (at <root>)",
            "bad.yaml:4:1: unknown root key 'workflows'; did you mean 'workflow'? (allowed: apiVersion, kind, metadata, keychain, executor, workload, workflow, workbook) (at workflows)",
        ],
        id="root-unknown-key-did-you-mean",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: tests/t}
vars:
  limit: 10
workflow:
  - step: start
    tool: {kind: noop}
""",
        [
            "bad.yaml:4:1: root 'vars' is not part of noetl.io/v2 (v10); use ctx (set_ctx in task policies) for mutable state and workload for inputs (at vars)",
        ],
        id="root-vars-deprecated",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
name: t
path: tests/t
workflow:
  - step: start
    tool: {kind: noop}
""",
        [
            "bad.yaml:1:1: missing 'metadata' (with 'name' and 'path') (at <root>)",
            "bad.yaml:3:1: root 'name' is not part of noetl.io/v2 (v10); use metadata.name (enable legacy extensions to translate it): validate or run with --legacy, or declare executor.spec.extensions: [legacy] (at name)",
            "bad.yaml:4:1: root 'path' is not part of noetl.io/v2 (v10); use metadata.path (enable legacy extensions to translate it): validate or run with --legacy, or declare executor.spec.extensions: [legacy] (at path)",
        ],
        id="root-name-and-path-of-older-drafts",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  version: "1"
workflow:
  - step: start
    tool: {kind: noop}
""",
        [
            "bad.yaml:3:1: metadata: missing 'name' (at metadata)",
            "bad.yaml:3:1: metadata: missing 'path' (at metadata)",
        ],
        id="metadata-missing-name-and-path",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata:
workflow:
  - step: start
    tool: {kind: noop}
""",
        [
            "bad.yaml:3:1: metadata is empty; it needs 'name' and 'path' (at metadata)",
        ],
        id="metadata-empty",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: ""
  path: tests/t
  descripton: typo
workflow:
  - step: start
    tool: {kind: noop}
""",
        [
            "bad.yaml:4:9: metadata: 'name' must be a non-empty string (at metadata.name)",
            "bad.yaml:6:3: metadata: unknown key 'descripton'; did you mean 'description'? (at metadata.descripton)",
        ],
        id="metadata-unknown-key-and-empty-name",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: tests/t}
workload: {n: 1}
""",
        [
            "bad.yaml:1:1: missing 'workflow' (a list of steps with a 'start' step) (at <root>)",
        ],
        id="workflow-missing",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: tests/t}
workflow: []
""",
        [
            "bad.yaml:4:1: workflow must be a non-empty list of steps, got empty (at workflow)",
        ],
        id="workflow-empty",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: tests/t}
workflow:
  start:
    tool: {kind: noop}
""",
        [
            "bad.yaml:4:1: workflow must be a non-empty list of steps, got a mapping (at workflow)",
        ],
        id="workflow-is-a-mapping",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: tests/t}
workload: [1, 2]
workflow:
  - step: start
    tool: {kind: noop}
""",
        [
            "bad.yaml:4:11: workload must be a mapping of input names to default values (at workload)",
        ],
        id="workload-not-a-mapping",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: tests/t}
keychain:
  - name: pg
    kind: postgres_credential
  - name: pg
    kind: postgres_credential
  - name: token
workflow:
  - step: start
    tool: {kind: noop}
""",
        [
            "bad.yaml:7:11: keychain entry 'pg' is declared twice (first at line 5) (at keychain[1].name)",
            "bad.yaml:9:5: keychain entry 'token' needs a 'kind' (e.g. postgres_credential, secret_manager) (at keychain[2])",
        ],
        id="keychain-duplicate-and-missing-kind",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: tests/t}
executor:
  spec:
    policy:
      rules: []
workflow:
  - step: start
    tool: {kind: noop}
""",
        [
            "bad.yaml:7:7: executor: control 'rules' is not allowed at executor scope; task control belongs in a task's spec.policy.rules (at executor.spec.policy.rules)",
        ],
        id="executor-control-in-policy",
    ),
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
            "bad.yaml:7:5: step 'start': a step needs 'tool' or 'next' (or both) (at workflow[0])",
        ],
        id="step-without-tool-or-next",
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


def test_playbook_error_counts_the_other_errors() -> None:
    text = steps('  - step: begin\n    tool: {kind: noop}\n    when: "{{ true }}"\n')
    with pytest.raises(PlaybookError) as info:
        load_playbook(text, "bad.yaml")
    assert str(info.value) == (
        "bad.yaml:6:1: workflow has no 'start' step (execution begins at the step named 'start') "
        "(at workflow) (and 1 more)"
    )


def test_validate_cli_exit_codes_and_json(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(steps("  - step: start\n    tool: {kind: noop}\n    next: start\n"))
    good = tmp_path / "good.yaml"
    good.write_text(steps("  - step: start\n    tool: {kind: noop}\n"))
    runner = CliRunner()
    ok = runner.invoke(main, ["validate", str(good)])
    assert ok.exit_code == 0, ok.output
    assert "ok (t, 1 steps)" in ok.output
    failed = runner.invoke(main, ["validate", str(good), str(bad)])
    assert failed.exit_code == 2
    assert f"{bad}:9:11: step 'start': 'next' as a string is not part of noetl.io/v2 (v10)" in failed.output
    as_json = runner.invoke(main, ["validate", "--json", str(bad)])
    assert as_json.exit_code == 2
    [diag] = json.loads(as_json.output)
    assert (diag["line"], diag["col"], diag["path"], diag["code"]) == (
        9,
        11,
        "workflow[0].next",
        "deprecated",
    )


def test_a_non_finite_number_is_an_error_where_it_is_written() -> None:
    """JSON has no .inf or .nan: a value travels as JSON and would arrive as null (a `timeout: .inf`
    silently meant no limit)."""
    from noetl_stream.dsl import compile_playbook

    text = (
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: t, path: t}\nworkload: {limit: .nan}\n"
        "workflow:\n  - step: start\n    tool: {kind: python, code: 'result = 1', spec: {timeout: .inf}}\n"
    )
    errors = compile_playbook(text, "bad.yaml").errors
    assert [(d.code, d.path, d.line) for d in errors] == [
        ("non-finite-number", "workload.limit", 4),
        ("non-finite-number", "workflow[0].tool.spec.timeout", 7),
    ], errors
