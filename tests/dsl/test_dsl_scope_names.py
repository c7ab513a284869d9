"""The names templates read, as NoETL's playbooks write them: one flat namespace in layers (bare workload
keys, step results, ctx values, the canonical names, the place's extras), views of step results
(``.data``, an http ``.body``, a pipeline's labels, a loop's ``.results``/``.stats``), ``ctx`` as the
whole namespace, ``job``, a loop iteration's positions, JSON-looking text, the workload rendered at
start. Pure: the template layer only."""

from __future__ import annotations

import json
import uuid
from typing import Any

import msgspec
import pytest

from noetl_stream.dsl import RenderError, render_value
from noetl_stream.dsl.scope import build_scope, iteration_names, job_of, render_workload
from noetl_stream.dsl.templates import attribute_reads, json_inputs
from noetl_stream.dsl.views import IterView, plain, result_meta
from noetl_stream.protocol.jsonvalue import to_json

EID = "0123456789abcdef0123456789abcdef"
HTTP = {"status_code": 200, "headers": {}, "url": "http://x", "elapsed": 0.1, "data": {"items": [1, 2]}}


def scope(**kw: Any) -> dict[str, Any]:
    return build_scope(
        workload=kw.get("workload", {}),
        ctx=kw.get("ctx", {}),
        execution_id=kw.get("execution_id", EID),
        args=kw.get("args"),
        results=kw.get("results"),
        result_meta=kw.get("meta"),
        extra=kw.get("extra"),
    )


def r(template: str, s: dict[str, Any], **kw: Any) -> Any:
    return render_value(template, s, "t", **kw)


# --- layers ----------------------------------------------------------------------------------------


def test_a_bare_workload_key_is_the_workload_value() -> None:
    s = scope(workload={"api_url": "http://api", "n": 3})
    assert r("{{ api_url }}", s) == r("{{ workload.api_url }}", s) == "http://api"
    assert r("{{ n + 1 }}", s) == 4


def test_later_layers_win_a_name_results_over_workload_ctx_over_results() -> None:
    s = scope(
        workload={"a": "workload", "b": "workload", "c": "workload"},
        results={"b": "result b", "c": "result c"},
        ctx={"c": "ctx"},
    )
    assert (r("{{ a }}", s), r("{{ b }}", s), r("{{ c }}", s)) == ("workload", "result b", "ctx")
    assert r("{{ workload.c }}", s) == "workload"  # the spelled-out scopes keep their own


def test_a_ctx_value_is_readable_bare() -> None:
    s = scope(ctx={"page": 2})
    assert r("{{ page }}", s) == r("{{ ctx.page }}", s) == 2


def test_canonical_names_win_over_bare_keys_of_the_same_name() -> None:
    s = scope(
        workload={"ctx": "w", "workload": "w", "job": "w", "execution_id": "w", "args": "w"},
        ctx={"args": "c", "workload": "c", "iter": "c"},
        args={"k": 1},
        extra={"iter": {"index": 0}},
    )
    assert r("{{ ctx.args }}", s) == "c"
    assert r("{{ workload.job }}", s) == "w"
    assert r("{{ args }}", s) == {"k": 1}
    assert r("{{ execution_id }}", s) == EID
    assert r("{{ job.id }}", s) == EID
    assert r("{{ iter }}", s) == {"index": 0}


def test_ctx_aliases_the_whole_namespace() -> None:
    s = scope(workload={"api_url": "http://api"}, results={"fetch": HTTP}, ctx={"state": "DONE"})
    assert r("{{ ctx.fetch.data.items }}", s) == [1, 2]
    assert r("{{ ctx.api_url }}", s) == "http://api"
    assert r("{{ ctx.state }}", s) == "DONE"
    assert r("{{ ctx.nothing | default('d') }}", s) == "d"
    assert r("{{ ctx.nothing is defined }}", s) is False
    value = r("{{ ctx }}", s)  # passed on whole it is the ctx, not the namespace
    assert value == {"state": "DONE"} and type(value) is dict


# --- job -------------------------------------------------------------------------------------------


def test_job_is_uuid_execution_id_and_id_the_same_on_every_render() -> None:
    first, again = r("{{ job }}", scope()), r("{{ job }}", scope())
    assert first == again == {"uuid": str(uuid.UUID(EID)), "execution_id": EID, "id": EID}


def test_job_uuid_of_an_id_that_is_not_hex_is_derived_from_it() -> None:
    a, b = job_of("run-2026-12-01"), job_of("run-2026-12-02")
    assert uuid.UUID(a["uuid"]) and a["uuid"] != b["uuid"]
    assert job_of("run-2026-12-01") == a


# --- step result views -----------------------------------------------------------------------------


def test_a_result_without_data_reads_itself_as_data() -> None:
    s = scope(results={"calc": {"n": 3}, "has": {"data": {"n": 4}, "n": 5}})
    assert r("{{ calc.data.n }}", s) == r("{{ calc.n }}", s) == 3
    assert r("{{ has.data.n }}", s) == 4  # a data key of its own is read as it is
    assert r("{{ calc.data }}", s) == {"n": 3}


def test_an_http_envelope_reads_its_body_as_body_too() -> None:
    s = scope(results={"fetch": HTTP, "py": {"data": 1}})
    assert r("{{ fetch.body.items }}", s) == r("{{ fetch.data.items }}", s) == [1, 2]
    assert r("{{ py.body is defined }}", s) is False  # only an http envelope has one
    assert "body" not in r("{{ fetch }}", s)


def test_a_view_travels_as_its_plain_value() -> None:
    s = scope(results={"calc": {"n": 3}, "fetch": HTTP, "loop": [1, None]}, meta=_loop_meta(2, 1, 1))
    for template, expected in [
        ("{{ calc }}", {"n": 3}),
        ("{{ calc.data }}", {"n": 3}),
        ("{{ [calc, loop] }}", [{"n": 3}, [1, None]]),
        ("{{ {'c': calc} }}", {"c": {"n": 3}}),
        ("{{ loop.results }}", [1, None]),
    ]:
        value = r(template, s)
        assert value == expected
        assert msgspec.json.encode(value) == msgspec.json.encode(expected)
        assert to_json(value) == expected
        assert json.dumps(value) == json.dumps(expected)
    assert type(r("{{ calc }}", s)) is dict and type(r("{{ loop }}", s)) is list
    assert r("{{ calc | tojson }}", s) == '{"n": 3}'
    assert r("{{ loop | tojson }}", s) == "[1, null]"
    assert r("n={{ calc }}", s) == "n={'n': 3}"


def _loop_meta(total: int, done: int, failed: int) -> dict[str, Any]:
    meta = result_meta("loop.done", {"total": total, "done": done, "failed": failed})
    assert meta is not None
    return {"loop": meta}


def test_a_loop_result_reads_as_its_list_and_as_results_stats_data() -> None:
    s = scope(results={"loop": [{"id": "a"}, None, {"id": "c"}]}, meta=_loop_meta(3, 2, 1))
    assert r("{{ loop | length }}", s) == 3
    assert r("{{ loop[0].id }}", s) == "a"
    assert r("{% for x in loop %}{{ x.id if x else '-' }}{% endfor %}", s) == "a-c"
    assert r("{{ loop.results | map(attribute='id', default='-') | list }}", s) == ["a", "-", "c"]
    assert r("{{ loop.stats }}", s) == {"total": 3, "success": 2, "failed": 1}
    assert r("{{ loop.data.stats.total }}", s) == 3
    assert r("{{ loop.data[2].id }}", s) == "c"
    assert r("{{ loop == [{'id': 'a'}, none, {'id': 'c'}] }}", s) is True


def test_a_list_result_that_is_not_a_loops_is_a_plain_list() -> None:
    s = scope(results={"rows": [1, 2]})
    assert r("{{ rows.stats is defined }}", s) is False


def test_a_pipeline_result_reads_each_task_by_label_and_every_tasks_fields() -> None:
    tasks = {"extract": HTTP, "transform": {"customers": 4, "accounts": {"acme": 1}, "n": "transform"}}
    last = {"rows": [{"loaded": 4}], "n": "load"}
    meta = {"sync": {"tasks": tasks, "result_task": "load"}}
    s = scope(results={"sync": last}, meta=meta)
    assert r("{{ sync.extract.status_code }}", s) == 200
    assert r("{{ sync.transform.accounts }}", s) == {"acme": 1}
    assert r("{{ sync.rows[0].loaded }}", s) == 4  # the last task's fields
    assert r("{{ sync.customers }}", s) == 4  # an earlier task's field
    assert r("{{ sync.n }}", s) == "load"  # the last task's wins
    assert r("{{ sync.results.transform.customers }}", s) == 4
    assert r("{{ sync.results.load.rows | length }}", s) == 1
    assert r("{{ sync.load.data.rows[0].loaded }}", s) == 4
    assert r("{{ sync }}", s) == last  # passed on whole: the step's result, its last task's


def test_plain_gives_the_value_a_view_stands_for() -> None:
    value = {"n": 1}
    view = scope(results={"v": value})["v"]
    assert plain(view) is value and plain(value) is value


# --- loop iterations -------------------------------------------------------------------------------


def test_an_iteration_binds_its_item_bare_and_its_position_as_noetl_does() -> None:
    it = IterView({"file": "b.csv", "index": 1}, 1, 3)
    s = scope(extra={"iter": it, **iteration_names("file", "b.csv", 1, 3)})
    assert r("{{ file }}", s) == r("{{ iter.file }}", s) == "b.csv"
    assert [r(f"{{{{ {n} }}}}", s) for n in ("iter.index", "iter._index", "_index", "loop_index")] == [1] * 4
    assert r("{{ [_total, iter._total, loop.length] }}", s) == [3, 3, 3]
    assert r("{{ [iter._first, iter._last, loop.first, loop.last] }}", s) == [False, False, False, False]
    assert r("{{ loop.index }}", s) == 2  # Jinja's: 1-based
    assert r("{{ loop.index0 }}", s) == 1
    last = scope(extra={"iter": IterView({"index": 2}, 2, 3), **iteration_names("f", None, 2, 3)})
    assert r("{{ [iter._last, loop.last, loop.first] }}", last) == [True, True, False]
    assert r("{{ iter }}", s) == {"file": "b.csv", "index": 1}  # its positions are not its keys


def test_a_for_loop_in_a_template_has_its_own_loop() -> None:
    s = scope(extra=iteration_names("f", None, 5, 9))
    assert r("{% for x in [7, 8] %}{{ loop.index }}{% endfor %}/{{ loop.index }}", s) == "12/6"


# --- native values and JSON-looking text -----------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{ spec }}", {"dpi": 203}),
        ("{{ ids }}", [1, 2]),
        ("{{ padded }}", {"a": 1}),
        ("{{ zone }}", "007"),
        ("{{ broken }}", "{not json}"),
        ("spec: {{ spec }}", 'spec: {"dpi": 203}'),
        ("{{ n }}", 3),
    ],
)
def test_json_looking_text_of_a_single_expression_is_parsed_where_it_is_a_tools_input(
    template: str, expected: Any
) -> None:
    s = scope(
        workload={
            "spec": '{"dpi": 203}',
            "ids": "[1, 2]",
            "padded": ' {"a": 1} ',
            "zone": "007",
            "broken": "{not json}",
            "n": 3,
        }
    )
    assert r(template, s, as_input=True) == expected
    assert json_inputs({"k": template}, {"k": r(template, s)}) == {"k": expected}


def test_json_looking_text_stays_text_elsewhere() -> None:
    s = scope(workload={"spec": '{"dpi": 203}'})
    assert r("{{ spec }}", s) == '{"dpi": 203}'
    assert json_inputs({"k": '{"a": 1}'}, {"k": '{"a": 1}'}) == {"k": '{"a": 1}'}  # not a template


# --- the workload at start -------------------------------------------------------------------------


def test_templated_workload_values_render_once_at_start() -> None:
    declared = {
        "scratch": "/tmp",
        "run_id": "{{ job.uuid }}",
        "trigger": "{{ trigger | default('schedule') }}",
        "db": "{{ scratch }}/x-{{ execution_id }}.duckdb",
        "again": "{{ db }}",
        "nested": {"ref": "audit-{{ workload.scratch }}", "n": 1},
    }
    out = render_workload(declared, {}, EID)
    assert out == {
        "scratch": "/tmp",
        "run_id": str(uuid.UUID(EID)),
        "trigger": "schedule",
        "db": f"/tmp/x-{EID}.duckdb",
        "again": f"/tmp/x-{EID}.duckdb",
        "nested": {"ref": "audit-/tmp", "n": 1},
    }
    assert render_workload(declared, {}, EID) == out  # a replay renders the same


def test_the_payload_is_data_and_replaces_what_it_gives() -> None:
    declared = {"trigger": "{{ trigger | default('schedule') }}", "dir": "/d", "path": "{{ dir }}/f"}
    payload = {"trigger": "manual {{ raw }}", "dir": "/other"}
    assert render_workload(declared, payload, EID) == {
        "trigger": "manual {{ raw }}",
        "dir": "/other",
        "path": "/other/f",
    }


def test_a_workload_template_that_fails_names_its_key() -> None:
    with pytest.raises(RenderError, match=r"workload\.bad: 'nosuch' is undefined"):
        render_workload({"bad": "{{ nosuch + 1 }}"}, {}, EID)


def test_attribute_reads_name_the_keys_read_of_top_level_names() -> None:
    text = "{{ ctx.page + iter._index }}{{ ctx['state'] }}{% for x in xs %}{{ loop.index }}{% endfor %}"
    assert attribute_reads(text) == {("ctx", "page"), ("iter", "_index"), ("ctx", "state")}
