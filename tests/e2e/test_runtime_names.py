"""End to end on a real nats-server: the names NoETL's playbooks read, in canonical mode: the loop's item
bare and its positions, ctx values bare and ``ctx`` as the whole namespace, ``output`` and ``result``
in a step's ``set:`` and its arcs, a loop's and a pipeline's result views, ``job`` and the workload
rendered once at start, JSON-looking text as a tool's input."""

from __future__ import annotations

import uuid

import pytest
from helpers import playbook, run

from noetl_stream.protocol import events as E
from noetl_stream.runtime.local import Runtime

EXECS = ("local", "distributed")


@pytest.mark.parametrize("exec_", EXECS)
async def test_an_iteration_reads_its_item_bare_and_its_position_as_noetl_does(
    runtime: Runtime, exec_: str
) -> None:
    text = playbook(
        f"""
        - step: start
          loop:
            in: "{{{{ files }}}}"
            iterator: f
            spec: {{mode: parallel, policy: {{exec: {exec_}}}}}
          tool:
            kind: noop
            result:
              file: "{{{{ f }}}}"
              same: "{{{{ f == iter.f }}}}"
              at: "{{{{ [iter.index, iter._index, _index, loop_index, loop.index0, loop.index - 1] }}}}"
              total: "{{{{ [_total, iter._total, loop.length] }}}}"
              first: "{{{{ [iter._first, loop.first] }}}}"
              last: "{{{{ [iter._last, loop.last] }}}}"
        """,
        workload={"files": ["a.csv", "b.csv", "c.csv"]},
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == [
        {
            "file": f,
            "same": True,
            "at": [i] * 6,
            "total": [3, 3, 3],
            "first": [i == 0] * 2,
            "last": [i == 2] * 2,
        }
        for i, f in enumerate(["a.csv", "b.csv", "c.csv"])
    ]


async def test_ctx_values_are_read_bare_and_ctx_reads_the_whole_namespace(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          set:
            ctx.polls: 0
          next: {arcs: [{step: poll}]}
        - step: poll
          tool:
            - name: count
              kind: noop
              result: "{{ polls + 1 }}"
              spec:
                policy:
                  rules:
                    - else: {then: {do: continue, set_ctx: {polls: "{{ outcome.result }}"}}}
            - name: seen
              kind: noop
              result: "{{ polls }}"
          next:
            arcs:
              - step: poll
                when: "{{ polls < 3 }}"
              - step: collect
        - step: collect
          tool:
            kind: noop
            result:
              polls: "{{ polls }}"
              seen: "{{ ctx.poll }}"
              api: "{{ ctx.api_url }}"
              written: "{{ ctx.polls }}"
        """,
        workload={"api_url": "http://api"},
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == {"polls": 3, "seen": 3, "api": "http://api", "written": 3}
    assert r.summary.ctx == {"polls": 3}


async def test_output_and_result_are_the_steps_result_in_its_set_and_its_arcs(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: python
            code: "result = {'rows': [{'n': 2}]}"
          set:
            ctx.n: "{{ output.data.rows[0].n }}"
            ctx.same: "{{ output == start and result == start }}"
          next:
            arcs:
              - step: many
                when: "{{ output.data.rows[0].n > 1 and result.rows | length == 1 }}"
              - step: few
        - step: many
          tool: {kind: noop, result: "many {{ ctx.n }} {{ ctx.same }}"}
        - step: few
          tool: {kind: noop, result: few}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == "many 2 True"
    assert r.summary.ctx == {"n": 2, "same": True}


async def test_a_loop_result_reads_as_its_list_and_as_results_and_stats(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          loop:
            in: "{{ [1, 2, 3] }}"
            iterator: x
            spec: {mode: parallel}
          tool: {kind: noop, result: {id: "{{ x }}"}}
          set:
            ctx.total: "{{ output.stats.total }}"
          next:
            arcs:
              - step: check
                when: "{{ start.stats.failed == 0 and (start | length) == 3 }}"
        - step: check
          tool:
            kind: python
            args:
              as_list: "{{ start | map(attribute='id') | list }}"
              first: "{{ start[0].id }}"
              results: "{{ start.results }}"
              stats: "{{ start.stats }}"
              via_data: "{{ start.data.stats.total }}"
              total: "{{ ctx.total }}"
            code: |
              result = {"as_list": as_list, "first": first, "results": results, "stats": stats,
                        "via_data": via_data, "total": total}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == {
        "as_list": [1, 2, 3],
        "first": 1,
        "results": [{"id": 1}, {"id": 2}, {"id": 3}],
        "stats": {"total": 3, "success": 3, "failed": 0},
        "via_data": 3,
        "total": 3,
    }
    assert r.step_result("start") == [{"id": 1}, {"id": 2}, {"id": 3}]  # the event: the plain list


async def test_a_pipeline_result_reads_its_tasks_by_label_and_stays_its_last_tasks(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            - name: extract
              kind: python
              code: "result = {'status_code': 200, 'count': 4}"
            - name: load
              kind: python
              code: "result = {'rows': [{'loaded': 4}]}"
          next: {arcs: [{step: check, when: "{{ start.extract.status_code == 200 }}"}]}
        - step: check
          tool:
            kind: noop
            result:
              status: "{{ start.extract.status_code }}"
              count: "{{ start.count }}"
              loaded: "{{ start.rows[0].loaded }}"
              via_results: "{{ start.results.extract.count }}"
              whole: "{{ start }}"
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == {
        "status": 200,
        "count": 4,
        "loaded": 4,
        "via_results": 4,
        "whole": {"rows": [{"loaded": 4}]},
    }
    (done,) = r.named(E.STEP_DONE, step="start")
    assert done.payload["result"] == {"rows": [{"loaded": 4}]}
    assert done.payload["tasks"] == {"extract": {"status_code": 200, "count": 4}}
    assert done.payload["result_task"] == "load"


async def test_a_result_without_data_reads_itself_as_data(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: python, code: "result = {'n': 3}"}
          next: {arcs: [{step: after, when: "{{ start.data.n == 3 }}"}]}
        - step: after
          tool: {kind: noop, result: "{{ start.data.n + start.n }}"}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == 6


async def test_templated_workload_values_render_once_at_start_and_every_step_sees_them(
    runtime: Runtime,
) -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: noop, result: "{{ run_id }}"}
          next: {arcs: [{step: again}]}
        - step: again
          tool:
            kind: noop
            result:
              run_id: "{{ run_id }}"
              job: "{{ job }}"
              trigger: "{{ trigger }}"
              ref: "{{ ref }}"
        """,
        workload={
            "run_id": "{{ job.uuid }}",
            "trigger": "{{ trigger | default('schedule') }}",
            "ref": "audit-{{ execution_id }}",
        },
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    eid = r.summary.execution_id
    job_uuid = str(uuid.UUID(eid))
    assert r.result == {
        "run_id": job_uuid,
        "job": {"uuid": job_uuid, "execution_id": eid, "id": eid},
        "trigger": "schedule",
        "ref": f"audit-{eid}",
    }
    assert r.step_result("start") == job_uuid
    (started,) = r.named(E.WORKFLOW_STARTED)
    assert started.payload["workload"] == {"run_id": job_uuid, "trigger": "schedule", "ref": f"audit-{eid}"}


async def test_a_workload_template_that_cannot_render_rejects_the_request(runtime: Runtime) -> None:
    text = playbook("- step: start\n  tool: {kind: noop}", workload={"bad": "{{ nosuch.x + 1 }}"})

    r = await run(runtime, text)

    assert r.status == "rejected"
    assert r.summary.error is not None and r.summary.error["kind"] == "template_error"
    assert "workload.bad" in r.summary.error["message"]


async def test_json_looking_text_is_an_object_where_it_is_a_tools_input(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          loop: {in: "{{ ids }}", iterator: i}
          tool:
            kind: python
            args: {spec: "{{ spec }}", zone: "{{ zone }}", caption: "zone {{ zone }}", i: "{{ iter.i }}"}
            code: |
              result = {"dpi": spec["dpi"], "zone": zone, "caption": caption, "i": i}
        """,
        workload={"ids": "[1, 2]", "spec": '{"dpi": 203}', "zone": "007"},
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == [{"dpi": 203, "zone": "007", "caption": "zone 007", "i": i} for i in (1, 2)]


async def test_a_pipelines_large_task_results_travel_by_reference_and_read_by_label(runtime: Runtime) -> None:
    text = (
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: t, path: tests/t}\n"
        "executor: {spec: {policy: {limits: {max_payload_bytes: 1024}}}}\n"
        "workflow:\n"
        + """
  - step: start
    tool:
      - {name: big, kind: noop, result: {n: 7, pad: "{{ 'x' * 2000 }}"}}
      - {name: small, kind: noop, result: {ok: true}}
    next: {arcs: [{step: after}]}
  - step: after
    tool: {kind: noop, result: {n: "{{ start.big.n }}", ok: "{{ start.ok }}", pad: "{{ start.pad | length }}"}}
    next: {arcs: [{step: routed, when: "{{ start.big.n == 7 }}"}]}
  - step: routed
    tool: {kind: noop}
"""
    )

    r = await run(runtime, text)

    (done,) = r.named(E.STEP_DONE, step="start")
    assert done.payload["result"] == {"ok": True}  # small: inline
    assert "$ref" in done.payload["tasks"]["big"]  # large: by reference, once
    assert r.step_result("after") == {"n": 7, "ok": True, "pad": 2000}  # the worker reads it
    assert r.status == "failed"  # ... the controller only has the reference
    assert (
        r.summary.error is not None
        and "the result of task 'big' of step 'start' is stored by reference" in (r.summary.error["message"])
    )


async def test_a_failed_steps_arcs_read_output_as_null(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: python, code: "raise ValueError('no')"}
          next:
            arcs:
              - step: handled
                when: "{{ event.name == 'step.failed' and output is none and result is none }}"
        - step: handled
          tool: {kind: noop, result: handled}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == "handled"


async def test_a_sequential_iteration_reads_bare_what_the_one_before_wrote_to_ctx(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          loop: {in: "{{ [1, 2, 3] }}", iterator: x}
          tool:
            kind: noop
            result: "{{ total | default(0) }}"
            spec:
              policy:
                rules:
                  - else: {then: {do: continue, set_ctx: {total: "{{ (total | default(0)) + x }}"}}}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == [0, 1, 3]
    assert r.summary.ctx == {"total": 6}
