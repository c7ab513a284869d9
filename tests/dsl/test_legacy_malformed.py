"""Malformed legacy constructs (found by the property tests): a diagnostic at the construct, from the
compiler and from ``migrate`` alike, never an exception."""

from __future__ import annotations

import pytest
from legacy_support import legacy, report

from noetl_stream.dsl.migrate import migrate_text

END = "- step: end\n  tool: {kind: noop}\n"
TARGET = "step 'start': a 'next' target is a step name or {step, args}, got"

CASES = [
    # A structural 'next' of a step with 000 constructs becomes arcs in the translation itself.
    pytest.param(
        "- step: start\n  tool: {kind: noop}\n  vars: {a: 1}\n  next: [null]\n" + END,
        f"9:12: {TARGET} null",
        "workflow[0].next[0]",
        id="structural_next_null",
    ),
    pytest.param(
        "- step: start\n  tool: {kind: noop}\n  vars: {a: 1}\n  next: [end, {}]\n" + END,
        f"9:17: {TARGET} a mapping without 'step'",
        "workflow[0].next[1]",
        id="structural_next_without_step",
    ),
    pytest.param(
        "- step: start\n  tool: {kind: noop}\n  sink: {tool: {kind: noop}}\n  next: [{step: 5}]\n" + END,
        f"9:12: {TARGET} a mapping whose 'step' is 5",
        "workflow[0].next[0]",
        id="structural_next_step_not_a_name",
    ),
    pytest.param(  # a looped step with vars: the structural next leaves from its <step>_exit step
        "- step: start\n  loop: {in: [1, 2], iterator: x}\n  tool: {kind: noop}\n  vars: {a: 1}\n"
        "  next: [[end]]\n" + END,
        f"10:12: {TARGET} a list",
        "workflow[0].next[0]",
        id="structural_next_list_after_loop",
    ),
    pytest.param(
        "- step: start\n  tool: {kind: noop}\n  case:\n    - when: \"{{ event.name == 'step.exit' }}\"\n"
        "      then: {next: [{args: {a: 1}}]}\n" + END,
        f"10:23: {TARGET} a mapping without 'step'",
        "workflow[0].case[0].then.next[0]",
        id="case_next_without_step",
    ),
    # 002 rule actions merged into a mapping the author also gave, as something else.
    pytest.param(
        "- step: start\n  tool:\n    - name: a\n      kind: noop\n      eval:\n"
        "        - {expr: '{{ true }}', do: continue, set_iter: [x], set_vars: {x: 1}}\n",
        "11:48: step 'start' task 'a': 'set_iter' next to set_vars must be a mapping of names to values",
        "workflow[0].tool[0].eval[0].set_iter",
        id="set_vars_into_a_list",
    ),
    pytest.param(
        "- step: start\n  tool:\n    - name: a\n      kind: noop\n      eval:\n"
        "        - else: {do: continue, set_ctx: x, set_shared: {x: 1}}\n",
        "11:34: step 'start' task 'a': 'set_ctx' next to set_shared must be a mapping of names to values",
        "workflow[0].tool[0].eval[0].else.set_ctx",
        id="set_shared_into_a_string",
    ),
    pytest.param(
        "- step: start\n  tool:\n    - name: a\n      kind: noop\n      eval:\n"
        "        - expr: '{{ true }}'\n          then: {do: continue, set_iter: 3, set_prev: 1}\n"
        "    - name: b\n      kind: noop\n",
        "12:34: step 'start' task 'a': 'set_iter' next to set_prev must be a mapping of names to values",
        "workflow[0].tool[0].eval[0].then.set_iter",
        id="set_prev_into_a_number",
    ),
]


@pytest.mark.parametrize(("steps", "error", "where"), CASES)
def test_a_malformed_legacy_construct_is_reported_not_a_crash(steps: str, error: str, where: str) -> None:
    text = legacy(steps)
    assert [d for d in report(text) if not d.split(": ", 1)[1].startswith("warning: ")] == [error]
    migration = migrate_text(text, "t.yaml")
    assert migration.text is None
    assert [d.format() for d in migration.errors] == [f"t.yaml:{error} (at {where})"]
