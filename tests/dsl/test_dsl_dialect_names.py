"""``validate`` on the names NoETL's playbooks read that v10 spells another way: one warning each (code
``dialect``) naming the canonical spelling, never an ``undefined-name`` for them; the canonical
spellings get none."""

from __future__ import annotations

from helpers import playbook

from noetl_stream.dsl import compile_playbook
from noetl_stream.dsl.diagnostics import Diagnostic


def diagnostics(text: str) -> list[Diagnostic]:
    result = compile_playbook(text, "t.yaml")
    assert result.playbook is not None, [d.format() for d in result.diagnostics]
    return list(result.diagnostics)


def messages(text: str, code: str) -> list[str]:
    return [d.message for d in diagnostics(text) if d.code == code]


LOOPED = playbook(
    """
    - step: start
      loop: {in: "{{ files }}", iterator: f}
      tool:
        kind: noop
        result:
          bare: "{{ f }}"
          positions: "{{ [_index, loop_index, _total, iter._index] }}"
          jinja: "{{ loop.index }} {{ loop.first }} {{ loop.length }}"
          canonical: "{{ [iter.f, iter.index, iter._total, iter._first, iter._last] }}"
          own_for: "{% for x in files %}{{ loop.index }}{% endfor %}"
    """,
    workload={"files": ["a", "b"]},
)


def test_the_loop_item_bare_and_noetls_positions_are_dialect_naming_the_canonical_spelling() -> None:
    warned = messages(LOOPED, "dialect")
    assert any("'{{ f }}' reads the loop's item bare (NoETL's); canonical: 'iter.f'" in m for m in warned)
    for name, canonical in [
        ("_index", "iter.index"),
        ("loop_index", "iter.index"),
        ("_total", "iter._total"),
    ]:
        assert any(f"'{name}' is NoETL's loop position; canonical: '{canonical}'" in m for m in warned), name
    assert any("'iter._index' is NoETL's; canonical: 'iter.index'" in m for m in warned)
    (jinja,) = [m for m in warned if "Jinja's 'loop'" in m]
    assert "loop.index is 'iter.index + 1'" in jinja
    assert "loop.first is 'iter._first'" in jinja and "loop.length is 'iter._total'" in jinja
    assert messages(LOOPED, "undefined-name") == []
    assert len(warned) == 6  # one per form; the canonical ones and a for's own loop: none


def test_the_item_bare_outside_its_loop_is_still_undefined() -> None:
    text = playbook(
        """
        - step: start
          loop: {in: "{{ [1] }}", iterator: f}
          tool: {kind: noop}
          next: {arcs: [{step: after}]}
        - step: after
          tool: {kind: noop, result: "{{ f }}"}
        """
    )
    (undefined,) = messages(text, "undefined-name")
    assert "did you mean 'iter.f'?" in undefined
    assert messages(text, "dialect") == []


CTX = playbook(
    """
    - step: start
      tool:
        kind: noop
        spec:
          policy:
            rules:
              - else: {then: {do: continue, set_ctx: {page: 1}}}
      next: {arcs: [{step: fetch, when: "{{ page > 0 }}"}]}
    - step: fetch
      tool:
        kind: noop
        result:
          bare: "{{ page + 1 }}"
          step: "{{ ctx.start }}"
          key: "{{ ctx.api_url }}"
          canonical: "{{ [ctx.page, start, workload.api_url, api_url] }}"
    """,
    workload={"api_url": "http://api"},
)


def test_ctx_values_bare_and_ctx_as_the_namespace_are_dialect() -> None:
    warned = messages(CTX, "dialect")
    assert (
        sum("'{{ page }}' reads a ctx value bare (NoETL's); canonical: 'ctx.page'" in m for m in warned) == 2
    )
    assert any(
        "'ctx.start' reads the result of step 'start' through ctx" in m and "canonical: 'start'" in m
        for m in warned
    )
    assert any(
        "'ctx.api_url' reads a workload key through ctx" in m and "'workload.api_url'" in m for m in warned
    )
    assert len(warned) == 4
    assert messages(CTX, "undefined-name") == []


def test_output_and_result_in_arcs_and_a_steps_set_are_the_steps_result() -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: python, code: "result = {'rows': [{'n': 1}]}"}
          set:
            ctx.n: "{{ output.data.rows[0].n }}"
          next:
            arcs:
              - step: end
                when: "{{ output.rows | length > 0 and result.rows[0].n == 1 }}"
        - step: end
          tool: {kind: noop}
        """
    )
    warned = messages(text, "dialect")
    assert any(
        "'output' in a step's 'set' is NoETL's name for the step's result; canonical: the step's name ('{{ start }}')"
        in m
        for m in warned
    )
    assert any(
        "'output' in an arc is NoETL's name for the step's result; canonical: 'start'" in m for m in warned
    )
    assert any(
        "'result' in an arc is NoETL's name for the step's result; canonical: 'start'" in m for m in warned
    )
    assert messages(text, "undefined-name") == []


def test_a_step_or_workload_key_named_output_is_read_as_itself() -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: noop, result: 1}
          next: {arcs: [{step: end, when: "{{ output == 'x' }}"}]}
        - step: end
          tool: {kind: noop}
        """,
        workload={"output": "x"},
    )
    assert not any("output" in m for m in messages(text, "dialect"))


def test_job_and_bare_workload_keys_and_step_names_are_canonical() -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: noop, result: "{{ job.uuid }} {{ api_url }}"}
          next: {arcs: [{step: end, when: "{{ start != '' }}"}]}
        - step: end
          tool: {kind: noop, result: "{{ start }} {{ job.execution_id }}"}
        """,
        workload={"api_url": "http://api"},
    )
    assert [d.format() for d in diagnostics(text)] == []


def test_a_workload_template_reads_what_exists_at_start() -> None:
    text = playbook(
        "- step: start\n  tool: {kind: noop}",
        workload={
            "a": "{{ job.uuid }}-{{ execution_id }}",
            "b": "{{ a ~ workload.a }}",
            "c": "{{ start.x }}",
        },
    )
    (undefined,) = messages(text, "undefined-name")
    assert "reads 'start'" in undefined and "the workload renders at start" in undefined
    broken = compile_playbook(
        playbook("- step: start\n  tool: {kind: noop}", workload={"e": "{{ oops( }}"}), "t"
    )
    assert [d.code for d in broken.diagnostics if d.severity == "error"] == ["template-syntax"]


def test_a_tasks_fields_read_its_own_input_and_without_one_input_is_undefined() -> None:
    own = playbook(
        """
        - step: start
          tool:
            - name: a
              kind: noop
              input: {k: 7}
              result: "{{ input.k }}"
        """
    )
    stepwide = playbook(
        """
        - step: start
          input: {k: 7}
          tool: {kind: noop, result: "{{ input.k }}"}
        """
    )
    none = playbook(
        """
        - step: start
          tool:
            - {name: a, kind: noop, input: {k: 7}}
            - {name: b, kind: noop, result: "{{ input.k }}"}
        """
    )
    assert messages(own, "undefined-name") == []
    assert messages(stepwide, "undefined-name") == []
    (undefined,) = messages(none, "undefined-name")
    assert "task 'b': template reads 'input'" in undefined


def test_a_cursor_loops_claim_reads_its_frame_size() -> None:
    text = playbook(
        """
        - step: start
          loop:
            cursor:
              kind: postgres
              auth: pg
              claim: "UPDATE q SET taken = true WHERE id IN (SELECT id FROM q LIMIT {{ __frame_max_rows }}) RETURNING id"
            iterator: row
            spec: {mode: cursor}
          tool: {kind: noop, result: "{{ iter.row.id }}"}
        """
    )
    assert messages(text, "undefined-name") == []
    elsewhere = playbook('- step: start\n  tool: {kind: noop, result: "{{ __frame_max_rows }}"}\n')
    assert len(messages(elsewhere, "undefined-name")) == 1


def test_arcs_that_are_not_a_list_are_an_error_not_a_crash() -> None:
    # (the names' scan of arcs for their set: keys read any value under next.arcs as a list)
    text = playbook(
        """
        - step: start
          tool: {kind: noop}
          next: {arcs: 5}
        - step: end
          tool: {kind: noop, result: "{{ x }}"}
        """
    )
    result = compile_playbook(text, "t.yaml")
    assert [d.path for d in result.errors] == ["workflow[0].next.arcs"]
