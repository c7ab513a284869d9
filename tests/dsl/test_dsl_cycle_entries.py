"""A cycle that routes enter at more than one step, with a join in it, has no one loop head: which arc
loops back, and so what the join waits for on its first run, follows the order the arcs are written
(probe: `[a, b]` ran the join four times, its first run without b; `[b, a]` three times). `validate`
warns about it (`multi-entry-cycle`); a cycle entered at one step does not."""

from __future__ import annotations

import pytest
from helpers import playbook

from noetl_stream.dsl import compile_playbook
from noetl_stream.dsl.graph import multi_entry_cycles

REJOIN = """
    - step: start
      tool: {kind: noop}
      next:
        spec: {mode: inclusive}
        arcs: [ARCS]
    - step: a
      tool: {kind: noop}
      next: {arcs: [{step: j}]}
    - step: b
      tool: {kind: noop}
      next: {arcs: [{step: j}]}
    - step: j
      tool: {kind: noop}
      next:
        arcs:
          - {step: b, when: "{{ ctx.n < 3 }}"}
    """


def warnings(text: str, code: str) -> list[str]:
    result = compile_playbook(text, "t.yaml")
    assert not result.errors, result.errors
    return [d.message for d in result.diagnostics if d.code == code]


@pytest.mark.parametrize("arcs", ["{step: a}, {step: b}", "{step: b}, {step: a}"])
def test_a_cycle_entered_at_two_steps_with_a_join_is_named_whatever_the_arc_order(arcs: str) -> None:
    (message,) = warnings(playbook(REJOIN.replace("ARCS", arcs)), "multi-entry-cycle")
    assert message.startswith("steps b, j form a cycle that routes enter at more than one step")
    assert "'b' from 'start'; 'j' from 'a'" in message
    assert "Route every way into the cycle to one step" in message


def test_a_cycle_entered_at_one_step_is_fine() -> None:
    """The same steps, with every way in going to b: b is the loop head, j -> b the back edge."""
    text = playbook(REJOIN.replace("ARCS", "{step: a}, {step: b}")).replace(
        "next: {arcs: [{step: j}]}\n  - step: b", "next: {arcs: [{step: b}]}\n  - step: b", 1
    )
    assert "next: {arcs: [{step: b}]}" in text
    assert warnings(text, "multi-entry-cycle") == []


def test_multi_entry_cycles_finds_each_entry_and_its_outside_predecessors() -> None:
    arcs = {"start": ["a", "b"], "a": ["j"], "b": ["j"], "j": ["b"], "x": ["y"], "y": ["x"]}
    assert multi_entry_cycles(arcs, "start") == [(["b", "j"], {"b": ["start"], "j": ["a"]})]
    loop = {"start": ["fetch"], "fetch": ["fetch", "done"], "done": []}
    assert multi_entry_cycles(loop, "start") == []
