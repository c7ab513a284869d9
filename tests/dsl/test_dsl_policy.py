"""Policy evaluation on compiled playbooks: task outcome rules, admission, routing, retry delays."""

from __future__ import annotations

from typing import Any

import pytest

from noetl_stream.dsl import Playbook, Then, admit, backoff_delay, decide, load_playbook, route
from noetl_stream.dsl.model import Rule, TaskPolicy

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: policies, path: tests/policies}
workflow:
  - step: start
    spec:
      policy:
        admit:
          rules:
            - when: "{{ ctx.ready == 'yes' }}"
              then: {allow: true}
            - when: "{{ ctx.ready == 'no' }}"
              then: {allow: false}
    tool:
      - name: plain
        kind: noop
      - name: guarded
        kind: noop
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' and _attempt < 3 }}"
                then: {do: retry, attempts: 3, backoff: linear, delay: 0.5}
              - when: "{{ outcome.status == 'error' }}"
                then: {do: fail}
              - when: "{{ outcome.result.more }}"
                then: {do: jump, to: plain, set_iter: {page: "{{ iter.page + 1 }}"}}
      - name: closing
        kind: noop
        spec:
          policy:
            rules:
              - when: "{{ outcome.result.more }}"
                then: {do: jump, to: plain}
              - else:
                  then: {do: break}
    next:
      arcs:
        - step: left
          when: "{{ event.name == 'step.done' and args.side == 'left' }}"
          args: {from: start}
        - step: right
          when: "{{ event.name == 'step.done' }}"
        - step: failed
          when: "{{ event.name == 'step.failed' }}"
  - step: fanout
    next:
      spec: {mode: inclusive}
      arcs:
        - step: left
        - step: right
          when: "{{ ctx.both }}"
        - step: failed
          when: false
  - step: left
    tool: {kind: noop}
  - step: right
    tool: {kind: noop}
  - step: failed
    tool: {kind: noop}
"""


@pytest.fixture(scope="module")
def playbook() -> Playbook:
    return load_playbook(PLAYBOOK, "policies.yaml")


def outcome_scope(status: str, result: Any = None, attempt: int = 1) -> dict[str, Any]:
    return {
        "outcome": {"status": status, "result": result or {}},
        "_attempt": attempt,
        "iter": {"page": 1},
        "ctx": {},
    }


def test_without_a_policy_ok_continues_and_error_fails(playbook: Playbook) -> None:
    plain = playbook.step("start").tasks[0]
    assert plain.policy is None
    assert decide(plain.policy, "ok", outcome_scope("ok")) == (Then(do="continue"), None)
    assert decide(plain.policy, "error", outcome_scope("error")) == (Then(do="fail"), None)


def test_the_first_matching_rule_wins(playbook: Playbook) -> None:
    policy = playbook.step("start").tasks[1].policy
    then, index = decide(policy, "error", outcome_scope("error", attempt=1))
    assert (then.do, then.attempts, then.backoff, then.delay, index) == ("retry", 3, "linear", 0.5, 0)
    then, index = decide(policy, "error", outcome_scope("error", attempt=3))
    assert (then.do, index) == ("fail", 1)
    then, index = decide(policy, "ok", outcome_scope("ok", {"more": True}))
    assert (then.do, then.to, then.set_iter, index) == ("jump", "plain", {"page": "{{ iter.page + 1 }}"}, 2)


def test_a_policy_with_no_match_and_no_else_continues_on_ok(playbook: Playbook) -> None:
    policy = playbook.step("start").tasks[1].policy
    assert decide(policy, "ok", outcome_scope("ok", {"more": False})) == (Then(do="continue"), None)


def test_an_error_no_rule_matches_fails_unless_on_unmatched_says_continue() -> None:
    only_ok = TaskPolicy(rules=(Rule(when="{{ outcome.status == 'ok' }}", then=Then(do="break")),))
    assert decide(only_ok, "error", outcome_scope("error")) == (Then(do="fail"), None)
    lenient = TaskPolicy(rules=only_ok.rules, on_unmatched="continue")
    assert decide(lenient, "error", outcome_scope("error")) == (Then(do="continue"), None)


def test_else_applies_when_nothing_matched(playbook: Playbook) -> None:
    policy = playbook.step("start").tasks[2].policy
    assert decide(policy, "ok", outcome_scope("ok", {"more": True}))[0].do == "jump"
    assert decide(policy, "ok", outcome_scope("ok", {"more": False})) == (Then(do="break"), 1)


def test_admission_first_match_and_default_allow(playbook: Playbook) -> None:
    gate = playbook.step("start").admit
    assert admit(gate, {"ctx": {"ready": "yes"}}) is True
    assert admit(gate, {"ctx": {"ready": "no"}}) is False
    assert admit(gate, {"ctx": {"ready": "maybe"}}) is True  # no rule matched
    assert admit(None, {}) is True  # no admission policy


def test_exclusive_routing_fires_the_first_true_arc(playbook: Playbook) -> None:
    router = playbook.step("start").next
    done = {"event": {"name": "step.done"}, "args": {"side": "left"}}
    assert [(a.step, a.args) for a in route(router, done)] == [("left", {"from": "start"})]
    done_right = {"event": {"name": "step.done"}, "args": {"side": "right"}}
    assert [a.step for a in route(router, done_right)] == ["right"]
    failed = {"event": {"name": "step.failed"}, "args": {}}
    assert [a.step for a in route(router, failed)] == ["failed"]
    assert route(router, {"event": {"name": "loop.done"}, "args": {}}) == []


def test_an_arc_without_when_fires_on_success_boundaries_only(playbook: Playbook) -> None:
    router = playbook.step("fanout").next  # inclusive: 'left' without when, 'right' on ctx.both
    assert [a.step for a in route(router, {"ctx": {"both": True}}, failed=True)] == ["right"]
    assert route(router, {"ctx": {"both": False}}, failed=True) == []


def test_inclusive_routing_fires_every_true_arc(playbook: Playbook) -> None:
    router = playbook.step("fanout").next
    assert router is not None and router.mode == "inclusive"
    assert [a.step for a in route(router, {"ctx": {"both": True}})] == ["left", "right"]
    assert [a.step for a in route(router, {"ctx": {"both": False}})] == ["left"]
    assert route(None, {}) == []


@pytest.mark.parametrize(
    ("backoff", "delay", "attempts", "expected"),
    [
        ("none", 2.0, [1, 2, 3], [2.0, 2.0, 2.0]),
        ("linear", 2.0, [1, 2, 3], [2.0, 4.0, 6.0]),
        ("exponential", 2.0, [1, 2, 3, 4], [2.0, 4.0, 8.0, 16.0]),
        ("exponential", None, [1, 2], [1.0, 2.0]),
        ("exponential", 1.0, [40], [600.0]),
        ("none", 0.0, [1], [0.0]),
    ],
)
def test_backoff_delay(backoff: Any, delay: float | None, attempts: list[int], expected: list[float]) -> None:
    then = Then(do="retry", backoff=backoff)
    assert [backoff_delay(then, attempt, delay) for attempt in attempts] == expected
