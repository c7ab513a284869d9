"""End to end on a real nats-server: joins, a step with several incoming arcs, which runs once
when every branch that can reach it has arrived or been cut off.
"""

from __future__ import annotations

from helpers import playbook, run

from noetl_stream.runtime.local import Runtime

# --- joins -----------------------------------------------------------------------------------------

JOIN_TAIL = """
        - step: a
          tool: {kind: noop, result: A}
          next:
            arcs:
              - step: join
                args: {from_a: 1}
        - step: b
          tool: {kind: noop, result: B}
          next:
            arcs:
              - step: join
                args: {from_b: 2}
        - step: c
          tool: {kind: noop, result: C}
          next:
            arcs:
              - step: join
        - step: join
          tool:
            kind: python
            args: {seen: "{{ args }}"}
            code: |
              result = sorted(seen)
          next:
            arcs:
              - step: end
        - step: end
          tool: {kind: noop, result: end}
"""


async def test_fan_out_then_join_runs_the_join_exactly_once(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: noop}
          next:
            spec: {mode: inclusive}
            arcs:
              - step: a
              - step: b
              - step: c
        """
        + JOIN_TAIL
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.started("join") == 1
    assert len(r.named("step.scheduled", step="join")) == 1
    assert r.summary.steps["join"].runs == 1
    assert r.started("end") == 1
    # the join starts only after every predecessor finished, and sees their tokens' args together
    done = {e.step: i for i, e in enumerate(r.events) if e.name == "step.done"}
    join_start = r.events.index(r.named("step.started", step="join")[0])
    assert max(done["a"], done["b"], done["c"]) < join_start
    assert r.step_result("join") == ["from_a", "from_b"]
    assert r.result == "end"


async def test_join_where_one_branch_is_not_taken_still_runs_once(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: noop}
          next:
            spec: {mode: inclusive}
            arcs:
              - step: a
              - step: b
                when: "{{ workload.take_b }}"
              - step: c
        """
        + JOIN_TAIL,
        workload={"take_b": False},
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert "b" not in r.summary.steps
    assert r.started("join") == 1
    assert r.step_result("join") == ["from_a"]
    assert r.started("end") == 1


async def test_join_after_exclusive_choice_runs_once(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: noop}
          next:
            arcs:
              - step: a
                when: "{{ workload.pick == 'a' }}"
              - step: b
                when: "{{ workload.pick == 'b' }}"
              - step: c
        """
        + JOIN_TAIL,
        workload={"pick": "b"},
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.ran() == ["start", "b", "join", "end"]
    assert r.step_result("join") == ["from_b"]


async def test_join_waits_for_a_branch_that_is_denied_admission(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: noop}
          next:
            spec: {mode: inclusive}
            arcs:
              - step: a
              - step: b
              - step: c
        """
        + JOIN_TAIL.replace(
            "        - step: b\n",
            "        - step: b\n          spec: {policy: {admit: {rules: [{else: {then: {allow: false}}}]}}}\n",
        )
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert [e.step for e in r.named("step.skipped")] == ["b"]
    assert r.started("join") == 1
    assert r.step_result("join") == ["from_a"]


async def test_join_after_a_deeper_branch_is_cut_off_upstream(runtime: Runtime) -> None:
    """A not-taken arc two steps above the join still reaches it: it does not wait forever."""
    text = playbook(
        """
        - step: start
          tool: {kind: noop}
          next:
            spec: {mode: inclusive}
            arcs:
              - step: left
              - step: right
        - step: left
          tool: {kind: noop}
          next:
            arcs:
              - step: left2
                when: "{{ false }}"
        - step: left2
          tool: {kind: noop}
          next:
            arcs:
              - step: join
        - step: right
          tool: {kind: noop}
          next:
            arcs:
              - step: join
        - step: join
          tool: {kind: noop, result: joined}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success"
    assert "left2" not in r.summary.steps
    assert r.started("join") == 1
    assert r.result == "joined"


async def test_join_whose_every_branch_is_not_taken_never_runs(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: noop}
          next:
            spec: {mode: inclusive}
            arcs:
              - step: a
                when: "{{ false }}"
              - step: b
                when: "{{ false }}"
              - step: done
        - step: a
          tool: {kind: noop}
          next: {arcs: [{step: join}]}
        - step: b
          tool: {kind: noop}
          next: {arcs: [{step: join}]}
        - step: join
          tool: {kind: noop}
        - step: done
          tool: {kind: noop, result: done}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success"
    assert "join" not in r.summary.steps
    assert r.ran() == ["start", "done"]


async def test_join_runs_when_a_predecessor_fails_and_routes_its_failure_there(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: noop}
          next:
            spec: {mode: inclusive}
            arcs:
              - step: ok
              - step: bad
        - step: ok
          tool: {kind: noop}
          next: {arcs: [{step: join}]}
        - step: bad
          tool:
            kind: python
            code: |
              raise RuntimeError("boom")
          next:
            arcs:
              - step: join
                when: "{{ event.name == 'step.failed' }}"
                args: {bad_error: "{{ event.error.kind }}"}
        - step: join
          tool: {kind: noop, result: "{{ args.bad_error }}"}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.started("join") == 1
    assert r.result == "python_error"


async def test_join_waits_for_a_predecessor_that_repeats_through_a_back_edge(runtime: Runtime) -> None:
    """A predecessor that routes back to itself has not resolved until its last run routes onward."""
    text = playbook(
        """
        - step: start
          tool:
            kind: noop
            spec: {policy: {rules: [{else: {then: {do: continue, set_ctx: {n: 0}}}}]}}
          next:
            spec: {mode: inclusive}
            arcs:
              - step: repeat
              - step: other
        - step: repeat
          tool:
            kind: python
            args: {n: "{{ ctx.n }}"}
            code: |
              import time
              time.sleep(0.05)
              result = n + 1
            spec: {policy: {rules: [{else: {then: {do: continue, set_ctx: {n: "{{ outcome.result }}"}}}}]}}
          next:
            arcs:
              - step: repeat
                when: "{{ ctx.n < 3 }}"
              - step: join
        - step: other
          tool: {kind: noop, result: other}
          next: {arcs: [{step: join}]}
        - step: join
          tool: {kind: noop, result: {n: "{{ ctx.n }}", repeat: "{{ repeat }}", other: "{{ other }}"}}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.started("repeat") == 3
    assert r.started("join") == 1
    assert r.result == {"n": 3, "repeat": 3, "other": "other"}


async def test_join_does_not_wait_for_a_predecessor_that_is_unreachable_from_start(runtime: Runtime) -> None:
    """The compiler warns about 'orphan'; at run time it can never deliver, so the join must not wait for it."""
    text = playbook(
        """
        - step: start
          tool: {kind: noop, result: from_start}
          next: {arcs: [{step: join}]}
        - step: orphan
          tool: {kind: noop}
          next: {arcs: [{step: join}]}
        - step: join
          tool: {kind: noop, result: "{{ start }}"}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert "orphan" not in r.summary.steps
    assert r.started("join") == 1
    assert r.result == "from_start"
