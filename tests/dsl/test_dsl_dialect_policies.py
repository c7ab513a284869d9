"""NoETL's task policy forms, accepted in canonical mode with a warning (code ``dialect``) each naming the
canonical spelling: ``output`` in rules, ``then.set``, the ``else`` shorthand, ``to: previous`` and
``backoff: fixed`` (any backoff name we do not know waits the same delay each time, as NoETL does)."""

from __future__ import annotations

from helpers import playbook
from legacy_support import report, step, yaml

from noetl_stream.dsl import compile_playbook

POLICY = playbook(
    """
    - step: start
      tool:
        - name: fetch
          kind: python
          code: "result = {'n': 1}"
        - name: send
          kind: python
          code: "result = {'n': 2}"
          spec:
            policy:
              rules:
                - when: "{{ output.status == 'error' and output.error.retryable }}"
                  then:
                    do: retry
                    attempts: 4
                    backoff: fixed
                    delay: 0.5
                    set: {iter.tries: "{{ _attempt }}", ctx.last_status: "{{ output.http.status }}"}
                - when: "{{ output.status == 'error' and output.error.kind == 'auth' }}"
                  then: {do: jump, to: previous}
                - when: true
                  then: {do: continue, set: {seen: "{{ output.data.n }}", step.by: send}}
                - else:
                    do: fail
    """
)


def test_policy_forms_become_their_canonical_spellings() -> None:
    rules = step(POLICY, "start")["tool"][1]["spec"]["policy"]["rules"]
    assert rules == yaml(
        """
        - when: "{{ output.status == 'error' and output.error.retryable }}"
          then:
            do: retry
            attempts: 4
            backoff: none
            delay: 0.5
            set_iter: {tries: "{{ _attempt }}"}
            set_ctx: {last_status: "{{ output.http.status }}"}
        - when: "{{ output.status == 'error' and output.error.kind == 'auth' }}"
          then: {do: jump, to: fetch}
        - when: true
          then: {do: continue, set_ctx: {seen: "{{ output.data.n }}", by: send}}
        - else: {then: {do: fail}}
        """
    )


def test_each_policy_form_is_one_dialect_warning_at_what_the_author_wrote() -> None:
    who = "step 'start' task 'send'"
    assert report(POLICY) == [
        f"16:17: warning: {who}: 'output' in a task policy is NoETL's envelope of the task's outcome; canonical: "
        "outcome (output.status is outcome.status, output.data outcome.result, output.error outcome.error, "
        "output.http.status outcome.http.status)",
        f"20:19: warning: {who}: 'backoff: fixed' is NoETL's name for 'backoff: none' (the same delay before "
        "every retry)",
        f"22:19: warning: {who}: 'set:' in a policy's 'then' is NoETL's; canonical: set_ctx (ctx., step. and "
        "bare keys) and set_iter (iter. keys)",
        f"24:34: warning: {who}: 'to: previous' is NoETL's; canonical: the label of the task before, 'to: fetch'",
        f"26:38: warning: {who}: 'set:' in a policy's 'then' is NoETL's; canonical: set_ctx (ctx., step. and "
        "bare keys) and set_iter (iter. keys)",
        f"27:17: warning: {who}: 'else: {{do: ...}}' is NoETL's shorthand for 'else: {{then: {{do: ...}}}}'",
    ]
    # `output` is bound in a task policy: no `undefined-name` warning for it (it used to say "not defined
    # in any scope", and an undefined `output` compared silently false at run time)
    assert "undefined-name" not in {d.code for d in compile_playbook(POLICY).diagnostics}


def test_output_outside_a_task_policy_is_still_undefined_there() -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: noop, result: "{{ output.data }}"}
        """
    )
    assert report(text) == [
        "6:32: warning: step 'start' task 'start_task': template reads 'output', which is not defined in any "
        "scope"
    ]


def test_an_unknown_backoff_waits_the_same_delay_with_a_warning() -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: noop
            spec: {policy: {rules: [{when: true, then: {do: retry, backoff: exponental}}]}}
        """
    )
    then = step(text, "start")["tool"]["spec"]["policy"]["rules"][0]["then"]
    assert then == {"do": "retry", "backoff": "none"}
    (warning,) = compile_playbook(text).diagnostics
    assert (warning.code, warning.line, warning.col) == ("unknown-backoff", 8, 62)
    assert warning.message == (
        "step 'start' task 'start_task': unknown backoff 'exponental'; did you mean 'exponential'?: it waits "
        "the same delay before every retry, as 'none' does (NoETL's rule for a name it does not know); write "
        "one of 'none', 'linear', 'exponential'"
    )


def test_jump_to_previous_from_the_first_task_is_an_error() -> None:
    text = playbook(
        """
        - step: start
          tool:
            - name: only
              kind: noop
              spec: {policy: {rules: [{when: true, then: {do: jump, to: previous}}]}}
        """
    )
    assert report(text) == [
        "9:67: step 'start' task 'only': 'to: previous' jumps to the task before this one, and this is the "
        "first task"
    ]


def test_a_task_labelled_previous_is_a_jump_target_like_any_other() -> None:
    text = playbook(
        """
        - step: start
          tool:
            - {name: previous, kind: noop}
            - name: again
              kind: noop
              spec: {policy: {rules: [{when: "{{ _attempt < 1 }}", then: {do: jump, to: previous}}]}}
        """
    )
    assert report(text) == []
    assert step(text, "start")["tool"][1]["spec"]["policy"]["rules"][0]["then"]["to"] == "previous"


def test_an_unknown_do_is_an_error() -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: noop
            spec: {policy: {rules: [{else: {do: skip}}]}}
        """
    )
    assert report(text) == [
        "8:32: warning: step 'start' task 'start_task': 'else: {do: ...}' is NoETL's shorthand for "
        "'else: {then: {do: ...}}'",
        "8:43: step 'start' task 'start_task': 'do' must be one of 'continue', 'retry', 'jump', 'break', "
        "'fail', got 'skip'",
    ]


def test_then_set_and_set_ctx_writing_one_key_is_an_error() -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: noop
            spec: {policy: {rules: [{when: true, then: {do: continue, set_ctx: {a: 1}, set: {ctx.a: 2}}}]}}
        """
    )
    assert report(text) == [
        "8:82: step 'start' task 'start_task': both 'set' and 'set_ctx' write 'a': give it once",
        "8:82: warning: step 'start' task 'start_task': 'set:' in a policy's 'then' is NoETL's; canonical: "
        "set_ctx (ctx., step. and bare keys) and set_iter (iter. keys)",
    ]


def test_a_policy_on_a_single_object_tool_is_its_steps_one_task() -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: noop
            spec: {policy: {rules: [{when: "{{ output.status == 'ok' }}", then: {do: break}}]}}
        """
    )
    pb = compile_playbook(text).playbook
    assert pb is not None
    (task,) = pb.step("start").tasks
    assert task.name == "start_task"
    assert task.policy is not None and task.policy.rules[0].then.do == "break"


def test_a_workbook_templates_policy_forms_are_read_the_same_way() -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: workbook, task: ping}
        """
    ).replace(
        "workflow:",
        """workbook:
  - name: ping
    tool:
      kind: noop
      spec:
        policy:
          rules:
            - when: "{{ output.status == 'error' }}"
              then: {do: retry, backoff: fixed, set: {ctx.x: 1}}
            - else: {do: continue}
workflow:""",
    )
    result = compile_playbook(text, "t.yaml")
    assert [(d.line, d.code) for d in result.diagnostics] == [
        (11, "dialect"),
        (12, "dialect"),
        (12, "dialect"),
        (13, "dialect"),
    ]
    assert result.playbook is not None
    policy = result.playbook.workbook["ping"].policy
    assert policy is not None
    assert [(r.then.do, r.then.backoff, r.then.set_ctx, r.is_else) for r in policy.rules] == [
        ("retry", "none", {"x": 1}, False),
        ("continue", "none", None, True),
    ]


def test_output_in_a_policy_is_warned_about_when_it_is_the_playbooks_only_dialect_form() -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: python
            code: "result = 1"
            spec:
              policy:
                rules:
                  - when: "{{ output.status == 'error' }}"
                    then: {do: fail}
                  - else: {then: {do: continue}}
        """
    )
    result = compile_playbook(text, "t.yaml")
    assert result.playbook is not None and not result.errors
    (warned,) = [d for d in result.diagnostics if d.code == "dialect"]
    assert "'output' in a task policy is NoETL's envelope" in warned.message
    assert warned.path == "workflow[0].tool.spec.policy.rules[0].when"


def test_output_is_known_in_a_task_policy_only_not_under_any_key_named_policy() -> None:
    text = playbook(
        """
        - step: start
          tool:
            - name: policy
              kind: noop
              args: {policy: "{{ output }}"}
              result: "{{ output }}"
            - name: b
              kind: noop
              spec:
                policy:
                  rules:
                    - when: "{{ output.status == 'error' }}"
                      then: {do: fail}
                    - else: {then: {do: continue}}
        """
    )
    result = compile_playbook(text, "t.yaml")
    undefined = sorted(d.path for d in result.diagnostics if d.code == "undefined-name")
    assert undefined == ["workflow[0].tool[0].args.policy", "workflow[0].tool[0].result"]
