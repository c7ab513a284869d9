"""``noetl-stream migrate`` on NoETL's dialect (noetl.io/v2 as NoETL's users write it): every form
``validate`` warns about (code ``dialect``) is written in its canonical spelling, the result validates
without a ``dialect`` warning and migrates to itself, comments and key order are kept; a form without
a canonical spelling is an error and nothing is written."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest
from helpers import playbook, run
from legacy_support import yaml
from test_migrate import noetl

from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.dsl import compile_playbook
from noetl_stream.dsl.migrate import migrate_text
from noetl_stream.dsl.respell import envelope
from noetl_stream.dsl.rewrite import Untranslatable, rewrite_chains
from noetl_stream.dsl.templates import RenderError, render_value
from noetl_stream.dsl.views import result_view
from noetl_stream.runtime.local import Runtime


def migrated(text: str) -> str:
    """The migrated text, checked: it validates without a ``dialect`` warning (nor any error) and
    migrates to itself; the original had ``dialect`` warnings and each rewrite was reported."""
    before = compile_playbook(text, "in.yaml")
    assert [d for d in before.diagnostics if d.code == "dialect"], "no NoETL form in the input"
    migration = migrate_text(text, "in.yaml")
    assert migration.text is not None, [d.format() for d in migration.diagnostics]
    assert migration.changed
    assert migration.errors == ()
    after = compile_playbook(migration.text, "out.yaml")
    assert after.errors == (), [d.format() for d in after.errors]
    assert [d.format() for d in after.diagnostics if d.code == "dialect"] == []
    again = migrate_text(migration.text, "out.yaml")
    assert (again.text, again.diagnostics, again.changed) == (migration.text, (), False)
    return migration.text


def steps(text: str) -> dict[str, Any]:
    return {s["step"]: s for s in yaml(text)["workflow"]}


def rules(step: dict[str, Any], task: int | None = None) -> list[dict[str, Any]]:
    tool = step["tool"] if task is None else step["tool"][task]
    return list(tool["spec"]["policy"]["rules"])


# -- the whole file: comments, order, styles --------------------------------------------------------

NOETL = """\
# Pages through an API (NoETL's dialect).
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: pages   # kept
  path: tests/pages
workload:
  api_url: http://127.0.0.1:1   # the API
workflow:
  - step: start
    set:
      ctx.page: 1    # the first page
    next:
      arcs:
        - step: fetch

  # one page at a time
  - step: fetch
    tool:
      kind: http
      url: "{{ api_url }}/items"
      params: {page: "{{ page }}"}
      timeout: 5   # seconds
      spec:
        policy:
          rules:
            - when: "{{ output.status == 'error' and output.error.retryable }}"
              then: {do: retry, attempts: 3, backoff: fixed}
            - else: {do: continue}
    set:
      ctx.page: "{{ page + 1 }}"
      ctx.more: "{{ output.data.data.more }}"
    next:
      arcs:
        - step: fetch
          when: "{{ event.name == 'call.done' and ctx.more }}"
        - step: end
          when: "{{ event.name == 'call.done' }}"

  - step: end
    tool:
      kind: noop
      result: "{{ ctx.fetch.data }}"
"""

CANONICAL = """\
# Pages through an API (NoETL's dialect).
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: pages   # kept
  path: tests/pages
workload:
  api_url: http://127.0.0.1:1   # the API
workflow:
  - step: start
    tool:
      - name: start_set
        kind: noop
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'ok' }}"
                then:
                  do: continue
                  set_ctx:
                    page: 1 # the first page
    next:
      arcs:
        - step: fetch

  # one page at a time
  - step: fetch
    tool:
      kind: http
      url: "{{ api_url }}/items"
      params: {page: "{{ ctx.page }}"}
      spec:
        policy:
          rules:
            - when: "{{ outcome.status == 'error' and (outcome.error.retryable | default(false)) }}"
              then: {do: retry, attempts: 3, backoff: none}
            - else:
                then:
                  do: continue
                  set_ctx:
                    page: "{{ ctx.page + 1 }}"
                    more: "{{ outcome.result.data.data.more }}"
        timeout: 5 # seconds
    next:
      arcs:
        - step: fetch
          when: "{{ event.name == 'step.done' and ctx.more }}"
        - step: end
          when: "{{ event.name == 'step.done' }}"

  - step: end
    tool:
      kind: noop
      result: "{{ fetch.data }}"
"""


def test_a_dialect_playbook_is_rewritten_keeping_comments_order_and_styles() -> None:
    assert migrated(NOETL) == CANONICAL


def test_each_form_is_reported_at_the_line_the_author_wrote_it() -> None:
    migration = migrate_text(NOETL, "pages.yaml")
    found = sorted((d.line, d.message.split(": ", 1)[1][:40]) for d in migration.diagnostics)
    assert found == [
        (11, "'set:' on a step is NoETL's; canonical: "),
        (22, "'{{ page }}' reads a ctx value bare (NoE"),
        (23, "'timeout: 5' written as 'spec: {timeout:"),
        (27, "'output' in a task policy is NoETL's env"),
        (28, "002 'backoff: fixed' translated to 'back"),  # (a legacy draft's form too)
        (29, "002 'else' with a flat action translated"),
        (30, "'output' in a step's 'set' is NoETL's na"),
        (30, "'set:' on a step is NoETL's; canonical: "),
        (31, "'{{ page }}' reads a ctx value bare (NoE"),
        (36, "'call.done' is NoETL's name for 'step.do"),
        (38, "'call.done' is NoETL's name for 'step.do"),
        (43, "'ctx.fetch' reads the result of step 'fe"),
    ]
    assert all(d.severity == "warning" for d in migration.diagnostics)


def test_a_canonical_playbook_is_not_changed() -> None:
    text = migrated(NOETL).replace("# kept", "#  as written")
    migration = migrate_text(text, "c.yaml")
    assert (migration.text, migration.diagnostics, migration.changed) == (text, (), False)


def test_a_task_input_is_canonical_and_stays() -> None:
    text = playbook(
        """
        - step: start
          loop: {in: [1, 2], iterator: n}
          tool: {kind: python, input: {n: "{{ n }}"}, code: "result = n"}
        """
    )
    out = migrated(text)
    assert steps(out)["start"]["tool"] == {
        "kind": "python",
        "input": {"n": "{{ iter.n }}"},
        "code": "result = n",
    }
    plain = playbook('- step: start\n  tool: {kind: python, input: {n: 1}, code: "result = n"}')
    assert migrate_text(plain).text == plain


# -- set: in its four places ---------------------------------------------------------------------


def test_policy_then_set_is_set_ctx_and_set_iter() -> None:
    text = playbook(
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
    )
    then = rules(steps(migrated(text))["start"])[0]["then"]
    assert then == {
        "do": "continue",
        "set_iter": {"tries": "{{ _attempt }}"},
        "set_ctx": {"n": "{{ outcome.result.n }}", "by": "me", "seen": 1},
    }


def test_a_step_set_is_set_ctx_on_the_rules_that_end_its_pipeline() -> None:
    text = playbook(
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
    )
    start = steps(migrated(text))["start"]
    assert "set" not in start and "spec" not in start["tool"][0]
    assert rules(start, 1) == [
        {
            "when": "{{ outcome.status == 'ok' }}",
            "then": {
                "do": "continue",
                "set_ctx": {
                    "total": "{{ outcome.result.m + outcome.result.a.n }}",
                    "result_too": "{{ outcome.result.m }}",
                },
            },
        }
    ]


def test_a_step_set_on_a_step_without_tasks_gets_a_noop_before_its_arcs() -> None:
    text = playbook(
        """
        - step: start
          set: {ctx.gate: open}
          next: {arcs: [{step: end}]}
        - step: end
          tool: {kind: noop, result: "{{ ctx.gate }}"}
        """
    )
    start = steps(migrated(text))["start"]
    assert list(start) == ["step", "tool", "next"]
    assert start["tool"][0]["name"] == "start_set"
    assert rules(start, 0)[0]["then"] == {"do": "continue", "set_ctx": {"gate": "open"}}


def test_a_looped_step_set_moves_to_a_step_after_the_loop() -> None:
    text = playbook(
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
    out = steps(migrated(text))
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
    text = playbook(
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
    )
    start = steps(migrated(text))["start"]
    assert rules(start, 0)[0]["then"] == {
        "do": "continue",
        "set_iter": {"n": "{{ outcome.result.n }}"},
        "set_ctx": {"seen": "{{ outcome.result.n }}"},
    }
    assert start["tool"][1]["result"] == "{{ iter.n + 1 }}"


ROUTED = playbook(
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
    - step: one
      tool: {kind: noop, result: "{{ [ctx.picked | default('-'), ctx.n | default('-'), ctx.seen] }}"}
    - step: two
      tool: {kind: noop, result: "{{ [ctx.picked | default('-'), ctx.n | default('-'), ctx.seen] }}"}
    - step: other
      tool: {kind: noop, result: "{{ [ctx.picked | default('-'), ctx.n | default('-'), ctx.seen] }}"}
    """,
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
    assert rules(start) == [
        {
            "when": "{{ outcome.status == 'ok' and not (outcome.result.x == 1) and outcome.result.x == 2 }}",
            "then": {
                "do": "continue",
                "set_ctx": {
                    "seen": "{{ outcome.result.x }}",
                    "picked": "two",
                    "n": "{{ outcome.result.x * 10 }}",
                },
            },
        },
        {
            "when": "{{ outcome.status == 'ok' and not (outcome.result.x == 1) }}",
            "then": {"do": "continue", "set_ctx": {"seen": "{{ outcome.result.x }}", "picked": "other"}},
        },
        {
            "when": "{{ outcome.status == 'ok' }}",
            "then": {"do": "continue", "set_ctx": {"seen": "{{ outcome.result.x }}"}},
        },
    ]


def test_an_arc_set_whose_condition_excludes_the_failure_boundary_is_moved() -> None:
    text = playbook(
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
    )
    start = steps(migrated(text))["start"]
    assert rules(start)[0] == {
        "when": "{{ outcome.status == 'ok' and outcome.result.n > 0 }}",
        "then": {"do": "continue", "set_ctx": {"k": "{{ outcome.result.n }}"}},
    }


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
    arcs: str, why: str, tmp_path: Any
) -> None:
    step = "- step: start\n  tool: {kind: python, code: \"result = {'n': 1}\"}\n"
    text = playbook(step + textwrap.indent(arcs, "  ") + "\n- step: end\n  tool: {kind: noop}\n")
    migration = migrate_text(text, "arc.yaml")
    assert migration.text is None
    error = migration.errors[0]
    assert error.message.startswith("step 'start' arc 'end': 'set:' on an arc has no canonical v10 form")
    assert error.message.endswith(f"only where that is the same, not here: {why}")
    source, out = tmp_path / "arc.yaml", tmp_path / "out.yaml"
    source.write_text(text)
    proc = noetl("migrate", str(source), "-o", str(out))
    assert proc.returncode == 2
    assert why in proc.stderr
    assert not out.exists() and source.read_text() == text


# -- policies -------------------------------------------------------------------------------------


def test_policy_shorthands_become_their_canonical_spellings() -> None:
    text = playbook(
        """
        - step: start
          tool:
            - name: fetch
              kind: python
              code: "result = 1"
            - name: send
              kind: python
              code: "result = 2"
              spec:
                policy:
                  rules:
                    - when: "{{ output.status == 'error' and output.error.kind == 'auth' }}"
                      then: {do: jump, to: previous}
                    - when: "{{ output.status == 'error' }}"
                      then: {do: retry, attempts: 2, backoff: fixed, delay: "{{ output.meta.attempt }}"}
                    - else: {do: continue}
        """
    )
    assert rules(steps(migrated(text))["start"], 1) == [
        {
            "when": "{{ outcome.status == 'error' and outcome.error.kind == 'auth' }}",
            "then": {"do": "jump", "to": "fetch"},
        },
        {
            "when": "{{ outcome.status == 'error' }}",
            "then": {"do": "retry", "attempts": 2, "backoff": "none", "delay": "{{ outcome.meta.attempt }}"},
        },
        {"else": {"then": {"do": "continue"}}},
    ]


def test_the_envelope_as_a_whole_has_no_canonical_spelling() -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: python
            code: "result = 1"
            spec:
              policy:
                rules:
                  - when: true
                    then: {do: continue, set: {ctx.all: "{{ output }}"}}
        """
    )
    migration = migrate_text(text, "env.yaml")
    assert migration.text is None
    assert [d.message for d in migration.errors] == [
        "step 'start' task 'start_task': 'output' as a whole is NoETL's envelope, which has no canonical "
        "spelling: read its keys (output.status, output.data, output.error.kind, ...)"
    ]


OUTCOMES = {
    "ok": Outcome.ok({"data": {"n": 1}}, http={"status": 200, "headers": {"a": "b"}}),
    "ok_python": Outcome.ok(5),
    "http_503": Outcome(
        status="error",
        result={"data": "down"},
        error={"kind": "server_error", "message": "503", "retryable": True, "status": 503},
        helpers={"http": {"status": 503, "headers": {}}},
    ),
    "refused": Outcome.fail(
        "connection_error", "refused", retryable=True, http={"status": None, "headers": {}}
    ),
    "pg": Outcome.fail("postgres_error", "dup", pg={"code": "23505"}),
    "plugin": Outcome(status="error", error={"kind": "mine", "message": "m"}),
}
READS = [
    "{{ output.status }}",
    "{{ output.data }}",
    "{{ output.error.kind }}",
    "{{ output.error.message }}",
    "{{ output.error.retryable }}",
    "{{ output.error.code }}",
    "{{ output.error.status_code }}",
    "{{ output.http.status }}",
    "{{ output.http.headers }}",
    "{{ output.error.kind == 'auth' }}",
    "{{ output.error.kind != 'auth' }}",
    "{{ 'auth' == output.error.kind }}",
    "{{ output.error.kind is none }}",
    "{{ output.error.kind | default('x') }}",
    "{{ output.http.status in [502, 503] }}",
    "{{ output.status == 'error' and output.error.retryable }}",
    "{{ 'yes' if output.error.retryable else 'no' }}",
    "{{ output.data.data.n | default(0) }}",
]


def _render(text: str, outcome: Outcome) -> Any:
    scope = {"outcome": {**outcome.as_scope(), "result": result_view(outcome.result)}}
    scope["output"] = outcome.as_output()  # type: ignore[assignment]
    try:
        return render_value(text, scope)
    except RenderError as exc:
        return f"fails: {exc}"


@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize("name", list(OUTCOMES))
def test_output_in_a_policy_reads_as_outcome_the_same(read: str, name: str) -> None:
    canonical = rewrite_chains(read, "output", envelope)
    assert "output" not in canonical
    assert _render(canonical, OUTCOMES[name]) == _render(read, OUTCOMES[name])


@pytest.mark.parametrize(
    ("read", "spelled"),
    [
        ("{{ output.status }}", "{{ outcome.status }}"),
        ("{{ output.data.rows[0].n }}", "{{ outcome.result.rows[0].n }}"),
        ("{{ output.error.kind == 'auth' }}", "{{ outcome.error.kind == 'auth' }}"),
        ("{{ output.error.kind }}", "{{ outcome.error.kind | default(none) }}"),
        ("{{ x and output.error.retryable }}", "{{ x and (outcome.error.retryable | default(false)) }}"),
        ("{{ output.http.status in [502] }}", "{{ outcome.http.status in [502] }}"),
        ("{{ output.http.status }}", "{{ outcome.http.status | default(none) }}"),
        ("{{ output.error.status_code }}", "{{ outcome.error.status | default(none) }}"),
        ("{{ output.meta.attempt }}", "{{ outcome.meta.attempt }}"),
    ],
)
def test_how_the_envelope_is_spelled(read: str, spelled: str) -> None:
    assert rewrite_chains(read, "output", envelope) == spelled


@pytest.mark.parametrize(
    "read",
    [
        "{{ output }}",
        "{{ output.error }}",
        "{{ output.http }}",
        "{{ output.x }}",
        "{{ output.meta.duration_ms }}",
        "{{ output['data'] }}",
    ],
)
def test_envelope_reads_without_a_canonical_spelling(read: str) -> None:
    with pytest.raises(Untranslatable):
        rewrite_chains(read, "output", envelope)


# -- routing ----------------------------------------------------------------------------------------


def test_call_done_and_call_error_and_output_in_arcs() -> None:
    text = playbook(
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
    )
    arcs = steps(migrated(text))["start"]["next"]["arcs"]
    assert [a["when"] for a in arcs] == [
        "{{ event.name == 'step.done' and start.ok and start.ok }}",
        "{{ event.name == 'step.failed' }}",
    ]


# -- names --------------------------------------------------------------------------------------------


def test_names_read_bare_are_written_in_their_scope() -> None:
    text = playbook(
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
    out = steps(migrated(text))
    assert out["each"]["loop"]["in"] == "{{ start.rows }}"
    assert out["each"]["tool"]["result"] == {
        "item": "{{ iter.row }}",
        "index": "{{ iter.index }} {{ iter.index }} {{ iter.index }}",
        "one_based": "{{ (iter.index + 1) }}",
        "edges": "{{ iter._first }} {{ iter._last }} {{ iter._total }} {{ iter._total }}",
        "limit": "{{ ctx.limit }}",
        "api": "{{ workload.api }}",
    }


# -- task keys ----------------------------------------------------------------------------------------


def test_http_timeouts_are_spec_timeout() -> None:
    text = playbook(
        """
        - step: start
          tool:
            - name: a
              kind: http
              url: http://x
              timeout: 5
            - name: b
              kind: http
              url: http://x
              timeout_seconds: 2.5
              spec: {timeout_s: 60}
        """
    )
    tool = steps(migrated(text))["start"]["tool"]
    assert tool[0] == {"name": "a", "kind": "http", "url": "http://x", "spec": {"timeout": 5}}
    assert tool[1] == {
        "name": "b",
        "kind": "http",
        "url": "http://x",
        "spec": {"timeout_s": 60, "timeout": 2.5},
    }


def test_credential_is_auth_and_gets_no_default_database() -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: postgres, credential: pg_main, query: "SELECT 1"}   # NoETL's name
        """
    )
    out = migrated(text)
    assert steps(out)["start"]["tool"] == {"kind": "postgres", "auth": "pg_main", "query": "SELECT 1"}
    assert "keychain" not in yaml(out) and "# NoETL's name" in out


def test_inline_scripts_are_the_kinds_code() -> None:
    text = playbook(
        """
        - step: start
          tool:
            - name: py
              kind: python
              script:
                uri: score.py
                source: {type: inline, code: "result = 1"}
            - name: pg
              kind: postgres
              auth: pg
              script: {uri: x.sql, source: {type: inline, code: "SELECT 1"}}
        """
    )
    tool = steps(migrated(text))["start"]["tool"]
    assert tool[0] == {"name": "py", "kind": "python", "code": "result = 1"}
    assert tool[1] == {"name": "pg", "kind": "postgres", "auth": "pg", "command": "SELECT 1"}


def test_the_command_line_lists_what_it_rewrote(tmp_path: Any) -> None:
    source, out = tmp_path / "pages.yaml", tmp_path / "out.yaml"
    source.write_text(NOETL)
    proc = noetl("migrate", str(source), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == CANONICAL
    lines = proc.stderr.splitlines()
    assert lines[-1] == f"{out}: migrated (2 legacy constructs translated, 10 NoETL dialect forms rewritten)"
    assert (
        f"{source}:23:7: warning: step 'fetch' task 'fetch_task': 'timeout: 5' written as 'spec: {{timeout: 5}}' (at workflow[1].tool.timeout)"
        in lines
    )
    again = noetl("migrate", str(out), "-q", "--in-place")
    assert (again.returncode, again.stderr) == (0, f"{out}: nothing to rewrite (already canonical)\n")
    assert out.read_text() == CANONICAL


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


def test_output_in_an_arc_that_can_see_a_failure_stays_null_there() -> None:
    # In a failed step's arcs output is null, where {{ <step> }} is undefined, or the result of the
    # step's run before (a cycle): the step's name is written only where it reads the same.
    text = playbook(
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
    out = steps(migrated(text))
    assert [a.get("when", a.get("args")) for a in out["start"]["next"]["arcs"]] == [
        "{{ start.more }}",
        "{{ (none if event.name == 'step.failed' else start) is none }}",
        "{{ event.name == 'step.done' and start is none }}",
        {"r": "{{ start }}"},
    ]
    assert out["page"]["next"]["arcs"][0]["when"] == (
        "{{ (none if event.name == 'step.failed' else page).more }}"
    )
