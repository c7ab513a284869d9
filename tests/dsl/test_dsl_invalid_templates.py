"""Invalid playbooks, inside a step: templates (syntax, tags, filters, located in every YAML scalar
style), and the warnings that do not reject a playbook (label-as-key tasks, names no scope defines).

Each case asserts every diagnostic, complete with file:line:col, text and YAML path; Jinja's account of a
syntax error is not ours, and any text stands for it (`LIBRARY`).
"""

from __future__ import annotations

import pytest
from dsl_support import LIBRARY, assert_accepted_with, assert_rejected_with, steps

CASES = [
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
            f"bad.yaml:11:19: step 'start' task 'calc': template syntax error: {LIBRARY} (at workflow[0].tool[0].args.n)",
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
            f"bad.yaml:13:11: step 'start' task 'query': template syntax error: {LIBRARY} (at workflow[0].tool[0].query)",
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
            f"bad.yaml:12:17: step 'start': template syntax error: {LIBRARY} (at workflow[0].next.arcs[0].when)",
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
            f"bad.yaml:15:11: step 'start' task 'calc': template syntax error: {LIBRARY} (at workflow[0].tool[0].code)",
        ],
        id="template-unknown-tag",
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
            f"bad.yaml:12:11: step 'start' task 'calc': template syntax error: {LIBRARY} (at workflow[0].tool[0].code)",
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
            f"bad.yaml:13:11: step 'start' task 'calc': template syntax error: {LIBRARY} (at workflow[0].tool[0].code)",
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
            f"bad.yaml:14:11: step 'start' task 'report': template syntax error: {LIBRARY} (at workflow[0].tool[0].result)",
        ],
        id="template-syntax-error-in-folded-block",
    ),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_invalid_playbook_is_reported_exactly(text: str, expected: list[str]) -> None:
    assert_rejected_with(text, expected)


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
            "bad.yaml:14:16: warning: step 'start' task 'fetch': '{{ item }}' reads the loop's item bare (NoETL's); canonical: 'iter.item' (at workflow[0].tool[0].fetch.url)",
            "bad.yaml:15:9: warning: step 'start': task 'store' uses the label-as-key shape; write it as '- name: store' with 'kind: ...' (003 §7) (at workflow[0].tool[1].store)",
            "bad.yaml:17:19: warning: step 'start' task 'store': template reads 'fetchh', which is not defined in any scope; did you mean 'fetch'? (at workflow[0].tool[1].store.result)",
        ],
        id="label-as-key-warnings-the-item-bare-and-undefined-names",
    ),
]


@pytest.mark.parametrize(("text", "expected"), WARNING_CASES)
def test_warnings_do_not_reject_a_playbook(text: str, expected: list[str]) -> None:
    assert_accepted_with(text, expected)
