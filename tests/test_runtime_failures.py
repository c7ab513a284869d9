"""End to end on a real nats-server: what skips or fails a step and what that does to the
execution: admission, unhandled and handled failures, template errors in arcs and admission.
"""

from __future__ import annotations

import asyncio

import pytest
import structlog
from helpers import playbook, run
from nats.js import JetStreamContext

from noetl_stream.client import follow, request_for, submit
from noetl_stream.kv.provision import provision
from noetl_stream.local import Runtime
from noetl_stream.subjects import Topology

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
    assert r.summary.error["kind"] == "ValueError"
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
