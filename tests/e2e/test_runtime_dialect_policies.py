"""End to end on a real nats-server and a real HTTP server: task policies written as NoETL writes them
run unchanged, with no flag. ``output`` in a policy is NoETL's envelope of the outcome (``{status, data,
error, http, meta}``), ``then.set`` writes ctx and iter, ``else: {do: ...}`` is the ``else`` rule,
``to: previous`` jumps to the task before, ``backoff: fixed`` waits the same delay before each retry and
``attempts`` counts every run. In a task's own ``set:``, ``output`` is its result."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from helpers import playbook, run, ts
from httpserver import HttpServer

from noetl_stream.runtime.local import Runtime


@pytest.fixture
async def api() -> AsyncIterator[HttpServer]:
    server = await HttpServer().start()
    yield server
    await server.stop()


def retried(url: str) -> str:
    return playbook(
        f"""
        - step: start
          tool:
            kind: http
            url: "{url}"
            spec:
              policy:
                rules:
                  - when: "{{{{ output.status == 'error' and output.error.retryable }}}}"
                    then:
                      do: retry
                      attempts: 3
                      backoff: fixed
                      delay: 0.1
                      set: {{iter.statuses: "{{{{ (iter.statuses | default([])) + [output.http.status] }}}}"}}
                  - when: "{{{{ output.status == 'error' }}}}"
                    then:
                      do: continue
                      set:
                        kind: "{{{{ output.error.kind }}}}"
                        retryable: "{{{{ output.error.retryable }}}}"
                        status_code: "{{{{ output.error.status_code }}}}"
                        body: "{{{{ output.data.data }}}}"
                  - else:
                      do: continue
                      set:
                        ctx.attempt: "{{{{ output.data.data.attempt }}}}"
                        ctx.status: "{{{{ output.http.status }}}}"
                        ctx.ok: "{{{{ output.status }}}}"
                        ctx.no_error: "{{{{ output.error.retryable }}}}"
                        ctx.runs: "{{{{ output.meta.attempt }}}}"
                        ctx.timed: "{{{{ output.meta.duration_ms >= 0 }}}}"
                        ctx.same_as_outcome: "{{{{ output.data == outcome.result }}}}"
                        step.statuses: "{{{{ iter.statuses }}}}"
        """
    )


async def test_output_is_noetls_envelope_in_rules_and_set_values(runtime: Runtime, api: HttpServer) -> None:
    r = await run(runtime, retried(f"{api.url}/flaky/a?fail=2&code=503"))

    assert r.status == "success", r.summary.error
    assert r.summary.ctx == {
        "attempt": 3,  # the body: output.data.data
        "status": 200,
        "ok": "ok",
        "no_error": False,  # output.error.retryable on success: false, not an undefined name
        "runs": 3,
        "timed": True,
        "same_as_outcome": True,
        "statuses": [503, 503],
    }
    # `attempts` counts every run, the first one too; `backoff: fixed` waits `delay` before each retry
    started = r.tasks("start", name="task.started")
    done = r.tasks("start")
    assert [e.payload["attempt"] for e in started] == [1, 2, 3]
    assert [e.payload["do"] for e in done] == ["retry", "retry", "continue"]
    for before, after in zip(done, started[1:], strict=False):
        assert (ts(after) - ts(before)).total_seconds() >= 0.1 - 0.005


async def test_an_error_the_envelope_describes_is_routed_by_its_kind(
    runtime: Runtime, api: HttpServer
) -> None:
    r = await run(runtime, retried(f"{api.url}/status/404"))

    assert r.status == "success", r.summary.error
    assert r.summary.ctx == {
        "kind": "not_found",
        "retryable": False,
        "status_code": 404,
        "body": {"error": {"code": 404}},
    }
    assert [e.payload["do"] for e in r.tasks("start")] == ["continue"]


async def test_retries_that_run_out_fail_the_step_with_the_last_error(
    runtime: Runtime, api: HttpServer
) -> None:
    r = await run(runtime, retried(f"{api.url}/flaky/b?fail=5&code=502"))

    assert r.status == "failed"
    assert r.step_error("start")["kind"] == "server_error"
    assert api.calls["b"] == 3


async def test_jump_to_previous_runs_the_task_before_again(runtime: Runtime, api: HttpServer) -> None:
    text = playbook(
        f"""
        - step: start
          tool:
            - name: issue_token
              kind: python
              input: {{before: "{{{{ ctx.tokens | default(0) }}}}"}}
              code: "result = {{'token': f'tok-{{before + 1}}', 'n': before + 1}}"
              spec:
                policy:
                  rules:
                    - when: true
                      then: {{do: continue, set: {{ctx.tokens: "{{{{ output.data.n }}}}"}}}}
            - name: call
              kind: http
              url: "{api.url}/flaky/t?fail=1&code=401"
              headers: {{X-Token: "{{{{ issue_token.token }}}}"}}
              spec:
                policy:
                  rules:
                    - when: "{{{{ output.status == 'error' and output.error.kind == 'auth' }}}}"
                      then: {{do: jump, to: previous}}
                    - else: {{do: continue}}
        """
    )
    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert [e.payload["task"] for e in r.named("task.done")] == ["issue_token", "call", "issue_token", "call"]
    assert r.summary.ctx == {"tokens": 2}
    assert r.result["data"]["attempt"] == 2


async def test_a_task_set_reads_its_raw_result_as_output_and_later_tasks_read_its_names(
    runtime: Runtime,
) -> None:
    text = playbook(
        """
        - step: start
          loop: {in: [1, 2, 3], iterator: n, spec: {mode: parallel}}
          tool:
            - name: square
              kind: python
              input: {n: "{{ iter.n }}"}
              code: "result = {'sq': n * n}"
              set:
                sq: "{{ output.sq }}"
                step.label: "{{ 'n' ~ iter.n }}"
            - name: report
              kind: noop
              result: "{{ label }}={{ sq }}"
        """
    )
    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.step_result("start") == ["n1=1", "n2=4", "n3=9"]  # each iteration its own names
    assert r.summary.ctx == {}  # a task's bare and step. keys are its step's, not the execution's


async def test_a_task_named_output_is_read_again_after_its_policy(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            - {name: output, kind: noop, result: {x: 1}}
            - name: next
              kind: noop
              result: "{{ output.x }}"
              spec: {policy: {rules: [{when: "{{ output.data == 1 }}", then: {do: continue}}]}}
            - {name: last, kind: noop, result: "{{ output.x + next }}"}
        """
    )
    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == 2
