"""``validate`` warns (code ``semantics``) where a playbook written for the earlier defaults means
something else now: an arc without ``when`` that a failure the playbook expects used to take, and a
policy without ``else`` whose rules leave some errors unmatched. Plain playbooks are not warned about."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers import playbook
from procs import NOETL_STREAM

from noetl_stream.dsl import compile_playbook

RETRIED = """
- step: start
  tool:
    - name: get
      kind: python
      code: "result = 1"
      spec:
        policy:
          rules:
            - when: "{{ outcome.status == 'error' }}"
              then: {do: retry, attempts: 3}
  next:
    arcs:
      - step: report
- step: report
  tool: {kind: noop}
"""

ROUTE_WARNING = (
    "t.yaml:17:11: warning: step 'start': the arc to 'report' has no 'when', so it is taken only when the "
    "step succeeds (it used to be taken on step.failed too), and the playbook expects this step to fail "
    "(its task 'get' can fail: its policy's rules[0] says retry). Such a failure now fails the execution "
    "unless an arc with a 'when' takes it; to route it to 'report' as before, add "
    "{step: report, when: \"{{ event.name == 'step.failed' }}\"} (at workflow[0].next.arcs[0])"
)


def semantics(text: str) -> list[str]:
    result = compile_playbook(text, "t.yaml")
    assert result.errors == (), [d.format() for d in result.errors]
    return [d.format() for d in result.warnings if d.code == "semantics"]


def test_a_plain_arc_after_a_step_whose_policy_can_fail_it_is_warned_where_it_stands() -> None:
    assert semantics(playbook(RETRIED)) == [ROUTE_WARNING]


def test_the_warning_says_where_with_validate(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(playbook(RETRIED))

    proc = subprocess.run([NOETL_STREAM, "validate", str(path)], capture_output=True, text=True, timeout=60)

    assert proc.returncode == 0, proc.stderr
    assert ROUTE_WARNING.replace("t.yaml", str(path)) in proc.stdout.splitlines()


@pytest.mark.parametrize(
    ("workflow", "at", "why"),
    [
        pytest.param(
            """
            - step: start
              tool: {kind: python, code: "result = 1"}
              next:
                arcs:
                  - {step: fine, when: "{{ event.name == 'step.done' }}"}
                  - {step: oops}
            """,
            "arcs[1]",
            "its arcs test which boundary ended it",
            id="fallback-after-a-success-arc",
        ),
        pytest.param(
            """
            - step: start
              tool: {kind: python, code: "result = 1"}
              next:
                arcs:
                  - {step: oops, args: {why: "{{ event.error.message }}"}}
            """,
            "arcs[0]",
            "its arcs test which boundary ended it",
            id="args-read-the-error",
        ),
        pytest.param(
            """
            - step: start
              tool: {kind: python, code: "result = 1"}
              next: {arcs: [{step: gate}]}
            - step: gate
              spec:
                policy:
                  admit:
                    rules:
                      - {when: "{{ event.status == 'error' }}", then: {allow: true}}
                      - else: {then: {allow: false}}
              tool: {kind: noop}
            """,
            "arcs[0]",
            "step 'gate' admits on a failure",
            id="target-admits-on-the-failure",
        ),
        pytest.param(
            """
            - step: start
              tool:
                kind: python
                code: "result = 1"
                spec: {policy: {rules: [{when: "{{ outcome.result == 0 }}", then: {do: fail}}]}}
              next: {arcs: [{step: oops}]}
            """,
            "arcs[0]",
            "its task 'start_task' can fail: its policy's rules[0] says fail",
            id="policy-fails",
        ),
    ],
)
def test_what_shows_the_playbook_expects_the_failure(workflow: str, at: str, why: str) -> None:
    text = playbook(workflow) + "  - {step: fine, tool: {kind: noop}}\n  - {step: oops, tool: {kind: noop}}\n"
    (warning,) = semantics(text)
    assert f"the playbook expects this step to fail ({why})" in warning
    assert warning.endswith(f"(at workflow[0].next.{at})")


def test_an_inclusive_router_names_every_plain_arc_in_one_warning() -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: python, code: "result = 1", spec: {policy: {rules: [{else: {then: {do: fail}}}]}}}
          next:
            spec: {mode: inclusive}
            arcs:
              - {step: a}
              - {step: handle, when: "{{ event.name == 'step.failed' }}"}
              - {step: b}
        - {step: a, tool: {kind: noop}}
        - {step: b, tool: {kind: noop}}
        - {step: handle, tool: {kind: noop}}
        """
    )
    (warning,) = semantics(text)
    assert "the arcs to 'a' and 'b' have no 'when', so they are taken only when the step succeeds" in warning
    assert warning.endswith("(at workflow[0].next.arcs[0])")


@pytest.mark.parametrize(
    "workflow",
    [
        pytest.param(
            """
            - step: start
              tool: {kind: python, code: "raise ValueError('x')"}
              next: {arcs: [{step: end}]}
            """,
            id="a-plain-step-with-a-plain-arc",
        ),
        pytest.param(
            """
            - step: start
              tool: {kind: python, code: "result = 1", spec: {policy: {rules: [{else: {then: {do: fail}}}]}}}
              next:
                arcs:
                  - {step: end, when: "{{ event.name == 'step.failed' }}"}
                  - {step: end}
            """,
            id="an-earlier-arc-takes-every-failure",
        ),
        pytest.param(
            """
            - step: start
              tool: {kind: python, code: "result = 1", spec: {policy: {rules: [{else: {then: {do: fail}}}]}}}
              next: {arcs: [{step: end, when: "{{ event.name == 'step.done' }}"}]}
            """,
            id="the-arc-has-a-when",
        ),
        pytest.param(
            """
            - step: start
              spec: {policy: {failure: {mode: best_effort}}}
              loop: {in: [1, 2], iterator: n}
              tool: {kind: python, code: "result = 1", spec: {policy: {rules: [{else: {then: {do: fail}}}]}}}
              next: {arcs: [{step: end}]}
            """,
            id="a-best-effort-loop",
        ),
        pytest.param(
            """
            - step: start
              next: {arcs: [{step: end, args: {why: "{{ event.name }}"}}]}
            """,
            id="a-router-step",
        ),
        pytest.param(
            """
            - step: start
              tool:
                kind: python
                code: "result = 1"
                spec: {policy: {rules: [{when: "{{ outcome.status == 'ok' }}", then: {do: retry}}]}}
              next: {arcs: [{step: end}]}
            """,
            id="a-retry-of-ok-outcomes",
        ),
    ],
)
def test_no_warning_where_nothing_says_a_failure_was_routed_on(workflow: str) -> None:
    text = playbook(workflow) + "  - step: end\n    tool: {kind: noop}\n"
    assert semantics(text) == []


# -- task policies without else ---------------------------------------------------------------------

POLICY = """
- step: start
  tool:
    kind: python
    code: "result = 1"
    spec:
      policy:
        RULES
"""

POLICY_WARNING = (
    "t.yaml:11:11: warning: step 'start' task 'start_task': this policy has no 'else' and its rules match "
    "only some errors: an error no rule matches now fails the task (it used to continue); end the rules "
    "with '- else: {then: {do: continue}}' (or set 'on_unmatched: continue') to go on past it "
    "(at workflow[0].tool.spec.policy.rules)"
)


def policy(rules: str) -> str:
    return playbook(POLICY.replace("RULES", rules))


def test_a_policy_whose_rules_match_only_some_errors_is_warned() -> None:
    rules = """rules:
          - when: "{{ outcome.status == 'error' and outcome.error.retryable }}"
            then: {do: retry, attempts: 3}"""
    assert semantics(policy(rules)) == [POLICY_WARNING]


@pytest.mark.parametrize(
    "rules",
    [
        pytest.param(
            """rules:
          - when: "{{ outcome.error.kind == 'timeout' }}"
            then: {do: retry}
          - else: {then: {do: fail}}""",
            id="with-else",
        ),
        pytest.param(
            """on_unmatched: continue
        rules:
          - when: "{{ outcome.error.kind == 'timeout' }}"
            then: {do: continue}""",
            id="on-unmatched-continue",
        ),
        pytest.param(
            """rules:
          - when: "{{ outcome.status != 'ok' }}"
            then: {do: retry, attempts: 2}""",
            id="every-error-matches",
        ),
        pytest.param(
            """rules:
          - when: "{{ outcome.status == 'ok' and outcome.result > 3 }}"
            then: {do: break}""",
            id="no-rule-about-errors",
        ),
    ],
)
def test_no_policy_warning_where_unmatched_errors_mean_what_they_did(rules: str) -> None:
    assert semantics(policy(rules)) == []
