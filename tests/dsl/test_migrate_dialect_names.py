"""``noetl-stream migrate`` on the names NoETL's templates read: the loop's item and positions, ctx
values and the workload read bare or through ``ctx``, ``ctx.<step>``; in arcs NoETL's event names and
``output``/``result`` (null where the step failed); a rewritten template keeps its block style."""

from __future__ import annotations

from helpers import playbook
from migrate_support import migrated, migrated_steps

# -- in a task ----------------------------------------------------------------------------------------


def test_names_read_bare_are_written_in_their_scope() -> None:
    out = migrated_steps(
        """
        - step: start
          tool:
            kind: python
            code: "result = {'rows': [1, 2]}"
            spec:
              policy:
                rules:
                  - when: true
                    then: {do: continue, set: {ctx.limit: 2}}
        - step: each
          loop: {in: "{{ ctx.start.rows }}", iterator: row}
          tool:
            kind: noop
            result:
              item: "{{ row }}"
              index: "{{ _index }} {{ loop_index }} {{ iter._index }}"
              one_based: "{{ loop.index }}"
              edges: "{{ loop.first }} {{ loop.last }} {{ loop.length }} {{ _total }}"
              limit: "{{ limit }}"
              api: "{{ ctx.api }}"
        """,
        workload={"api": "http://x"},
    )
    assert out["each"]["loop"]["in"] == "{{ start.rows }}"
    assert out["each"]["tool"]["result"] == {
        "item": "{{ iter.row }}",
        "index": "{{ iter.index }} {{ iter.index }} {{ iter.index }}",
        "one_based": "{{ (iter.index + 1) }}",
        "edges": "{{ iter._first }} {{ iter._last }} {{ iter._total }} {{ iter._total }}",
        "limit": "{{ ctx.limit }}",
        "api": "{{ workload.api }}",
    }


def test_migrated_names_in_a_block_scalar_keep_the_block() -> None:
    text = playbook(
        """
        - step: start
          loop: {in: [1], iterator: n}
          tool:
            kind: python
            code: |
              # the item
              result = {{ n }}
        """
    )
    assert "code: |\n        # the item\n        result = {{ iter.n }}\n" in migrated(text)


# -- in arcs -----------------------------------------------------------------------------------------


def test_call_done_and_call_error_and_output_in_arcs() -> None:
    arcs = migrated_steps(
        """
        - step: start
          tool: {kind: python, code: "result = {'ok': True}"}
          next:
            arcs:
              - step: good
                when: "{{ event.name == 'call.done' and output.ok and result.ok }}"
              - step: bad
                when: "{{ event.name == 'call.error' }}"
        - step: good
          tool: {kind: noop}
        - step: bad
          tool: {kind: noop}
        """
    )["start"]["next"]["arcs"]
    assert [a["when"] for a in arcs] == [
        "{{ event.name == 'step.done' and start.ok and start.ok }}",
        "{{ event.name == 'step.failed' }}",
    ]


def test_output_in_an_arc_that_can_see_a_failure_stays_null_there() -> None:
    # In a failed step's arcs output is null, where {{ <step> }} is undefined, or the result of the
    # step's run before (a cycle): the step's name is written only where it reads the same.
    out = migrated_steps(
        """
        - step: start
          tool: {kind: python, code: "result = {'more': False}"}
          next:
            arcs:
              - step: once
                when: "{{ output.more }}"
              - step: once
                when: "{{ output is none }}"
              - step: end
                when: "{{ event.name == 'call.done' and output is none }}"
              - step: end
                args: {r: "{{ result }}"}
        - step: once
          tool: {kind: noop}
        - step: page
          tool: {kind: python, code: "result = {'more': False}"}
          next:
            arcs:
              - step: page
                when: "{{ output.more }}"
              - step: end
        - step: end
          tool: {kind: noop}
        """
    )
    assert [a.get("when", a.get("args")) for a in out["start"]["next"]["arcs"]] == [
        "{{ start.more }}",
        "{{ (none if event.name == 'step.failed' else start) is none }}",
        "{{ event.name == 'step.done' and start is none }}",
        {"r": "{{ start }}"},
    ]
    assert out["page"]["next"]["arcs"][0]["when"] == (
        "{{ (none if event.name == 'step.failed' else page).more }}"
    )
