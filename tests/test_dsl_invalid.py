"""Invalid playbooks: each case asserts every diagnostic, complete with file:line:col and text.

Cases built with ``steps(...)`` are appended to ``HEADER``, so their first step is on line 7.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from noetl_stream.cli import main
from noetl_stream.dsl import PlaybookError, compile_playbook, load_playbook

HEADER = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: t
  path: tests/t
workflow:
"""


def steps(text: str) -> str:
    return HEADER + text


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
            "bad.yaml:1:1: a playbook is a mapping with apiVersion, kind, metadata and workflow; found a list (a bare workflow? put it under 'workflow:') (at <root>)",
        ],
        id="root-is-a-list",
    ),
    pytest.param(
        """\
just text
""",
        [
            "bad.yaml:1:1: a playbook is a mapping with apiVersion, kind, metadata and workflow (at <root>)",
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
            "bad.yaml:4:1: root 'vars' is not part of noetl.io/v2 (v10); use ctx (set_ctx in task policies) for mutable state and workload for inputs (enable legacy extensions to translate it) (at vars)",
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
            "bad.yaml:3:1: root 'name' is not part of noetl.io/v2 (v10); use metadata.name (enable legacy extensions to translate it) (at name)",
            "bad.yaml:4:1: root 'path' is not part of noetl.io/v2 (v10); use metadata.path (enable legacy extensions to translate it) (at path)",
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
            "bad.yaml:8:5: step 'start': 'when' is not part of noetl.io/v2 (v10); use spec.policy.admit.rules (enable legacy extensions to translate it) (at workflow[0].when)",
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
            "bad.yaml:9:5: step 'start': 'case' is not part of noetl.io/v2 (v10); use task spec.policy.rules and next.arcs (enable legacy extensions to translate it) (at workflow[0].case)",
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
            "bad.yaml:9:5: step 'start': 'retry' is not part of noetl.io/v2 (v10); use task spec.policy.rules with 'do: retry' (enable legacy extensions to translate it) (at workflow[0].retry)",
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
            "bad.yaml:9:5: step 'start': 'sink' is not part of noetl.io/v2 (v10); store results with a task of a storage kind (e.g. postgres) in the pipeline (enable legacy extensions to translate it) (at workflow[0].sink)",
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
            "bad.yaml:9:5: step 'start': 'vars' is not part of noetl.io/v2 (v10); use set_ctx or set_iter in task spec.policy.rules (enable legacy extensions to translate it) (at workflow[0].vars)",
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
            "bad.yaml:9:5: step 'start': 'eval' is not part of noetl.io/v2 (v10); use task spec.policy.rules (enable legacy extensions to translate it) (at workflow[0].eval)",
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
            "bad.yaml:9:7: step 'start': 'spec.next_mode' is not part of noetl.io/v2 (v10); use next.spec.mode (enable legacy extensions to translate it) (at workflow[0].spec.next_mode)",
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
            "bad.yaml:9:11: step 'start': 'next' as a string is not part of noetl.io/v2 (v10); use a router object 'next: {spec: {mode: exclusive}, arcs: [{step: finish}]}' (enable legacy extensions to translate it) (at workflow[0].next)",
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
            "bad.yaml:10:7: step 'start': 'next' as a list is not part of noetl.io/v2 (v10); use a router object 'next: {spec: {mode: exclusive}, arcs: [{step: ...}]}' (enable legacy extensions to translate it) (at workflow[0].next)",
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
            "bad.yaml:12:11: step 'start': 'expr' is not part of noetl.io/v2 (v10); use 'when' (enable legacy extensions to translate it) (at workflow[0].next.arcs[0].expr)",
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
            "bad.yaml:9:9: step 'start' task 'calc': kind 'python' needs 'code' or 'module' (at workflow[0].tool[0])",
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
            "bad.yaml:8:5: step 'start' task 'start_task': kind 'duckdb' needs 'query' or 'command' (at workflow[0].tool)",
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
            "bad.yaml:11:9: step 'start' task 'fetch': 'eval' is not part of noetl.io/v2 (v10); use spec.policy.rules (enable legacy extensions to translate it) (at workflow[0].tool[0].eval)",
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
            "bad.yaml:11:9: step 'start' task 'fetch': 'expr' is not part of noetl.io/v2 (v10); use 'when' inside spec.policy.rules (enable legacy extensions to translate it) (at workflow[0].tool[0].expr)",
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
            "bad.yaml:10:15: step 'start': task label 'task_0' is used twice in this pipeline (first at line 9) (at workflow[0].tool[1].name)",
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
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: fetch
        kind: noop
        spec:
          policy:
            - when: "{{ true }}"
              then: {do: continue}
"""),
        [
            "bad.yaml:13:13: step 'start' task 'fetch': spec.policy must be an object with a required 'rules:' list (003 §5.4) (at workflow[0].tool[0].spec.policy)",
        ],
        id="policy-not-an-object",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: fetch
        kind: noop
        spec:
          policy:
            mode: exclusive
"""),
        [
            "bad.yaml:12:11: step 'start' task 'fetch': spec.policy needs a 'rules:' list (003 §5.4) (at workflow[0].tool[0].spec.policy)",
        ],
        id="policy-without-rules",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: fetch
        kind: noop
        spec:
          policy:
            rulez: []
            rules: []
"""),
        [
            "bad.yaml:13:13: step 'start' task 'fetch': unknown task policy key 'rulez'; did you mean 'rules'? (at workflow[0].tool[0].spec.policy.rulez)",
        ],
        id="policy-unknown-key",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: fetch
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: {do: jump, to: fetch_pag}
      - name: fetch_page
        kind: noop
"""),
        [
            "bad.yaml:15:40: step 'start' task 'fetch': jump target 'fetch_pag' is not a task of this pipeline; did you mean 'fetch_page'? (at workflow[0].tool[0].spec.policy.rules[0].else.then.to)",
        ],
        id="jump-to-unknown-task",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: fetch
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: {do: jump}
"""),
        [
            "bad.yaml:15:25: step 'start' task 'fetch': 'do: jump' needs 'to' (a task label of this pipeline) (at workflow[0].tool[0].spec.policy.rules[0].else.then)",
        ],
        id="jump-without-to",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: fetch
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: {do: continue, to: fetch}
"""),
        [
            "bad.yaml:15:40: step 'start' task 'fetch': 'to' is only allowed with 'do: jump' (at workflow[0].tool[0].spec.policy.rules[0].else.then.to)",
        ],
        id="to-without-jump",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: fetch
        kind: noop
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                then: {do: retry, attempts: 0}
              - else:
                  then: {do: retry, attempts: -2}
"""),
        [
            "bad.yaml:15:45: step 'start' task 'fetch': 'attempts' must be a positive integer, got 0 (at workflow[0].tool[0].spec.policy.rules[0].then.attempts)",
            "bad.yaml:17:47: step 'start' task 'fetch': 'attempts' must be a positive integer, got -2 (at workflow[0].tool[0].spec.policy.rules[1].else.then.attempts)",
        ],
        id="attempts-not-positive",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: fetch
        kind: noop
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                then: {do: retry, attempts: "5"}
"""),
        [
            "bad.yaml:15:45: step 'start' task 'fetch': 'attempts' must be a positive integer, got '5' (at workflow[0].tool[0].spec.policy.rules[0].then.attempts)",
        ],
        id="attempts-not-an-integer",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: fetch
        kind: noop
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                then: {do: fail, attempts: 3}
"""),
        [
            "bad.yaml:15:34: step 'start' task 'fetch': 'attempts' is only meaningful with 'do: retry' (at workflow[0].tool[0].spec.policy.rules[0].then.attempts)",
        ],
        id="attempts-without-retry",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: fetch
        kind: noop
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                then: {do: retry, attempts: 3, backoff: exponentail}
"""),
        [
            "bad.yaml:15:57: step 'start' task 'fetch': 'backoff' must be one of 'none', 'linear', 'exponential', got 'exponentail'; did you mean 'exponential'? (at workflow[0].tool[0].spec.policy.rules[0].then.backoff)",
        ],
        id="bad-backoff",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: fetch
        kind: noop
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                then: {do: stop}
              - else:
                  then: {do: retry, delay: -1}
"""),
        [
            "bad.yaml:15:28: step 'start' task 'fetch': 'do' must be one of 'continue', 'retry', 'jump', 'break', 'fail', got 'stop' (at workflow[0].tool[0].spec.policy.rules[0].then.do)",
            "bad.yaml:17:44: step 'start' task 'fetch': 'delay' must be a number of seconds >= 0 or a template, got -1 (at workflow[0].tool[0].spec.policy.rules[1].else.then.delay)",
        ],
        id="bad-do-and-negative-delay",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: fetch
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: {do: continue}
              - when: "{{ outcome.status == 'error' }}"
                then: {do: fail}
"""),
        [
            "bad.yaml:16:17: step 'start' task 'fetch': rule 2 comes after 'else' (rule 1) and can never match (at workflow[0].tool[0].spec.policy.rules[1])",
        ],
        id="rules-after-else",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: fetch
        kind: noop
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                else:
                  then: {do: fail}
"""),
        [
            "bad.yaml:14:17: step 'start' task 'fetch': a rule has either 'when' or 'else', not both (at workflow[0].tool[0].spec.policy.rules[0])",
        ],
        id="rule-with-when-and-else",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: fetch
        kind: noop
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                do: fail
              - when: "{{ outcome.status == 'ok' }}"
"""),
        [
            "bad.yaml:15:17: step 'start' task 'fetch': 'do' belongs under the rule's 'then' (at workflow[0].tool[0].spec.policy.rules[0].do)",
            "bad.yaml:16:17: step 'start' task 'fetch': the rule has 'when' but no 'then' (at workflow[0].tool[0].spec.policy.rules[1])",
        ],
        id="rule-without-then",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: fetch
        kind: noop
        spec:
          policy:
            rules:
              - expr: "{{ outcome.status == 'error' }}"
                then: {do: fail}
              - else:
                  then: {do: continue, set_vars: {page: 2}, set_shared: {n: 1}}
"""),
        [
            "bad.yaml:14:17: step 'start' task 'fetch': 'expr' is not part of noetl.io/v2 (v10); use 'when' (enable legacy extensions to translate it) (at workflow[0].tool[0].spec.policy.rules[0].expr)",
            "bad.yaml:17:40: step 'start' task 'fetch': 'set_vars' is not part of noetl.io/v2 (v10); use set_iter (iteration scope) or set_ctx (execution scope) (enable legacy extensions to translate it) (at workflow[0].tool[0].spec.policy.rules[1].else.then.set_vars)",
            "bad.yaml:17:61: step 'start' task 'fetch': 'set_shared' is not part of noetl.io/v2 (v10); use set_ctx (enable legacy extensions to translate it) (at workflow[0].tool[0].spec.policy.rules[1].else.then.set_shared)",
        ],
        id="rule-expr-and-set-vars",
    ),
    pytest.param(
        steps("""\
  - step: start
    spec:
      policy:
        admit:
          rules:
            - when: "{{ ctx.ready }}"
              then: {allow: true, do: retry}
            - else:
                then: {allow: false, set_ctx: {skipped: true}}
    tool: {kind: noop}
"""),
        [
            "bad.yaml:13:35: step 'start': 'do' is a task policy action and is not allowed at step scope; admission rules only set 'allow' (task control belongs in a task's spec.policy.rules) (at workflow[0].spec.policy.admit.rules[0].then.do)",
            "bad.yaml:15:38: step 'start': 'set_ctx' is a task policy action and is not allowed at step scope; admission rules only set 'allow' (task control belongs in a task's spec.policy.rules) (at workflow[0].spec.policy.admit.rules[1].else.then.set_ctx)",
        ],
        id="admission-with-control-actions",
    ),
    pytest.param(
        steps("""\
  - step: start
    spec:
      policy:
        admit:
          rules:
            - when: "{{ ctx.ready }}"
              then: {allow: "yes"}
            - else:
                then: {}
    tool: {kind: noop}
"""),
        [
            "bad.yaml:13:29: step 'start': admission 'allow' must be true or false, got 'yes' (at workflow[0].spec.policy.admit.rules[0].then.allow)",
            "bad.yaml:15:23: step 'start': admission 'then' needs 'allow: true' or 'allow: false' (at workflow[0].spec.policy.admit.rules[1].else.then)",
        ],
        id="admission-allow-not-boolean",
    ),
    pytest.param(
        steps("""\
  - step: start
    spec:
      policy:
        admit:
          mode: exclusive
    tool: {kind: noop}
"""),
        [
            "bad.yaml:10:9: step 'start': spec.policy.admit needs a 'rules:' list (at workflow[0].spec.policy.admit)",
        ],
        id="admission-without-rules",
    ),
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
            "bad.yaml:12:15: step 'start': loop mode must be one of 'sequential', 'parallel', got 'paralel'; did you mean 'parallel'? (at workflow[0].loop.spec.mode)",
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
    tool:
      - name: calc
        kind: python
        args: {n: "{{ workload.n + }}"}
        code: "result = n"
"""),
        [
            "bad.yaml:11:19: step 'start' task 'calc': template syntax error: unexpected 'end of template' (at workflow[0].tool[0].args.n)",
        ],
        id="template-syntax-error",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: query
        kind: duckdb
        query: |
          SELECT 1
          WHERE x = {{ workload.x ) }}
"""),
        [
            "bad.yaml:13:11: step 'start' task 'query': template syntax error: unexpected ')' (at workflow[0].tool[0].query)",
        ],
        id="template-syntax-error-in-block-scalar",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop}
    next:
      arcs:
        - step: start
          when: "{{ event.name == 'step.done' and }}"
"""),
        [
            "bad.yaml:12:17: step 'start': template syntax error: unexpected 'end of template' (at workflow[0].next.arcs[0].when)",
        ],
        id="template-syntax-error-in-arc-when",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: calc
        kind: python
        code: |
          {% for x in workload.items %}
          print({{ x }})
          {% endfor %}
          {% frobnicate %}
"""),
        [
            "bad.yaml:15:11: step 'start' task 'calc': template syntax error: Encountered unknown tag 'frobnicate'. (at workflow[0].tool[0].code)",
        ],
        id="template-unknown-tag",
    ),
]

WARNING_CASES = [
    pytest.param(
        steps("""\
  - step: start
    loop:
      in: "{{ workload.items }}"
      iterator: item
    tool:
      - fetch:
          kind: http
          url: "{{ item.url }}"
      - store:
          kind: noop
          result: "{{ fetchh.data }}"
    next:
      arcs:
        - step: start
          when: "{{ false }}"
"""),
        [
            "bad.yaml:12:9: warning: step 'start': task 'fetch' uses the label-as-key shape; write it as '- name: fetch' with 'kind: ...' (003 §7) (at workflow[0].tool[0].fetch)",
            "bad.yaml:14:16: warning: step 'start' task 'fetch': template reads 'item', which is not defined in any scope; did you mean 'iter.item'? (at workflow[0].tool[0].fetch.url)",
            "bad.yaml:15:9: warning: step 'start': task 'store' uses the label-as-key shape; write it as '- name: store' with 'kind: ...' (003 §7) (at workflow[0].tool[1].store)",
            "bad.yaml:17:19: warning: step 'start' task 'store': template reads 'fetchh', which is not defined in any scope; did you mean 'fetch'? (at workflow[0].tool[1].store.result)",
        ],
        id="label-as-key-warnings-and-undefined-names",
    ),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_invalid_playbook_is_reported_exactly(text: str, expected: list[str]) -> None:
    result = compile_playbook(text, "bad.yaml")
    assert [d.format() for d in result.diagnostics] == expected
    assert result.playbook is None
    with pytest.raises(PlaybookError) as info:
        load_playbook(text, "bad.yaml")
    assert [d.format() for d in info.value.diagnostics] == expected


@pytest.mark.parametrize(("text", "expected"), WARNING_CASES)
def test_warnings_do_not_reject_a_playbook(text: str, expected: list[str]) -> None:
    result = compile_playbook(text, "bad.yaml")
    assert [d.format() for d in result.diagnostics] == expected
    assert result.playbook is not None
    assert not result.errors


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
