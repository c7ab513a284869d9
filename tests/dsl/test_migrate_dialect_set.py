"""``noetl-stream migrate`` on NoETL's ``set:``: in a policy's ``then``, on a step, on a task and on an
arc it is written as the dialect expansion makes it (``set_ctx``/``set_iter`` on the rules that go on, a
looped step's ``<step>_set`` step); an arc's ``set:`` only where a rule writes the same as the controller
would, else migrate refuses and names the reason."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from helpers import playbook, run
from migrate_support import migrated, migrated_steps, refused, rules, steps
from test_migrate import noetl

from noetl_stream.runtime.local import Runtime


def going_on(when: str, set_ctx: dict[str, Any]) -> dict[str, Any]:
    """A rule that, when `when` holds, goes on and writes `set_ctx`."""
    return {"when": when, "then": {"do": "continue", "set_ctx": set_ctx}}


# -- set: in a policy, on a step, on a task ----------------------------------------------------------


def test_policy_then_set_is_set_ctx_and_set_iter() -> None:
    start = migrated_steps(
        """
        - step: start
          tool:
            kind: python
            code: "result = {'n': 1}"
            spec:
              policy:
                rules:
                  - when: true
                    then:
                      do: continue
                      set: {iter.tries: "{{ _attempt }}", ctx.n: "{{ output.data.n }}", step.by: me, seen: 1}
        """
    )["start"]
    assert rules(start)[0]["then"] == {
        "do": "continue",
        "set_iter": {"tries": "{{ _attempt }}"},
        "set_ctx": {"n": "{{ outcome.result.n }}", "by": "me", "seen": 1},
    }


def test_a_step_set_is_set_ctx_on_the_rules_that_end_its_pipeline() -> None:
    start = migrated_steps(
        """
        - step: start
          tool:
            - name: a
              kind: python
              code: "result = {'n': 1}"
            - name: b
              kind: python
              code: "result = {'m': 2}"
          set:
            total: "{{ output.m + start.a.n }}"
            ctx.result_too: "{{ result.m }}"
        """
    )["start"]
    assert "set" not in start and "spec" not in start["tool"][0]
    assert rules(start, 1) == [
        going_on(
            "{{ outcome.status == 'ok' }}",
            {"total": "{{ outcome.result.m + outcome.result.a.n }}", "result_too": "{{ outcome.result.m }}"},
        )
    ]


def test_a_step_set_on_a_step_without_tasks_gets_a_noop_before_its_arcs() -> None:
    start = migrated_steps(
        """
        - step: start
          set: {ctx.gate: open}
          next: {arcs: [{step: end}]}
        - step: end
          tool: {kind: noop, result: "{{ ctx.gate }}"}
        """
    )["start"]
    assert list(start) == ["step", "tool", "next"]
    assert start["tool"][0]["name"] == "start_set"
    assert rules(start, 0)[0]["then"] == {"do": "continue", "set_ctx": {"gate": "open"}}


def test_a_looped_step_set_moves_to_a_step_after_the_loop() -> None:
    out = migrated_steps(
        """
        - step: start
          loop: {in: [1, 2, 3], iterator: n}
          tool: {kind: python, code: "result = n * 2", input: {n: "{{ n }}"}}
          set:
            ctx.total: "{{ output.results | sum }}"
          next:
            arcs:
              - step: end
                when: "{{ event.name == 'call.done' }}"
        - step: end
          tool: {kind: noop, result: "{{ total }}"}
        """
    )
    assert list(out) == ["start", "start_set", "end"]
    (to_set,) = out["start"]["next"]["arcs"]  # the loop's success leads to start_set, with its boundary
    assert (to_set["step"], to_set["when"]) == ("start_set", "{{ event.name != 'step.failed' }}")
    assert to_set["args"]["loop_event"]["total"] == "{{ event.total | default(none) }}"
    assert out["start_set"]["tool"]["result"] == "{{ start }}"
    assert rules(out["start_set"])[0]["then"]["set_ctx"] == {"total": "{{ start.results | sum }}"}
    assert out["start_set"]["next"]["arcs"] == [
        {"step": "end", "when": "{{ args.loop_event.name == 'loop.done' }}"}
    ]
    assert out["end"]["tool"]["result"] == "{{ ctx.total }}"


def test_a_task_set_names_what_later_tasks_read_in_iter() -> None:
    start = migrated_steps(
        """
        - step: start
          tool:
            - name: count
              kind: python
              code: "result = {'n': 3}"
              set: {n: "{{ output.n }}", ctx.seen: "{{ count.n }}"}
            - name: use
              kind: noop
              result: "{{ n + 1 }}"
        """
    )["start"]
    assert rules(start, 0)[0]["then"] == {
        "do": "continue",
        "set_iter": {"n": "{{ outcome.result.n }}"},
        "set_ctx": {"seen": "{{ outcome.result.n }}"},
    }
    assert start["tool"][1]["result"] == "{{ iter.n + 1 }}"


# -- set: on an arc ----------------------------------------------------------------------------------

# Three routes from start (x = 1, 2, anything else), each to a step that returns what the arcs wrote.
TARGETS = ("one", "two", "other")
WROTE = "{{ [ctx.picked | default('-'), ctx.n | default('-'), ctx.seen] }}"
ROUTED = playbook(
    textwrap.dedent(
        """
    - step: start
      tool: {kind: python, input: {x: "{{ workload.x }}"}, code: "result = {'x': x}"}
      set: {ctx.seen: "{{ output.x }}"}
      next:
        arcs:
          - step: one
            when: "{{ output.x == 1 }}"
          - step: two
            when: "{{ event.name == 'call.done' and output.x == 2 }}"
            set: {picked: two, ctx.n: "{{ output.x * 10 }}"}
          - step: other
            set: {picked: other}
    """
    )
    + "".join(f'- step: {name}\n  tool: {{kind: noop, result: "{WROTE}"}}\n' for name in TARGETS),
    workload={"x": 1},
)


def test_an_arc_set_is_set_ctx_on_the_rules_taken_when_the_arc_is() -> None:
    start = steps(migrated(ROUTED))["start"]
    assert [a.get("when") for a in start["next"]["arcs"]] == [
        "{{ start.x == 1 }}",
        "{{ event.name == 'step.done' and start.x == 2 }}",
        None,
    ]
    assert all("set" not in a for a in start["next"]["arcs"])
    seen = {"seen": "{{ outcome.result.x }}"}
    assert rules(start) == [
        going_on(
            "{{ outcome.status == 'ok' and not (outcome.result.x == 1) and outcome.result.x == 2 }}",
            {**seen, "picked": "two", "n": "{{ outcome.result.x * 10 }}"},
        ),
        going_on("{{ outcome.status == 'ok' and not (outcome.result.x == 1) }}", {**seen, "picked": "other"}),
        going_on("{{ outcome.status == 'ok' }}", seen),
    ]


def test_an_arc_set_whose_condition_excludes_the_failure_boundary_is_moved() -> None:
    start = migrated_steps(
        """
        - step: start
          tool: {kind: python, code: "result = {'n': 1}"}
          next:
            arcs:
              - step: end
                when: "{{ event.name != 'step.failed' and output.n > 0 }}"
                set: {k: "{{ output.n }}"}
        - step: end
          tool: {kind: noop, result: "{{ ctx.k }}"}
        """
    )["start"]
    assert rules(start)[0] == going_on(
        "{{ outcome.status == 'ok' and outcome.result.n > 0 }}", {"k": "{{ outcome.result.n }}"}
    )


@pytest.mark.parametrize(("x", "expected"), [(1, ["-", "-", 1]), (2, ["two", 20, 2]), (3, ["other", "-", 3])])
async def test_a_moved_arc_set_writes_what_the_controller_wrote(
    runtime: Runtime, x: int, expected: list[Any]
) -> None:
    before = await run(runtime, ROUTED, {"x": x})
    after = await run(runtime, migrated(ROUTED), {"x": x})
    assert (before.summary.status, before.summary.result) == ("success", expected)
    assert (after.summary.status, after.summary.result) == ("success", expected)


@pytest.mark.parametrize(
    ("arcs", "why"),
    [
        (
            "loop: {in: [1], iterator: i}\nnext: {arcs: [{step: end, set: {k: 1}}]}",
            "the step has a loop (its arcs see the loop's end, which no task sees)",
        ),
        (
            "next: {arcs: [{step: end, when: \"{{ event.name == 'call.error' }}\", set: {k: 1}}]}",
            "arc 1 is taken on the step's failure, where its rules write nothing",
        ),
        (
            'next: {arcs: [{step: end, when: "{{ ctx.k is not defined }}", set: {k: 1}}]}',
            "arc 1 may be taken on the step's failure (its condition does not exclude it), where its rules "
            "write nothing",
        ),
        (
            'set: {k: 2}\nnext: {arcs: [{step: end, set: {j: "{{ ctx.k }}"}}]}',
            "arc 1's condition or set: reads 'k', which the step's own rules write in the same block (the "
            "controller reads it after that write, a rule before it)",
        ),
        (
            'next: {arcs: [{step: end, when: "{{ output.n and ctx.k }}", set: {k: 1}}]}',
            "arc 1's condition or args read 'k', which an arc's set: writes (the controller reads it before "
            "that write, and would read it after)",
        ),
        (
            "next: {spec: {mode: inclusive}, arcs: [{step: end, set: {k: 1}}, {step: end, set: {j: 1}}]}",
            "the router is 'inclusive' and several arcs have a 'set:' (they may be taken together)",
        ),
        (
            'next: {arcs: [{step: end, when: "{{ output.n }}", set: {k: "{{ event.result }}"}}]}',
            "arc 1's set: value reads 'event', which a task policy does not see as an arc does",
        ),
    ],
)
def test_an_arc_set_that_a_rule_would_not_write_the_same_is_refused(
    arcs: str, why: str, tmp_path: Path
) -> None:
    step = "- step: start\n  tool: {kind: python, code: \"result = {'n': 1}\"}\n"
    text = playbook(step + textwrap.indent(arcs, "  ") + "\n- step: end\n  tool: {kind: noop}\n")
    error = refused(text, "arc.yaml")[0]
    assert error.startswith("step 'start' arc 'end': 'set:' on an arc has no canonical v10 form")
    assert error.endswith(f"only where that is the same, not here: {why}")
    source, out = tmp_path / "arc.yaml", tmp_path / "out.yaml"
    source.write_text(text)
    proc = noetl("migrate", str(source), "-o", str(out))
    assert proc.returncode == 2
    assert why in proc.stderr
    assert not out.exists() and source.read_text() == text
