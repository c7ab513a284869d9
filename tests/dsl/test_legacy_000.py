"""000/004 forms under the legacy extension: each construct, its canonical translation, and what a
run of the translation does (real NATS; an aiohttp server for the HTTP ones)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from helpers import run
from httpserver import HttpServer
from legacy_support import canonical, compiles, legacy, report, step, yaml

from noetl_stream.runtime.local import Runtime

FAILED = "{{ event.name == 'step.failed' }}"
DONE = "{{ event.name != 'step.failed' }}"


@pytest.fixture
async def http() -> AsyncIterator[HttpServer]:
    server = await HttpServer().start()
    server.pages.update({"a": [1, 2, 3, 4, 5], "b": ["x", "y", "z"]})
    yield server
    await server.stop()


# -- root, structural next, loop ----------------------------------------------------------------------


def test_root_name_and_path_become_metadata() -> None:
    text = "apiVersion: noetl.io/v2\nkind: Playbook\nname: old\npath: legacy/old\nversion: 3\n" + (
        "executor: {spec: {extensions: [legacy]}}\nworkflow:\n  - step: start\n    tool: {kind: noop}\n"
    )
    data = canonical(text)
    assert list(data) == ["apiVersion", "kind", "metadata", "workflow"]
    assert data["metadata"] == {"name": "old", "path": "legacy/old", "version": 3}
    assert report(text) == ["3:1: warning: root 'name', 'path', 'version' translated to metadata"]


def test_structural_next_string_and_list() -> None:
    text = legacy(
        """
        - step: start
          next: work
        - step: work
          tool: {kind: noop}
          next: [left, {step: right, args: {n: 1}}]
        - step: left
          tool: {kind: noop}
        - step: right
          tool: {kind: noop}
        """
    )
    assert step(text, "start")["next"] == {"arcs": [{"step": "work"}]}
    assert step(text, "work")["next"] == {
        "spec": {"mode": "inclusive"},
        "arcs": [{"step": "left", "when": DONE}, {"step": "right", "args": {"n": 1}, "when": DONE}],
    }
    assert report(text) == [
        "7:5: warning: step 'start': structural 'next' translated to next.arcs",
        "10:5: warning: step 'work': structural 'next' translated to next.arcs (every target is taken)",
    ]


async def test_a_structural_next_takes_every_target_and_does_not_route_a_failure(runtime: Runtime) -> None:
    text = legacy(
        """
        - step: start
          next: [left, right]
        - step: left
          tool: {kind: noop, result: l}
        - step: right
          tool: {kind: python, code: "raise ValueError('no')"}
          next: never
        - step: never
          tool: {kind: noop}
        """
    )
    r = await run(runtime, text)
    assert r.status == "failed"
    assert sorted(r.ran()) == ["left", "right", "start"]
    assert r.summary.error is not None and r.summary.error["kind"] == "python_error"


def test_loop_mode_iterator_with_and_endpoint() -> None:
    text = legacy(
        """
        - step: start
          loop: {in: "{{ workload.items }}", iterator: item, mode: parallel}
          tool:
            kind: http
            endpoint: "{{ workload.url }}/{{ item }}"
            with: {a: 1}
        """,
        workload={"items": [1], "url": "http://x"},
    )
    s = step(text, "start")
    assert s["loop"] == {"in": "{{ workload.items }}", "iterator": "item", "spec": {"mode": "parallel"}}
    assert s["tool"] == {"kind": "http", "url": "{{ workload.url }}/{{ iter.item }}", "args": {"a": 1}}


# -- vars ---------------------------------------------------------------------------------------------

VARS = """
- step: start
  tool: {kind: python, code: "result = [{'id': 7, 'mail': 'a@x'}]"}
  vars:
    user_id: "{{ result[0].id }}"
    mail: "{{ result[0]['mail'] }}"
  next: greet
- step: greet
  tool: {kind: noop, result: "hello {{ vars.mail }} ({{ vars.user_id }})"}
"""


def test_vars_become_set_ctx_after_the_call_and_vars_reads_become_ctx() -> None:
    s = step(legacy(VARS), "start")
    assert s["tool"] == yaml(
        """
        - {name: start_task, kind: python, code: "result = [{'id': 7, 'mail': 'a@x'}]"}
        - name: start_result
          kind: noop
          spec:
            policy:
              rules:
                - else:
                    then:
                      do: continue
                      set_ctx: {user_id: "{{ outcome.result[0].id }}", mail: "{{ outcome.result[0]['mail'] }}"}
        """
    )
    assert step(legacy(VARS), "greet")["tool"]["result"] == "hello {{ ctx.mail }} ({{ ctx.user_id }})"


async def test_vars_are_readable_by_later_steps(runtime: Runtime) -> None:
    r = await run(runtime, legacy(VARS))
    assert r.status == "success", r.summary.error
    assert r.result == "hello a@x (7)"
    assert r.summary.ctx == {"user_id": 7, "mail": "a@x"}


LOOP_VARS = """
- step: start
  loop: {in: [1, 2, 3], iterator: n}
  tool: {kind: python, args: {n: "{{ n }}"}, code: "result = n * 10"}
  vars:
    total: "{{ result | sum }}"
  next: end
- step: end
  tool: {kind: noop, result: "{{ vars.total }}"}
"""


def test_vars_of_a_looped_step_are_set_in_a_step_after_the_loop() -> None:
    text = legacy(LOOP_VARS)
    assert [s["step"] for s in canonical(text)["workflow"]] == ["start", "start_exit", "end"]
    assert step(text, "start")["next"] == {"arcs": [{"step": "start_exit", "when": DONE}]}
    assert step(text, "start_exit") == yaml(
        """
        step: start_exit
        tool:
          - name: start_exit_vars
            kind: noop
            spec: {policy: {rules: [{else: {then: {do: continue, set_ctx: {total: "{{ start | sum }}"}}}}]}}
        next: {arcs: [{step: end, when: "{{ event.name != 'step.failed' }}"}]}
        """
    )


async def test_vars_of_a_looped_step_see_every_iteration(runtime: Runtime) -> None:
    r = await run(runtime, legacy(LOOP_VARS))
    assert r.status == "success", r.summary.error
    assert (r.result, r.summary.ctx) == (60, {"total": 60})


# -- retry policies -----------------------------------------------------------------------------------


def test_retry_settings_become_a_retry_rule_with_the_same_waits() -> None:
    text = legacy(
        """
        - step: start
          tool: {kind: http, url: "http://x"}
          retry:
            - when: "{{ error.status in [503] }}"
              then: {max_attempts: 4, initial_delay: 0.5, backoff_multiplier: 2.0}
            - when: "{{ status_code == 429 }}"
              then: {max_attempts: 2, initial_delay: 3}
            - then: {max_attempts: 3, initial_delay: 1, backoff_multiplier: 1.5}
        """
    )
    rules = step(text, "start")["tool"]["spec"]["policy"]["rules"]
    assert rules == yaml(
        """
        - when: "{{ outcome.status == 'error' and outcome.http.status in [503] }}"
          then: {do: retry, attempts: 4, backoff: exponential, delay: 0.5}
        - when: "{{ outcome.http.status == 429 }}"
          then: {do: retry, attempts: 2, backoff: none, delay: 3}
        - when: "{{ outcome.status == 'error' }}"
          then: {do: retry, attempts: 3, backoff: none, delay: "{{ 1.0 * 1.5 ** (_attempt - 1) }}"}
        - when: "{{ outcome.status == 'error' }}"
          then: {do: fail}
        """
    )
    compiles(text)


async def test_a_retried_call_succeeds_and_an_exhausted_one_fails_the_step(
    runtime: Runtime, http: HttpServer
) -> None:
    text = legacy(
        """
        - step: start
          tool: {kind: http, url: "{{ workload.url }}/flaky/{{ workload.key }}?fail=2"}
          retry:
            - when: "{{ error.status in [503] }}"
              then: {max_attempts: "{{ workload.attempts }}", initial_delay: 0}
        """.replace('"{{ workload.attempts }}"', "3"),
        workload={"url": http.url, "key": "k1"},
    )
    r = await run(runtime, text)
    assert r.status == "success", r.summary.error
    assert r.result["data"] == {"attempt": 3, "ok": True}
    r = await run(runtime, text.replace("max_attempts: 3", "max_attempts: 2"), {"key": "k2"})
    assert r.status == "failed"
    assert r.step_error("start")["kind"] == "server_error"


PAGES = """
- step: start
  loop: {in: ["a", "b"], iterator: name}
  tool:
    kind: http
    url: "{{ workload.url }}/pages/{{ name }}"
    params: {page: 1, pageSize: 2}
  retry:
    - when: "{{ response.data.paging.hasMore }}"
      then:
        max_attempts: 10
        next_call: {params: {page: "{{ response.data.paging.page + 1 }}"}}
        collect: {strategy: extend, path: data.data, into: rows}
"""


def test_next_call_and_collect_become_a_jump_with_iteration_state() -> None:
    tasks = step(legacy(PAGES, workload={"url": "u"}), "start")["tool"]
    assert tasks == yaml(
        """
        - name: start_task
          kind: http
          url: "{{ workload.url }}/pages/{{ iter.name }}"
          params: {page: "{{ iter.next_call.params.page | default(1) }}", pageSize: 2}
          spec:
            policy:
              rules:
                - when: "{{ outcome.status == 'ok' and outcome.result.data.paging.hasMore and (iter.retry_index | default(1)) < 10 }}"
                  then:
                    do: jump
                    to: start_task
                    set_iter:
                      rows: "{{ (iter.rows | default([])) + (outcome.result.data.data) }}"
                      next_call: {params: {page: "{{ outcome.result.data.paging.page + 1 }}"}}
                      retry_index: "{{ (iter.retry_index | default(1)) + 1 }}"
                - when: "{{ outcome.status == 'ok' and outcome.result.data.paging.hasMore }}"
                  then:
                    do: continue
                    set_iter: {rows: "{{ (iter.rows | default([])) + (outcome.result.data.data) }}"}
                - when: "{{ outcome.status == 'error' }}"
                  then: {do: fail}
        - {name: start_result, kind: noop, result: "{{ iter.rows | default([]) }}"}
        """
    )


async def test_next_call_pages_through_and_collects_each_iteration(
    runtime: Runtime, http: HttpServer
) -> None:
    r = await run(runtime, legacy(PAGES, workload={"url": http.url}))
    assert r.status == "success", r.summary.error
    # legacy collects a page when a policy matches it: the pages that have more
    assert r.step_result("start") == [[1, 2, 3, 4], ["x", "y"]]
    assert http.calls["pages/a"] == 3 and http.calls["pages/b"] == 2
    limited = legacy(PAGES.replace("max_attempts: 10", "max_attempts: 2"), workload={"url": http.url})
    r = await run(runtime, limited)
    assert r.step_result("start") == [[1, 2, 3, 4], ["x", "y"]]  # 2 calls: the second matches, spent
    assert http.calls["pages/a"] == 5


# -- case rules ------------------------------------------------------------------------------------

CASE_004 = """
- step: start
  tool:
    kind: http
    url: "{{ workload.url }}/pages/a"
    params: {page: 1, pageSize: 2}
  case:
    - when: "{{ event.name == 'step.enter' }}"
      then: {set: {ctx: {pages: []}}}
    - when: >-
        {{ event.name == 'call.done'
        and response is defined
        and response.data.paging.hasMore == true }}
      then:
        collect: {from: response.data.data, into: pages, mode: extend}
        call:
          params: {page: "{{ (response.data.paging.page | int) + 1 }}"}
    - when: >-
        {{ event.name == 'call.done'
        and response is defined
        and not response.data.paging.hasMore }}
      then:
        collect: {from: response.data.data, into: pages, mode: extend}
        result: {from: pages}
        next:
          - step: validate
            args: {pages: "{{ pages }}"}
- step: validate
  tool: {kind: noop, result: "{{ args }}"}
"""


def test_case_on_call_done_collects_calls_again_and_sets_the_result() -> None:
    text = legacy(CASE_004, workload={"url": "u"})
    start = step(text, "start")
    enter, call, result = start["tool"]
    assert enter == yaml(
        """
        name: start_enter
        kind: noop
        spec: {policy: {rules: [{else: {then: {do: continue, set_iter: {pages: []}}}}]}}
        """
    )
    assert call["spec"]["policy"]["rules"] == yaml(
        """
        - when: "{{ (outcome.status == 'ok') and outcome.result.data.paging.hasMore == true }}"
          then:
            do: jump
            to: start_task
            set_iter:
              pages: "{{ (iter.pages | default([])) + (outcome.result.data.data) }}"
              next_call: {params: {page: "{{ (outcome.result.data.paging.page | int) + 1 }}"}}
              retry_index: "{{ (iter.retry_index | default(1)) + 1 }}"
        - when: "{{ (outcome.status == 'ok') and not outcome.result.data.paging.hasMore }}"
          then:
            do: continue
            set_iter:
              pages: "{{ (iter.pages | default([])) + (outcome.result.data.data) }}"
              step_result: "{{ ((iter.pages | default([])) + (outcome.result.data.data)) }}"
            set_ctx: {start_route: 2}
        - when: "{{ outcome.status == 'ok' }}"
          then: {do: continue, set_ctx: {start_route: 0}}
        - when: "{{ outcome.status == 'error' }}"
          then: {do: fail}
        """
    )
    assert result == {
        "name": "start_result",
        "kind": "noop",
        "result": "{{ iter.step_result | default(iter.pages | default([])) }}",
    }
    assert start["next"] == yaml(
        """
        arcs:
          - step: validate
            when: "{{ event.name != 'step.failed' and ctx.start_route == 2 }}"
            args: {pages: "{{ start }}"}
        """
    )


async def test_the_004_pagination_case_runs_and_hands_its_pages_on(
    runtime: Runtime, http: HttpServer
) -> None:
    r = await run(runtime, legacy(CASE_004, workload={"url": http.url}))
    assert r.status == "success", r.summary.error
    assert r.step_result("start") == [1, 2, 3, 4, 5]
    assert r.result == {"pages": [1, 2, 3, 4, 5]}
    assert r.summary.ctx == {"start_route": 2}


CASE_ACTIONS = """
- step: start
  tool: {kind: http, url: "{{ workload.url }}/flaky/{{ workload.key }}?fail=1"}
  case:
    - when: "{{ event.name == 'step.enter' and workload.limit < 1 }}"
      then: {fail: true}
    - when: "{{ event.name == 'step.enter' }}"
      then:
        sink:
          tool: {kind: python, code: "open(path, 'a').write('enter\\\\n')"}
          args: {path: "{{ workload.journal }}"}
    - when: "{{ event.name == 'call.done' and response.data.ok }}"
      then:
        set: {attempt: "{{ response.data.attempt }}"}
        sink:
          tool: {kind: python, code: "open(path, 'a').write(f'call {n}\\\\n')"}
          args: {path: "{{ workload.journal }}", n: "{{ attempt }}"}
    - when: "{{ event.name == 'call.error' }}"
      then:
        retry: {max_attempts: 2, initial_delay: 0}
    - when: "{{ event.name == 'step.exit' and result.data.ok }}"
      then:
        next: [{step: good, args: {n: "{{ result.data.attempt }}"}}]
    - when: "{{ event.name == 'step.exit' }}"
      then: {fail: true}
- step: good
  tool: {kind: noop, result: "{{ args.n }}"}
"""


def test_case_actions_on_every_event_become_tasks_rules_and_arcs() -> None:
    text = legacy(CASE_ACTIONS, workload={"url": "u", "key": "k", "limit": 1, "journal": "j"})
    start = step(text, "start")
    assert [t["name"] for t in start["tool"]] == [
        "start_enter",
        "start_enter_sink_1",
        "start_task",
        "start_result",
        "start_sink_0",
    ]
    assert start["tool"][0]["spec"]["policy"]["rules"] == yaml(
        """
        - when: "{{ workload.limit < 1 }}"
          then: {do: fail}
        - else: {then: {do: jump, to: start_enter_sink_1}}
        """
    )
    assert start["tool"][2]["spec"]["policy"]["rules"] == yaml(
        """
        - when: "{{ outcome.status == 'ok' and outcome.result.data.ok }}"
          then: {do: jump, to: start_sink_0, set_iter: {attempt: "{{ outcome.result.data.attempt }}"}}
        - when: "{{ outcome.status == 'error' }}"
          then: {do: retry, attempts: 2, backoff: none, delay: 0}
        - when: "{{ outcome.status == 'error' }}"
          then: {do: fail}
        """
    )
    assert start["tool"][4]["args"] == {"path": "{{ workload.journal }}", "n": "{{ iter.attempt }}"}
    assert start["next"] == {"arcs": [{"step": "start_exit", "when": DONE}]}
    assert step(text, "start_exit") == yaml(
        """
        step: start_exit
        tool:
          - name: start_exit_route
            kind: noop
            spec:
              policy:
                rules:
                  - when: "{{ start.data.ok }}"
                    then: {do: break}
                  - else: {then: {do: jump, to: start_exit_fail_1}}
          - name: start_exit_fail_1
            kind: noop
            spec: {policy: {rules: [{else: {then: {do: fail}}}]}}
        next:
          arcs:
            - step: good
              when: "{{ event.name != 'step.failed' and start.data.ok }}"
              args: {n: "{{ start.data.attempt }}"}
        """
    )


async def test_case_actions_run_in_order(runtime: Runtime, http: HttpServer, tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    workload = {"url": http.url, "key": "k1", "limit": 1, "journal": str(journal)}
    r = await run(runtime, legacy(CASE_ACTIONS, workload=workload))
    assert r.status == "success", r.summary.error
    assert r.result == 2  # the call failed once and was retried
    assert journal.read_text().split("\n") == ["enter", "call 2", ""]
    r = await run(runtime, legacy(CASE_ACTIONS, workload={**workload, "limit": 0, "key": "k2"}))
    assert r.status == "failed"
    assert r.step_error("start")["kind"] == "policy_fail"


SKIP_AND_ERROR = """
- step: start
  next: [work]
- step: work
  tool: {kind: http, url: "{{ workload.url }}/status/{{ workload.code }}"}
  case:
    - when: "{{ event.name == 'step.enter' and workload.code == 0 }}"
      then: {skip: true}
    - when: "{{ event.name == 'call.error' }}"
      then:
        next: [{step: handler, args: {why: "{{ error.kind }}"}}]
  next: fine
- step: handler
  tool: {kind: noop, result: "{{ args.why }}"}
- step: fine
  tool: {kind: noop, result: fine}
"""


def test_skip_becomes_admission_and_call_error_next_a_failure_arc() -> None:
    work = step(legacy(SKIP_AND_ERROR, workload={"url": "u", "code": 500}), "work")
    assert work["spec"] == yaml(
        """
        policy:
          admit:
            rules:
              - when: "{{ workload.code == 0 }}"
                then: {allow: false}
              - else: {then: {allow: true}}
        """
    )
    assert "spec" not in work["tool"]
    assert work["next"] == yaml(
        """
        arcs:
          - step: handler
            when: "{{ event.name == 'step.failed' }}"
            args: {why: "{{ event.error.kind }}"}
          - step: fine
            when: "{{ event.name != 'step.failed' }}"
        """
    )


@pytest.mark.parametrize(("code", "expected"), [(500, "server_error"), (200, "fine"), (0, None)])
async def test_skip_and_call_error_at_run_time(
    runtime: Runtime, http: HttpServer, code: int, expected: str | None
) -> None:
    r = await run(runtime, legacy(SKIP_AND_ERROR, workload={"url": http.url, "code": code}))
    assert r.status == "success", r.summary.error
    assert r.result == expected
    assert r.summary.steps["work"].status == ("skipped" if code == 0 else "failed" if code == 500 else "done")


def test_call_done_next_in_a_simple_step_routes_on_its_result() -> None:
    text = legacy(
        """
        - step: start
          tool: {kind: noop, result: 5}
          case:
            - when: "{{ event.name == 'call.done' and response > 3 }}"
              then: {next: [big]}
            - when: "{{ event.name == 'call.done' }}"
              then: {next: [small]}
        - step: big
          tool: {kind: noop}
        - step: small
          tool: {kind: noop}
        """
    )
    assert step(text, "start")["next"] == yaml(
        """
        arcs:
          - step: small
            when: "{{ event.name == 'step.failed' }}"
          - step: big
            when: "{{ event.name != 'step.failed' and start > 3 }}"
          - step: small
            when: "{{ event.name != 'step.failed' and not (start > 3) }}"
        """
    )


def test_step_args_become_the_steps_input() -> None:
    text = legacy(
        """
        - step: start
          args: {user: "{{ workload.user }}"}
          tool: {kind: noop, result: "{{ args.user }}"}
        """,
        workload={"user": "ada"},
    )
    assert step(text, "start") == {
        "step": "start",
        "input": {"user": "{{ workload.user }}"},
        "tool": {"kind": "noop", "result": "{{ args.user }}"},
    }
    assert report(text) == [
        "8:5: warning: step 'start': 000 step 'args' translated to step 'input' (merged over the arcs' args)"
    ]
