"""Legacy constructs without a faithful canonical translation: the error says so, and why, at the
construct (and nothing else about the step is reported)."""

from __future__ import annotations

import pytest
from legacy_support import legacy, report

CASES = [
    pytest.param(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: t, path: t}\nexecutor: {spec: {extensions: [legacy]}}\nvars: {a: 1}\nworkflow:\n  - step: start\n    tool: {kind: noop}\n",
        [
            "5:1: root 'vars' has no canonical translation: a playbook has no execution variables with initial values (put inputs in workload, and write state with set_ctx in a task policy)",
        ],
        id="root_vars",
    ),
    pytest.param(
        """
- step: start
  tool: {kind: noop}
  case:
    - when: "{{ event.name == 'step.enter' }}"
      then: {next: [start]}
""",
        [
            "10:16: step 'start': 'next' on step.enter has no canonical translation: a transition before the step runs would bypass it; route on step.exit",
        ],
        id="enter_next",
    ),
    pytest.param(
        """
- step: start
  tool: {kind: noop}
  case:
    - when: "{{ event.name == 'step.exit' }}"
      then: {result: 1}
""",
        [
            "10:16: step 'start': 'result' on step.exit has no canonical translation: the step's result is fixed when it ends; set 'result' on call.done",
        ],
        id="exit_result",
    ),
    pytest.param(
        """
- step: start
  tool: {kind: noop}
  case:
    - when: "{{ response.ok }}"
      then: {next: [start]}
""",
        [
            "9:9: step 'start': case rule without an event.name test; say which event it reacts to (step.enter, call.done, call.error, step.exit)",
        ],
        id="no_event",
    ),
    pytest.param(
        """
- step: start
  tool: {kind: noop}
  case:
    - when: "{{ event.name == 'worker.done' }}"
      then: {next: [start]}
""",
        [
            "9:9: step 'start': case event 'worker.done' has no canonical translation (translated: step.enter, call.done, call.error, step.exit)",
        ],
        id="unknown_event",
    ),
    pytest.param(
        """
- step: start
  tool: {kind: noop}
  case:
    - when: "{{ event.name == 'call.done' or response.ok }}"
      then: {next: [start]}
""",
        [
            "9:9: step 'start': case condition cannot be translated: it tests 'event' in a way the translation cannot separate from the rest (write the event test as a separate \"event.name == '...' and ...\")",
        ],
        id="mixed_event",
    ),
    pytest.param(
        """
- step: start
  tool: {kind: noop}
  retry:
    - when: "{{ error is defined }}"
      then: {max_attempts: 3}
  case:
    - when: "{{ event.name == 'call.done' }}"
      then: {set: {a: 1}}
""",
        [
            "13:9: step 'start': a 'retry' policy and a case rule on call.done both act on each call (legacy applies the first match of each); one canonical rule list cannot do both: move the case actions into the retry policies",
        ],
        id="retry_and_case",
    ),
    pytest.param(
        """
- step: start
  loop: {in: [1], iterator: x}
  tool: {kind: noop}
  case:
    - when: "{{ event.name == 'call.done' and response }}"
      then: {next: [start]}
""",
        [
            "11:16: step 'start': 'next' on call.done in a looped step has no canonical translation: it would end the loop at one iteration's call (route on step.exit instead)",
        ],
        id="loop_call_done_next",
    ),
    pytest.param(
        """
- step: start
  tool: {kind: http, url: "http://x"}
  case:
    - when: "{{ event.name == 'call.error' and error.status == 404 }}"
      then: {next: [start]}
""",
        [
            "9:9: step 'start': no faithful translation: it reads the call's HTTP status after the step ended: routing sees the step's error {kind, message}, not the response (route on event.error.kind, or decide in the task policy)",
        ],
        id="error_status_arc",
    ),
    pytest.param(
        """
- step: start
  tool:
    - {name: a, kind: noop}
    - {name: b, kind: noop}
  retry: {max_attempts: 2}
""",
        [
            "10:5: step 'start': 'retry' rules on the step's call need exactly one tool call; this step has a pipeline of 2 tasks (no faithful translation: which task would they apply to?)",
        ],
        id="pipeline_case",
    ),
    pytest.param(
        """
- step: start
  loop: {in: [1], iterator: x}
  tool: {kind: noop}
  case:
    - when: "{{ event.name == 'step.enter' }}"
      then: {set: {seen: 1}}
    - when: "{{ event.name == 'step.exit' }}"
      then: {next: [{step: start, args: {x: "{{ x }}", s: "{{ seen }}"}}]}
""",
        [
            "10:9: warning: step 'start': case on step.enter translated to a first task 'start_enter'",
            "13:16: step 'start': no faithful translation: it reads 'seen' after the step ended, when only its result, ctx, workload and args are known",
        ],
        id="exit_reads_context",
    ),
    pytest.param(
        """
- step: start
  tool: {kind: noop}
  retry: {max_attempts: 2, backoff_multiplier: 0.5}
""",
        [
            "8:12: step 'start': backoff_multiplier must be a number >= 1",
        ],
        id="bad_multiplier",
    ),
    pytest.param(
        """
- step: start
  tool: {kind: noop}
  retry:
    - when: "{{ response }}"
      then: {collect: {into: all, strategy: merge}}
""",
        [
            "10:37: step 'start': collect strategy 'merge' has no canonical translation (append, extend)",
        ],
        id="collect_strategy",
    ),
    pytest.param(
        """
- step: start
  tool: {kind: noop}
  case:
    - when: "{{ event.name == 'call.error' }}"
      then: {sink: {tool: {kind: noop}}}
""",
        [
            "10:16: step 'start': 'sink' on call.error has no canonical translation: a task run after a failed call cannot end the step with that call's error",
        ],
        id="sink_on_error",
    ),
    pytest.param(
        """
- step: start
  tool: {kind: noop}
  case:
    - when: "{{ event.name == 'step.exit' }}"
      then: {set: {a: 1}}
""",
        [
            "8:5: warning: step 'start': 000/004 'case' translated to task policy rules and next.arcs",
            "10:16: warning: step 'start': 'set' on step.exit writes the step's own context as the step ends: no effect, dropped",
        ],
        id="exit_set",
    ),
    pytest.param(
        """
- step: start
  pipe: [a]
  tool: {kind: noop}
""",
        [
            "7:5: step 'start': 'pipe' is not part of noetl.io/v2 (v10); a step's tool list is the pipeline (the legacy extension has no translation for this form)",
        ],
        id="pipe",
    ),
    pytest.param(
        """
- step: start
  tool: {kind: noop}
  case:
    - when: "{{ event.name == 'step.exit' }}"
      then: {next: [start]}
  next:
    - step: start
      when: "{{ true }}"
""",
        [
            "11:5: step 'start': a conditional 'next' list (002) next to 000 'case'/'retry'/'sink'/'vars' has no single translation: route with case rules on step.exit",
        ],
        id="conditional_next_with_case",
    ),
    pytest.param(
        """
- step: start
  tool:
    - name: a
      kind: noop
      spec: {policy: {rules: [{else: {then: {do: continue, set_vars: {n: 1}}}}]}}
    - name: b
      kind: noop
      result: "{{ vars.n }}"
  vars: {n: "{{ result }}"}
""",
        [
            "10:62: warning: step 'start' task 'a': 002 'set_vars' (step scope) translated to 'set_iter' (iteration scope, the mapping 002 §6.5 allows); 'vars.<name>' reads become 'iter.<name>'",
            "13:17: 'vars.n' is written both by a 000 'vars' block (execution scope) and by 002 'set_vars' (step scope): no single translation",
            "14:5: warning: step 'start': 000 'vars' translated to set_ctx on task 'start_result' (vars.<name> reads become ctx.<name>)",
        ],
        id="vars_both",
    ),
    pytest.param(
        """
- step: start
  tool: {kind: noop}
  case:
    - when: "{{ event.name == 'step.enter' and response.ok }}"
      then: {fail: true}
""",
        [
            "9:9: step 'start': no faithful translation: it reads 'response' before the step's call: there is none yet",
        ],
        id="enter_reads_response",
    ),
    pytest.param(
        """
- step: start
  loop: {in: [1], iterator: x}
  tool: {kind: noop}
  case:
    - when: "{{ event.name == 'step.enter' }}"
      then: {sink: {tool: {kind: noop}}}
""",
        [
            "11:16: step 'start': a sink on step.enter of a looped step has no canonical translation (there is no hook before the first iteration)",
        ],
        id="enter_sink_loop",
    ),
    pytest.param(
        """
- step: start
  tool:
    - name: a
      kind: noop
      spec: {policy: {rules: [{else: {then: {do: retry, set_prev: 1}}}]}}
""",
        [
            "10:59: step 'start' task 'a': 'set_prev' with 'do: retry' has no canonical translation (a retried or failed task does not hand a value to the next task)",
        ],
        id="set_prev_retry",
    ),
]


@pytest.mark.parametrize(("steps", "expected"), CASES)
def test_untranslatable_constructs_are_reported_with_the_reason(steps: str, expected: list[str]) -> None:
    text = steps if steps.startswith("apiVersion") else legacy(steps)
    assert report(text) == expected
