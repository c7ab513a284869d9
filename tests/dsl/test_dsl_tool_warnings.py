"""Tool keys NoETL's playbooks give that a tool ignores: accepted, each with a warning at its place."""

from __future__ import annotations

from noetl_stream.dsl import compile_playbook

HEAD = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: tests/t}
workflow:
  - step: start
    tool:
"""


def warnings(tasks: str) -> list[str]:
    result = compile_playbook(HEAD + tasks, "t.yaml")
    assert result.playbook is not None, [d.format() for d in result.errors]
    return [f"{d.line}:{d.col}: {d.code}: {d.message}" for d in result.warnings]


def test_a_second_http_body_key_is_ignored_with_a_warning_naming_the_one_used() -> None:
    assert warnings(
        """\
      - name: post
        kind: http
        method: POST
        url: http://127.0.0.1/x
        payload: {a: 1}
        json: {b: 2}
        data: {c: 3}
"""
    ) == [
        "11:9: ignored-key: step 'start' task 'post': 'payload' is ignored: kind 'http' uses the first of "
        "json, form, body, payload, data that is given, here 'json'",
        "13:9: ignored-key: step 'start' task 'post': 'data' is ignored: kind 'http' uses the first of "
        "json, form, body, payload, data that is given, here 'json'",
    ]


def test_the_data_of_a_get_is_its_query_not_a_second_body() -> None:
    assert (
        warnings(
            """\
      - name: get
        kind: http
        url: http://127.0.0.1/x
        data: {q: 1}
        body: "raw"
"""
        )
        == []
    )


def test_a_postgres_pool_is_accepted_and_ignored_with_a_warning() -> None:
    assert warnings(
        """\
      - name: load
        kind: postgres
        pool: reporting
        command: SELECT 1
"""
    ) == [
        "9:9: ignored-key: step 'start' task 'load': 'pool' is accepted for NoETL's playbooks and ignored "
        "by kind 'postgres'"
    ]
