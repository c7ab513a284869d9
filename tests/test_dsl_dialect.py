"""The NoETL dialect as deployed, accepted in canonical mode: step/task ``set:``, step/task ``input:``."""

from __future__ import annotations

import pytest
from helpers import playbook, run
from legacy_support import report, step, yaml

from noetl_stream.dsl import compile_playbook, load_playbook
from noetl_stream.local import Runtime

TASK_SET = playbook(
    """
    - step: start
      tool:
        - name: fetch_users
          kind: python
          code: "result = {'rows': [1, 2, 3]}"
          set:
            ctx.total: "{{ fetch_users.rows | length }}"
            iter.first: "{{ outcome.result.rows[0] }}"
        - name: after
          kind: noop
          result: "{{ iter.first }}-{{ ctx.total }}"
    """
)


def test_task_set_becomes_patches_of_the_tasks_policy() -> None:
    first = step(TASK_SET, "start")["tool"][0]
    assert "set" not in first
    assert first["spec"] == yaml(
        """
        policy:
          rules:
            - when: "{{ outcome.status == 'error' }}"
              then: {do: fail}
            - else:
                then:
                  do: continue
                  set_ctx: {total: "{{ outcome.result.rows | length }}"}
                  set_iter: {first: "{{ outcome.result.rows[0] }}"}
        """
    )
    assert report(TASK_SET) == []


async def test_task_set_applies_when_the_task_completes(runtime: Runtime) -> None:
    r = await run(runtime, TASK_SET)
    assert r.status == "success", r.summary.error
    assert r.result == "1-3"
    assert r.summary.ctx == {"total": 3}


def test_task_set_joins_an_existing_policy_but_not_its_retries() -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: noop
            set: {ctx: {done: true}}
            spec:
              policy:
                rules:
                  - when: "{{ _attempt < 2 }}"
                    then: {do: retry}
                  - when: "{{ true }}"
                    then: {do: break, set_iter: {x: 1}}
        """
    )
    assert step(text, "start")["tool"]["spec"]["policy"]["rules"] == yaml(
        """
        - when: "{{ _attempt < 2 }}"
          then: {do: retry}
        - when: "{{ true }}"
          then: {do: break, set_iter: {x: 1}, set_ctx: {done: true}}
        - else: {then: {do: continue, set_ctx: {done: true}}}
        """
    )


STEP_SET = playbook(
    """
    - step: start
      tool:
        - {name: a, kind: noop, result: 1, spec: {policy: {rules: [{when: "{{ workload.early }}", then: {do: break}}]}}}
        - {name: b, kind: noop, result: 2}
      set:
        ctx.last: "{{ start }}"
      next: {arcs: [{step: end}]}
    - step: end
      tool: {kind: noop, result: "{{ ctx.last }}"}
    """,
    workload={"early": False},
)


def test_step_set_patches_the_rules_that_end_the_pipeline() -> None:
    a, b = step(STEP_SET, "start")["tool"]
    assert a["spec"]["policy"]["rules"] == [
        {"when": "{{ workload.early }}", "then": {"do": "break", "set_ctx": {"last": "{{ outcome.result }}"}}}
    ]
    assert b["spec"]["policy"]["rules"][1] == {
        "else": {"then": {"do": "continue", "set_ctx": {"last": "{{ outcome.result }}"}}}
    }


@pytest.mark.parametrize(("early", "expected"), [(False, 2), (True, 1)])
async def test_step_set_applies_when_the_step_completes(runtime: Runtime, early: bool, expected: int) -> None:
    r = await run(runtime, STEP_SET, {"early": early})
    assert r.status == "success", r.summary.error
    assert (r.result, r.summary.ctx) == (expected, {"last": expected})


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param(
            "- step: start\n  tool: {kind: noop, set: {total: 1}}\n",
            [
                "6:30: step 'start' task 'start_task': 'set' key 'total' needs a scope: 'ctx.total' (execution) or 'iter.total' (iteration)"
            ],
            id="unscoped",
        ),
        pytest.param(
            "- step: start\n  tool: {kind: noop, set: {vars.total: 1}}\n",
            [
                "6:30: step 'start' task 'start_task': 'set' key 'vars.total': the scope must be 'ctx' or 'iter', not 'vars'"
            ],
            id="bad-scope",
        ),
        pytest.param(
            "- step: start\n  tool: {kind: noop, set: {ctx.a.b: 1}}\n",
            [
                "6:30: step 'start' task 'start_task': 'set' writes one level of ctx or iter; 'a.b' is not a plain name"
            ],
            id="nested",
        ),
        pytest.param(
            "- step: start\n  loop: {in: [1], iterator: x}\n  tool: {kind: noop}\n  set: {ctx.n: 1}\n",
            [
                "8:5: step 'start': step 'set' on a looped step is not supported: the step completes after its "
                "last iteration, which no task sees (write set_iter/set_ctx in the last task's policy, or set ctx "
                "in the next step)"
            ],
            id="looped-step",
        ),
        pytest.param(
            "- step: start\n  tool: {kind: python, code: 'x', input: {a: 1}, args: {a: 2}}\n",
            [
                "6:37: step 'start' task 'start_task': 'input' and 'args' both given; they are the same: keep one"
            ],
            id="input-and-args",
        ),
        pytest.param(
            "- step: start\n  input: [1]\n  tool: {kind: noop}\n",
            ["6:12: step 'start': 'input' must be a mapping of names to values (templates)"],
            id="step-input-not-a-mapping",
        ),
    ],
)
def test_malformed_dialect_forms(steps: str, expected: list[str]) -> None:
    text = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: t, path: t}\nworkflow:\n"
    text += "".join(f"  {line}\n" for line in steps.splitlines())
    assert report(text) == expected


async def test_task_input_is_the_tasks_args(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: python
            input: {a: 2, b: "{{ workload.b }}"}
            code: "result = a * b"
        """,
        workload={"b": 21},
    )
    assert step(text, "start")["tool"] == {
        "kind": "python",
        "args": {"a": 2, "b": "{{ workload.b }}"},
        "code": "result = a * b",
    }
    r = await run(runtime, text)
    assert (r.status, r.result) == ("success", 42), r.summary.error


def test_step_input_is_kept_on_the_step_and_known_to_its_templates() -> None:
    text = playbook(
        """
        - step: start
          input: {user: "{{ args.user | default(workload.user) }}"}
          tool: {kind: noop, result: "{{ input.user }}"}
        """,
        workload={"user": "ada"},
    )
    pb = load_playbook(text)
    assert pb.step("start").input == {"user": "{{ args.user | default(workload.user) }}"}
    assert compile_playbook(text).diagnostics == ()
