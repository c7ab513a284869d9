"""Invalid playbooks, inside a step: the tasks of a pipeline (kinds, keys, labels, the tool's shape).

Each case asserts every diagnostic, complete with file:line:col, text and YAML path.
"""

from __future__ import annotations

import pytest
from dsl_support import assert_rejected_with, steps

CASES = [
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: read
        kind: duckdb
        query: SELECT 1
        command: CREATE TABLE t (x INT)
      - name: run
        kind: python
        code: "def main(): return 1"
        module: pkg.mod:main
"""),
        [
            "bad.yaml:12:9: step 'start' task 'read': kind 'duckdb' takes 'query' or 'command', not both (at workflow[0].tool[0].command)",
            "bad.yaml:16:9: step 'start' task 'run': kind 'python' takes 'code' or 'module', not both (at workflow[0].tool[1].module)",
        ],
        id="task-exclusive-keys",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: fetch
        kind: htttp
        url: http://example.com
"""),
        [
            "bad.yaml:10:15: step 'start' task 'fetch': unknown tool kind 'htttp'; did you mean 'http'? (known: duckdb, http, noop, playbook, postgres, python, script, secrets, workbook; enable the 'custom_kinds' extension for others) (at workflow[0].tool[0].kind)",
        ],
        id="task-unknown-kind-did-you-mean",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: fetch
        url: http://example.com
"""),
        [
            "bad.yaml:9:9: step 'start' task 'fetch': missing 'kind' (one of duckdb, http, noop, playbook, postgres, python, script, secrets, workbook) (at workflow[0].tool[0])",
        ],
        id="task-missing-kind",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: calc
        kind: python
        cod: "result = 1"
"""),
        [
            "bad.yaml:9:9: step 'start' task 'calc': kind 'python' needs 'code' or 'module' or 'script' (at workflow[0].tool[0])",
            "bad.yaml:11:9: step 'start' task 'calc': unknown key 'cod' for kind 'python'; did you mean 'code'? (at workflow[0].tool[0].cod)",
        ],
        id="task-unknown-key-did-you-mean",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      kind: duckdb
      params: [1]
"""),
        [
            "bad.yaml:8:5: step 'start' task 'start_task': kind 'duckdb' needs 'query' or 'command' or 'commands' or 'cmds' (at workflow[0].tool)",
        ],
        id="task-kind-needs-its-key",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: fetch
        kind: noop
        eval:
          - expr: "{{ outcome.status == 'error' }}"
            do: retry
"""),
        [
            "bad.yaml:11:9: step 'start' task 'fetch': 'eval' is not part of noetl.io/v2 (v10); use spec.policy.rules (enable legacy extensions to translate it): validate or run with --legacy, or declare executor.spec.extensions: [legacy] (at workflow[0].tool[0].eval)",
        ],
        id="task-eval-deprecated",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: fetch
        kind: noop
        expr: "{{ true }}"
"""),
        [
            "bad.yaml:11:9: step 'start' task 'fetch': 'expr' is not part of noetl.io/v2 (v10); use 'when' inside spec.policy.rules (at workflow[0].tool[0].expr)",
        ],
        id="task-expr-deprecated",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: fetch
        kind: noop
      - name: fetch
        kind: noop
"""),
        [
            "bad.yaml:11:15: step 'start': task label 'fetch' is used twice in this pipeline (first at line 9) (at workflow[0].tool[1].name)",
        ],
        id="duplicate-task-labels",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - kind: noop
      - name: task_0
        kind: noop
"""),
        [
            "bad.yaml:10:15: step 'start': task label 'task_0' is already the label of the unnamed task at line 9; choose another name (at workflow[0].tool[1].name)",
        ],
        id="duplicate-task-label-synthetic",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: fetch page
        kind: noop
"""),
        [
            "bad.yaml:9:15: step 'start': task name 'fetch page' must be an identifier (letters, digits, '_', not starting with a digit) (at workflow[0].tool[0].name)",
        ],
        id="task-name-not-identifier",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: outcome
        kind: noop
"""),
        [
            "bad.yaml:9:15: step 'start' task 'outcome': the name 'outcome' is reserved for a template scope (at workflow[0].tool[0].name)",
        ],
        id="task-name-reserved",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: []
"""),
        [
            "bad.yaml:8:11: step 'start': 'tool' is an empty list; give at least one task or remove 'tool' (at workflow[0].tool)",
        ],
        id="tool-empty-list",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: noop
"""),
        [
            "bad.yaml:8:11: step 'start': 'tool' must be a task (a mapping with 'kind') or a list of tasks; did you mean 'tool: {kind: noop}'? (at workflow[0].tool)",
        ],
        id="tool-as-kind-name",
    ),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_invalid_playbook_is_reported_exactly(text: str, expected: list[str]) -> None:
    assert_rejected_with(text, expected)
