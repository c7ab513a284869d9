"""End to end on a real nats-server: what steps hand on: results by step and task name, and ctx
(set_ctx patches, their order, their fate when a step fails or runs again, their size).
"""

from __future__ import annotations

from helpers import playbook, run

from noetl_stream.runtime.local import Runtime

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
