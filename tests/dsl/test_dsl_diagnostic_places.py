"""Conformance audit of the validator: inputs it used to accept, or report at the wrong place.

Each case asserts every diagnostic, complete with ``file:line:col``. Steps built with ``steps(...)``
start on line 7.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from dsl_support import HEADER, LIBRARY, assert_accepted_with, assert_rejected_with, steps

from noetl_stream.cli import main
from noetl_stream.dsl import compile_playbook

LOOPED_SET = """\
  - step: start
    next: {arcs: [{step: each}]}
  - step: each
    loop: {in: [1, 2], iterator: it}
    tool: {kind: noop}
    set: {ctx.n: "{{ each }}"}
    next: %s
  - step: done
    tool: {kind: noop}
"""

TASK_POLICY = """\
  - step: start
    tool:
      - name: a
        kind: noop
        spec:
          policy: %s
"""

REJECTED = [
    # 001 §13.1 / 003 §4: an arc's `when` is a template or a boolean, with or without a step `set:`
    # on a looped step (the dialect used to rewrite the plain text into an always-true expression).
    pytest.param(
        steps(LOOPED_SET % "{arcs: [{step: done, when: 'event.name == 1'}]}"),
        [
            "bad.yaml:12:5: warning: step 'each': 'set:' on a step is NoETL's; canonical: set_ctx (ctx., step. "
            "and bare keys) in the 'then' of the rules that end its pipeline (the last task's that go on, and any "
            "'break'); on a looped step, in a task of a step after the loop (at workflow[1].set)",
            "bad.yaml:13:38: step 'each': arc 'when' is plain text, which would always be true; write it "
            'as a template: "{{ event.name == 1 }}" (at workflow[1].next.arcs[0].when)',
            "bad.yaml:14:11: warning: step 'done' is not reachable from 'start' (at workflow[2].step)",
        ],
        id="looped-set-arc-when-plain-text",
    ),
    pytest.param(
        steps(LOOPED_SET % "{arcs: [{step: done, when: 7}]}"),
        [
            "bad.yaml:12:5: warning: step 'each': 'set:' on a step is NoETL's; canonical: set_ctx (ctx., step. "
            "and bare keys) in the 'then' of the rules that end its pipeline (the last task's that go on, and any "
            "'break'); on a looped step, in a task of a step after the loop (at workflow[1].set)",
            "bad.yaml:13:38: step 'each': arc 'when' must be a template string or a boolean, got 7 "
            "(at workflow[1].next.arcs[0].when)",
            "bad.yaml:14:11: warning: step 'done' is not reachable from 'start' (at workflow[2].step)",
        ],
        id="looped-set-arc-when-number",
    ),
    pytest.param(
        steps(LOOPED_SET % "{arcs: []}"),
        [
            "bad.yaml:12:5: warning: step 'each': 'set:' on a step is NoETL's; canonical: set_ctx (ctx., step. "
            "and bare keys) in the 'then' of the rules that end its pipeline (the last task's that go on, and any "
            "'break'); on a looped step, in a task of a step after the loop (at workflow[1].set)",
            "bad.yaml:13:12: step 'each': 'next' has no arcs; list the steps to go to (arcs: [{step: ...}]) "
            "or remove 'next' (at workflow[1].next.arcs)",
            "bad.yaml:14:11: warning: step 'done' is not reachable from 'start' (at workflow[2].step)",
        ],
        id="looped-set-no-arcs",
    ),
    pytest.param(
        steps(LOOPED_SET % "null"),
        [
            "bad.yaml:12:5: warning: step 'each': 'set:' on a step is NoETL's; canonical: set_ctx (ctx., step. "
            "and bare keys) in the 'then' of the rules that end its pipeline (the last task's that go on, and any "
            "'break'); on a looped step, in a task of a step after the loop (at workflow[1].set)",
            "bad.yaml:13:11: step 'each': 'next' must be a router object with 'arcs' (at workflow[1].next)",
            "bad.yaml:14:11: warning: step 'done' is not reachable from 'start' (at workflow[2].step)",
        ],
        id="looped-set-null-next",
    ),
    # 001 §13.1: `when` defaults to true when omitted; an empty `when:` is an unfinished condition.
    pytest.param(
        steps(
            """\
  - step: start
    tool: {kind: noop}
    next:
      arcs:
        - step: start
          when:
"""
        ),
        [
            "bad.yaml:12:11: step 'start': arc 'when' is empty; write a condition like \"{{ ... }}\" "
            "(or true) (at workflow[0].next.arcs[0].when)",
        ],
        id="arc-when-empty",
    ),
    # 003 §5.4: mode/before/after/finally are placeholders; rules is the only place for control
    # actions. on_unmatched: fail used to be accepted and silently run as continue; only 'continue' is.
    pytest.param(
        steps(TASK_POLICY % "{on_unmatched: fail, rules: []}"),
        [
            "bad.yaml:12:34: step 'start' task 'a': spec.policy.on_unmatched can only be 'continue' (an "
            "outcome no rule matches continues, an error too; without it such an error fails the task), "
            "got 'fail'; add an 'else' rule for another action "
            "(at workflow[0].tool[0].spec.policy.on_unmatched)",
        ],
        id="task-policy-on-unmatched-fail",
    ),
    pytest.param(
        steps(TASK_POLICY % "{mode: exclusve, rules: []}"),
        [
            "bad.yaml:12:26: step 'start' task 'a': spec.policy.mode must be one of 'exclusive', "
            "'inclusive', got 'exclusve'; did you mean 'exclusive'? (at workflow[0].tool[0].spec.policy.mode)",
        ],
        id="task-policy-mode-typo",
    ),
    pytest.param(
        steps(TASK_POLICY % "{before: [{do: retry}], after: 5, rules: []}"),
        [
            "bad.yaml:12:30: step 'start' task 'a': 'do' in spec.policy.before: hooks have no control "
            "flow in v10; control actions belong in spec.policy.rules "
            "(at workflow[0].tool[0].spec.policy.before[0].do)",
            "bad.yaml:12:50: step 'start' task 'a': spec.policy.after must be a list, got number "
            "(at workflow[0].tool[0].spec.policy.after)",
        ],
        id="task-policy-hooks",
    ),
    # A `spec` is a mapping at every scope (003 §3): '' / 0 / [] / false were taken as empty.
    pytest.param(
        steps(
            """\
  - step: start
    spec: []
    loop: {in: [1], iterator: x, spec: 0}
    tool: {kind: noop, spec: ''}
    next: {spec: false, arcs: [{step: start, spec: []}]}
"""
        ),
        [
            "bad.yaml:8:11: step 'start': 'spec' must be a mapping (at workflow[0].spec)",
            "bad.yaml:9:40: step 'start': loop 'spec' must be a mapping (at workflow[0].loop.spec)",
            "bad.yaml:10:30: step 'start' task 'start_task': 'spec' must be a mapping (at workflow[0].tool.spec)",
            "bad.yaml:11:18: step 'start': next.spec must be a mapping (at workflow[0].next.spec)",
            "bad.yaml:11:52: step 'start': arc 'spec' must be a mapping (at workflow[0].next.arcs[0].spec)",
        ],
        id="spec-falsy-non-mapping",
    ),
    pytest.param(
        steps(
            """\
  - step: start
    loop: {in: [1], iterator: x, spec: {policy: []}}
    tool: {kind: noop}
"""
        ),
        ["bad.yaml:8:49: step 'start': loop.spec.policy must be a mapping (at workflow[0].loop.spec.policy)"],
        id="loop-policy-empty-list",
    ),
    # Seconds are finite numbers: NaN never times out, infinity never retries.
    pytest.param(
        steps(
            """\
  - step: start
    spec: {policy: {lifecycle: {timeout_s: .nan, deadline_s: .inf}}}
    tool:
      kind: noop
      spec: {policy: {rules: [{else: {then: {do: retry, attempts: 2, delay: .inf}}}]}}
"""
        ),
        [
            "bad.yaml:8:44: step 'start': lifecycle.timeout_s must be a positive number of seconds, got nan "
            "(at workflow[0].spec.policy.lifecycle.timeout_s)",
            "bad.yaml:8:62: step 'start': lifecycle.deadline_s must be a positive number of seconds, got inf "
            "(at workflow[0].spec.policy.lifecycle.deadline_s)",
            "bad.yaml:11:77: step 'start' task 'start_task': 'delay' must be a number of seconds >= 0 or a "
            "template, got inf (at workflow[0].tool.spec.policy.rules[0].else.then.delay)",
        ],
        id="seconds-not-finite",
    ),
    # 001 §3 / §6.3: metadata.description and step desc are strings (they used to be str()-ed).
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: t, version: [2], description: {a: 1}}
workflow:
  - step: start
    desc: [first]
    tool: {kind: noop}
""",
        [
            "bad.yaml:3:39: metadata: 'version' must be a string or a number, got list (at metadata.version)",
            "bad.yaml:3:57: metadata: 'description' must be a string, got mapping (at metadata.description)",
            "bad.yaml:6:11: step 'start': 'desc' must be a string, got list (at workflow[0].desc)",
        ],
        id="metadata-and-desc-types",
    ),
    # 003 §5.1: limits.max_payload_bytes; the runtime ignored a value it could not use ("1MB").
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: t}
executor:
  spec:
    policy:
      limits: {max_payload_bytes: 1MB}
workflow:
  - step: start
    tool: {kind: noop}
""",
        [
            "bad.yaml:7:35: executor: limits.max_payload_bytes must be a positive integer (bytes), got '1MB' "
            "(at executor.spec.policy.limits.max_payload_bytes)",
        ],
        id="max-payload-bytes-not-an-integer",
    ),
    # `kind: workbook` runs a root workbook template (its `task`, else its own label); the worker does
    # not render `task`, so a missing name used to fail only at run time (config_error).
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: t}
workbook: {ping: {kind: noop}}
workflow:
  - step: start
    tool:
      - {name: a, kind: workbook, task: pong}
      - {name: b, kind: workbook, task: "{{ workload.t }}"}
      - {name: c, kind: workbook}
""",
        [
            "bad.yaml:8:41: step 'start' task 'a': workbook template 'pong' is not defined in the root "
            "workbook; did you mean 'ping'? (at workflow[0].tool[0].task)",
            "bad.yaml:9:41: step 'start' task 'b': 'task' must be the name of a root workbook template, got "
            "'{{ workload.t }}' (at workflow[0].tool[1].task)",
            "bad.yaml:10:9: step 'start' task 'c': workbook template 'c' is not defined in the root workbook "
            "(at workflow[0].tool[2])",
        ],
        id="workbook-template-undefined",
    ),
    # 001 §3.1: a keychain entry's kind and the executor's kind are strings (they were str()-ed, and a
    # number kind was reported as missing).
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: t}
keychain: [{name: pg, kind: 5}]
executor: {kind: [local]}
workflow:
  - step: start
    tool: {kind: noop}
""",
        [
            "bad.yaml:4:29: keychain entry 'pg': 'kind' must be a non-empty string, got 5 (at keychain[0].kind)",
            "bad.yaml:5:18: executor: 'kind' must be a string, got list (at executor.kind)",
        ],
        id="keychain-and-executor-kind-types",
    ),
    # 001 §9.2: labels are unique; a clash with a synthetic label (003 §7.2) names the unnamed task.
    pytest.param(
        steps(
            """\
  - step: start
    tool:
      - name: task_1
        kind: noop
      - kind: noop
"""
        ),
        [
            "bad.yaml:11:9: step 'start': this unnamed task gets the label 'task_1', which the task at line 9 "
            "already has; give it a 'name' (at workflow[0].tool[1])",
        ],
        id="synthetic-label-clash",
    ),
    # An empty value is reported where its key stands, not at the next line's token.
    pytest.param(
        steps(
            """\
  - step: start
    loop:
      in:
      iterator: x
    tool:
      - name: a
        kind: noop
        spec:
          policy:
      - name: b
        kind: noop
"""
        ),
        [
            "bad.yaml:9:7: step 'start': loop 'in' must be a list or a template, got null "
            "(at workflow[0].loop.in)",
            "bad.yaml:15:11: step 'start' task 'a': spec.policy must be an object with a required 'rules:' "
            "list (003 §5.4) (at workflow[0].tool[0].spec.policy)",
        ],
        id="empty-values-located-at-their-key",
    ),
    # YAML a reader refuses: the position of the offending character, not 1:1.
    pytest.param(
        steps("  - step: st\x01art\n    tool: {kind: noop}\n"),
        [
            f"bad.yaml:7:13: YAML syntax error: {LIBRARY} (at <root>)",
        ],
        id="control-character-located",
    ),
    # A node that contains itself: ruamel builds it as null ("'next' has no arcs" was reported).
    pytest.param(
        HEADER
        + """\
  &w
  - step: start
    tool: {kind: noop}
    next: {arcs: *w}
""",
        [
            "bad.yaml:7:3: YAML syntax error: recursive alias: the node anchored here contains itself "
            "(at <root>)",
        ],
        id="recursive-alias",
    ),
]


@pytest.mark.parametrize(("text", "expected"), REJECTED)
def test_rejected_with_a_located_message(text: str, expected: list[str]) -> None:
    assert_rejected_with(text, expected)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            steps(TASK_POLICY % "{mode: inclusive, on_unmatched: continue, before: [], rules: []}"),
            id="placeholders",
        ),
        pytest.param(steps("  - step: start\n    spec:\n    tool: {kind: noop, spec: }\n"), id="spec-null"),
        pytest.param(
            steps(
                "  - step: start\n    tool: {kind: noop}\n    next: {arcs: [{step: after, when: true}]}\n"
                "  - step: after\n    tool: {kind: noop}\n"
            ),
            id="when-true",
        ),
        pytest.param(
            HEADER.replace("workflow:\n", "workbook: [{name: ping, tool: {kind: noop}}]\nworkflow:\n")
            + "  - step: start\n    tool: [{name: ping, kind: workbook}, {kind: workbook, task: ping}]\n",
            id="workbook-refs",
        ),
        pytest.param(
            steps(LOOPED_SET % "{arcs: [{step: done, when: \"{{ event.name == 'loop.done' }}\"}]}"),
            id="looped-set",
        ),
    ],
)
def test_the_v10_values_of_the_same_places_still_compile(text: str) -> None:
    result = compile_playbook(text, "bad.yaml")  # (a step `set:` is NoETL's: a `dialect` warning names it)
    assert result.playbook is not None
    assert [d.format() for d in result.diagnostics if d.code != "dialect"] == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # 001 §4: `outcome` and the pipeline locals exist in task policy evaluation only, `event`
        # in routing and admission only; elsewhere the strict template renderer fails at run time.
        pytest.param(
            steps(
                """\
  - step: start
    tool: {kind: noop}
    next: {arcs: [{step: start, when: "{{ outcome.status == 'ok' }}"}]}
"""
            ),
            [
                "bad.yaml:9:39: warning: step 'start': an arc cannot read 'outcome' (only task policy rules "
                "see the outcome); it is undefined here (at workflow[0].next.arcs[0].when)",
            ],
            id="arc-reads-outcome",
        ),
        pytest.param(
            steps(
                """\
  - step: start
    spec: {policy: {admit: {rules: [{when: "{{ _prev.ok }}", then: {allow: true}}, {else: {then: {allow: false}}}]}}}
    tool:
      kind: noop
      spec: {policy: {rules: [{when: "{{ event.name == 'step.done' }}", then: {do: fail}}]}}
"""
            ),
            [
                "bad.yaml:8:44: warning: step 'start': an admission rule cannot read '_prev' (a pipeline "
                "local); it is undefined here (at workflow[0].spec.policy.admit.rules[0].when)",
                "bad.yaml:11:38: warning: step 'start' task 'start_task': a task cannot read 'event' (only "
                "routing and admission see the boundary event); it is undefined here "
                "(at workflow[0].tool.spec.policy.rules[0].when)",
            ],
            id="admission-reads-prev-task-reads-event",
        ),
        pytest.param(
            steps(
                """\
  - step: start
    loop: {in: "{{ [1, 2] }}", iterator: x}
    tool: {kind: noop}
    next:
      arcs:
        - {step: a, when: "{{ event.name == 'step.done' }}"}
        - {step: a, when: "{{ event.name in ['step.done', 'loop.done'] }}"}
  - step: a
    tool: {kind: noop}
"""
            ),
            [
                "bad.yaml:12:27: warning: step 'start': a step with a loop ends with 'loop.done' (or "
                "'step.failed'), never 'step.done': this condition never matches it; test event.name == "
                "'loop.done' (at workflow[0].next.arcs[0].when)",
            ],
            id="looped-step-arc-tests-step-done",
        ),
        pytest.param(
            HEADER.replace("workflow:\n", "keychain: [{name: tok, kind: secret_manager}]\nworkflow:\n")
            + "  - step: start\n    tool: {kind: noop}\n"
            + "    next: {arcs: [{step: start, when: \"{{ keychain.tok.value == 'x' }}\"}]}\n",
            [
                "bad.yaml:10:39: warning: step 'start': an arc cannot read 'keychain' (credentials reach only "
                "the worker that runs a step's tasks, never the controller); it is undefined here "
                "(at workflow[0].next.arcs[0].when)",
            ],
            id="arc-reads-keychain",
        ),
        pytest.param(
            HEADER
            + '  - step: start\n    loop: {in: "{{ [1] }}", iterator: x}\n    tool: {kind: noop}\n'
            + '    next: {arcs: [{step: b, when: "{{ iter.x == 1 }}"}]}\n'
            + "  - step: b\n    tool: {kind: noop}\n",
            [
                "bad.yaml:10:35: warning: step 'start': an arc cannot read 'iter' (a loop iteration exists "
                "only in the looped step's tasks; a loop's arcs see its loop.done); it is undefined here "
                "(at workflow[0].next.arcs[0].when)",
            ],
            id="arc-reads-iter",
        ),
        pytest.param(
            HEADER.replace("workflow:\n", "workload: {outcome: 1}\nworkflow:\n")
            + "  - step: start\n    tool: {kind: noop}\n    next: {arcs: [{step: start, when: '{{ outcome }}'}]}\n",
            [
                "bad.yaml:10:39: warning: step 'start': the arc back to 'start' is taken when its 'when' is true "
                "on any boundary, step.failed too, and a failure does not change what it tests: a step that "
                "keeps failing re-enters the cycle until the execution ends (the controller ends it after 10 "
                'failures of one step in a row); to loop on success only, write "{{ outcome and event.name != '
                "'step.failed' }}\" (at workflow[0].next.arcs[0].when)"
            ],
            id="a-workload-key-of-that-name-is-readable",
        ),
    ],
)
def test_templates_that_cannot_work_where_they_stand_are_warned(text: str, expected: list[str]) -> None:
    assert_accepted_with(text, expected)


def test_validate_cli_reports_a_recursive_alias_with_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(HEADER + "  &w\n  - step: start\n    next: {arcs: *w}\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["validate", str(bad)])
    assert result.exit_code == 2
    assert f"{bad}:7:3: YAML syntax error: recursive alias" in result.output


def test_validate_cli_locates_a_byte_that_is_not_utf8(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(
        HEADER.encode() + '  - step: start\n    desc: "d\u00e9j\u00e0 \xe9t\u00e9"\n'.encode("latin-1")
    )
    result = CliRunner().invoke(main, ["validate", str(bad)])
    assert result.exit_code == 2
    assert result.output == f"{bad}:8:13: the file is not UTF-8: byte 0xe9 cannot be decoded\n"


@pytest.mark.parametrize(
    ("workflow", "expected"),
    [
        pytest.param(
            "  - step: start\n    tool: {kind: noop}\n    next: {arcs: [{step: a}]}\n"
            "  - step: a\n    tool: {kind: noop}\n    next: {arcs: [{step: b}]}\n"
            "  - step: b\n    tool: {kind: noop}\n    next: {arcs: [{step: a}]}\n",
            ["a -> b -> a"],
            id="two-steps",
        ),
        pytest.param(
            "  - step: start\n    tool: {kind: noop}\n    next: {arcs: [{step: start, when: true}, {step: x}]}\n"
            "  - step: x\n    tool: {kind: noop}\n",
            ["start -> start"],
            id="self-loop-first-of-exclusive",
        ),
        pytest.param(
            "  - step: start\n    tool: {kind: noop}\n"
            '    next: {arcs: [{step: x, when: "{{ ctx.done }}"}, {step: start}]}\n'
            "  - step: x\n    tool: {kind: noop}\n",
            [],
            id="a-condition-can-leave-it",
        ),
        pytest.param(
            "  - step: start\n    tool: {kind: noop}\n    next: {arcs: [{step: a}]}\n"
            '  - step: a\n    spec: {policy: {admit: {rules: [{when: "{{ args.n < 3 }}", then: {allow: true}}]}}}\n'
            '    tool: {kind: noop}\n    next: {arcs: [{step: a, args: {n: "{{ args.n + 1 }}"}}]}\n',
            [],
            id="admission-can-stop-it",
        ),
    ],
)
def test_a_cycle_that_can_never_end_is_warned(workflow: str, expected: list[str]) -> None:
    result = compile_playbook(steps(workflow), "t.yaml")
    assert result.errors == ()
    found = [
        d.message.split("steps ", 1)[1].split(" route", 1)[0]
        for d in result.warnings
        if d.code == "endless-cycle"
    ]
    assert found == expected
