"""The NoETL dialect as deployed, accepted in canonical mode: step/task ``set:``, step/task ``input:``."""

from __future__ import annotations

import pytest
from helpers import playbook, run
from legacy_support import report, step, yaml

from noetl_stream.dsl import compile_playbook, load_playbook
from noetl_stream.runtime.local import Runtime

TASK_SET = playbook(
    """
    - step: start
      tool:
        - name: fetch_users
          kind: python
          code: "result = {'rows': [1, 2, 3]}"
          set:
            ctx.total: "{{ fetch_users.rows | length }}"
            iter.first: "{{ outcome.result.rows[0] }}"
        - name: after
          kind: noop
          result: "{{ iter.first }}-{{ ctx.total }}"
    """
)


def test_task_set_becomes_patches_of_the_tasks_policy() -> None:
    first = step(TASK_SET, "start")["tool"][0]
    assert "set" not in first
    assert first["spec"] == yaml(
        """
        policy:
          rules:
            - when: "{{ outcome.status == 'ok' }}"
              then:
                do: continue
                set_ctx: {total: "{{ outcome.result.rows | length }}"}
                set_iter: {first: "{{ outcome.result.rows[0] }}"}
        """
    )
    assert report(TASK_SET) == [
        "10:9: warning: step 'start' task 'fetch_users': 'set:' on a task is NoETL's; canonical: set_ctx (ctx. "
        "keys) and set_iter (iter. keys, and the names later tasks of the step read: step. and bare keys, read "
        "as iter.<name>) in the 'then' of its spec.policy rules that go on; 'output' there is its result, "
        "outcome.result"
    ]


async def test_task_set_applies_when_the_task_completes(runtime: Runtime) -> None:
    r = await run(runtime, TASK_SET)
    assert r.status == "success", r.summary.error
    assert r.result == "1-3"
    assert r.summary.ctx == {"total": 3}


def test_task_set_joins_an_existing_policy_but_not_its_retries() -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: noop
            set: {ctx: {done: true}}
            spec:
              policy:
                rules:
                  - when: "{{ _attempt < 2 }}"
                    then: {do: retry}
                  - when: "{{ true }}"
                    then: {do: break, set_iter: {x: 1}}
        """
    )
    assert step(text, "start")["tool"]["spec"]["policy"]["rules"] == yaml(
        """
        - when: "{{ _attempt < 2 }}"
          then: {do: retry}
        - when: "{{ true }}"
          then: {do: break, set_iter: {x: 1}, set_ctx: {done: true}}
        - when: "{{ outcome.status == 'ok' }}"
          then: {do: continue, set_ctx: {done: true}}
        """
    )


STEP_SET = playbook(
    """
    - step: start
      tool:
        - {name: a, kind: noop, result: 1, spec: {policy: {rules: [{when: "{{ workload.early }}", then: {do: break}}]}}}
        - {name: b, kind: noop, result: 2}
      set:
        ctx.last: "{{ start }}"
      next: {arcs: [{step: end}]}
    - step: end
      tool: {kind: noop, result: "{{ ctx.last }}"}
    """,
    workload={"early": False},
)


def test_step_set_patches_the_rules_that_end_the_pipeline() -> None:
    a, b = step(STEP_SET, "start")["tool"]
    assert a["spec"]["policy"]["rules"] == [
        {"when": "{{ workload.early }}", "then": {"do": "break", "set_ctx": {"last": "{{ outcome.result }}"}}}
    ]
    assert b["spec"]["policy"]["rules"] == [
        {
            "when": "{{ outcome.status == 'ok' }}",
            "then": {"do": "continue", "set_ctx": {"last": "{{ outcome.result }}"}},
        }
    ]


@pytest.mark.parametrize(("early", "expected"), [(False, 2), (True, 1)])
async def test_step_set_applies_when_the_step_completes(runtime: Runtime, early: bool, expected: int) -> None:
    r = await run(runtime, STEP_SET, {"early": early})
    assert r.status == "success", r.summary.error
    assert (r.result, r.summary.ctx) == (expected, {"last": expected})


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param(
            "- step: start\n  tool: {kind: noop, set: {ctx: 1}}\n",
            [
                "6:30: step 'start' task 'start_task': 'set' key 'ctx' needs a name: 'ctx.<name>' (or 'ctx: {...}')"
            ],
            id="scope-without-name",
        ),
        pytest.param(
            "- step: start\n  tool: {kind: noop, set: {vars.total: 1}}\n",
            [
                "6:30: step 'start' task 'start_task': 'set' key 'vars.total': the scope must be 'ctx', 'iter' or "
                "'step' (or none), not 'vars'"
            ],
            id="bad-scope",
        ),
        pytest.param(
            "- step: start\n  tool: {kind: noop}\n  set: {ctx.total: 1, total: 2}\n",
            ["7:25: step 'start': 'set' writes 'total' twice (a key with a scope and one without)"],
            id="twice",
        ),
        pytest.param(
            "- step: start\n  loop: {in: [1], iterator: x}\n  tool: {kind: noop, set: {x: 1, index: 2}}\n",
            [
                "7:30: step 'start' task 'start_task': 'set' key 'x' names what the step's iteration holds (its "
                "item or position): choose another name",
                "7:36: step 'start' task 'start_task': 'set' key 'index' names what the step's iteration holds "
                "(its item or position): choose another name",
            ],
            id="task-set-iteration-names",
        ),
        pytest.param(
            "- step: start\n  tool: {kind: noop}\n  next: {arcs: [{step: end, set: {iter.n: 1}}]}\n"
            "- step: end\n  tool: {kind: noop}\n",
            [
                "7:37: step 'start' arc 'end': 'set' on an arc writes ctx when the arc is taken, after the step "
                "run and its iter are gone: 'iter.n' cannot be written (write 'ctx.n')"
            ],
            id="arc-set-iter",
        ),
        pytest.param(
            "- step: start\n  tool: {kind: noop, set: {ctx.a.b: 1}}\n",
            [
                "6:30: step 'start' task 'start_task': 'set' writes one level of ctx or iter; 'a.b' is not a plain name"
            ],
            id="nested",
        ),
        pytest.param(
            "- step: start\n  loop: {in: [1], iterator: x}\n  tool: {kind: noop}\n  set: {iter.n: 1}\n",
            [
                "8:5: step 'start': step 'set' on a looped step applies once, after the last iteration, where "
                "there is no iteration scope: 'iter.n' cannot be written (use 'set' on a task to write iter in "
                "each iteration)"
            ],
            id="looped-step-iter",
        ),
        pytest.param(
            "- step: start\n  loop: {in: [1], iterator: x}\n  tool: {kind: noop}\n"
            "  set: {ctx.n: '{{ iter.x }}'}\n",
            [
                "8:5: step 'start': step 'set' on a looped step applies after the last iteration, where 'iter' "
                "does not exist (it reads the loop's result, the list of iteration results, as '{{ start }}')"
            ],
            id="looped-step-reads-iter",
        ),
        pytest.param(
            "- step: start\n  tool: {kind: python, code: 'x', input: '{{ workload.a }}', args: {a: 2}}\n",
            [
                "6:37: step 'start' task 'start_task': 'input' and 'args' are merged (input's keys win), so both "
                "must be mappings; 'input' is not: keep one"
            ],
            id="input-and-args",
        ),
        pytest.param(
            "- step: start\n  input: [1]\n  tool: {kind: noop}\n",
            ["6:12: step 'start': 'input' must be a mapping of names to values (templates)"],
            id="step-input-not-a-mapping",
        ),
    ],
)
def test_malformed_dialect_forms(steps: str, expected: list[str]) -> None:
    text = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: t, path: t}\nworkflow:\n"
    text += "".join(f"  {line}\n" for line in steps.splitlines())
    assert report(text) == expected


async def test_task_input_is_the_tasks_args(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: python
            input: {a: 2, b: "{{ workload.b }}"}
            code: "result = a * b"
        """,
        workload={"b": 21},
    )
    assert step(text, "start")["tool"] == {
        "kind": "python",
        "args": {"a": 2, "b": "{{ workload.b }}"},
        "code": "result = a * b",
    }
    r = await run(runtime, text)
    assert (r.status, r.result) == ("success", 42), r.summary.error


def test_step_input_is_kept_on_the_step_and_known_to_its_templates() -> None:
    text = playbook(
        """
        - step: start
          input: {user: "{{ args.user | default(workload.user) }}"}
          tool: {kind: noop, result: "{{ input.user }}"}
        """,
        workload={"user": "ada"},
    )
    pb = load_playbook(text)
    assert pb.step("start").input == {"user": "{{ args.user | default(workload.user) }}"}
    assert compile_playbook(text).diagnostics == ()


# -- step `set:` on a looped step: once, after the last iteration ------------------------------------

LOOP_SET = """
- step: start
  loop:
    in: "{{{{ workload.items }}}}"
    iterator: n
    spec: {{mode: parallel, max_in_flight: "{{{{ workload.mif }}}}", policy: {{exec: {exec_}}}}}
  tool:
    - name: square
      kind: python
      input: {{n: "{{{{ iter.n }}}}"}}
      code: "result = n * n"
      set:
        iter.square: "{{{{ square }}}}"
    - name: plus_one
      kind: python
      input: {{n: "{{{{ iter.n }}}}", bad: "{{{{ workload.bad }}}}", square: "{{{{ iter.square }}}}"}}
      code: |
        if n == bad:
            raise ValueError("bad item")
        result = square + 1
  set:
    ctx.total: "{{{{ start | sum }}}}"
    ctx.count: "{{{{ start | length }}}}"
  next:
    arcs:
      - step: big
        when: "{{{{ event.name == 'loop.done' and ctx.total > 20 }}}}"
        args: {{seen: "{{{{ event.total }}}}", total: "{{{{ ctx.total }}}}"}}
      - step: small
        when: "{{{{ event.name == 'loop.done' }}}}"
      - step: handle
        when: "{{{{ event.name == 'step.failed' }}}}"
        args: {{why: "{{{{ event.error.kind }}}}"}}
- step: big
  tool: {{kind: noop, result: "{{{{ args }}}}"}}
- step: small
  tool: {{kind: noop, result: small}}
- step: handle
  tool: {{kind: noop, result: "{{{{ args.why }}}}"}}
"""


def loop_set(exec_: str = "local") -> str:
    return playbook(LOOP_SET.format(exec_=exec_), workload={"items": [1, 2, 3, 4], "mif": 2, "bad": 0})


def test_step_set_on_a_looped_step_is_a_step_after_the_loop_that_takes_its_arcs() -> None:
    text = loop_set()
    assert step(text, "start")["next"] == yaml(
        """
        arcs:
          - step: handle
            when: "{{ event.name == 'step.failed' }}"
            args: {why: "{{ event.error.kind }}"}
          - step: start_set
            when: "{{ event.name != 'step.failed' }}"
            args:
              loop_event:
                name: "{{ event.name | default(none) }}"
                status: "{{ event.status | default(none) }}"
                total: "{{ event.total | default(none) }}"
                done: "{{ event.done | default(none) }}"
                failed: "{{ event.failed | default(none) }}"
        """
    )
    assert step(text, "start_set") == yaml(
        """
        step: start_set
        tool:
          kind: noop
          result: "{{ start }}"
          spec:
            policy:
              rules:
                - when: "{{ outcome.status == 'ok' }}"
                  then:
                    do: continue
                    set_ctx: {total: "{{ start | sum }}", count: "{{ start | length }}"}
        next:
          arcs:
            - step: big
              when: "{{ args.loop_event.name == 'loop.done' and ctx.total > 20 }}"
              args: {seen: "{{ args.loop_event.total }}", total: "{{ ctx.total }}"}
            - step: small
              when: "{{ args.loop_event.name == 'loop.done' }}"
        """
    )
    assert [d.code for d in compile_playbook(text).diagnostics] == ["dialect", "dialect"]  # the two set:


@pytest.mark.parametrize("exec_", ["local", "distributed"])
@pytest.mark.parametrize(
    ("workload", "result", "ctx"),
    [
        pytest.param({}, {"seen": 4, "total": 34}, {"total": 34, "count": 4}, id="big"),
        pytest.param({"items": [1, 2]}, "small", {"total": 7, "count": 2}, id="small"),
        pytest.param({"bad": 3}, "python_error", {}, id="failed"),
    ],
)
async def test_step_set_on_a_looped_step_applies_once_after_the_loop_and_before_its_arcs(
    runtime: Runtime, exec_: str, workload: dict[str, object], result: object, ctx: dict[str, int]
) -> None:
    r = await run(runtime, loop_set(exec_), workload)
    assert r.status == "success", r.summary.error
    assert (r.result, r.summary.ctx) == (result, ctx)
    patches = [p for e in r.named("ctx.patched") for p in e.payload["patches"]]
    assert patches == ([ctx] if ctx else [])  # one patch, not one per iteration
    if ctx:  # squares 1, 4, 9, 16 plus one; iter.square was set per iteration by the task's `set:`
        assert r.step_result("start") == [2, 5, 10, 17][: ctx["count"]]
        assert r.summary.steps["start_set"].status == "done"
    else:  # the loop failed: its own arcs route the failure, the set step does not run
        assert "start_set" not in r.summary.steps


async def test_task_set_of_ctx_in_parallel_iterations_is_written_by_each_the_last_one_winning(
    runtime: Runtime,
) -> None:
    text = playbook(
        """
        - step: start
          loop: {in: [1, 2], iterator: n, spec: {mode: parallel}}
          tool: {kind: noop, result: "{{ iter.n }}", set: {ctx.last: "{{ outcome.result }}"}}
        """
    )
    r = await run(runtime, text)
    assert r.status == "success", r.summary.error
    patches = [p for e in r.named("ctx.patched") for p in e.payload["patches"]]
    assert sorted(p["last"] for p in patches) == [1, 2]
    assert r.summary.ctx == patches[-1]  # the iteration that ended last


# -- a playbook as NoETL users write them: every dialect form at once, canonical mode, no flag ----------

AS_WRITTEN = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: users_report, path: examples/users_report}
workload:
  limit: 3
  min_rows: 2
  batch: 2
  title: Users
workbook:
  - name: double
    tool:
      kind: python
      args: {value: "{{ args.value }}"}
      code: |
        def main(value):
            return value * 2
workflow:
  - step: start
    next: {arcs: [{step: fetch_users}]}
  - step: fetch_users
    input: {limit: "{{ workload.limit }}"}
    tool:
      - name: query
        kind: python
        input: {limit: "{{ input.limit }}"}
        code: |
          result = {"rows": [{"id": i} for i in range(1, limit + 1)]}
        set:
          ctx.fetched: "{{ query.rows | length }}"
          iter.first: "{{ outcome.result.rows[0].id }}"
      - name: shape
        kind: python
        input: {rows: "{{ query.rows }}", first: "{{ iter.first }}"}
        code: |
          result = {"rows": rows, "first": first}
    set:
      ctx.user_count: "{{ fetch_users.rows | length }}"
    next:
      arcs:
        - step: per_user
          when: "{{ event.name == 'step.done' and event.result.rows | length >= min_rows }}"
        - step: too_few
          when: "{{ event.name in ['step.done', 'step.failed'] }}"
  - step: per_user
    loop:
      in: "{{ fetch_users.rows }}"
      iterator: user
      spec: {mode: parallel, max_in_flight: "{{ workload.batch }}"}
    tool:
      - name: double
        kind: workbook
        args: {value: "{{ iter.user.id }}"}
    set:
      ctx.doubled: "{{ per_user | sum }}"
    next:
      arcs:
        - step: report
          when: "{{ event.name == 'loop.done' and event.status == 'success' }}"
  - step: report
    tool:
      kind: python
      input:
        users: "{{ ctx.user_count }}"
        doubled: "{{ ctx.doubled }}"
        first: "{{ fetch_users.first }}"
        title: "{{ title }}"
      code: |
        result = f"{title}: {users} users, ids doubled add up to {doubled}, first {first}"
  - step: too_few
    tool: {kind: noop, result: too few}
"""


@pytest.mark.parametrize(
    ("limit", "result", "ctx"),
    [
        (
            3,
            "Users: 3 users, ids doubled add up to 12, first 1",
            {"fetched": 3, "user_count": 3, "doubled": 12},
        ),
        (1, "too few", {"fetched": 1, "user_count": 1}),
    ],
)
async def test_a_playbook_as_noetl_users_write_it_runs_without_any_flag(
    runtime: Runtime, limit: int, result: str, ctx: dict[str, int]
) -> None:
    diagnostics = compile_playbook(AS_WRITTEN, "users_report.yaml").diagnostics
    assert [(d.path, d.code) for d in diagnostics] == [  # one warning per form, naming its canonical spelling
        ("workflow[1].tool[0].set", "dialect"),
        ("workflow[1].set", "dialect"),
        ("workflow[2].set", "dialect"),
    ]
    r = await run(runtime, AS_WRITTEN, {"limit": limit})
    assert r.status == "success", r.summary.error
    assert (r.result, r.summary.ctx) == (result, ctx)
    if limit == 3:
        assert r.step_result("per_user") == [2, 4, 6]


def test_a_diagnostic_in_a_set_value_points_at_the_key_the_author_wrote() -> None:
    """`set:` entries are moved into the policy's rules (task), every task's rules (step) or a
    ``<step>_set`` step (looped step): an error in one is reported at the authored key's value, with
    the authored path, not at the task or step nor with the rewritten path."""
    text = playbook(
        """
        - step: start
          tool:
            - name: fetch
              kind: noop
              set:
                ctx.total: "{{ outcome.result | nosuchfilter }}"
          next:
            arcs:
              - step: each
        - step: each
          loop: {in: "{{ [1, 2] }}", iterator: item}
          tool: {kind: noop}
          set:
            ctx: {sum: "{{ each | nosuchfilter }}"}
          next:
            arcs:
              - step: end
        - step: end
          tool: {kind: noop}
          set:
            ctx.x: "{{ end.foo( }}"
        """
    )
    lines = text.splitlines()
    result = compile_playbook(text, "t.yaml")
    found = {(d.path, d.line): d for d in result.errors}
    where = {
        "workflow[0].tool[0].set.ctx.total": next(i for i, s in enumerate(lines, 1) if "ctx.total:" in s),
        "workflow[1].set.ctx.sum": next(i for i, s in enumerate(lines, 1) if "{sum:" in s),
        "workflow[2].set.ctx.x": next(i for i, s in enumerate(lines, 1) if "ctx.x:" in s),
    }
    assert sorted(found) == sorted(where.items()), [d.format() for d in result.errors]
    for (path, line), d in found.items():
        assert d.col == lines[line - 1].index('"{{') + 1, (path, d.format())


def test_an_error_in_an_arc_a_looped_step_set_moves_is_reported_once_where_it_was_written() -> None:
    """A looped step's arcs move to its ``<step>_set`` step (a copy stays for failures): an error in one is
    reported once, at the arc the author wrote, with its path, not at ``set`` nor at the copy."""
    text = playbook(
        """
        - step: start
          loop: {in: "{{ [1, 2] }}", iterator: item}
          tool: {kind: noop}
          set:
            ctx: {sum: "{{ start | length }}"}
          next:
            arcs:
              - step: end
                args: {x: "{{ nope( }}"}
        - step: end
          tool: {kind: noop}
        """
    )
    lines = text.splitlines()
    (error,) = compile_playbook(text, "t.yaml").errors
    line = next(i for i, s in enumerate(lines, 1) if "nope(" in s)
    assert (error.path, error.line, error.col) == (
        "workflow[0].next.arcs[0].args.x",
        line,
        lines[line - 1].index('"{{') + 1,
    )


def _loop_arcs(with_set: bool) -> str:
    text = playbook(
        """
        - step: start
          loop: {in: "{{ [1, 2] }}", iterator: n}
          tool: {kind: noop, result: "{{ iter.n }}"}
          SET
          next:
            spec: {mode: inclusive}
            arcs:
              - step: A
                when: "{{ event.name == 'loop.done' }}"
                args:
                  name: "{{ event.name }}"
                  in_list: "{{ event.name in ['loop.done'] }}"
                  is_step_done: "{{ event.name == 'step.done' }}"
              - {step: B, when: "{{ event.name in ['loop.done'] }}"}
              - {step: C, when: "{{ event.name.startswith('loop') }}"}
              - {step: D, when: "{{ event.name == 'step.done' }}"}
        - step: A
          tool: {kind: noop, result: "{{ args }}"}
        - step: B
          tool: {kind: noop}
        - step: C
          tool: {kind: noop}
        - step: D
          tool: {kind: noop}
        """
    )
    return text.replace("SET", 'set: {ctx.total: "{{ start | sum }}"}' if with_set else "desc: no set")


@pytest.mark.parametrize("with_set", [False, True], ids=["without-set", "with-set"])
async def test_a_step_set_on_a_looped_step_leaves_its_arcs_seeing_loop_done(
    runtime: Runtime, with_set: bool
) -> None:
    """`event.name` is the loop's boundary in every use (a comparison, a list, a method, an arg), with or
    without a step `set:` (which moves the arcs to a step after the loop), and an arc testing a boundary
    a loop never has is the same warning either way."""
    text = _loop_arcs(with_set)
    codes = [d.code for d in compile_playbook(text, "t.yaml").diagnostics if d.code != "dialect"]
    assert codes == ["loop-boundary"]
    r = await run(runtime, text)
    assert r.status == "success", r.summary.error
    assert sorted(s for s in r.ran() if s in "ABCD") == ["A", "B", "C"]
    assert r.step_result("A") == {"name": "loop.done", "in_list": True, "is_step_done": False}
    assert r.summary.ctx == ({"total": 3} if with_set else {})
