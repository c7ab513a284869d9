"""End to end on a real nats-server: task policies (retry/jump/break/continue/fail), errors, set_iter.

Retries are counted through ``_attempt`` and the worker's ``task.started`` events. Backoff delays are
checked only as lower bounds between a run's ``task.done`` and the next run's ``task.started``
(both stamped by the worker, around the policy's sleep), which cannot flake on a slow machine.
"""

from __future__ import annotations

import pytest
from helpers import playbook, run, ts

from noetl_stream.runtime.local import Runtime

# A python task that fails until its `_attempt` reaches `ok_at`, and reports the attempt it ran as.
FLAKY = """
        - step: start
          tool:
            - name: flaky
              kind: python
              args: {{attempt: "{{{{ _attempt }}}}", ok_at: {ok_at}}}
              code: |
                if attempt < ok_at:
                    raise ConnectionError(f"attempt {{attempt}} failed")
                result = {{"attempt": attempt}}
              spec:
                policy:
                  rules:
                    - when: "{{{{ outcome.status == 'error' }}}}"
                      then: {{do: retry, attempts: {attempts}, backoff: {backoff}, delay: {delay}}}
            - name: after
              kind: noop
              result: "{{{{ _prev }}}}"
"""


def flaky(ok_at: int, attempts: int, backoff: str = "none", delay: object = 0) -> str:
    return playbook(FLAKY.format(ok_at=ok_at, attempts=attempts, backoff=backoff, delay=delay))


@pytest.mark.parametrize("backoff", ["none", "linear", "exponential"])
async def test_retry_until_ok_counts_attempts_from_one(runtime: Runtime, backoff: str) -> None:
    r = await run(runtime, flaky(ok_at=3, attempts=5, backoff=backoff))

    assert r.status == "success", r.summary.error
    assert r.result == {"attempt": 3}
    started = r.tasks("start", "flaky", name="task.started")
    assert [e.payload["attempt"] for e in started] == [1, 2, 3]
    done = r.tasks("start", "flaky")
    assert [e.payload["status"] for e in done] == ["error", "error", "ok"]
    assert [e.payload["do"] for e in done] == ["retry", "retry", "continue"]
    assert done[0].payload["error"]["kind"] == "python_error"
    assert len(r.tasks("start", "after")) == 1


@pytest.mark.parametrize(
    ("backoff", "expected_gaps"),
    [
        ("none", [0.1, 0.1, 0.1]),
        ("linear", [0.1, 0.2, 0.3]),
        ("exponential", [0.1, 0.2, 0.4]),
    ],
)
async def test_retry_waits_at_least_the_backoff_delay(
    runtime: Runtime, backoff: str, expected_gaps: list[float]
) -> None:
    r = await run(runtime, flaky(ok_at=4, attempts=4, backoff=backoff, delay=0.1))

    assert r.status == "success", r.summary.error
    started = r.tasks("start", "flaky", name="task.started")
    done = r.tasks("start", "flaky")
    assert len(started) == 4
    gaps = [(ts(started[i + 1]) - ts(done[i])).total_seconds() for i in range(3)]
    for gap, expected in zip(gaps, expected_gaps, strict=True):
        assert gap >= expected - 0.005, (backoff, gaps)


async def test_retry_delay_may_be_a_template(runtime: Runtime) -> None:
    text = flaky(ok_at=2, attempts=2, delay='"{{ workload.wait }}"').replace(
        "workflow:", 'workload: {"wait": 0.2}\nworkflow:'
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    started = r.tasks("start", "flaky", name="task.started")
    done = r.tasks("start", "flaky")
    assert (ts(started[1]) - ts(done[0])).total_seconds() >= 0.195


async def test_retry_exhausted_on_error_fails_the_step(runtime: Runtime) -> None:
    r = await run(runtime, flaky(ok_at=99, attempts=3))

    assert r.status == "failed"
    assert len(r.tasks("start", "flaky", name="task.started")) == 3
    assert not r.tasks("start", "after", name="task.started")
    error = r.step_error("start")
    assert error["kind"] == "python_error"
    assert "attempt 3 failed" in error["message"]
    assert error["task"] == "flaky"
    assert r.summary.error is not None and r.summary.error["step"] == "start"


async def test_retry_with_a_single_attempt_runs_once(runtime: Runtime) -> None:
    r = await run(runtime, flaky(ok_at=2, attempts=1))

    assert r.status == "failed"
    assert len(r.tasks("start", "flaky", name="task.started")) == 1


async def test_retry_exhausted_on_ok_continues_with_the_last_result(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            - name: poll
              kind: python
              args: {attempt: "{{ _attempt }}"}
              code: |
                result = {"ready": False, "attempt": attempt}
              spec:
                policy:
                  rules:
                    - when: "{{ outcome.status == 'ok' and not outcome.result.ready }}"
                      then: {do: retry, attempts: 3, delay: 0}
            - name: after
              kind: noop
              result: "{{ _prev }}"
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert len(r.tasks("start", "poll", name="task.started")) == 3
    assert r.result == {"ready": False, "attempt": 3}


async def test_retry_until_a_result_condition_holds(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: python
            args: {attempt: "{{ _attempt }}"}
            code: |
              result = attempt * 10
            spec:
              policy:
                rules:
                  - when: "{{ outcome.result < 30 }}"
                    then: {do: retry, attempts: 10, delay: 0}
                  - else:
                      then: {do: continue}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success"
    assert r.result == 30


async def test_attempt_resets_for_the_next_task(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            - name: first
              kind: python
              args: {attempt: "{{ _attempt }}"}
              code: |
                if attempt < 2:
                    raise TimeoutError("slow")
                result = attempt
              spec:
                policy:
                  rules:
                    - when: "{{ outcome.status == 'error' }}"
                      then: {do: retry, attempts: 3, delay: 0}
            - name: second
              kind: noop
              result: {first: "{{ first }}", attempt: "{{ _attempt }}"}
        """
    )

    r = await run(runtime, text)

    assert r.result == {"first": 2, "attempt": 1}


# --- jump, break, continue, fail -------------------------------------------------------------------


async def test_jump_back_makes_a_pipeline_loop_with_set_iter(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            - name: init
              kind: noop
              spec: {policy: {rules: [{else: {then: {do: continue, set_iter: {n: 0, seen: []}}}}]}}
            - name: inc
              kind: python
              args: {n: "{{ iter.n }}", seen: "{{ iter.seen }}"}
              code: |
                result = {"n": n + 1, "seen": seen + [n + 1]}
              spec:
                policy:
                  rules:
                    - else:
                        then: {do: continue, set_iter: {n: "{{ outcome.result.n }}", seen: "{{ outcome.result.seen }}"}}
            - name: check
              kind: noop
              spec:
                policy:
                  rules:
                    - when: "{{ iter.n < 3 }}"
                      then: {do: jump, to: inc}
            - name: report
              kind: noop
              result: {n: "{{ iter.n }}", seen: "{{ iter.seen }}"}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == {"n": 3, "seen": [1, 2, 3]}
    assert [e.payload["task"] for e in r.tasks("start")] == [
        "init", "inc", "check", "inc", "check", "inc", "check", "report",
    ]  # fmt: skip


async def test_jump_forward_skips_tasks(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            - name: a
              kind: noop
              result: from_a
              spec: {policy: {rules: [{else: {then: {do: jump, to: c}}}]}}
            - name: b
              kind: python
              code: |
                raise AssertionError("b must be skipped")
            - name: c
              kind: noop
              result: "{{ _prev }}+c"
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert [e.payload["task"] for e in r.tasks("start")] == ["a", "c"]
    assert r.result == "from_a+c"


async def test_break_ends_the_pipeline_successfully_with_that_result(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            - name: a
              kind: noop
              result: early
              spec:
                policy:
                  rules:
                    - when: "{{ outcome.result == 'early' }}"
                      then: {do: break}
            - name: b
              kind: noop
              result: late
          next: {arcs: [{step: after, when: "{{ event.name == 'step.done' }}"}]}
        - step: after
          tool: {kind: noop, result: "{{ start }}"}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success"
    assert [e.payload["task"] for e in r.tasks("start")] == ["a"]
    assert r.step_result("start") == "early"
    assert r.result == "early"


async def test_fail_on_an_ok_outcome_fails_the_step(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            - name: check
              kind: noop
              result: {rows: 0}
              spec:
                policy:
                  rules:
                    - when: "{{ outcome.result.rows == 0 }}"
                      then: {do: fail}
            - name: b
              kind: noop
        """
    )

    r = await run(runtime, text)

    assert r.status == "failed"
    assert [e.payload["task"] for e in r.tasks("start")] == ["check"]
    error = r.step_error("start")
    assert error["kind"] == "policy_fail"
    assert error["task"] == "check"
    assert "check" in error["message"]


async def test_fail_on_an_error_outcome_keeps_the_tools_error(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: python
            code: |
              raise PermissionError("denied")
            spec:
              policy:
                rules:
                  - when: "{{ outcome.py.exception_type == 'PermissionError' }}"
                    then: {do: fail}
                  - else:
                      then: {do: continue}
        """
    )

    r = await run(runtime, text)

    assert r.status == "failed"
    assert r.step_error("start")["kind"] == "python_error"


async def test_continue_on_error_proceeds_to_the_next_task(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            - name: risky
              kind: python
              code: |
                {}["missing"]
              spec:
                policy:
                  rules:
                    - when: "{{ outcome.status == 'error' and outcome.py.exception_type == 'KeyError' }}"
                      then: {do: continue, set_iter: {recovered: "{{ outcome.py.exception_type }}"}}
            - name: after
              kind: noop
              result: {prev: "{{ _prev }}", recovered: "{{ iter.recovered }}"}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == {"prev": None, "recovered": "KeyError"}


UNMATCHED = """
- step: start
  tool:
    - name: risky
      kind: python
      args: {fail: "{{ workload.fail }}"}
      code: |
        if fail:
            raise ValueError("risky failed")
        result = "risky ran"
      spec:
        policy:
          ON_UNMATCHED
          rules:
            - when: "{{ outcome.status == 'error' and outcome.error.kind == 'timeout' }}"
              then: {do: retry, attempts: 2, delay: 0}
            - when: "{{ outcome.status == 'ok' and outcome.result == 'never' }}"
              then: {do: break}
    - name: after
      kind: noop
      result: reached
"""


def unmatched(fail: bool, on_unmatched: str = "") -> str:
    return playbook(UNMATCHED.replace("ON_UNMATCHED", on_unmatched), workload={"fail": fail})


async def test_an_error_no_rule_matches_fails_the_task(runtime: Runtime) -> None:
    """A policy without ``else``: an error none of its rules matches fails the task, as without a
    policy (it used to continue)."""
    r = await run(runtime, unmatched(fail=True))

    assert r.status == "failed"
    error = r.step_error("start")
    assert error["task"] == "risky" and "risky failed" in error["message"]
    (done,) = r.tasks("start", "risky")
    assert (done.payload["do"], done.payload["rule"]) == ("fail", None)
    assert not r.tasks("start", "after")


async def test_an_ok_outcome_no_rule_matches_continues(runtime: Runtime) -> None:
    r = await run(runtime, unmatched(fail=False))

    assert r.status == "success", r.summary.error
    assert r.result == "reached"
    (done,) = r.tasks("start", "risky")
    assert (done.payload["do"], done.payload["rule"]) == ("continue", None)


async def test_on_unmatched_continue_lets_an_unmatched_error_continue(runtime: Runtime) -> None:
    r = await run(runtime, unmatched(fail=True, on_unmatched="on_unmatched: continue"))

    assert r.status == "success", r.summary.error
    assert r.result == "reached"


async def test_error_without_a_policy_fails_the_step_and_stops_the_pipeline(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            - name: a
              kind: noop
            - name: boom
              kind: python
              code: |
                x = 1
                y = x / 0
            - name: never
              kind: noop
        """
    )

    r = await run(runtime, text)

    assert r.status == "failed"
    assert [e.payload["task"] for e in r.tasks("start")] == ["a", "boom"]
    error = r.step_error("start")
    assert error["kind"] == "python_error"
    assert error["task"] == "boom"
    assert "division by zero" in error["message"]
    assert "line 2" in error["message"]


async def test_a_python_exception_is_a_python_error_naming_its_type(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: python
            code: |
              class QuotaExceeded(Exception):
                  pass
              def main():
                  raise QuotaExceeded("too many")
        """
    )

    r = await run(runtime, text)

    assert r.status == "failed"
    error = r.step_error("start")
    assert error["kind"] == "python_error"
    assert error["message"].startswith("QuotaExceeded: too many")
    (done,) = r.tasks("start")
    assert done.payload["status"] == "error"
    assert done.payload["error"]["kind"] == "python_error"


async def test_python_syntax_error_fails_the_step(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: python
            code: |
              def main(:
                  pass
        """
    )

    r = await run(runtime, text)

    assert r.status == "failed"
    assert r.step_error("start")["kind"] == "python_error"


async def test_python_main_receives_args_and_its_return_is_the_result(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: python
            args: {a: 2, b: "{{ workload.b }}"}
            code: |
              def main(a, b):
                  return {"sum": a + b, "args": args}
        """,
        workload={"b": 5},
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == {"sum": 7, "args": {"a": 2, "b": 5}}


# --- template errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("task", "where"),
    [
        pytest.param('{kind: noop, result: "{{ workload.nope.deeper + 1 }}"}', "task 'a'", id="task-config"),
        pytest.param(
            '{kind: noop, spec: {policy: {rules: [{when: "{{ undefined_name > 1 }}", then: {do: break}}]}}}',
            "rules[0].when",
            id="policy-when",
        ),
        pytest.param(
            '{kind: noop, spec: {policy: {rules: [{else: {then: {do: continue, set_ctx: {x: "{{ no_such.v }}"}}}}]}}}',
            "set_ctx",
            id="set-ctx",
        ),
    ],
)
async def test_template_errors_give_clear_step_failures(runtime: Runtime, task: str, where: str) -> None:
    text = playbook(
        f"""
        - step: start
          tool: [{task[:-1]}, name: a}}]
        """
    )

    r = await run(runtime, text)

    assert r.status == "failed"
    error = r.step_error("start")
    assert error["kind"] == "template_error", error
    assert "step 'start'" in error["message"]
    assert where in error["message"]
    assert r.summary.error is not None and r.summary.error["kind"] == "template_error"


async def test_retry_without_a_delay_waits_one_second(runtime: Runtime) -> None:
    text = flaky(ok_at=2, attempts=2).replace(", delay: 0}", "}")
    assert "delay" not in text

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    started = r.tasks("start", "flaky", name="task.started")
    done = r.tasks("start", "flaky")
    assert (ts(started[1]) - ts(done[0])).total_seconds() >= 0.995


async def test_outcome_meta_has_the_attempt_duration_timestamps_and_trace_id(runtime: Runtime) -> None:
    """001 §11: ``outcome.meta`` carries duration, attempt, timestamps and trace ids."""
    import datetime

    import msgspec

    from noetl_stream.client.submit import request_for, submit
    from noetl_stream.client.tracking import follow

    text = playbook(
        """
        - step: start
          tool:
            kind: noop
            result: 1
            spec:
              policy:
                rules:
                  - else: {then: {do: continue, set_ctx: {m: "{{ outcome.meta }}"}}}
        """
    )
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    request = msgspec.structs.replace(request_for(text, "meta.yaml"), trace_id=trace)
    execution_id = await submit(runtime.nc, runtime.topology, request)
    summary = await follow(runtime.nc, runtime.topology, execution_id, timeout=15)
    assert summary.status == "success", summary.error
    meta = summary.ctx["m"]
    assert meta["attempt"] == 1 and meta["duration_s"] >= 0 and meta["trace_id"] == trace

    def at(text: str) -> datetime.datetime:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))

    assert at(meta["started_at"]) <= at(meta["ended_at"]) <= datetime.datetime.now(datetime.UTC)
