"""End to end on a real nats-server: what skips or fails a step and what that does to the
execution: admission, unhandled and handled failures, template errors in arcs and admission.
"""

from __future__ import annotations

import asyncio

import pytest
import structlog
from helpers import playbook, run
from nats.js import JetStreamContext

from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import follow
from noetl_stream.kv.provision import provision
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import Runtime

# --- admission ------------------------------------------------------------------------------------


def _admission(flag: object) -> str:
    return playbook(
        f"""
        - step: start
          tool: {{kind: noop}}
          next:
            arcs:
              - step: gated
                args: {{ok: {flag}}}
        - step: gated
          spec:
            policy:
              admit:
                rules:
                  - when: "{{{{ args.ok and workload.open }}}}"
                    then: {{allow: true}}
                  - else:
                      then: {{allow: false}}
          tool: {{kind: noop, result: ran}}
          next:
            arcs:
              - step: after
        - step: after
          tool: {{kind: noop, result: after}}
        """,
        workload={"open": True},
    )


async def test_admitted_step_runs(runtime: Runtime) -> None:
    r = await run(runtime, _admission("true"))

    assert r.status == "success"
    assert r.ran() == ["start", "gated", "after"]
    assert not r.named("step.skipped")


@pytest.mark.parametrize(
    ("flag", "payload"), [("false", None), ("true", {"open": False})], ids=["args", "workload"]
)
async def test_denied_admission_skips_the_step_and_ends_its_branch(
    runtime: Runtime, flag: str, payload: dict[str, bool] | None
) -> None:
    r = await run(runtime, _admission(flag), payload)

    assert r.status == "success"
    (skipped,) = r.named("step.skipped")
    assert skipped.step == "gated"
    assert skipped.payload["reason"] == "admission_denied"
    assert r.ran() == ["start"]
    assert r.summary.steps["gated"].status == "skipped"
    assert "after" not in r.summary.steps
    assert not r.named("step.started", step="gated")


async def test_admission_reads_ctx(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: noop
            spec:
              policy:
                rules:
                  - else:
                      then: {do: continue, set_ctx: {allowed: false}}
          next:
            arcs:
              - step: gated
        - step: gated
          spec:
            policy:
              admit:
                rules:
                  - when: "{{ ctx.allowed }}"
                    then: {allow: true}
                  - else:
                      then: {allow: false}
          tool: {kind: noop}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success"
    assert [e.step for e in r.named("step.skipped")] == ["gated"]


# --- failures --------------------------------------------------------------------------------------


async def test_unhandled_step_failure_fails_the_execution(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: noop}
          next:
            spec: {mode: inclusive}
            arcs:
              - step: bad
              - step: good
        - step: bad
          tool:
            kind: python
            code: |
              raise ValueError("bad input")
          next:
            arcs:
              - step: never
                when: "{{ event.name == 'step.done' }}"
        - step: good
          tool: {kind: noop, result: good}
        - step: never
          tool: {kind: noop}
        """
    )

    r = await run(runtime, text)

    assert r.status == "failed"
    assert r.summary.error is not None
    assert r.summary.error["step"] == "bad"
    assert r.summary.error["kind"] == "python_error"
    assert "bad input" in r.summary.error["message"]
    assert r.summary.steps["good"].status == "done"  # the other branch still finished
    assert r.summary.steps["bad"].status == "failed"
    assert "never" not in r.summary.steps
    (processed,) = r.named("playbook.processed")
    assert processed.status == "error"


async def test_handled_step_failure_lets_the_execution_succeed(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: python
            code: |
              raise ValueError("bad input")
          next:
            arcs:
              - step: recover
                when: "{{ event.name == 'step.failed' }}"
                args: {why: "{{ event.error.message }}"}
        - step: recover
          tool: {kind: noop, result: "{{ args.why }}"}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert "bad input" in r.result
    assert r.summary.steps["start"].status == "failed"


async def test_template_error_in_an_arc_fails_the_execution_clearly(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: noop}
          next:
            arcs:
              - step: after
                when: "{{ missing_thing.x > 1 }}"
        - step: after
          tool: {kind: noop}
        """
    )

    r = await run(runtime, text)

    assert r.status == "failed"
    assert r.summary.error is not None
    assert r.summary.error["kind"] == "template_error"
    assert "missing_thing" in r.summary.error["message"]
    assert "step 'start'" in r.summary.error["message"]
    assert "after" not in r.summary.steps


async def test_template_error_in_admission_fails_the_execution_clearly(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: noop}
          next: {arcs: [{step: gated}]}
        - step: gated
          spec:
            policy:
              admit:
                rules:
                  - when: "{{ nope.flag }}"
                    then: {allow: true}
          tool: {kind: noop}
        """
    )

    r = await run(runtime, text)

    assert r.status == "failed"
    assert r.summary.error is not None
    assert r.summary.error["kind"] == "template_error"
    assert r.summary.error["step"] == "gated"
    assert "nope" in r.summary.error["message"]
    assert not r.named("step.started", step="gated")


# --- arcs without `when` are taken on success only --------------------------------------------------


async def test_a_raising_step_with_a_plain_arc_to_end_fails_the_execution(runtime: Runtime) -> None:
    """An arc without ``when`` is not taken on ``step.failed``: the failure is unhandled."""
    text = playbook(
        """
        - step: start
          tool:
            kind: python
            code: |
              raise ValueError("bad input")
          next:
            arcs:
              - step: end
        - step: end
          tool: {kind: noop, result: ended}
        """
    )

    r = await run(runtime, text)

    assert r.status == "failed"
    assert r.summary.error is not None and r.summary.error["step"] == "start"
    assert "bad input" in r.summary.error["message"]
    assert r.matched("start") == [[]]
    assert "end" not in r.summary.steps
    (processed,) = r.named("playbook.processed")
    assert processed.status == "error"


async def test_a_failure_takes_the_arc_with_a_when_and_not_the_plain_one(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: python
            code: |
              raise ValueError("bad input")
          next:
            spec: {mode: inclusive}
            arcs:
              - step: after
              - step: recover
                when: "{{ event.name == 'step.failed' }}"
        - step: after
          tool: {kind: noop}
        - step: recover
          tool: {kind: noop, result: recovered}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == "recovered"
    assert r.matched("start") == [["recover"]]
    assert "after" not in r.summary.steps


async def test_a_failed_branch_fails_the_execution_while_the_other_completes(runtime: Runtime) -> None:
    """Inclusive fan-out to a join: the failed branch's plain arc is not taken, the join runs on the
    branch that arrived, and the execution still ends failed with the branch's error."""
    text = playbook(
        """
        - step: start
          tool: {kind: noop}
          next:
            spec: {mode: inclusive}
            arcs:
              - step: bad
              - step: good
        - step: bad
          tool:
            kind: python
            code: |
              raise ValueError("bad branch")
          next: {arcs: [{step: join}]}
        - step: good
          tool: {kind: noop, result: good}
          next: {arcs: [{step: join}]}
        - step: join
          tool: {kind: noop, result: joined}
        """
    )

    r = await run(runtime, text)

    assert r.status == "failed"
    assert r.summary.error is not None and r.summary.error["step"] == "bad"
    assert "bad branch" in r.summary.error["message"]
    assert r.summary.steps["good"].status == "done"
    assert r.summary.steps["join"].status == "done"
    assert r.started("join") == 1
    (processed,) = r.named("playbook.processed")
    assert processed.status == "error"


LOOPED = """
- step: start
  spec: {policy: {failure: {mode: MODE}}}
  loop: {in: [1, 2, 3], iterator: n}
  tool:
    kind: python
    args: {n: "{{ iter.n }}"}
    code: |
      if n == 2:
          raise ValueError("two")
      result = n
  next:
    arcs:
      - step: after
- step: after
  tool: {kind: noop, result: "{{ start }}"}
"""


async def test_a_best_effort_loop_that_finished_routes_on_with_its_failures_counted(
    runtime: Runtime,
) -> None:
    """``loop.done`` is a success boundary, also when iterations failed under ``best_effort``: the
    plain arc is taken and the failures are in its counts."""
    r = await run(runtime, playbook(LOOPED.replace("MODE", "best_effort")))

    assert r.status == "success", r.summary.error
    assert r.result == [1, None, 3]
    (done,) = r.named("loop.done", step="start")
    assert (done.payload["total"], done.payload["done"], done.payload["failed"]) == (3, 2, 1)
    assert r.matched("start") == [["after"]]


async def test_a_fail_fast_loop_that_fails_does_not_take_its_plain_arc(runtime: Runtime) -> None:
    r = await run(runtime, playbook(LOOPED.replace("MODE", "fail_fast")))

    assert r.status == "failed"
    assert r.summary.error is not None and r.summary.error["step"] == "start"
    assert "after" not in r.summary.steps


async def test_a_step_failing_inside_a_cycle_fails_the_execution(runtime: Runtime) -> None:
    """The cycle's second run of ``count`` fails: its back edge (a ``when`` that wants step.done) and
    its plain exit arc both leave the failure alone."""
    text = playbook(
        """
        - step: start
          tool: {kind: noop}
          next: {arcs: [{step: count, args: {n: 1}}]}
        - step: count
          tool:
            kind: python
            args: {n: "{{ args.n }}"}
            code: |
              if n == 2:
                  raise ValueError("second round")
              result = n
          next:
            arcs:
              - step: count
                when: "{{ event.name == 'step.done' and args.n < 3 }}"
                args: {n: "{{ args.n + 1 }}"}
              - step: end
        - step: end
          tool: {kind: noop}
        """
    )

    r = await run(runtime, text)

    assert r.status == "failed"
    assert r.summary.error is not None and r.summary.error["step"] == "count"
    assert "second round" in r.summary.error["message"]
    assert r.started("count") == 2
    assert "end" not in r.summary.steps


# --- a fold that cannot be stored -------------------------------------------------------------------

BIG_LOOP = playbook(
    """
    - step: start
      loop:
        in: "{{ range(workload.n) | map('string') | list }}"
        iterator: item
        spec: {mode: parallel, max_in_flight: 50, policy: {exec: distributed}}
      tool: {kind: noop, result: "{{ iter.item }}"}
    """,
    workload={"n": 4000},  # packed, the items are above the inline limit: stored in the results bucket
)


async def test_a_fold_that_keeps_failing_backs_off_and_resumes_once_its_cause_is_gone(
    runtime: Runtime, js: JetStreamContext, topology: Topology
) -> None:
    """The results bucket is gone (an operator deleted it): the fold that starts a distributed loop
    cannot store the loop's items, so nothing of it is published or acked. The event comes back later
    each time (1 s, 2 s, 4 s ...: `controller.batch_failed` says when), and once the bucket is there
    again the execution runs to its end: nothing lost."""
    await js.delete_object_store(topology.results_store)
    with structlog.testing.capture_logs() as logs:
        eid = await submit(runtime.nc, topology, request_for(BIG_LOOP, "big.yaml"))
        async with asyncio.timeout(20):
            while len(failed := [e for e in logs if e["event"] == "controller.batch_failed"]) < 3:
                await asyncio.sleep(0.05)
    assert [e["execution_id"] for e in failed[:3]] == [eid] * 3
    assert [(e["attempt"], e["retry_in_s"]) for e in failed[:3]] == [(1, 1.0), (2, 2.0), (3, 4.0)]
    assert f"the results bucket '{topology.results_store}' is not on the server" in failed[0]["error"]

    await provision(js, topology, ("default",))  # the bucket again
    summary = await follow(runtime.nc, topology, eid, timeout=30)
    assert summary.status == "success"
    assert summary.result == [str(i) for i in range(4000)]
