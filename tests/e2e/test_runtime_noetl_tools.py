"""Tools as NoETL's playbooks write them, run for real: a task's ``input`` in its own fields, a step's
``input`` over the task's, python's ``context``, noop's default result, workbook entries with the caller's
values winning, file scripts shipped with the playbook, and a step ``output: {store}``'s ``_ref``
(docs/tools.md, docs/semantics.md)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from helpers import playbook, run
from httpserver import HttpServer
from pgserver import PgServer

from noetl_stream.runtime.local import Runtime


@pytest.fixture
async def server() -> AsyncIterator[HttpServer]:
    srv = await HttpServer().start()
    yield srv
    await srv.stop()


@pytest.fixture
def table() -> str:
    return "t_" + uuid.uuid4().hex[:12]


async def test_a_tasks_input_is_read_as_input_and_args_in_its_own_fields(
    runtime: Runtime, server: HttpServer, pg: PgServer, table: str
) -> None:
    text = playbook(
        f"""
        - step: start
          tool:
            - name: fetch
              kind: http
              input: {{who: ada, n: 2}}
              url: "{{{{ workload.api }}}}/echo"
              params: {{who: "{{{{ input.who }}}}", n: "{{{{ args.n }}}}"}}
            - name: store
              kind: postgres
              dsn: "{{{{ workload.dsn }}}}"
              input: {{who: "{{{{ fetch.data.query[0][1] }}}}"}}
              command: |
                CREATE TABLE {table} (who text);
                INSERT INTO {table} VALUES ('{{{{ input.who }}}}');
                SELECT who FROM {table}
        """,
        workload={"api": server.url, "dsn": pg.dsn},
    )
    r = await run(runtime, text)
    assert r.status == "success", r.summary.error
    assert r.summary.result["rows"] == [{"who": "ada"}]
    assert server.seen[-1]["query"] == [["who", "ada"], ["n", "2"]]


async def test_a_step_input_wins_over_its_tasks_input_and_context_is_the_render_scope(
    runtime: Runtime,
) -> None:
    text = playbook(
        """
        - step: start
          input: {weight: 0.1}
          tool:
            - name: score
              kind: python
              input: {weight: 99, base: 1}
              code: |
                seen = context.get("execution_id") is not None and context["input"]["weight"]
                try:
                    context["execution_id"] = "changed"
                    changed = True
                except TypeError:
                    changed = False
                result = {"weight": weight, "base": base, "seen": seen, "changed": changed}
            - name: again
              kind: python
              code: |
                result = {"first": _prev, "same_id": context["execution_id"] != "changed", "weight": weight}
        """
    )
    r = await run(runtime, text)
    assert r.status == "success", r.summary.error
    result = r.summary.result
    assert result["first"] == {"weight": 0.1, "base": 1, "seen": 0.1, "changed": False}
    assert result["same_id"] is True and result["weight"] == 0.1


async def test_a_noop_without_result_is_noetls_value_first_and_hands_on_the_previous_result(
    runtime: Runtime,
) -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: noop}
          next: {arcs: [{step: after}]}
        - step: after
          tool:
            - {name: calc, kind: python, code: "result = {'n': 3}"}
            - {name: pass_on, kind: noop}
        """
    )
    r = await run(runtime, text)
    assert r.status == "success", r.summary.error
    assert r.step_result("start") == {"status": "ok", "message": "noop"}
    assert r.summary.result["n"] == 3


async def test_a_workbook_entry_takes_the_callers_input_over_its_own(runtime: Runtime) -> None:
    text = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: wb, path: tests/wb}
workbook:
  - name: fee
    tool:
      kind: python
      input: {basis_points: 150, cents: 0}
      code: |
        result = {"fee": cents * basis_points // 10000, "bp": basis_points}
workflow:
  - step: start
    tool: {kind: workbook, name: fee, input: {cents: 4100, basis_points: 200}}
"""
    r = await run(runtime, text)
    assert r.status == "success", r.summary.error
    assert r.summary.result == {"fee": 82, "bp": 200}


async def test_file_scripts_are_shipped_with_the_playbook_and_run(
    runtime: Runtime, pg: PgServer, table: str, tmp_path: Path
) -> None:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "score.py").write_text("result = {'doubled': n * 2}\n")
    (tmp_path / "scripts" / "load.sql").write_text(
        f"CREATE TABLE {table} (n int);\nINSERT INTO {table} VALUES (21);\nSELECT n FROM {table}\n"
    )
    text = playbook(
        """
        - step: start
          tool:
            - name: load
              kind: postgres
              dsn: "{{ workload.dsn }}"
              script: {uri: scripts/load.sql, source: {type: file}}
            - name: score
              kind: python
              input: {n: "{{ load.rows[0].n }}"}
              script: {uri: scripts/score.py, source: {type: file}}
        """,
        workload={"dsn": pg.dsn},
    )
    path = tmp_path / "flow.yaml"
    path.write_text(text)
    r = await run(runtime, text, file=str(path))
    assert r.status == "success", r.summary.error
    assert r.summary.result == {"doubled": 42}


async def test_a_missing_script_file_fails_the_task_naming_it(runtime: Runtime, tmp_path: Path) -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: python, script: {uri: nowhere.py, source: {type: file}}}
        """
    )
    r = await run(runtime, text, file=str(tmp_path / "flow.yaml"))
    assert r.status == "failed"
    error = r.step_error("start")
    assert error["kind"] == "config_error" and "'nowhere.py' was not shipped" in error["message"]


async def test_a_step_output_store_keeps_the_result_inline_with_a_ref(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: python, code: "result = {'rows': [1, 2]}"}
          output: {store: {kind: kv}, output_select: [rows]}
          next: {arcs: [{step: check}]}
        - step: check
          tool: {kind: python, input: {rows: "{{ start.rows }}", ref: "{{ start._ref }}"}, code: "result = ref"}
        """
    )
    r = await run(runtime, text)
    assert r.status == "success", r.summary.error
    assert r.step_result("start")["rows"] == [1, 2]
    ref = r.summary.result
    assert {k: ref[k] for k in ("kind", "store", "step")} == {
        "kind": "step_result",
        "store": "kv",
        "step": "start",
    }
    assert ref["execution_id"] == r.summary.execution_id


async def _rows(dsn: str, query: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(query))
    finally:
        await conn.close()
