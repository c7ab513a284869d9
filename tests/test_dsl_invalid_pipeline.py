"""Invalid playbooks, inside a step: tasks, task policies, admission, loops and templates.

Each case asserts every diagnostic, complete with file:line:col, text and YAML path.
"""

from __future__ import annotations

import pytest
from dsl_support import assert_accepted_with, assert_rejected_with, steps

CASES = [
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
            "bad.yaml:11:19: step 'start' task 'calc': template syntax error: unexpected 'end of print statement' (at workflow[0].tool[0].args.n)",
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
            "bad.yaml:12:17: step 'start': template syntax error: unexpected 'end of print statement' (at workflow[0].next.arcs[0].when)",
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
                  then: {do: jump, to: {task: fetch}}
"""),
        [
            "bad.yaml:15:40: step 'start' task 'fetch': jump 'to' must be a task label, got {'task': 'fetch'} (at workflow[0].tool[0].spec.policy.rules[0].else.then.to)",
        ],
        id="jump-to-not-a-label",
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
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: fetch
        kind: noop
        spec:
          policy:
            rules:
              - when: outcome.status == 'error'
                then: {do: fail}
"""),
        [
            "bad.yaml:14:23: step 'start' task 'fetch': 'when' is plain text, which would always be true; write it as a template: \"{{ outcome.status == 'error' }}\" (at workflow[0].tool[0].spec.policy.rules[0].when)",
        ],
        id="rule-when-plain-text",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: calc
        kind: python
        args:
          n: "{{ workload.n | integer }}"
        code: |
          result = n
"""),
        [
            "bad.yaml:12:14: step 'start' task 'calc': template syntax error: no filter named 'integer' (at workflow[0].tool[0].args.n)",
        ],
        id="template-unknown-filter",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: calc
        kind: python
        code: |-
          x = "{{ workload.n + }}"
          result = x
"""),
        [
            "bad.yaml:12:11: step 'start' task 'calc': template syntax error: unexpected 'end of print statement' (at workflow[0].tool[0].code)",
        ],
        id="template-syntax-error-on-first-line-of-block",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: calc
        kind: python
        code: "result = 1

          # {{ workload.n + }}"
"""),
        [
            "bad.yaml:13:11: step 'start' task 'calc': template syntax error: unexpected 'end of print statement' (at workflow[0].tool[0].code)",
        ],
        id="template-syntax-error-in-multiline-quoted-string",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - name: report
        kind: noop
        result: >
          total is

          {{ workload.n }} and
          {{ workload.m + }}
"""),
        [
            "bad.yaml:14:11: step 'start' task 'report': template syntax error: unexpected 'end of print statement' (at workflow[0].tool[0].result)",
        ],
        id="template-syntax-error-in-folded-block",
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
    assert_rejected_with(text, expected)


@pytest.mark.parametrize(("text", "expected"), WARNING_CASES)
def test_warnings_do_not_reject_a_playbook(text: str, expected: list[str]) -> None:
    assert_accepted_with(text, expected)
