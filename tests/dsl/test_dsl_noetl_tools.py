"""Tools and loops as NoETL's playbooks write them: what `validate` accepts (and says), what it refuses.

Each case names every diagnostic with file:line:col. Accepted forms are compiled to the canonical one the
runtime reads (`dsl/toolforms.py`, `dsl/steps.py`).
"""

from __future__ import annotations

import pytest
from dsl_support import assert_rejected_with, steps

from noetl_stream.dsl import compile_playbook


def compiled(text: str) -> tuple[list[str], object]:
    result = compile_playbook(text, "t.yaml")
    return [d.format() for d in result.diagnostics], result.playbook


def test_http_timeout_and_timeout_seconds_are_spec_timeout_with_a_dialect_warning() -> None:
    diags, pb = compiled(
        steps("""\
  - step: start
    tool:
      - {name: a, kind: http, url: "http://x/a", timeout: 10, verify_ssl: false}
      - {name: b, kind: http, url: "http://x/b", timeout_seconds: 2.5, spec: {max_body_bytes: 100}}
""")
    )
    assert diags == [
        "t.yaml:9:50: warning: step 'start' task 'a': 'timeout:' is NoETL's spelling of 'spec.timeout:' "
        "(seconds, for connecting and for reading) (at workflow[0].tool[0].timeout)",
        "t.yaml:10:50: warning: step 'start' task 'b': 'timeout_seconds:' is NoETL's spelling of "
        "'spec.timeout:' (seconds, for connecting and for reading) (at workflow[0].tool[1].timeout_seconds)",
    ]
    assert pb is not None
    a, b = pb.workflow[0].tasks  # type: ignore[attr-defined]
    assert (a.spec, a.config) == ({"timeout": 10}, {"url": "http://x/a", "verify_ssl": False})
    assert b.spec == {"max_body_bytes": 100, "timeout": 2.5}


def test_an_inline_script_is_code_and_a_file_script_is_shipped_by_path() -> None:
    diags, pb = compiled(
        steps("""\
  - step: start
    tool:
      - name: inline
        kind: python
        script: {uri: score.py, source: {type: inline, code: "result = 1"}}
      - name: from_file
        kind: postgres
        auth: pg
        script: {uri: sql/load.sql, source: {type: file}}
""")
    )
    assert diags == [
        "t.yaml:11:9: warning: step 'start' task 'inline': an inline 'script:' is NoETL's spelling of "
        "'code:' (write the text as 'code: |') (at workflow[0].tool[0].script)",
        "t.yaml:14:15: warning: step 'start' task 'from_file': credential 'pg' is not declared in the root "
        "keychain (at workflow[0].tool[1].auth)",
    ]
    assert pb is not None
    inline, from_file = pb.workflow[0].tasks  # type: ignore[attr-defined]
    assert inline.config == {"code": "result = 1"}
    assert from_file.config == {"auth": "pg", "script": {"path": "sql/load.sql"}}


def test_noetl_extras_are_accepted_and_each_named_in_a_warning() -> None:
    text = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: t, tags: [a], exposes_as_mcp: true}
executor: {profile: local, version: x/1, requires: [pg]}
tracing: {enabled: true}
workflow:
  - step: start
    tool: {kind: duckdb, pool: analytics, retry: {max_attempts: 2}, query: SELECT 1}
    output: {store: {kind: kv}, output_select: [rows]}
"""
    diags, pb = compiled(text)
    assert diags == [
        "t.yaml:3:30: warning: 'metadata.tags' is accepted for NoETL's playbooks and ignored (at metadata.tags)",
        "t.yaml:3:41: warning: 'metadata.exposes_as_mcp' is accepted for NoETL's playbooks and ignored "
        "(at metadata.exposes_as_mcp)",
        "t.yaml:4:12: warning: 'executor.profile' is accepted for NoETL's playbooks and ignored (at executor.profile)",
        "t.yaml:4:28: warning: 'executor.version' is accepted for NoETL's playbooks and ignored (at executor.version)",
        "t.yaml:4:42: warning: 'executor.requires' is accepted for NoETL's playbooks and ignored (at executor.requires)",
        "t.yaml:5:1: warning: 'tracing' is accepted for NoETL's playbooks and ignored (at tracing)",
        "t.yaml:8:26: warning: step 'start' task 'start_task': 'pool' is accepted for NoETL's playbooks and "
        "ignored (a worker keeps its own connection pools) (at workflow[0].tool.pool)",
        "t.yaml:8:43: warning: step 'start' task 'start_task': 'retry' is accepted for NoETL's playbooks and "
        "ignored (retrying is task policy: spec.policy.rules with 'then: {do: retry, attempts: N}') "
        "(at workflow[0].tool.retry)",
        "t.yaml:9:5: warning: step 'start': 'output' is NoETL's storage hint, accepted and ignored: the result "
        "stays inline whole (output_select keeps every field) and gets a '_ref' naming it (at workflow[0].output)",
    ]
    assert pb is not None
    step = pb.workflow[0]  # type: ignore[attr-defined]
    assert step.result_store == "kv"
    assert step.tasks[0].config == {"query": "SELECT 1"}


def test_workbook_entries_take_input_and_their_assert_is_documentation() -> None:
    diags, pb = compiled("""\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: t}
workbook:
  - name: fee
    assert: {expects: [cents]}
    tool: {kind: python, input: {bp: 150}, args: {cents: 0}, code: "result = cents * bp"}
workflow:
  - step: start
    tool: {kind: workbook, name: fee, input: {cents: 10}}
""")
    assert diags == [
        "t.yaml:6:5: warning: workbook 'fee': 'assert' beside 'tool' is ignored (NoETL's 'assert' is "
        "documentation only) (at workbook[0].assert)",
    ]
    assert pb is not None
    assert pb.workbook["fee"].config["args"] == {"cents": 0, "bp": 150}  # type: ignore[attr-defined]


def test_a_cursor_loop_compiles_without_in() -> None:
    diags, pb = compiled(
        steps("""\
  - step: start
    loop:
      iterator: row
      spec: {mode: cursor, frame: {max_rows: 3}, max_in_flight: 2}
      cursor: {kind: postgres, auth: "{{ workload.pg }}", claim: "UPDATE q SET taken = true RETURNING id"}
    tool: {kind: noop}
""")
    )
    assert diags == []
    assert pb is not None
    loop = pb.workflow[0].loop  # type: ignore[attr-defined]
    assert (loop.in_, loop.spec.mode, loop.spec.frame_max_rows, loop.spec.max_in_flight) == (
        None,
        "cursor",
        3,
        2,
    )
    assert loop.cursor["claim"].startswith("UPDATE q")


CASES = [
    pytest.param(
        steps("""\
  - step: start
    tool:
      kind: http
      spec: {url: "http://x", input: {a: 1}, timeout: 5}
"""),
        [
            "bad.yaml:8:5: step 'start' task 'start_task': kind 'http' needs 'url' or 'endpoint' (at workflow[0].tool)",
            "bad.yaml:10:14: step 'start' task 'start_task': 'url' is a field of the task, not of its spec: "
            "move it up, beside 'kind' (spec holds the policy and knobs such as timeout) (at workflow[0].tool.spec.url)",
            "bad.yaml:10:31: step 'start' task 'start_task': 'input' is a field of the task, not of its spec: "
            "move it up, beside 'kind' (spec holds the policy and knobs such as timeout) (at workflow[0].tool.spec.input)",
        ],
        id="tool-fields-under-spec",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - {name: a, kind: http, url: "http://x", timeout: 5, timeout_seconds: 6}
      - {name: b, kind: http, url: "http://x", timeout: "{{ t }}"}
"""),
        [
            "bad.yaml:9:60: step 'start' task 'a': 'timeout' and 'timeout_seconds' both give the request's "
            "timeout: keep one (spec.timeout) (at workflow[0].tool[0].timeout_seconds)",
            "bad.yaml:10:57: step 'start' task 'b': 'timeout' must be a number of seconds, got '{{ t }}' (a "
            "template is not rendered there) (at workflow[0].tool[1].timeout)",
        ],
        id="http-timeouts",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool:
      - {name: a, kind: python, script: {uri: "gs://b/x.py", source: {type: gcs}}}
      - {name: b, kind: postgres, dsn: x, script: {source: {type: inline}}}
      - {name: c, kind: python, code: x, script: {source: {type: inline, code: y}}}
"""),
        [
            "bad.yaml:9:77: step 'start' task 'a': a script fetched over a network (source type 'gcs') is not "
            "supported: put the text in 'code' (or in a file shipped with the playbook: source type 'file') "
            "(at workflow[0].tool[0].script.source.type)",
            "bad.yaml:10:52: step 'start' task 'b': an inline script needs its text in 'source.code' "
            "(at workflow[0].tool[1].script.source)",
            "bad.yaml:11:42: step 'start' task 'c': kind 'python' takes 'code' or 'script', not both "
            "(at workflow[0].tool[2].script)",
        ],
        id="scripts",
    ),
    pytest.param(
        steps("""\
  - step: start
    loop:
      in: [1]
      iterator: row
      spec: {mode: cursor, policy: {exec: distributed}}
      cursor: {kind: mysql, claim: ""}
    tool: {kind: noop}
  - step: other
    loop: {in: [1], iterator: row, cursor: {kind: postgres, claim: x}}
    tool: {kind: noop}
"""),
        [
            "bad.yaml:9:7: step 'start': a cursor loop takes its items from its claim, not from 'in': remove "
            "'in' (or the cursor mode) (at workflow[0].loop.in)",
            "bad.yaml:11:43: step 'start': a cursor loop runs on one worker (exec: local): its claims are "
            "queries, and the controller runs none (at workflow[0].loop.spec.policy.exec)",
            "bad.yaml:12:22: step 'start': a cursor loop claims its rows with 'kind: postgres', got 'mysql' "
            "(at workflow[0].loop.cursor.kind)",
            "bad.yaml:12:36: step 'start': the cursor needs 'claim', the SQL that claims a frame of rows and "
            "returns them (UPDATE ... RETURNING ...) (at workflow[0].loop.cursor.claim)",
            "bad.yaml:15:36: step 'other': 'cursor' is read by a cursor loop only: add 'spec: {mode: cursor}' "
            "(or loop over 'in') (at workflow[1].loop.cursor)",
        ],
        id="cursor-loops",
    ),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_what_both_engines_fail_on_is_refused_exactly(text: str, expected: list[str]) -> None:
    assert_rejected_with(text, expected)
