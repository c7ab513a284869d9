"""End to end on a real nats-server: loop steps, run locally in one worker or fanned out as commands.

Concurrency is observed, not inferred: each iteration's python task appends ``+i`` when it starts
and ``-i`` when it ends to a journal file, holding a moment in between, so the journal shows the
order of iterations and how many really ran at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import JOURNAL_CODE, indent, journal, max_concurrency, playbook, run

from noetl_stream.api.graph import fold_graph
from noetl_stream.client.timeline import Timeline
from noetl_stream.control.replay import verify
from noetl_stream.protocol import events as E
from noetl_stream.runtime.local import Runtime

EXECS = ["local", "distributed"]


def journaled_loop(
    *,
    mode: str,
    exec_: str,
    max_in_flight: object = None,
    hold: float = 0.15,
) -> str:
    mif = f"\n      max_in_flight: {max_in_flight}" if max_in_flight is not None else ""
    return playbook(
        f"""
- step: start
  loop:
    in: "{{{{ workload['items'] }}}}"
    iterator: item
    spec:
      mode: {mode}{mif}
      policy: {{exec: {exec_}}}
  tool:
    kind: python
    args: {{path: "{{{{ workload.journal }}}}", i: "{{{{ iter.index }}}}", hold: {hold}}}
    code: |
{indent(JOURNAL_CODE, 6)}
"""
    )


def payload(tmp_path: Path, items: list[Any], **extra: Any) -> dict[str, Any]:
    return {"items": items, "journal": str(tmp_path / "journal.txt"), **extra}


# --- order and concurrency -------------------------------------------------------------------------


@pytest.mark.parametrize("exec_", EXECS)
async def test_sequential_loop_runs_one_iteration_at_a_time_in_order(
    runtime: Runtime, tmp_path: Path, exec_: str
) -> None:
    text = journaled_loop(mode="sequential", exec_=exec_, hold=0.02)

    r = await run(runtime, text, payload(tmp_path, ["a", "b", "c", "d"]))

    assert r.status == "success", r.summary.error
    assert journal(tmp_path / "journal.txt") == ["+0", "-0", "+1", "-1", "+2", "-2", "+3", "-3"]
    assert r.result == [0, 10, 20, 30]
    assert [e.payload["index"] for e in r.named("loop.iteration.started")] == [0, 1, 2, 3]
    assert [e.payload["index"] for e in r.named("loop.iteration.done")] == [0, 1, 2, 3]
    for e in r.named("loop.iteration.started", "loop.iteration.done"):  # stable iteration ids
        assert e.entity_id == f"{e.step_run_id}.{e.payload['index']}"
    (done,) = r.named("loop.done")
    assert (done.payload["total"], done.payload["done"], done.payload["failed"]) == (4, 4, 0)


@pytest.mark.parametrize("exec_", EXECS)
@pytest.mark.parametrize("max_in_flight", [2, 3])
async def test_parallel_loop_honours_max_in_flight(
    runtime: Runtime, tmp_path: Path, exec_: str, max_in_flight: int
) -> None:
    text = journaled_loop(mode="parallel", exec_=exec_, max_in_flight=max_in_flight, hold=0.25)

    r = await run(runtime, text, payload(tmp_path, list(range(6))))

    assert r.status == "success", r.summary.error
    entries = journal(tmp_path / "journal.txt")
    assert sorted(entries) == sorted([f"+{i}" for i in range(6)] + [f"-{i}" for i in range(6)])
    assert max_concurrency(entries) == max_in_flight, entries
    assert r.result == [0, 10, 20, 30, 40, 50]  # in index order, whatever the completion order


@pytest.mark.parametrize("exec_", EXECS)
async def test_parallel_max_in_flight_may_be_a_template(runtime: Runtime, tmp_path: Path, exec_: str) -> None:
    text = journaled_loop(mode="parallel", exec_=exec_, max_in_flight='"{{ workload.mif }}"')

    r = await run(runtime, text, payload(tmp_path, list(range(4)), mif=2))

    assert r.status == "success", r.summary.error
    assert max_concurrency(journal(tmp_path / "journal.txt")) == 2


@pytest.mark.parametrize("exec_", EXECS)
async def test_parallel_loop_without_max_in_flight_runs_all_iterations_at_once(
    runtime: Runtime, tmp_path: Path, exec_: str
) -> None:
    text = journaled_loop(mode="parallel", exec_=exec_, hold=0.3)

    r = await run(runtime, text, payload(tmp_path, list(range(4))))

    assert r.status == "success", r.summary.error
    assert max_concurrency(journal(tmp_path / "journal.txt")) == 4


@pytest.mark.parametrize("mode", ["sequential", "parallel"])
@pytest.mark.parametrize("exec_", EXECS)
async def test_every_loop_writes_loop_started_once_before_its_iterations(
    runtime: Runtime, tmp_path: Path, exec_: str, mode: str
) -> None:
    # 003 §8: loop.started is a loop event whoever runs the loop (the worker for a local one).
    text = journaled_loop(mode=mode, exec_=exec_, max_in_flight=2, hold=0.01)

    r = await run(runtime, text, payload(tmp_path, list(range(3))))

    assert r.status == "success", r.summary.error
    (started,) = r.named(E.LOOP_STARTED)
    assert started.source == ("worker" if exec_ == "local" else "server")
    assert started.entity_type == "loop" and started.entity_id == started.step_run_id
    assert started.status == "in_progress" and started.step == "start"
    assert (started.payload["exec"], started.payload["total"]) == (exec_, 3)
    assert started.payload["max_in_flight"] == (2 if mode == "parallel" else 1)
    assert started.payload["pool"] == "default" and started.payload["mode"] == mode
    names = r.names()
    assert names.index(E.LOOP_STARTED) < names.index(E.LOOP_ITERATION_STARTED)
    # 001 §15.2's minimum set, whoever runs the loop: the controller records a distributed loop's start.
    assert names.index(E.STEP_SCHEDULED) < names.index(E.STEP_STARTED) < names.index(E.LOOP_STARTED)
    (step_started,) = r.named(E.STEP_STARTED)
    assert step_started.source == started.source and step_started.step_run_id == started.step_run_id
    # The viewer and `noetl-stream events` know the loop's size while it runs.
    before = r.events[: r.events.index(started) + 1]
    (node,) = [s for s in fold_graph(r.summary.execution_id, enumerate(before)).steps if s.name == "start"]
    assert node.status == "running" and node.loop is not None and node.loop.total == 3
    assert "3 items" in Timeline().line(started)
    # Nothing the controller folds changed: the replay equals the live projection.
    diffs, _ = await verify(runtime.nc.jetstream(), runtime.topology, r.summary.execution_id)
    assert diffs == []


async def test_distributed_loop_fans_iterations_out_as_commands(runtime: Runtime, tmp_path: Path) -> None:
    text = journaled_loop(mode="parallel", exec_="distributed", max_in_flight=2, hold=0.01)

    r = await run(runtime, text, payload(tmp_path, list(range(3))))

    assert r.status == "success", r.summary.error
    (started,) = r.named("loop.started")
    assert started.source == "server"
    assert started.payload["exec"] == "distributed"
    assert started.payload["total"] == 3
    assert started.payload["max_in_flight"] == 2
    (step_started,) = r.named("step.started")  # no single worker owns the step: the controller's
    assert step_started.source == "server" and step_started.payload == {
        "pool": "default",
        "exec": "distributed",
    }
    iterations = r.named("loop.iteration.done")
    assert sorted(e.payload["index"] for e in iterations) == [0, 1, 2]
    assert all(e.source == "worker" and e.worker for e in iterations)
    (done,) = r.named("loop.done")
    assert done.source == "server"


# --- iteration scope and results -------------------------------------------------------------------


@pytest.mark.parametrize("exec_", EXECS)
async def test_each_iteration_has_its_own_iter(runtime: Runtime, exec_: str) -> None:
    text = playbook(
        f"""
        - step: start
          loop:
            in: "{{{{ workload.cities }}}}"
            iterator: city
            spec: {{mode: parallel, max_in_flight: 3, policy: {{exec: {exec_}}}}}
          tool:
            - name: tag
              kind: noop
              spec:
                policy:
                  rules:
                    - else:
                        then: {{do: continue, set_iter: {{label: "{{{{ iter.city.name }}}}-{{{{ iter.index }}}}"}}}}
            - name: slow
              kind: python
              args: {{n: "{{{{ iter.city.n }}}}"}}
              code: |
                import time
                time.sleep(0.05)
                result = n * n
            - name: out
              kind: noop
              result: {{label: "{{{{ iter.label }}}}", sq: "{{{{ slow }}}}", prev: "{{{{ _prev }}}}"}}
          next:
            arcs:
              - step: total
        - step: total
          tool:
            kind: python
            args: {{rows: "{{{{ start }}}}"}}
            code: |
              result = {{"labels": [r["label"] for r in rows], "sum": sum(r["sq"] for r in rows)}}
        """,
        workload={"cities": [{"name": "oslo", "n": 1}, {"name": "rome", "n": 2}, {"name": "lima", "n": 3}]},
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.step_result("start") == [
        {"label": "oslo-0", "sq": 1, "prev": 1},
        {"label": "rome-1", "sq": 4, "prev": 4},
        {"label": "lima-2", "sq": 9, "prev": 9},
    ]
    assert r.result == {"labels": ["oslo-0", "rome-1", "lima-2"], "sum": 14}


@pytest.mark.parametrize("exec_", EXECS)
async def test_empty_list_finishes_the_loop_at_once(runtime: Runtime, exec_: str) -> None:
    text = playbook(
        f"""
        - step: start
          loop:
            in: "{{{{ workload['items'] }}}}"
            iterator: x
            spec: {{mode: parallel, policy: {{exec: {exec_}}}}}
          tool: {{kind: noop, result: "{{{{ iter.x }}}}"}}
          next:
            arcs:
              - step: after
                when: "{{{{ event.name == 'loop.done' }}}}"
        - step: after
          tool: {{kind: noop, result: {{n: "{{{{ start | length }}}}", total: "{{{{ start }}}}"}}}}
        """,
        workload={"items": []},
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    (done,) = r.named("loop.done")
    assert (done.payload["total"], done.payload["done"], done.payload["failed"]) == (0, 0, 0)
    assert not r.named("loop.iteration.started")
    assert r.result == {"n": 0, "total": []}


@pytest.mark.parametrize("exec_", EXECS)
@pytest.mark.parametrize(("value", "type_name"), [("abc", "str"), ({"a": 1}, "dict"), (5, "int")])
async def test_in_that_is_not_a_list_fails_the_step_clearly(
    runtime: Runtime, exec_: str, value: object, type_name: str
) -> None:
    text = playbook(
        f"""
        - step: start
          loop:
            in: "{{{{ workload['items'] }}}}"
            iterator: x
            spec: {{policy: {{exec: {exec_}}}}}
          tool: {{kind: noop}}
        """
    )

    r = await run(runtime, text, {"items": value})

    assert r.status == "failed"
    error = r.step_error("start")
    assert error["kind"] == "loop_error"
    assert "'in' must render to a list" in error["message"]
    assert type_name in error["message"]
    assert "step 'start'" in error["message"]
    assert not r.named("loop.iteration.started")


@pytest.mark.parametrize("exec_", EXECS)
async def test_in_with_an_undefined_name_fails_the_step_clearly(runtime: Runtime, exec_: str) -> None:
    text = playbook(
        f"""
        - step: start
          loop:
            in: "{{{{ workload.not_there }}}}"
            iterator: x
            spec: {{policy: {{exec: {exec_}}}}}
          tool: {{kind: noop}}
        """
    )

    r = await run(runtime, text)

    assert r.status == "failed"
    error = r.step_error("start")
    assert error["kind"] == "template_error"
    assert "not_there" in error["message"]


WHOLE = "must be a whole number >= 1"


@pytest.mark.parametrize("exec_", EXECS)
@pytest.mark.parametrize(
    ("mode", "value", "problem"),
    [
        ("parallel", "abc", WHOLE),
        ("parallel", 2.5, WHOLE),
        ("parallel", "2.0", WHOLE),
        ("parallel", True, WHOLE),
        ("parallel", None, WHOLE),
        ("parallel", [2], WHOLE),
        ("parallel", 0, "must be >= 1"),
        ("parallel", "-1", "must be >= 1"),
        ("sequential", "abc", WHOLE),
    ],
)
async def test_a_templated_max_in_flight_that_is_not_a_whole_number_fails_the_step_clearly(
    runtime: Runtime, tmp_path: Path, exec_: str, mode: str, value: object, problem: str
) -> None:
    # Before: "abc" failed a local loop with only "invalid literal for int() with base 10: 'abc'" (no
    # step, no field) and a distributed one with another message; 2.5 ran 2 at a time, true 1, null all;
    # a sequential distributed loop ignored the value. Both sides now read it with one function.
    text = journaled_loop(mode=mode, exec_=exec_, max_in_flight='"{{ workload.mif }}"')

    r = await run(runtime, text, payload(tmp_path, list(range(3)), mif=value))

    assert r.status == "failed"
    error = r.step_error("start")
    assert error["kind"] == "loop_error"
    assert error["message"] == f"step 'start' loop.spec.max_in_flight: max_in_flight {problem}, got {value!r}"
    assert not r.named(E.LOOP_STARTED, E.LOOP_ITERATION_STARTED)


@pytest.mark.parametrize("exec_", EXECS)
@pytest.mark.parametrize("value", ["2", 2.0])
async def test_a_templated_max_in_flight_may_be_a_whole_number_as_text_or_float(
    runtime: Runtime, tmp_path: Path, exec_: str, value: object
) -> None:
    text = journaled_loop(mode="parallel", exec_=exec_, max_in_flight='"{{ workload.mif }}"', hold=0.25)

    r = await run(runtime, text, payload(tmp_path, list(range(4)), mif=value))

    assert r.status == "success", r.summary.error
    (started,) = r.named(E.LOOP_STARTED)
    assert started.payload["max_in_flight"] == 2
    assert max_concurrency(journal(tmp_path / "journal.txt")) == 2


# --- failure modes ---------------------------------------------------------------------------------


def _dividing_loop(exec_: str, failure: str, mode: str = "sequential", mif: int = 1) -> str:
    return playbook(
        f"""
        - step: start
          spec: {{policy: {{failure: {{mode: {failure}}}}}}}
          loop:
            in: "{{{{ workload['items'] }}}}"
            iterator: x
            spec: {{mode: {mode}, max_in_flight: {mif}, policy: {{exec: {exec_}}}}}
          tool:
            kind: python
            args: {{x: "{{{{ iter.x }}}}"}}
            code: |
              import time
              time.sleep(0.5 if x == 5 else 0)
              result = 10 // x
          next:
            arcs:
              - step: partial
                when: "{{{{ event.name == 'loop.done' and event.failed > 0 }}}}"
                args: {{total: "{{{{ event.total }}}}", done: "{{{{ event.done }}}}", failed: "{{{{ event.failed }}}}"}}
              - step: complete
                when: "{{{{ event.name == 'loop.done' }}}}"
        - step: partial
          tool: {{kind: noop, result: {{args: "{{{{ args }}}}", results: "{{{{ start }}}}"}}}}
        - step: complete
          tool: {{kind: noop, result: complete}}
        """
    )


@pytest.mark.parametrize("exec_", EXECS)
async def test_fail_fast_stops_at_the_first_failed_iteration(runtime: Runtime, exec_: str) -> None:
    r = await run(runtime, _dividing_loop(exec_, "fail_fast"), {"items": [1, 0, 2, 5]})

    assert r.status == "failed"
    assert [e.payload["index"] for e in r.named("loop.iteration.started")] == [0, 1]
    assert [e.payload["index"] for e in r.named("loop.iteration.failed")] == [1]
    error = r.step_error("start")
    assert error["kind"] == "python_error"
    assert not r.named("loop.done")
    assert r.summary.error is not None and r.summary.error["step"] == "start"
    assert "partial" not in r.summary.steps and "complete" not in r.summary.steps


@pytest.mark.parametrize("exec_", EXECS)
async def test_fail_fast_parallel_starts_no_new_iteration_after_a_failure(
    runtime: Runtime, exec_: str
) -> None:
    # iteration 0 fails at once while iteration 1 (x == 5) is still running: 2 and 3 never start
    r = await run(runtime, _dividing_loop(exec_, "fail_fast", "parallel", 2), {"items": [0, 5, 1, 2]})

    assert r.status == "failed"
    assert sorted(e.payload["index"] for e in r.named("loop.iteration.started")) == [0, 1]
    assert [e.payload["index"] for e in r.named("loop.iteration.done")] == [1]  # in-flight work finishes
    assert r.step_error("start")["kind"] == "python_error"


@pytest.mark.parametrize("exec_", EXECS)
@pytest.mark.parametrize(("mode", "mif"), [("sequential", 1), ("parallel", 2)])
async def test_best_effort_runs_every_iteration_and_reports_counts(
    runtime: Runtime, exec_: str, mode: str, mif: int
) -> None:
    r = await run(runtime, _dividing_loop(exec_, "best_effort", mode, mif), {"items": [1, 0, 2, 0, 10]})

    assert r.status == "success", r.summary.error
    assert sorted(e.payload["index"] for e in r.named("loop.iteration.started")) == [0, 1, 2, 3, 4]
    assert sorted(e.payload["index"] for e in r.named("loop.iteration.failed")) == [1, 3]
    (done,) = r.named("loop.done")
    assert (done.payload["total"], done.payload["done"], done.payload["failed"]) == (5, 3, 2)
    assert r.ran() == ["start", "partial"]
    assert r.result == {"args": {"total": 5, "done": 3, "failed": 2}, "results": [10, None, 5, None, 1]}


@pytest.mark.parametrize("exec_", EXECS)
async def test_best_effort_without_failures_takes_the_plain_arc(runtime: Runtime, exec_: str) -> None:
    r = await run(runtime, _dividing_loop(exec_, "best_effort"), {"items": [1, 2]})

    assert r.status == "success"
    assert r.ran() == ["start", "complete"]


# --- set_ctx inside loops --------------------------------------------------------------------------


def _ctx_loop(exec_: str, mode: str) -> str:
    return playbook(
        f"""
        - step: start
          loop:
            in: "{{{{ [1, 2, 3, 4] }}}}"
            iterator: x
            spec: {{mode: {mode}, max_in_flight: 2, policy: {{exec: {exec_}}}}}
          tool:
            kind: noop
            result: "{{{{ (ctx.total | default(0)) + iter.x }}}}"
            spec:
              policy:
                rules:
                  - else:
                      then: {{do: continue, set_ctx: {{total: "{{{{ outcome.result }}}}"}}}}
          next:
            arcs:
              - step: after
                when: "{{{{ event.name == 'loop.done' }}}}"
        - step: after
          tool: {{kind: noop, result: "{{{{ ctx.total }}}}"}}
        """
    )


@pytest.mark.parametrize("exec_", EXECS)
async def test_set_ctx_in_sequential_iterations_is_seen_by_the_next_iteration(
    runtime: Runtime, exec_: str
) -> None:
    r = await run(runtime, _ctx_loop(exec_, "sequential"))

    assert r.status == "success", r.summary.error
    assert r.step_result("start") == [1, 3, 6, 10]
    assert r.result == 10
    assert r.summary.ctx == {"total": 10}
    patches = [p for e in r.named("ctx.patched") for p in e.payload["patches"]]
    assert patches == [{"total": 1}, {"total": 3}, {"total": 6}, {"total": 10}]


@pytest.mark.parametrize("exec_", EXECS)
async def test_set_ctx_in_parallel_iterations_is_applied_the_last_iteration_to_end_winning(
    runtime: Runtime, exec_: str
) -> None:
    """As in NoETL's engines: every write is applied, in the order the iterations ended, so the last one
    wins. An iteration reads the ctx its command carried and its own writes, not those of iterations
    running beside it."""
    r = await run(runtime, _ctx_loop(exec_, "parallel"))

    assert r.status == "success", r.summary.error
    results = r.step_result("start")
    patches = [p for e in r.named("ctx.patched") for p in e.payload["patches"]]
    assert sorted(p["total"] for p in patches) == sorted(results)
    assert results[:2] == [1, 2]  # the first two ran side by side: neither saw the other's write
    assert r.summary.ctx == patches[-1]
    assert r.result == patches[-1]["total"]


async def test_set_iter_in_parallel_iterations_is_allowed(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          loop:
            in: "{{ [1, 2, 3] }}"
            iterator: x
            spec: {mode: parallel, max_in_flight: 3}
          tool:
            - name: a
              kind: noop
              spec: {policy: {rules: [{else: {then: {do: continue, set_iter: {double: "{{ iter.x * 2 }}"}}}}]}}
            - name: b
              kind: noop
              result: "{{ iter.double }}"
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == [2, 4, 6]


async def test_jump_and_break_paginate_inside_each_iteration(runtime: Runtime) -> None:
    """Streaming pagination (003 §12): per item, fetch pages until there are no more, then break."""
    text = playbook(
        """
        - step: start
          loop:
            in: "{{ workload.endpoints }}"
            iterator: endpoint
            spec: {mode: parallel, max_in_flight: 2, policy: {exec: distributed}}
          tool:
            - name: init
              kind: noop
              spec: {policy: {rules: [{else: {then: {do: continue, set_iter: {page: 1, got: []}}}}]}}
            - name: fetch_page
              kind: python
              args: {page: "{{ iter.page }}", pages: "{{ iter.endpoint.pages }}", name: "{{ iter.endpoint.name }}"}
              code: |
                result = {"item": f"{name}:{page}", "has_more": page < pages}
              spec:
                policy:
                  rules:
                    - else:
                        then:
                          do: continue
                          set_iter: {got: "{{ iter.got + [outcome.result.item] }}", has_more: "{{ outcome.result.has_more }}"}
            - name: paginate
              kind: noop
              result: "{{ iter.got }}"
              spec:
                policy:
                  rules:
                    - when: "{{ iter.has_more }}"
                      then: {do: jump, to: fetch_page, set_iter: {page: "{{ iter.page + 1 }}"}}
                    - else:
                        then: {do: break}
        """,
        workload={
            "endpoints": [{"name": "a", "pages": 3}, {"name": "b", "pages": 1}, {"name": "c", "pages": 2}]
        },
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == [["a:1", "a:2", "a:3"], ["b:1"], ["c:1", "c:2"]]


@pytest.mark.parametrize("exec_", EXECS)
async def test_loop_over_an_earlier_steps_result(runtime: Runtime, exec_: str) -> None:
    text = playbook(
        f"""
        - step: start
          tool:
            kind: python
            code: |
              result = {{"rows": [{{"id": 1}}, {{"id": 2}}, {{"id": 3}}]}}
          next: {{arcs: [{{step: each}}]}}
        - step: each
          loop:
            in: "{{{{ start.rows }}}}"
            iterator: row
            spec: {{mode: parallel, max_in_flight: 2, policy: {{exec: {exec_}}}}}
          tool: {{kind: noop, result: "{{{{ iter.row.id * 100 + iter.index }}}}"}}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == [100, 201, 302]


@pytest.mark.parametrize("exec_", EXECS)
async def test_task_retry_inside_iterations(runtime: Runtime, exec_: str) -> None:
    text = playbook(
        f"""
        - step: start
          loop:
            in: "{{{{ [1, 2, 3] }}}}"
            iterator: x
            spec: {{mode: parallel, max_in_flight: 3, policy: {{exec: {exec_}}}}}
          tool:
            kind: python
            args: {{x: "{{{{ iter.x }}}}", attempt: "{{{{ _attempt }}}}"}}
            code: |
              if attempt < x:
                  raise ConnectionError("again")
              result = [x, attempt]
            spec:
              policy:
                rules:
                  - when: "{{{{ outcome.status == 'error' }}}}"
                    then: {{do: retry, attempts: 3, delay: 0}}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == [[1, 1], [2, 2], [3, 3]]


# --- what the controller folds -----------------------------------------------------------------------


@pytest.mark.parametrize("exec_", EXECS)
async def test_the_controller_folds_a_distributed_loops_iterations_and_only_acks_a_local_ones(
    runtime: Runtime, exec_: str
) -> None:
    """A local loop's worker reports each iteration (so a redelivered command skips the finished ones);
    the controller receives them and acks them without a fold; replay skips them the same way."""
    folded: list[str] = []
    runtime.controller.observer = lambda event, _effects, _state: folded.append(event.name)
    text = playbook(
        f"""
        - step: start
          loop:
            in: "{{{{ range(40) | list }}}}"
            iterator: n
            spec: {{mode: parallel, max_in_flight: 8, policy: {{exec: {exec_}}}}}
          tool: {{kind: noop, result: "{{{{ iter.n * 2 }}}}"}}
          next:
            arcs: [{{step: after}}]
        - step: after
          tool: {{kind: noop, result: "{{{{ start | sum }}}}"}}
        """
    )

    r = await run(runtime, text)

    assert r.status == "success", r.summary.error
    assert r.result == sum(n * 2 for n in range(40))
    assert [e.name for e in r.events].count(E.LOOP_ITERATION_DONE) == 40  # reported either way
    assert folded.count(E.LOOP_ITERATION_DONE) == (40 if exec_ == "distributed" else 0)
    diffs, _ = await verify(runtime.nc.jetstream(), runtime.topology, r.summary.execution_id)
    assert diffs == []
