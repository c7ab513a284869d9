"""End to end on a real nats-server: routing between steps (exclusive and inclusive arcs, arc args,
router steps, the legacy event aliases, what arcs read).

Each test runs a playbook through a controller and a worker on its own topology and checks what a
user sees: which steps ran (and how often), the execution's status, result and ctx, and the events.
"""

from __future__ import annotations

import pytest
from helpers import playbook, run

from noetl_stream.runtime.local import Runtime

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


async def test_a_step_with_neither_tool_nor_next_ends_its_branch(runtime: Runtime) -> None:
    """NoETL's ``- step: end``: a terminal step, routed by the controller like a router step (no worker),
    with a null result; a join when several branches lead to it, a failure's arc included."""
    text = playbook(
        """
        - step: start
          tool: {kind: noop, result: 7}
          next:
            spec: {mode: inclusive}
            arcs:
              - step: work
              - step: broken
        - step: work
          tool: {kind: noop, result: "{{ start + 1 }}"}
          next:
            arcs:
              - step: end
        - step: broken
          tool:
            kind: python
            code: |
              raise ValueError("no")
          next:
            arcs:
              - step: end
                when: "{{ event.name == 'step.failed' }}"
        - step: end
          desc: the end
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.step_result("work") == 8
    assert r.step_result("end") is None
    assert r.result is None  # the last step's: the terminal step's
    assert r.summary.steps["end"].runs == 1
    assert r.summary.steps["end"].status == "done"
    assert r.matched("end") == [[]]
    end_events = [e for e in r.events if e.step == "end"]
    assert {e.source for e in end_events} == {"server"}
    assert not [e for e in end_events if e.name in ("step.scheduled", "step.started")]


# --- legacy alias arcs -----------------------------------------------------------------------------

LEGACY_EXECUTOR = "executor: {spec: {extensions: [legacy]}}\nworkflow:\n"
"""The aliases exist only inside legacy translation: these playbooks enable it."""


def _legacy(text: str) -> str:
    return text.replace("workflow:\n", LEGACY_EXECUTOR, 1)


def _alias(alias: str, fail: bool) -> str:
    code = 'raise ValueError("no")' if fail else "result = 1"
    return _legacy(
        playbook(
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
async def test_legacy_event_name_aliases_in_arcs_with_the_legacy_extension(
    runtime: Runtime, alias: str, fail: bool, expected: str
) -> None:
    r = await run(runtime, _alias(alias, fail))

    assert r.status == "success", r.summary.error
    assert r.result == expected
    assert r.matched("start") == [[expected]]


async def test_call_done_matches_a_loop_boundary_with_the_legacy_extension(runtime: Runtime) -> None:
    text = _legacy(
        playbook(
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
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == [1, 2]


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
