"""NoETL's ``set:`` keys and routing names, accepted in canonical mode with a ``dialect`` warning: bare and
``step.`` keys on steps, arcs and policies (ctx), on tasks (names for the step's later tasks); an arc's
``set:``; ``'call.done'``/``'call.error'`` in arc conditions. And the warning at an arc back into a cycle
that a failure takes too."""

from __future__ import annotations

from helpers import playbook
from legacy_support import report, step, yaml

from noetl_stream.dsl import compile_playbook, load_playbook

KEYS = playbook(
    """
    - step: start
      set:
        gate: open
        step.attempt: 1
        ctx.seen: []
      next:
        arcs:
          - step: work
            when: "{{ ctx.gate == 'open' }}"
            set: {release: "v{{ workload.version }}", step.approved_by: gate, ctx.calls: 0}
          - step: work
    - step: work
      tool:
        - name: fetch
          kind: noop
          result: {n: 2}
          set: {count: "{{ output.n }}", step.twice: "{{ fetch.n * 2 }}"}
        - name: use
          kind: noop
          result: "{{ count }}-{{ twice }}-{{ workload.count }}"
    """,
    workload={"version": "2.4", "count": 9},
)


def test_bare_and_step_keys_write_ctx_on_steps_and_arcs() -> None:
    start = step(KEYS, "start")
    (noop,) = start["tool"]
    assert noop["spec"]["policy"]["rules"] == yaml(
        """
        - when: "{{ outcome.status == 'ok' }}"
          then: {do: continue, set_ctx: {gate: open, attempt: 1, seen: []}}
        """
    )
    assert start["next"]["arcs"][0]["set"] == {
        "release": "v{{ workload.version }}",
        "approved_by": "gate",
        "calls": 0,
    }
    arc = load_playbook(KEYS).step("start").next.arcs[0]  # type: ignore[union-attr]
    assert arc.set_ctx == {"release": "v{{ workload.version }}", "approved_by": "gate", "calls": 0}


def test_a_tasks_bare_and_step_keys_are_names_its_later_tasks_read_in_iter() -> None:
    fetch, use = step(KEYS, "work")["tool"]
    assert fetch["spec"]["policy"]["rules"] == yaml(
        """
        - when: "{{ outcome.status == 'ok' }}"
          then: {do: continue, set_iter: {count: "{{ outcome.result.n }}", twice: "{{ outcome.result.n * 2 }}"}}
        """
    )
    assert use["result"] == "{{ iter.count }}-{{ iter.twice }}-{{ workload.count }}"


def test_each_set_block_is_one_dialect_warning() -> None:
    found = [(d.path, d.line, d.col, d.code) for d in compile_playbook(KEYS).diagnostics]
    assert found == [
        ("workflow[0].set", 7, 5, "dialect"),
        ("workflow[0].next.arcs[0].set", 15, 11, "dialect"),
        ("workflow[1].tool[0].set", 22, 9, "dialect"),
    ]


def test_call_names_in_arc_conditions_are_the_boundaries_they_stand_for() -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: noop}
          next:
            arcs:
              - {step: ok, when: "{{ event.name == 'call.done' and workload.go }}"}
              - {step: bad, when: "{{ 'call.error' == event.name }}"}
        - step: each
          loop: {in: [1], iterator: x}
          tool: {kind: noop}
          next:
            arcs:
              - {step: ok, when: "{{ event.name in ['call.done'] }}"}
              - {step: bad, when: "{{ event.name != 'call.done' }}"}
        - step: ok
          tool: {kind: noop}
        - step: bad
          tool: {kind: noop}
        """,
        workload={"go": True},
    )
    assert [a["when"] for a in step(text, "start")["next"]["arcs"]] == [
        "{{ event.name == 'step.done' and workload.go }}",
        "{{ 'step.failed' == event.name }}",
    ]
    assert [a["when"] for a in step(text, "each")["next"]["arcs"]] == [
        "{{ event.name in ['loop.done'] }}",
        "{{ event.name != 'loop.done' }}",
    ]
    assert [r for r in report(text) if "NoETL" in r] == [
        "10:22: warning: step 'start': 'call.done' is NoETL's name for 'step.done' in an arc condition",
        "11:23: warning: step 'start': 'call.error' is NoETL's name for 'step.failed' in an arc condition",
        "17:22: warning: step 'each': 'call.done' is NoETL's name for 'loop.done' in an arc condition",
        "18:23: warning: step 'each': 'call.done' is NoETL's name for 'loop.done' in an arc condition",
    ]
    assert compile_playbook(text).playbook is not None


CYCLE = playbook(
    """
    - step: start
      set: {ctx.more: true}
      next: {arcs: [{step: page}]}
    - step: page
      tool: {kind: noop}
      next:
        arcs:
          - {step: page, when: "{{ ctx.more or workload.again }}"}
          - {step: end}
    - step: end
      tool: {kind: noop}
    """,
    workload={"again": False},
)


def test_an_arc_back_into_a_cycle_that_a_failure_takes_too_is_warned_about() -> None:
    (warning,) = [d for d in compile_playbook(CYCLE, "t.yaml").diagnostics if d.code == "semantics"]
    assert _back_arc_warnings(CYCLE.replace("or workload.again", "")) != []
    assert warning.format() == (
        "t.yaml:13:30: warning: step 'page': the arc back to 'page' is taken when its 'when' is true on any "
        "boundary, step.failed too, and a failure does not change what it tests: a step that keeps failing "
        "re-enters the cycle until the execution ends (the controller ends it after 10 failures of one step "
        'in a row); to loop on success only, write "{{ (ctx.more or workload.again) and event.name != '
        "'step.failed' }}\" (at workflow[1].next.arcs[0].when)"
    )


def test_an_arc_back_that_tests_the_boundary_is_not_warned_about() -> None:
    for guard in ("event.name == 'step.done' and ctx.more", "ctx.more and event.status != 'error'"):
        text = CYCLE.replace("ctx.more or workload.again", guard)
        assert not _back_arc_warnings(text), guard
    forward = CYCLE.replace("{step: page, when", "{step: end, when")  # not a cycle
    assert not _back_arc_warnings(forward)


def _back_arc_warnings(text: str) -> list[str]:
    return [d.message for d in compile_playbook(text).diagnostics if "the arc back" in d.message]
