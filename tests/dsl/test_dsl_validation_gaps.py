"""Validation gaps a conformance probe found: conditions that are always true, event names that never
occur, legacy advice that does not apply, label-as-key tasks written wrong, admission that admits all.

Each case asserts every diagnostic, complete with file:line:col, text and YAML path.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from dsl_support import LIBRARY, assert_accepted_with, assert_rejected_with, steps

from noetl_stream.dsl import compile_playbook
from noetl_stream.dsl.templates import evaluate_when

HOW = (
    "(enable legacy extensions to translate it): validate or run with --legacy, or declare "
    "executor.spec.extensions: [legacy]"
)
MIXED = (
    "must be one '{{ ... }}' expression: text around or between expressions makes it render to a string "
    "(such as 'False and False'), which counts as true; write"
)

# -- 1. a `when` is one expression ------------------------------------------------------------------


def test_two_expressions_joined_by_text_render_to_a_true_string() -> None:
    """Why it is an error: the text renders as 'False and False', which is true."""
    assert evaluate_when("{{ a }} and {{ b }}", {"a": False, "b": False}) is True
    assert evaluate_when("{{ a and b }}", {"a": False, "b": False}) is False


def test_a_when_of_several_expressions_is_an_error_showing_the_one_expression() -> None:
    assert_rejected_with(
        steps("""\
  - step: start
    spec:
      policy:
        admit:
          rules:
            - when: "{{ workload.a }} and {{ workload.b }}"
              then: {allow: true}
            - else: {then: {allow: false}}
    tool:
      - name: t
        kind: noop
        spec:
          policy:
            rules:
              - when: "{{ workload.a or workload.b }} and not {{ workload.c }}"
                then: {do: fail}
    next:
      arcs:
        - step: start
          when: "{{ workload.a }} or {{ workload.b }}"
"""),
        [
            f"bad.yaml:12:21: step 'start': 'when' {MIXED} \"{{{{ workload.a and workload.b }}}}\" "
            "(at workflow[0].spec.policy.admit.rules[0].when)",
            f"bad.yaml:21:23: step 'start' task 't': 'when' {MIXED} "
            '"{{ (workload.a or workload.b) and not workload.c }}" '
            "(at workflow[0].tool[0].spec.policy.rules[0].when)",
            f"bad.yaml:26:17: step 'start': arc 'when' {MIXED} \"{{{{ workload.a or workload.b }}}}\" "
            "(at workflow[0].next.arcs[0].when)",
        ],
    )


def test_a_when_with_a_statement_or_text_that_is_no_expression_is_an_error() -> None:
    assert_rejected_with(
        steps("""\
  - step: start
    tool: {kind: noop}
    next:
      arcs:
        - step: start
          when: "{% if workload.go %}true{% endif %}"
        - step: start
          when: "go: {{ workload.go }}"
"""),
        [
            "bad.yaml:12:17: step 'start': arc 'when' must be one '{{ ... }}' expression: a '{% ... %}' "
            "statement makes it render to text, which counts as true unless it is empty or spells false; "
            'write the whole condition in one, e.g. "{{ workload.a and workload.b }}" '
            "(at workflow[0].next.arcs[0].when)",
            f"bad.yaml:14:17: step 'start': arc 'when' {MIXED} the whole condition in one, e.g. "
            '"{{ workload.a and workload.b }}" (at workflow[0].next.arcs[1].when)',
        ],
    )


def test_a_mixed_arc_condition_on_a_looped_step_with_set_is_reported_not_rewritten() -> None:
    """The dialect's step ``set:`` moves a looped step's arcs; it must not hide the condition in one."""
    assert_rejected_with(
        steps("""\
  - step: start
    loop: {in: "{{ [1, 2] }}", iterator: x}
    tool: {kind: noop}
    set: {ctx.n: 1}
    next:
      arcs:
        - step: start
          when: "{{ workload.a }} and {{ workload.b }}"
"""),
        [
            f"bad.yaml:10:5: warning: step 'start': {LIBRARY} (at workflow[0].set)",  # (dialect)
            f"bad.yaml:14:17: step 'start': arc 'when' {MIXED} \"{{{{ workload.a and workload.b }}}}\" "
            "(at workflow[0].next.arcs[0].when)",
        ],
    )


def test_one_expression_with_whitespace_around_it_stays_valid() -> None:
    assert_accepted_with(
        steps("""\
  - step: start
    tool: {kind: noop}
    next:
      arcs:
        - {step: a, when: " {{ workload.a }} "}
        - {step: a, when: "{{- workload.a -}}"}
        - {step: a, when: true}
        - step: a
          when: >-
            {{ workload.a
            and workload.b }}
        - step: a
          when: |
            {{ workload.a }}
  - step: a
    tool: {kind: noop}
"""),
        [],
    )


# -- 2. event.name is compared with names it can have -----------------------------------------------


def test_event_names_that_never_occur_at_an_arc_are_errors() -> None:
    assert_rejected_with(
        steps("""\
  - step: start
    tool: {kind: noop}
    next:
      spec: {mode: inclusive}
      arcs:
        - {step: a, when: "{{ event.name == 'step.finished' }}"}
        - {step: a, when: "{{ event.name == 'StepCompleted' }}"}
        - {step: a, when: "{{ event.name == 'loop.done' }}"}
        - {step: a, when: "{{ event.name != 'loop.done' }}"}
        - {step: a, when: "{{ event.name in ['step.done', 'step.exited'] }}"}
        - {step: a, when: "{{ 'step.ok' == event.name }}"}
  - step: a
    tool: {kind: noop}
"""),
        [
            "bad.yaml:12:27: step 'start': event.name is never 'step.finished' in this step's arcs: it is "
            "'step.done' or 'step.failed' (at workflow[0].next.arcs[0].when)",
            "bad.yaml:13:27: step 'start': event.name is never 'StepCompleted' in this step's arcs: it is "
            "'step.done' or 'step.failed' (the CamelCase event names are 000's; v10 names are dotted and "
            "lower case) (at workflow[0].next.arcs[1].when)",
            "bad.yaml:14:27: step 'start': event.name is never 'loop.done' in this step's arcs: it is "
            "'step.done' or 'step.failed' (loop.done ends a step with a loop; this one has none) "
            "(at workflow[0].next.arcs[2].when)",
            "bad.yaml:15:27: step 'start': event.name is never 'loop.done' in this step's arcs: it is "
            "'step.done' or 'step.failed' (loop.done ends a step with a loop; this one has none) "
            "(at workflow[0].next.arcs[3].when)",
            "bad.yaml:16:27: step 'start': event.name is never 'step.exited' in this step's arcs: it is "
            "'step.done' or 'step.failed' (at workflow[0].next.arcs[4].when)",
            "bad.yaml:17:27: step 'start': event.name is never 'step.ok' in this step's arcs: it is "
            "'step.done' or 'step.failed' (at workflow[0].next.arcs[5].when)",
        ],
    )


def test_event_names_that_never_occur_at_an_admission_rule_are_errors() -> None:
    assert_rejected_with(
        steps("""\
  - step: start
    tool: {kind: noop}
    next: {arcs: [{step: a}]}
  - step: a
    spec:
      policy:
        admit:
          rules:
            - when: "{{ event.name == 'step.finished' }}"
              then: {allow: true}
            - when: "{{ event.name == 'loop.done' }}"
              then: {allow: true}
            - else: {then: {allow: false}}
    tool: {kind: noop}
"""),
        [
            "bad.yaml:15:21: step 'a': event.name is never 'step.finished' in an admission rule of this "
            "step: it is 'step.done' or 'step.failed' (at workflow[1].spec.policy.admit.rules[0].when)",
            "bad.yaml:17:21: step 'a': event.name is never 'loop.done' in an admission rule of this step: "
            "it is 'step.done' or 'step.failed' (at workflow[1].spec.policy.admit.rules[1].when)",
        ],
    )


def test_event_names_a_step_can_see_stay_valid() -> None:
    """A looped step's arcs see loop.done; a generic test that lists a name this step never has next to
    one it has (the legacy translation of call.done) works; admission after a loop sees loop.done."""
    assert_accepted_with(
        steps("""\
  - step: start
    tool: {kind: noop}
    next:
      spec: {mode: inclusive}
      arcs:
        - {step: each, when: "{{ event.name == 'step.done' }}"}
        - {step: each, when: "{{ event.name in ['step.done', 'loop.done'] }}"}
        - {step: each, when: "{{ event.name not in ['step.failed'] }}"}
  - step: each
    loop: {in: "{{ [1, 2] }}", iterator: x}
    tool: {kind: noop}
    next:
      arcs:
        - {step: after, when: "{{ event.name == 'loop.done' }}"}
        - {step: after, when: "{{ event.name == 'step.failed' }}"}
  - step: after
    spec:
      policy:
        admit:
          rules:
            - when: "{{ event.name == 'loop.done' }}"
              then: {allow: true}
            - else: {then: {allow: false}}
    tool: {kind: noop}
"""),
        [],
    )


def test_the_legacy_call_done_alias_on_a_step_without_a_loop_still_translates() -> None:
    text = steps("""\
  - step: start
    tool: {kind: noop}
    next: [{step: a, when: "{{ event.name == 'call.done' }}"}]
  - step: a
    tool: {kind: noop}
""")
    result = compile_playbook(text, "old.yaml", extensions=("legacy",))
    assert result.errors == ()


# -- 3. legacy advice only where it helps, and how to enable it ------------------------------------


def _messages(text: str, *, legacy: bool = False) -> list[str]:
    result = compile_playbook(text, "old.yaml", extensions=("legacy",) if legacy else ())
    return [d.message for d in result.errors]


CONSTRUCTS = [
    # (id, steps or a root key, whether the legacy extension translates it)
    ("root-vars", "vars: {a: 1}\n", False),
    ("root-version", "version: '1'\n", True),
    ("step-when", '  - step: start\n    when: "{{ true }}"\n    tool: {kind: noop}\n', True),
    ("step-retry", "  - step: start\n    tool: {kind: noop}\n    retry: {max_attempts: 2}\n", True),
    (
        "step-eval",
        '  - step: start\n    tool: {kind: noop}\n    eval: [{expr: "{{ true }}", do: continue}]\n',
        False,
    ),
    ("step-pipe", "  - step: start\n    tool: {kind: noop}\n    pipe: []\n", False),
    ("next-mode", "  - step: start\n    spec: {next_mode: exclusive}\n    tool: {kind: noop}\n", True),
    ("task-when", '  - step: start\n    tool: {kind: noop, when: "{{ true }}"}\n', False),
    ("task-vars", "  - step: start\n    tool: {kind: noop, vars: {a: 1}}\n", False),
    ("task-expr", '  - step: start\n    tool: {kind: noop, expr: "{{ true }}"}\n', False),
    (
        "task-eval",
        '  - step: start\n    tool: {kind: noop, eval: [{expr: "{{ true }}", do: continue}]}\n',
        True,
    ),
    (
        "rule-expr",
        '  - step: start\n    tool: {kind: noop, spec: {policy: {rules: [{expr: "{{ true }}", '
        "then: {do: continue}}]}}}\n",
        True,
    ),
    (
        "admit-rule-expr",
        '  - step: start\n    spec: {policy: {admit: {rules: [{expr: "{{ true }}", then: {allow: true}}]}}}\n'
        "    tool: {kind: noop}\n",
        False,
    ),
    (
        "arc-expr",
        '  - step: start\n    tool: {kind: noop}\n    next: {arcs: [{step: start, expr: "{{ true }}"}]}\n',
        False,
    ),
    (
        "then-set-shared",
        "  - step: start\n    tool: {kind: noop, spec: {policy: {rules: [{else: {then: {do: continue, "
        "set_shared: {a: 1}}}}]}}}\n",
        True,
    ),
    (
        "workbook-eval",
        "  - step: start\n    tool: {kind: workbook, task: w}\nworkbook:\n  w: {kind: noop, eval: []}\n",
        False,
    ),
]


@pytest.mark.parametrize(("text", "translated"), [pytest.param(t, tr, id=i) for i, t, tr in CONSTRUCTS])
def test_legacy_is_suggested_exactly_for_what_it_translates(text: str, translated: bool) -> None:
    playbook = (
        steps("  - step: start\n    tool: {kind: noop}\n").replace("workflow:\n", text + "workflow:\n")
        if not text.startswith("  ")
        else steps(text)
    )
    plain = _messages(playbook)
    assert plain, "the construct is rejected without the extension"
    suggests = [m for m in plain if "enable legacy extensions" in m]
    with_legacy = _messages(playbook, legacy=True)
    assert not with_legacy if translated else with_legacy  # the table above is the truth ...
    assert bool(suggests) == translated  # ... and the advice follows it
    assert all(HOW in m for m in suggests)


def test_untranslated_constructs_name_only_their_replacement() -> None:
    assert_rejected_with(
        steps("""\
  - step: start
    tool:
      - name: t
        kind: noop
        when: "{{ true }}"
""").replace("workflow:\n", "vars: {a: 1}\nworkflow:\n"),
        [
            "bad.yaml:6:1: root 'vars' is not part of noetl.io/v2 (v10); use ctx (set_ctx in task policies) "
            "for mutable state and workload for inputs (at vars)",
            "bad.yaml:12:9: step 'start' task 't': 'when' is not part of noetl.io/v2 (v10); use "
            "spec.policy.rules (outcome control) or the step's spec.policy.admit (admission) "
            "(at workflow[0].tool[0].when)",
        ],
    )


BARE = """\
- step: start
  when: "{{ true }}"
  tool: {kind: noop}
"""


def test_a_list_of_steps_is_not_a_playbook_with_or_without_the_extension() -> None:
    not_a_playbook = (
        "this document is a list of steps, not a playbook: a playbook is a mapping with apiVersion, kind, "
        "metadata and workflow (put the steps under 'workflow:')"
    )
    assert _messages(BARE) == [
        not_a_playbook,
        f"step 'start': 'when' is not part of noetl.io/v2 (v10); use spec.policy.admit.rules {HOW}",
    ]
    assert _messages(BARE, legacy=True) == [
        f"{not_a_playbook}; the legacy extension translates only a playbook",
        "step 'start': 'when' is not part of noetl.io/v2 (v10); use spec.policy.admit.rules (the legacy "
        "extension translates it only in a playbook, not in a list of steps)",
    ]


def test_a_scalar_document_is_not_a_playbook() -> None:
    assert _messages("42\n") == [
        "this document is a number, not a playbook: a playbook is a mapping with apiVersion, kind, "
        "metadata and workflow"
    ]


# -- 4. label-as-key tasks ----------------------------------------------------------------------------


def test_keys_beside_a_label_are_an_error_that_says_where_they_belong() -> None:
    assert_rejected_with(
        steps("""\
  - step: start
    tool:
      - fetch:
          kind: noop
        spec:
          policy:
            rules:
              - else: {then: {do: continue}}
      - one: {kind: noop}
        two: {kind: noop}
      - url: http://x
        headers: {kind: not-a-label}
"""),
        [
            "bad.yaml:11:9: step 'start': 'spec' stands beside the label of task 'fetch'; the keys of a "
            "label-as-key task belong inside it: indent 'spec' under 'fetch:' (or write '- name: fetch' "
            "with 'kind: ...' and its keys) (at workflow[0].tool[0].spec)",
            "bad.yaml:16:9: step 'start': one list item holds the label-as-key tasks 'one', 'two'; each "
            "task is a list item of its own: '- two: ...' (at workflow[0].tool[1].two)",
            "bad.yaml:17:9: step 'start' task 'task_2': missing 'kind' (one of duckdb, http, noop, playbook, "
            "postgres, python, script, secrets, workbook) (at workflow[0].tool[2])",
        ],
    )


def test_a_name_inside_a_label_as_key_task_is_an_error() -> None:
    assert_rejected_with(
        steps("""\
  - step: start
    tool:
      - fetch:
          name: other
          kind: noop
"""),
        [
            "bad.yaml:9:9: warning: step 'start': task 'fetch' uses the label-as-key shape; write it as "
            "'- name: fetch' with 'kind: ...' (003 §7) (at workflow[0].tool[0].fetch)",
            "bad.yaml:10:11: step 'start': task 'fetch' has a 'name' inside its label-as-key body; the "
            "label is the task's name: remove 'name: other' (or write the task as '- name: ...' with "
            "'kind: ...') (at workflow[0].tool[0].fetch.name)",
        ],
    )


def test_errors_about_a_label_stay_at_the_label() -> None:
    """The label-as-key form is rewritten before validation: what is said about the label points at it."""
    assert_rejected_with(
        steps("""\
  - step: start
    tool:
      - fetch:
          kind: noop
      - workload:
          kind: noop
      - fetch: {kind: noop}
"""),
        [
            "bad.yaml:9:9: warning: step 'start': task 'fetch' uses the label-as-key shape; write it as "
            "'- name: fetch' with 'kind: ...' (003 §7) (at workflow[0].tool[0].fetch)",
            "bad.yaml:11:9: step 'start' task 'workload': the name 'workload' is reserved for a template "
            "scope (at workflow[0].tool[1].workload)",
            "bad.yaml:11:9: warning: step 'start': task 'workload' uses the label-as-key shape; write it "
            "as '- name: workload' with 'kind: ...' (003 §7) (at workflow[0].tool[1].workload)",
            "bad.yaml:13:9: step 'start': task label 'fetch' is used twice in this pipeline (first at "
            "line 9) (at workflow[0].tool[2].fetch)",
            "bad.yaml:13:9: warning: step 'start': task 'fetch' uses the label-as-key shape; write it as "
            "'- name: fetch' with 'kind: ...' (003 §7) (at workflow[0].tool[2].fetch)",
        ],
    )


def test_show_canonical_writes_label_as_key_tasks_with_a_name(tmp_path: Path) -> None:
    path = tmp_path / "labels.yaml"
    path.write_text(
        steps("""\
  - step: start
    tool:
      - fetch:
          kind: python
          code: "result = 1"
      - use: {kind: noop}
  - step: single
    tool:
      one: {kind: noop}
""")
    )
    cli = Path(sys.executable).parent / "noetl-stream"
    proc = subprocess.run(
        [str(cli), "validate", "--show-canonical", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    shown = proc.stdout.split("canonical form\n", 1)[1]
    assert shown.split("workflow:\n", 1)[1] == (
        "  - step: start\n"
        "    tool:\n"
        "      - name: fetch\n"
        "        kind: python\n"
        "        code: result = 1\n"
        "      - name: use\n"
        "        kind: noop\n"
        "  - step: single\n"
        "    tool:\n"
        "      name: one\n"
        "      kind: noop\n"
        f"{path}: ok (t, 2 steps)\n"
    )


# -- 5. admission that admits everything ------------------------------------------------------------

ADMITS_ALL = (
    "when no rule matches, the step is admitted, so this gate lets every event through; add "
    "'- else: {then: {allow: false}}' to admit only what a rule matches"
)


def test_admission_rules_that_only_allow_without_else_are_warned() -> None:
    assert_accepted_with(
        steps("""\
  - step: start
    spec:
      policy:
        admit:
          rules:
            - when: "{{ workload.run }}"
              then: {allow: true}
    tool: {kind: noop}
    next: {arcs: [{step: a}]}
  - step: a
    spec: {policy: {admit: {rules: []}}}
    tool: {kind: noop}
""").replace("workflow:\n", "workload: {run: false}\nworkflow:\n"),
        [
            f"bad.yaml:12:11: warning: step 'start': every admission rule allows and there is no 'else': "
            f"{ADMITS_ALL} (at workflow[0].spec.policy.admit.rules)",
            f"bad.yaml:18:29: warning: step 'a': admission has no rules: {ADMITS_ALL} "
            "(at workflow[1].spec.policy.admit.rules)",
        ],
    )


@pytest.mark.parametrize(
    "rules",
    [
        '[{when: "{{ workload.run }}", then: {allow: true}}, {else: {then: {allow: false}}}]',
        '[{when: "{{ workload.run }}", then: {allow: false}}]',
        '[{when: "{{ workload.run }}", then: {allow: true}}, {else: {then: {allow: true}}}]',
    ],
    ids=["else-denies", "a-rule-denies", "explicit-else-allows"],
)
def test_admission_that_can_deny_or_says_so_is_not_warned(rules: str) -> None:
    assert_accepted_with(
        steps(f"""\
  - step: start
    spec: {{policy: {{admit: {{rules: {rules}}}}}}}
    tool: {{kind: noop}}
""").replace("workflow:\n", "workload: {run: false}\nworkflow:\n"),
        [],
    )
