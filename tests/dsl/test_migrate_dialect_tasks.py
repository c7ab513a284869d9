"""``noetl-stream migrate`` on what a task says in NoETL's dialect: its policy's shorthands, ``output``
(NoETL's envelope) in its policy read as ``outcome`` the same, and its keys (``timeout:``,
``credential:``, an inline ``script:``) in their canonical spelling."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import playbook
from legacy_support import yaml
from migrate_support import migrated, migrated_steps, refused, rules

from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.dsl.migrate import migrate_text
from noetl_stream.dsl.respell import envelope
from noetl_stream.dsl.rewrite import UntranslatableError, rewrite_chains
from noetl_stream.dsl.templates import RenderError, render_value
from noetl_stream.dsl.views import result_view

# -- policies -------------------------------------------------------------------------------------


def test_policy_shorthands_become_their_canonical_spellings() -> None:
    start = migrated_steps(
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
    )["start"]
    assert rules(start, 1) == [
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
    assert refused(text, "env.yaml") == [
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
    with pytest.raises(UntranslatableError):
        rewrite_chains(read, "output", envelope)


# -- task keys ----------------------------------------------------------------------------------------

CREDENTIAL = """
- step: start
  tool: {kind: postgres, credential: pg_main, query: "SELECT 1"}   # NoETL's name
"""


@pytest.mark.parametrize(
    ("workflow", "tool"),
    [
        pytest.param(
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
            """,
            [
                {"name": "a", "kind": "http", "url": "http://x", "spec": {"timeout": 5}},
                {"name": "b", "kind": "http", "url": "http://x", "spec": {"timeout_s": 60, "timeout": 2.5}},
            ],
            id="http timeouts are spec.timeout",
        ),
        pytest.param(
            CREDENTIAL,
            {"kind": "postgres", "auth": "pg_main", "query": "SELECT 1"},
            id="credential is auth",
        ),
        pytest.param(
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
            """,
            [
                {"name": "py", "kind": "python", "code": "result = 1"},
                {"name": "pg", "kind": "postgres", "auth": "pg", "command": "SELECT 1"},
            ],
            id="inline scripts are the kind's code",
        ),
        pytest.param(
            """
            - step: start
              loop: {in: [1, 2], iterator: n}
              tool: {kind: python, input: {n: "{{ n }}"}, code: "result = n"}
            """,
            {"kind": "python", "input": {"n": "{{ iter.n }}"}, "code": "result = n"},
            id="a task input is canonical and stays",
        ),
    ],
)
def test_task_keys_are_written_in_their_canonical_spelling(workflow: str, tool: Any) -> None:
    assert migrated_steps(workflow)["start"]["tool"] == tool


def test_a_credential_gets_no_default_database_and_keeps_its_comment() -> None:
    out = migrated(playbook(CREDENTIAL))
    assert "keychain" not in yaml(out) and "# NoETL's name" in out


def test_a_task_input_with_nothing_to_rewrite_is_not_changed() -> None:
    plain = playbook('- step: start\n  tool: {kind: python, input: {n: 1}, code: "result = n"}')
    assert migrate_text(plain).text == plain
