"""002 forms under the legacy extension: each construct, its canonical translation and its warning."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from helpers import run
from legacy_support import canonical, compiles, legacy, report, step, yaml

from noetl_stream.dsl import compile_playbook
from noetl_stream.dsl.migrate import migrate_text
from noetl_stream.runtime.local import Runtime


def test_eval_with_expr_and_flat_actions_becomes_spec_policy_rules() -> None:
    text = legacy(
        """
        - step: start
          tool:
            - fetch:
                kind: python
                code: "result = 1"
                eval:
                  - expr: "{{ outcome.status == 'error' }}"
                    do: retry
                    attempts: 3
                    backoff: fixed
                    delay: 1
                  - else:
                      do: continue
                      set_iter: {seen: true}
        """
    )
    assert step(text, "start")["tool"] == yaml(
        """
        - name: fetch
          kind: python
          code: "result = 1"
          spec:
            policy:
              rules:
                - when: "{{ outcome.status == 'error' }}"
                  then: {do: retry, attempts: 3, backoff: none, delay: 1}
                - else:
                    then: {do: continue, set_iter: {seen: true}}
        """
    )
    assert report(text) == [
        "8:9: warning: step 'start': task 'fetch' (label-as-key) rewritten as '- name: fetch'",
        "11:11: warning: step 'start' task 'fetch': 002 'eval' translated to spec.policy.rules",
        "12:15: warning: step 'start' task 'fetch': 002 'expr' translated to 'when'",
        "13:15: warning: step 'start' task 'fetch': 002 flat rule action translated to 'then: {do: ...}'",
        "15:15: warning: step 'start' task 'fetch': 002 'backoff: fixed' translated to 'backoff: none'",
        "17:15: warning: step 'start' task 'fetch': 002 'else' with a flat action translated to 'else: {then: ...}'",
    ]


def test_expr_inside_canonical_rules_becomes_when() -> None:
    text = legacy(
        """
        - step: start
          tool:
            kind: noop
            spec:
              policy:
                rules:
                  - expr: "{{ _attempt < 2 }}"
                    then: {do: retry}
        """
    )
    rules = step(text, "start")["tool"]["spec"]["policy"]["rules"]
    assert rules == [{"when": "{{ _attempt < 2 }}", "then": {"do": "retry"}}]
    assert "12:15: warning: step 'start' task 'start_task': 002 'expr' translated to 'when'" in report(text)
    compiles(text)


def test_step_when_becomes_admission() -> None:
    text = legacy(
        """
        - step: start
          next: {arcs: [{step: gated}]}
        - step: gated
          when: "{{ workload.go }}"
          tool: {kind: noop}
        """,
        workload={"go": False},
    )
    assert step(text, "gated") == yaml(
        """
        step: gated
        spec:
          policy:
            admit:
              rules:
                - when: "{{ workload.go }}"
                  then: {allow: true}
                - else:
                    then: {allow: false}
        tool: {kind: noop}
        """
    )
    assert report(text) == ["10:5: warning: step 'gated': 002 step 'when' translated to spec.policy.admit"]


def test_list_next_with_when_args_expr_and_next_mode_becomes_a_router() -> None:
    text = legacy(
        """
        - step: start
          spec: {next_mode: inclusive}
          tool: {kind: noop, result: 3}
          next:
            - step: big
              when: "{{ event.result > 2 }}"
              args: {n: "{{ event.result }}"}
            - step: any
              expr: "{{ true }}"
        - step: big
          tool: {kind: noop}
        - step: any
          tool: {kind: noop}
        """
    )
    start = step(text, "start")
    assert "spec" not in start
    assert start["next"] == yaml(
        """
        spec: {mode: inclusive}
        arcs:
          - step: big
            when: "{{ event.result > 2 }}"
            args: {n: "{{ event.result }}"}
          - step: any
            when: "{{ true }}"
        """
    )
    assert report(text) == [
        "7:12: warning: step 'start': 002 'spec.next_mode' translated to next.spec.mode",
        "9:5: warning: step 'start': 002 'next' list translated to next.arcs",
        "14:9: warning: step 'start': 002 arc 'expr' translated to 'when'",
    ]


def test_set_vars_becomes_set_iter_and_vars_reads_become_iter() -> None:
    text = legacy(
        """
        - step: start
          tool:
            - name: a
              kind: noop
              spec:
                policy:
                  rules:
                    - else:
                        then: {do: continue, set_vars: {total: 5}, set_shared: {seen: true}}
            - name: b
              kind: noop
              result: "{{ vars.total + 1 }}"
        """
    )
    a, b = step(text, "start")["tool"]
    assert a["spec"]["policy"]["rules"][0]["else"]["then"] == {
        "do": "continue",
        "set_iter": {"total": 5},
        "set_ctx": {"seen": True},
    }
    assert b["result"] == "{{ iter.total + 1 }}"
    assert report(text) == [
        "14:40: warning: step 'start' task 'a': 002 'set_vars' (step scope) translated to 'set_iter' "
        "(iteration scope, the mapping 002 §6.5 allows); 'vars.<name>' reads become 'iter.<name>'",
        "14:62: warning: step 'start' task 'a': 002 'set_shared' translated to 'set_ctx'",
        "17:17: warning: step 'start': legacy 'vars.<name>' reads translated to ctx.<name> (iter.<name> for "
        "names of 002 set_vars)",
    ]


FORMS_002 = """
- step: start
  spec: {next_mode: inclusive}
  tool:
    - name: count
      kind: noop
      result: 3
      eval:
        - expr: "{{ outcome.status == 'success' }}"
          do: continue
          set_vars: {n: "{{ outcome.result }}"}
          set_shared: {seen: "{{ outcome.result }}"}
    - name: doubled
      kind: noop
      result: "{{ vars.n * 2 }}"
  next:
    - step: big
      when: "{{ event.result > 5 }}"
      args: {n: "{{ event.result }}"}
    - step: small
      expr: "{{ event.result <= 5 }}"
    - step: gated
- step: big
  tool: {kind: noop, result: "{{ args.n }}"}
- step: small
  tool: {kind: noop, result: small}
- step: gated
  when: "{{ workload.open }}"
  tool: {kind: noop, result: gated}
"""


@pytest.mark.parametrize("gate", [True, False])
async def test_the_002_forms_run_as_their_translation(runtime: Runtime, gate: bool) -> None:
    r = await run(runtime, legacy(FORMS_002, workload={"open": gate}))
    assert r.status == "success", r.summary.error
    assert r.summary.ctx == {"seen": 3}  # set_shared
    assert r.step_result("start") == 6  # set_vars read back as vars.n in the same step
    assert r.step_result("big") == 6  # the list next's args; next_mode inclusive takes every true arc
    assert r.summary.steps["gated"].status == ("done" if gate else "skipped")  # step when: admission
    assert "small" not in r.summary.steps


SET_PREV = """
- step: start
  tool:
    - name: a
      kind: noop
      result: original
      eval:
        - expr: "{{ true }}"
          do: continue
          set_prev: "{{ outcome.result ~ '!' }}"
    - name: b
      kind: python
      args: {prev: "{{ _prev }}", a: "{{ a }}"}
      code: "result = {'prev': prev, 'a': a}"
"""


def test_set_prev_jumps_to_a_generated_noop_that_returns_the_value() -> None:
    a, prev, b = step(legacy(SET_PREV), "start")["tool"]
    assert a["spec"]["policy"]["rules"] == [
        {
            "when": "{{ true }}",
            "then": {"do": "jump", "to": "a_prev_0", "set_iter": {"prev_a": "{{ outcome.result ~ '!' }}"}},
        },
        {"else": {"then": {"do": "jump", "to": "b"}}},
    ]
    assert prev == yaml(
        """
        name: a_prev_0
        kind: noop
        result: "{{ iter.prev_a }}"
        spec: {policy: {rules: [{else: {then: {do: jump, to: b}}}]}}
        """
    )
    assert b["name"] == "b"


async def test_set_prev_changes_what_the_next_task_sees_as_prev(runtime: Runtime) -> None:
    r = await run(runtime, legacy(SET_PREV))
    assert r.status == "success", r.summary.error
    assert r.result == {"prev": "original!", "a": "original"}


SUCCESS = """
- step: start
  tool:
    kind: python
    code: "result = 41"
    spec:
      policy:
        rules:
          - when: "{{ outcome.status == 'success' }}"
            then: {do: continue, set_ctx: {answer: "{{ outcome.result + 1 }}"}}
          - when: "{{ outcome.status in ['error'] or outcome.status != 'success' }}"
            then: {do: fail}
"""


def test_outcome_status_success_becomes_ok() -> None:
    rules = step(legacy(SUCCESS), "start")["tool"]["spec"]["policy"]["rules"]
    assert [r["when"] for r in rules] == [
        "{{ outcome.status == 'ok' }}",
        "{{ outcome.status in ['error'] or outcome.status != 'ok' }}",
    ]
    assert [line for line in report(legacy(SUCCESS)) if "success" in line] == [
        "13:21: warning: 002 outcome status 'success' translated to 'ok'",
        "15:21: warning: 002 outcome status 'success' translated to 'ok'",
    ]


async def test_a_success_test_matches_an_ok_outcome_at_run_time(runtime: Runtime) -> None:
    r = await run(runtime, legacy(SUCCESS))
    assert r.status == "success", r.summary.error
    assert r.summary.ctx == {"answer": 42}


def test_without_the_extension_002_forms_stay_rejected() -> None:
    text = legacy(SET_PREV).replace("executor: {spec: {extensions: [legacy]}}\n", "")
    result = compile_playbook(text, "t.yaml")
    assert result.playbook is None
    assert any("(enable legacy extensions to translate it)" in d.message for d in result.errors)


def test_the_caller_can_enable_the_extension() -> None:
    text = legacy(SET_PREV).replace("executor: {spec: {extensions: [legacy]}}\n", "")
    assert compile_playbook(text, "t.yaml", extensions=("legacy",)).playbook is not None


def test_the_translation_does_not_keep_the_legacy_extension() -> None:
    data = canonical(legacy(SET_PREV))
    assert "executor" not in data


@pytest.mark.parametrize(
    "path",
    sorted((Path(__file__).resolve().parents[2] / "playbooks").glob("**/*.yaml")),
    ids=lambda p: p.name,
)
def test_canonical_playbooks_are_left_alone_by_the_extension(path: Path) -> None:
    text = path.read_text()
    plain = compile_playbook(text, str(path))
    translated = compile_playbook(text, str(path), extensions=("legacy",))
    assert plain.playbook is not None
    assert msgspec.to_builtins(translated.playbook) == msgspec.to_builtins(plain.playbook)
    assert translated.diagnostics == plain.diagnostics
    assert migrate_text(text, str(path)).text == text
