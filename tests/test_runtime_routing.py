"""End to end on a real nats-server: routing between steps (arcs, args, admission, joins, ctx).

Each test runs a playbook through a controller and a worker on its own topology and checks what a
user sees: which steps ran (and how often), the execution's status, result and ctx, and the events.
"""

from __future__ import annotations

import pytest
from helpers import playbook, run

from noetl_stream.local import Runtime

# --- exclusive and inclusive routing ---------------------------------------------------------------


def _fan(mode: str | None) -> str:
    spec = f"spec: {{mode: {mode}}}" if mode else ""
    return playbook(
        f"""
        - step: start
          tool: {{kind: noop, result: 1}}
          next:
            {spec}
            arcs:
              - step: a
                when: "{{{{ start == 2 }}}}"
              - step: b
                when: "{{{{ start == 1 }}}}"
              - step: c
              - step: d
                when: "{{{{ workload.go_d }}}}"
        - step: a
          tool: {{kind: noop, result: a}}
        - step: b
          tool: {{kind: noop, result: b}}
        - step: c
          tool: {{kind: noop, result: c}}
        - step: d
          tool: {{kind: noop, result: d}}
        """,
        workload={"go_d": True},
    )


async def test_exclusive_routing_takes_only_the_first_true_arc_in_yaml_order(runtime: Runtime) -> None:
    r = await run(runtime, _fan("exclusive"))

    assert r.status == "success"
    assert r.ran() == ["start", "b"]
    assert r.matched("start") == [["b"]]
    assert set(r.summary.steps) == {"start", "b"}
    assert r.result == "b"


async def test_exclusive_is_the_default_mode(runtime: Runtime) -> None:
    r = await run(runtime, _fan(None))

    assert r.ran() == ["start", "b"]


async def test_inclusive_routing_takes_every_true_arc(runtime: Runtime) -> None:
    r = await run(runtime, _fan("inclusive"))

    assert r.status == "success"
    assert r.ran()[0] == "start"
    assert sorted(r.ran()[1:]) == ["b", "c", "d"]
    assert r.matched("start") == [["b", "c", "d"]]
    assert "a" not in r.summary.steps
    assert all(r.summary.steps[s].runs == 1 for s in ("b", "c", "d"))


async def test_arc_condition_reads_the_request_payload(runtime: Runtime) -> None:
    r = await run(runtime, _fan("inclusive"), {"go_d": False})

    assert sorted(r.ran()[1:]) == ["b", "c"]


async def test_a_step_without_next_ends_its_branch(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: noop, result: only}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success"
    assert r.result == "only"
    assert r.names()[-2:] == ["workflow.finished", "playbook.processed"]


async def test_no_true_arc_after_success_ends_the_execution_successfully(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: noop, result: 1}
          next:
            arcs:
              - step: never
                when: "{{ start > 5 }}"
        - step: never
          tool: {kind: noop}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success"
    assert r.matched("start") == [[]]
    assert "never" not in r.summary.steps


# --- args ------------------------------------------------------------------------------------------


async def test_arc_args_become_the_targets_args(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: noop, result: {n: 20}}
          next:
            arcs:
              - step: use
                args: {x: "{{ start.n + 1 }}", label: "n={{ start.n }}", fixed: [1, 2], wl: "{{ workload.k }}"}
        - step: use
          tool:
            kind: python
            args: {x: "{{ args.x }}", label: "{{ args.label }}", fixed: "{{ args.fixed }}", wl: "{{ args.wl }}"}
            code: |
              result = {"x": x * 2, "label": label, "fixed": fixed, "wl": wl, "args": sorted(args)}
        """,
        workload={"k": "v"},
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == {
        "x": 42,
        "label": "n=20",
        "fixed": [1, 2],
        "wl": "v",
        "args": ["fixed", "label", "wl", "x"],
    }
    (scheduled,) = r.named("step.scheduled", step="use")
    assert scheduled.payload["args"] == {"x": 21, "label": "n=20", "fixed": [1, 2], "wl": "v"}


async def test_each_arc_carries_its_own_args(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: noop}
          next:
            spec: {mode: inclusive}
            arcs:
              - step: left
                args: {side: L}
              - step: right
                args: {side: R}
        - step: left
          tool: {kind: noop, result: "{{ args.side }}"}
        - step: right
          tool: {kind: noop, result: "{{ args.side }}"}
        """
    )

    r = await run(runtime, text)

    assert r.step_result("left") == "L"
    assert r.step_result("right") == "R"


async def test_arcs_can_route_on_args_of_the_current_step(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          next:
            arcs:
              - step: middle
                args: {mode: fast}
        - step: middle
          tool: {kind: noop}
          next:
            arcs:
              - step: slow
                when: "{{ args.mode == 'slow' }}"
              - step: fast
                when: "{{ args.mode == 'fast' }}"
        - step: slow
          tool: {kind: noop, result: slow}
        - step: fast
          tool: {kind: noop, result: fast}
        """
    )

    r = await run(runtime, text)

    assert r.ran() == ["start", "middle", "fast"]


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
    assert r.result == "RuntimeError"


# --- router steps (no tool) ------------------------------------------------------------------------


async def test_router_step_is_routed_by_the_controller_without_a_worker(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          next:
            arcs:
              - step: route
                args: {size: "{{ workload.size }}"}
        - step: route
          next:
            arcs:
              - step: big
                when: "{{ args.size > 10 }}"
              - step: small
        - step: big
          tool: {kind: noop, result: big}
        - step: small
          tool: {kind: noop, result: small}
        """,
        workload={"size": 3},
    )

    small = await run(runtime, text)
    big = await run(runtime, text, {"size": 30})

    assert (small.status, small.result) == ("success", "small")
    assert (big.status, big.result) == ("success", "big")
    for r in (small, big):
        router_events = [e for e in r.events if e.step in ("start", "route")]
        assert router_events, r.names()
        assert {e.source for e in router_events} == {"server"}
        assert not [e for e in router_events if e.name in ("step.scheduled", "step.started")]
        assert r.summary.steps["route"].status == "done"


# --- legacy alias arcs -----------------------------------------------------------------------------


def _alias(alias: str, fail: bool) -> str:
    code = 'raise ValueError("no")' if fail else "result = 1"
    return playbook(
        f"""
        - step: start
          tool:
            kind: python
            code: |
              {code}
          next:
            arcs:
              - step: matched
                when: "{{{{ event.name == '{alias}' }}}}"
              - step: fallback
                when: "{{{{ event.name in ['step.done', 'step.failed'] }}}}"
        - step: matched
          tool: {{kind: noop, result: matched}}
        - step: fallback
          tool: {{kind: noop, result: fallback}}
        """
    )


@pytest.mark.parametrize(
    ("alias", "fail", "expected"),
    [
        ("call.done", False, "matched"),
        ("call.done", True, "fallback"),
        ("call.error", True, "matched"),
        ("call.error", False, "fallback"),
        ("step.exit", False, "matched"),
        ("step.exit", True, "matched"),
        ("step.done", False, "matched"),
        ("step.failed", True, "matched"),
    ],
)
async def test_legacy_event_name_aliases_in_arcs(
    runtime: Runtime, alias: str, fail: bool, expected: str
) -> None:
    r = await run(runtime, _alias(alias, fail))

    assert r.status == "success", r.summary.error
    assert r.result == expected
    assert r.matched("start") == [[expected]]


async def test_call_done_matches_a_loop_boundary(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          loop:
            in: "{{ [1, 2] }}"
            iterator: x
          tool: {kind: noop, result: "{{ iter.x }}"}
          next:
            arcs:
              - step: after
                when: "{{ event.name == 'call.done' }}"
        - step: after
          tool: {kind: noop, result: "{{ start }}"}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == [1, 2]


# --- results by name -------------------------------------------------------------------------------


async def test_step_results_are_addressable_by_step_name_later(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: python
            code: |
              result = {"items": [1, 2, 3], "meta": {"page": 7}}
          next: {arcs: [{step: middle}]}
        - step: middle
          tool: {kind: noop, result: "{{ start.meta.page }}"}
          next:
            arcs:
              - step: last
                when: "{{ start['items'] | length == 3 and middle == 7 }}"
        - step: last
          tool:
            kind: python
            args: {items: "{{ start['items'] }}", page: "{{ middle }}", via_dot: "{{ start.items }}"}
            code: |
              result = {"sum": sum(items), "page": page, "via_dot": via_dot}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == {"sum": 6, "page": 7, "via_dot": [1, 2, 3]}


async def test_step_result_is_the_pipelines_last_task_result(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            - name: first
              kind: noop
              result: one
            - name: second
              kind: noop
              result: two
          next: {arcs: [{step: after}]}
        - step: after
          tool: {kind: noop, result: "{{ start }}"}
        """
    )

    r = await run(runtime, text)

    assert r.step_result("start") == "two"
    assert r.result == "two"


async def test_task_results_are_addressable_by_task_name_inside_the_pipeline(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            - name: fetch
              kind: python
              code: |
                result = {"rows": [{"id": 1}, {"id": 2}]}
            - name: count
              kind: python
              args: {rows: "{{ fetch.rows }}", prev: "{{ _prev }}"}
              code: |
                result = {"n": len(rows), "prev_is_fetch": prev == {"rows": rows}}
            - name: both
              kind: noop
              result: {first: "{{ fetch.rows[0].id }}", n: "{{ count.n }}", prev: "{{ _prev.n }}", task: "{{ _task }}"}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == {"first": 1, "n": 2, "prev": 2, "task": "both"}
    assert r.step_result("start") == r.result
    assert [e.payload["task"] for e in r.tasks("start")] == ["fetch", "count", "both"]
    assert r.tasks("start", "count")[0].payload["result"] == {"n": 2, "prev_is_fetch": True}


async def test_unknown_step_result_name_fails_the_step_clearly(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: noop}
          next: {arcs: [{step: later}]}
        - step: later
          tool: {kind: noop, result: "{{ nowhere.field }}"}
        - step: nowhere
          tool: {kind: noop, result: x}
        """
    )

    r = await run(runtime, text)

    assert r.status == "failed"
    error = r.step_error("later")
    assert error["kind"] == "template_error"
    assert "nowhere" in error["message"]


# --- ctx -------------------------------------------------------------------------------------------


async def test_set_ctx_is_visible_to_later_steps_and_is_the_final_ctx(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: noop
            result: 5
            spec:
              policy:
                rules:
                  - else:
                      then: {do: continue, set_ctx: {count: "{{ outcome.result }}", who: start}}
          next:
            arcs:
              - step: bump
                when: "{{ ctx.count == 5 }}"
        - step: bump
          tool:
            kind: python
            args: {count: "{{ ctx.count }}"}
            code: |
              result = count + 1
            spec:
              policy:
                rules:
                  - else:
                      then: {do: continue, set_ctx: {count: "{{ outcome.result }}", bumped: true}}
          next: {arcs: [{step: read}]}
        - step: read
          tool: {kind: noop, result: "{{ ctx }}"}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == {"count": 6, "who": "start", "bumped": True}
    assert r.summary.ctx == {"count": 6, "who": "start", "bumped": True}
    patched = r.named("ctx.patched")
    assert [e.payload["patches"] for e in patched] == [
        [{"count": 5, "who": "start"}],
        [{"count": 6, "bumped": True}],
    ]
    assert [e.payload["revision"] for e in patched] == [1, 2]
    assert [e.step for e in patched] == ["start", "bump"]
    assert {e.source for e in patched} == {"server"}


async def test_set_ctx_renders_before_the_patch_and_later_tasks_see_it_at_once(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            - name: one
              kind: noop
              spec:
                policy:
                  rules:
                    - else:
                        then: {do: continue, set_ctx: {n: 1}}
            - name: two
              kind: noop
              spec:
                policy:
                  rules:
                    - else:
                        then: {do: continue, set_ctx: {n: "{{ ctx.n + 1 }}", before: "{{ ctx.n }}"}}
            - name: three
              kind: noop
              result: "{{ ctx.n }}"
          next: {arcs: [{step: after}]}
        - step: after
          tool: {kind: noop, result: "{{ [start, ctx.n, ctx.before] }}"}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == [2, 2, 1]
    assert r.summary.ctx == {"n": 2, "before": 1}
    (patched,) = r.named("ctx.patched")
    assert patched.payload["patches"] == [{"n": 1}, {"n": 2, "before": 1}]


async def test_ctx_patches_of_a_failed_step_are_kept(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            - name: mark
              kind: noop
              spec: {policy: {rules: [{else: {then: {do: continue, set_ctx: {marked: true}}}}]}}
            - name: boom
              kind: python
              code: |
                raise KeyError("k")
          next:
            arcs:
              - step: handle
                when: "{{ event.name == 'step.failed' and ctx.marked }}"
        - step: handle
          tool: {kind: noop, result: handled}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == "handled"
    assert r.summary.ctx == {"marked": True}


async def test_step_run_again_through_a_back_edge(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: noop
            spec: {policy: {rules: [{else: {then: {do: continue, set_ctx: {n: 0}}}}]}}
          next: {arcs: [{step: count}]}
        - step: count
          tool:
            kind: noop
            result: "{{ ctx.n + 1 }}"
            spec: {policy: {rules: [{else: {then: {do: continue, set_ctx: {n: "{{ outcome.result }}"}}}}]}}
          next:
            arcs:
              - step: count
                when: "{{ ctx.n < 3 }}"
              - step: done
        - step: done
          tool: {kind: noop, result: "{{ count }}"}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.started("count") == 3
    assert r.summary.steps["count"].runs == 3
    assert r.result == 3
    assert r.summary.ctx == {"n": 3}


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


async def test_arcs_read_the_boundary_events_result(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: noop, result: {status: partial, count: 2}}
          next:
            arcs:
              - step: complete
                when: "{{ event.result.status == 'complete' }}"
              - step: partial
                when: "{{ event.result.status == 'partial' and event.result.count == 2 }}"
                args: {count: "{{ event.result.count }}"}
        - step: complete
          tool: {kind: noop}
        - step: partial
          tool: {kind: noop, result: "{{ args.count }}"}
        """
    )

    r = await run(runtime, text)

    assert r.ran() == ["start", "partial"]
    assert r.result == 2


async def test_a_ctx_patch_too_large_for_an_event_fails_the_step_clearly(runtime: Runtime) -> None:
    """Large results travel by reference (test_results_by_reference.py); a huge ctx patch cannot."""
    text = playbook(
        """
        - step: start
          tool:
            kind: python
            code: |
              result = "x" * 2_000_000
            spec:
              policy:
                rules:
                  - else:
                      then: {do: continue, set_ctx: {blob: "{{ outcome.result }}"}}
        """
    )

    r = await run(runtime, text)

    assert r.status == "failed"
    error = r.step_error("start")
    assert error["kind"] == "result_too_large"
    assert "reference" in error["message"]


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
