"""End to end on a real nats-server: NoETL's ``set:`` on steps and arcs, its routing names and its cycles.

* Step and arc ``set:`` write ctx (bare and ``step.`` keys too); an arc's is written by the controller
  when the arc is taken, before its target is scheduled, so the target's admission, loop and tasks see
  it, and a replay of the execution's events writes it again.
* ``'call.done'``/``'call.error'`` in an arc condition are the step's success and failure boundaries.
* Cycles driven by ``set:`` guards, and joins after branches that ``set:`` their own keys.
* A step that keeps failing in a cycle ends the execution after ten failures in a row.
"""

from __future__ import annotations

import asyncio

import pytest
from helpers import playbook, run
from nats.js.client import JetStreamContext

from noetl_stream.control.replay import replay, verify
from noetl_stream.runtime.local import Runtime

GATE = playbook(
    """
    - step: start
      set:
        gate: open
        step.attempt: 1
      next: {arcs: [{step: run_gate}]}
    - step: run_gate
      tool:
        kind: python
        input: {failed: "{{ workload.failed }}", gate: "{{ ctx.gate }}", attempt: "{{ ctx.attempt }}"}
        code: "result = {'passed': failed == 0 and gate == 'open', 'attempt': attempt}"
      set:
        attempt: "{{ ctx.attempt + 1 }}"
        step.previous: "{{ ctx.attempt }}"
      next:
        arcs:
          - step: tag
            when: "{{ run_gate.passed }}"
            set: {tag: "v{{ workload.version }}-{{ ctx.attempt }}", step.by: gate}
          - step: hold
            set: {tag: none}
    - step: tag
      loop: {in: "{{ [ctx.tag, ctx.by] }}", iterator: part, spec: {policy: {exec: EXEC}}}
      tool: {kind: noop, result: "{{ iter.part }}"}
    - step: hold
      spec: {policy: {admit: {rules: [{when: "{{ ctx.tag == 'none' }}", then: {allow: true}}, {else: {then: {allow: false}}}]}}}
      tool: {kind: noop, result: "{{ ctx.tag }}"}
    """,
    workload={"version": "2.4", "failed": 0},
)


@pytest.mark.parametrize("exec_", ["local", "distributed"])
async def test_step_and_arc_set_write_ctx_before_the_target_is_scheduled(
    runtime: Runtime, js: JetStreamContext, exec_: str
) -> None:
    r = await run(runtime, GATE.replace("EXEC", exec_))

    assert r.status == "success", r.summary.error
    # both values of a block render against the ctx before it: attempt 1 -> 2, previous 1; the arc's
    # `set:` sees the step's (ctx.attempt is 2 by then)
    assert r.summary.ctx == {"gate": "open", "attempt": 2, "previous": 1, "tag": "v2.4-2", "by": "gate"}
    assert r.step_result("tag") == ["v2.4-2", "gate"]  # the loop's `in` read what the arc wrote
    assert "hold" not in r.summary.steps
    patches = [(e.step, e.payload["patches"]) for e in r.named("ctx.patched")]
    assert patches == [
        ("start", [{"gate": "open", "attempt": 1}]),
        ("run_gate", [{"attempt": 2, "previous": 1}]),  # the step's, in its boundary
        ("run_gate", [{"tag": "v2.4-2", "by": "gate"}]),  # its arc's, written by the controller
    ]
    # a replay of the stored events writes the arc's ctx again: the same state as the live one
    state = await replay(js, runtime.topology, r.summary.execution_id)
    assert state is not None and state.ctx == r.summary.ctx
    for _ in range(100):  # the terminal snapshot follows playbook.processed closely
        diffs, live = await verify(js, runtime.topology, r.summary.execution_id)
        if live is not None:
            break
        await asyncio.sleep(0.02)
    assert diffs == []


async def test_an_arc_without_when_writes_its_set_too_and_admission_reads_it(runtime: Runtime) -> None:
    r = await run(runtime, GATE.replace("EXEC", "local"), {"failed": 1})

    assert r.status == "success", r.summary.error
    assert r.ran() == ["start", "run_gate", "hold"]
    assert r.result == "none"
    assert r.summary.ctx["tag"] == "none"


CURSOR = playbook(
    """
    - step: start
      set: {ctx.page: 1, ctx.rows: []}
      next: {arcs: [{step: fetch}]}
    - step: fetch
      tool:
        kind: python
        input: {page: "{{ ctx.page }}", rows: "{{ workload.rows }}", bad: "{{ workload.bad }}"}
        code: |
          if page == bad:
              raise RuntimeError(f"page {page} is bad")
          result = {"items": rows[(page - 1) * 2 : page * 2], "more": page * 2 < len(rows)}
      set:
        rows: "{{ ctx.rows + fetch['items'] }}"
      next:
        arcs:
          - step: fetch
            when: "{{ fetch.more and event.name == 'call.done' }}"
            set: {ctx.page: "{{ ctx.page + 1 }}"}
          - step: done
            when: "{{ event.name == 'call.done' }}"
          - step: failed
            when: "{{ event.name == 'call.error' }}"
            args: {why: "{{ event.error.message }}"}
    - step: done
      tool: {kind: noop, result: "{{ ctx.rows }}"}
    - step: failed
      tool: {kind: noop, result: "{{ args.why }}"}
    """,
    workload={"rows": [1, 2, 3, 4, 5], "bad": 0},
)


async def test_a_self_loop_pages_on_a_set_guard_and_call_names_route_it(runtime: Runtime) -> None:
    r = await run(runtime, CURSOR)

    assert r.status == "success", r.summary.error
    assert r.started("fetch") == 3
    assert r.result == [1, 2, 3, 4, 5]
    assert r.summary.ctx == {"page": 3, "rows": [1, 2, 3, 4, 5]}


async def test_call_error_routes_a_failure(runtime: Runtime) -> None:
    r = await run(runtime, CURSOR, {"bad": 2})

    assert r.status == "success", r.summary.error
    assert r.ran() == ["start", "fetch", "fetch", "failed"]
    assert "page 2 is bad" in r.result
    assert r.summary.ctx == {"page": 2, "rows": [1, 2]}


async def test_call_done_on_a_looped_step_is_its_loop_done(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          loop: {in: [1, 2], iterator: n}
          tool: {kind: noop, result: "{{ iter.n }}"}
          next: {arcs: [{step: after, when: "{{ event.name == 'call.done' }}"}]}
        - step: after
          tool: {kind: noop, result: "{{ start | sum }}"}
        """
    )
    r = await run(runtime, text)
    assert (r.status, r.result) == ("success", 3), r.summary.error


async def test_a_join_after_branches_that_set_their_own_keys_runs_once_with_all_of_them(
    runtime: Runtime,
) -> None:
    text = playbook(
        """
        - step: start
          next:
            spec: {mode: inclusive}
            arcs:
              - {step: emea, set: {ctx.regions: 3}}
              - {step: apac}
              - {step: amer, when: "{{ workload.amer }}"}
        - step: emea
          tool: {kind: python, code: "import time; time.sleep(0.2); result = {'total': 10}"}
          set: {emea: "{{ emea.total }}"}
          next: {arcs: [{step: sum, set: {ctx.from_emea: true}}]}
        - step: apac
          tool: {kind: noop, result: {total: 20}}
          set: {apac: "{{ apac.total }}"}
          next: {arcs: [{step: sum}]}
        - step: amer
          tool: {kind: noop, result: {total: 40}}
          set: {amer: "{{ amer.total }}"}
          next: {arcs: [{step: sum}]}
        - step: sum
          tool: {kind: noop, result: "{{ ctx.emea + ctx.apac + (ctx.amer | default(0)) }}"}
        """,
        workload={"amer": False},
    )
    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.started("sum") == 1
    assert r.result == 30
    assert r.summary.ctx == {"regions": 3, "emea": 10, "apac": 20, "from_emea": True}


async def test_a_cycle_of_steps_runs_while_its_set_guard_holds_and_a_join_after_it_runs_once(
    runtime: Runtime,
) -> None:
    text = playbook(
        """
        - step: start
          set: {ctx.page: 0, ctx.total: 0}
          next:
            spec: {mode: inclusive}
            arcs: [{step: fetch}, {step: audit}]
        - step: fetch
          tool: {kind: noop, result: {more: "{{ ctx.page < 2 }}"}}
          set: {page: "{{ ctx.page + 1 }}", more: "{{ fetch.more }}"}
          next: {arcs: [{step: save}]}
        - step: save
          tool: {kind: noop, result: "{{ ctx.page }}"}
          set: {total: "{{ ctx.total + 10 }}"}
          next:
            arcs:
              - {step: fetch, when: "{{ ctx.more and event.name != 'step.failed' }}"}
              - {step: report}
        - step: audit
          tool: {kind: python, code: "import time; time.sleep(0.2); result = 'audited'"}
          next: {arcs: [{step: report}]}
        - step: report
          tool: {kind: noop, result: "{{ ctx.total }} {{ audit }}"}
        """
    )
    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert (r.started("fetch"), r.started("save"), r.started("report")) == (3, 3, 1)
    assert r.result == "30 audited"
    assert r.summary.ctx == {"page": 3, "total": 30, "more": False}


FAILING_CYCLE = playbook(
    """
    - step: start
      set: {ctx.more: true}
      next: {arcs: [{step: load}]}
    - step: load
      tool: {kind: python, code: "raise RuntimeError('the table is locked')"}
      next:
        arcs:
          - {step: load, when: "{{ ctx.more }}"}
          - {step: end}
    - step: end
      tool: {kind: noop}
    """
)


async def test_a_step_that_keeps_failing_in_a_cycle_ends_the_execution(runtime: Runtime) -> None:
    r = await run(runtime, FAILING_CYCLE)

    assert r.status == "failed"
    assert r.started("load") == 10
    error = r.summary.error or {}
    assert (error["kind"], error["step"]) == ("failing_cycle", "load")
    assert error["message"].startswith("step 'load' failed 10 times in a row, routed back into its cycle")
    assert "its last error: RuntimeError: the table is locked" in error["message"]


async def test_a_success_between_failures_starts_the_count_again(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          set: {ctx.runs: 0}
          next: {arcs: [{step: load}]}
        - step: load
          tool:
            kind: python
            input: {n: "{{ ctx.runs }}"}
            code: |
              if n % 8 != 7 and n < 20:
                  raise RuntimeError(f"run {n}")
              result = n
          next:
            arcs:
              - {step: load, when: "{{ ctx.runs < 20 }}", set: {ctx.runs: "{{ ctx.runs + 1 }}"}}
              - {step: end}
        - step: end
          tool: {kind: noop, result: "{{ ctx.runs }}"}
        """
    )
    r = await run(runtime, text)

    assert r.status == "success", r.summary.error  # 7 failures, a success, 7, a success, 4, a success
    assert r.started("load") == 21
    assert r.result == 20
