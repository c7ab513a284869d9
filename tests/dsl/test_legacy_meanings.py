"""Legacy translation faults found by probe C (findings 4-11): each legacy form means what its draft
says, or is refused with a reason; never a silent change of meaning."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from helpers import run
from httpserver import HttpServer
from legacy_support import canonical, legacy, report, step
from ruamel.yaml import YAML

from noetl_stream.dsl import compile_playbook
from noetl_stream.runtime.local import Runtime

DONE = "{{ event.name != 'step.failed' }}"

# A 000 playbook: root name/path, a single tool per step (000 §2.1).
HEADER_000 = """\
apiVersion: noetl.io/v2
kind: Playbook
name: t
path: tests/t
executor: {spec: {extensions: [legacy]}}
workflow:
"""


def legacy_000(steps: str) -> str:
    return HEADER_000 + textwrap.indent(textwrap.dedent(steps).strip("\n"), "  ") + "\n"


def errors(text: str) -> list[str]:
    return [line for line in report(text) if ": warning: " not in line]


@pytest.fixture
async def http() -> AsyncIterator[HttpServer]:
    server = await HttpServer().start()
    server.pages.update({"a": [1, 2, 3, 4, 5], "b": ["x", "y", "z"]})
    yield server
    await server.stop()


# -- 4. 004 `result: {from: pages}` in a looped step ----------------------------------------------------

LOOPED_CASE = """
- step: start
  loop: {in: "{{ workload.names }}", iterator: name}
  tool:
    kind: http
    url: "{{ workload.url }}/pages/{{ name }}"
    params: {page: 1, pageSize: 2}
  case:
    - when: "{{ event.name == 'step.enter' }}"
      then: {set: {ctx: {pages: []}}}
    - when: "{{ event.name == 'call.done' and response.data.paging.hasMore }}"
      then:
        collect: {from: response.data.data, into: pages, mode: extend}
        call:
          params: {page: "{{ (response.data.paging.page | int) + 1 }}"}
    - when: "{{ event.name == 'call.done' and not response.data.paging.hasMore }}"
      then:
        collect: {from: response.data.data, into: pages, mode: extend}
        RESULT
    - when: "{{ event.name == 'step.exit' }}"
      then:
        next: [{step: validate, args: {pages: "{{ pages }}"}}]
- step: validate
  tool: {kind: noop, result: "{{ args.pages }}"}
"""


def looped_case(with_result: bool, url: str = "u") -> str:
    body = LOOPED_CASE.replace("RESULT", "result: {from: pages}" if with_result else "")
    return legacy(body, workload={"url": url, "names": ["a", "b"]})


def test_result_from_a_collected_name_reads_it_as_collected_in_a_loop() -> None:
    arcs = [step(looped_case(w), "start")["next"]["arcs"] for w in (False, True)]
    assert arcs[0] == arcs[1]
    assert arcs[1][0]["args"] == {"pages": "{{ (start | reject('none') | sum(start=[])) }}"}


async def test_result_from_pages_does_not_change_what_pages_hands_on(
    runtime: Runtime, http: HttpServer
) -> None:
    for with_result in (False, True):
        r = await run(runtime, looped_case(with_result, http.url))
        assert r.status == "success", r.summary.error
        assert r.step_result("validate") == [1, 2, 3, 4, 5, "x", "y", "z"], with_result


# -- 5. 002 set_vars read after the step ---------------------------------------------------------------

VARS_IN_NEXT = """
- step: start
  tool:
    - work:
        kind: python
        code: "result = 7"
        eval:
          - else:
              do: continue
              set_vars: {n: "{{ outcome.result }}"}
  next:
    - step: big
      when: "{{ vars.n > 5 }}"
      args: {n: "{{ vars.n }}"}
    - step: small
- step: big
  tool: {kind: noop}
- step: small
  tool: {kind: noop}
"""


def test_set_vars_read_in_next_is_rejected_with_a_reason() -> None:
    text = legacy(VARS_IN_NEXT)
    assert compile_playbook(text, "t.yaml").playbook is None
    found = errors(text)
    assert len(found) == 2, found
    assert found[0].startswith("17:15: step 'start': 'vars.n' (002 set_vars, step scope) is read in 'next'")
    assert "after the step ended" in found[0]
    assert found[1].startswith("18:19: step 'start': 'vars.n'")


def test_set_vars_read_in_the_same_step_still_translates() -> None:
    text = legacy(VARS_IN_NEXT.replace("{{ vars.n > 5 }}", "{{ event.result > 5 }}").replace("vars.n", "_n"))
    assert errors(text) == []


# -- 6. 002 set_vars in a sequential loop ----------------------------------------------------------------

SETVARS_LOOP = """
- step: start
  loop:
    spec: {mode: MODE}
    in: "{{ workload.items }}"
    iterator: x
  tool:
    - add:
        kind: noop
        eval:
          - else:
              do: continue
              set_vars: {total: "{{ (vars.total | default(0)) + iter.x }}"}
    - show:
        kind: python
        args: {t: "{{ vars.total }}"}
        code: "result = t"
"""


def test_set_vars_in_a_sequential_loop_is_rejected_not_narrowed_to_one_iteration() -> None:
    text = legacy(SETVARS_LOOP.replace("MODE", "sequential"), workload={"items": [1, 2, 3]})
    assert compile_playbook(text, "t.yaml").playbook is None
    found = errors(text)
    assert len(found) == 1, found
    assert found[0].startswith("18:17: step 'start' task 'add': 002 'set_vars' in a sequential loop")
    assert "every iteration" in found[0]


def test_set_vars_in_a_loop_without_a_mode_is_sequential_and_rejected() -> None:
    text = legacy(SETVARS_LOOP.replace("    spec: {mode: MODE}\n", ""), workload={"items": [1, 2, 3]})
    assert any("002 'set_vars' in a sequential loop" in e for e in errors(text))


def test_set_vars_in_a_parallel_loop_maps_to_iteration_scope() -> None:
    text = legacy(SETVARS_LOOP.replace("MODE", "parallel"), workload={"items": [1, 2, 3]})
    assert errors(text) == []
    add, show = step(text, "start")["tool"]
    assert add["spec"]["policy"]["rules"][0]["else"]["then"]["set_iter"] == {
        "total": "{{ (iter.total | default(0)) + iter.x }}"
    }
    assert show["args"] == {"t": "{{ iter.total }}"}


# -- 7. an unguarded arc of a 002 next list -------------------------------------------------------------

FAILING = """
- step: start
  tool:
    - work: {kind: python, code: "raise ValueError('boom')"}
  next:
    SIBLING
    - step: after
- step: never
  tool: {kind: noop}
- step: after
  tool: {kind: noop, result: after ran}
"""


def failing(sibling: bool) -> str:
    return legacy(FAILING.replace("SIBLING", '- {step: never, when: "{{ false }}"}' if sibling else ""))


def test_an_arc_without_when_routes_the_same_whatever_its_siblings() -> None:
    alone = step(failing(False), "start")["next"]
    with_sibling = step(failing(True), "start")["next"]
    assert alone == {"arcs": [{"step": "after"}]}
    assert with_sibling["arcs"][1] == {"step": "after"}
    assert "spec" not in with_sibling


async def test_an_unguarded_002_arc_is_not_taken_on_failure(runtime: Runtime) -> None:
    """An arc without ``when`` fires on success only (docs/semantics.md, Routing): the failure is
    unhandled and fails the execution, whatever the arc's siblings."""
    for sibling in (False, True):
        r = await run(runtime, failing(sibling))
        assert r.status == "failed", sibling
        assert r.summary.error is not None and r.summary.error["step"] == "start"
        assert "after" not in r.summary.steps


def test_a_002_list_without_when_is_exclusive_like_one_with_an_always_true_when() -> None:
    plain = """
    - step: start
      tool:
        - work: {kind: noop}
      next:
        - {step: a, args: {k: 1}}
        - {step: b, args: {k: 2}}
    - step: a
      tool: {kind: noop}
    - step: b
      tool: {kind: noop}
    """
    guarded = plain.replace("args: {k: 1}", 'args: {k: 1}, when: "{{ true }}"').replace(
        "args: {k: 2}", 'args: {k: 2}, when: "{{ true }}"'
    )
    nxt = step(legacy(plain), "start")["next"]
    assert nxt == {"arcs": [{"step": "a", "args": {"k": 1}}, {"step": "b", "args": {"k": 2}}]}
    assert [
        {k: v for k, v in a.items() if k != "when"} for a in step(legacy(guarded), "start")["next"]["arcs"]
    ] == nxt["arcs"]


def test_a_000_playbook_keeps_the_structural_reading() -> None:
    text = legacy_000(
        """
        - step: start
          tool: {kind: noop}
          next: [{step: a}, {step: b}]
        - step: a
          tool: {kind: noop}
        - step: b
          tool: {kind: noop}
        """
    )
    assert step(text, "start")["next"] == {
        "spec": {"mode": "inclusive"},
        "arcs": [{"step": "a", "when": DONE}, {"step": "b", "when": DONE}],
    }


# -- 8. result/response in structural next args ----------------------------------------------------------

NEXT_ARGS = """
- step: start
  tool: {kind: python, code: "result = {'v': 42}"}
  next:
    - step: b
      args: {got: "{{ result.v }}", whole: "{{ response }}"}
- step: b
  tool: {kind: noop, result: "{{ args }}"}
"""


def test_structural_next_args_read_result_as_the_steps_result() -> None:
    text = legacy_000(NEXT_ARGS)
    assert step(text, "start")["next"]["arcs"] == [
        {"step": "b", "args": {"got": "{{ start.v }}", "whole": "{{ start }}"}, "when": DONE}
    ]
    assert errors(text) == []


async def test_structural_next_args_hand_on_the_result(runtime: Runtime) -> None:
    r = await run(runtime, legacy_000(NEXT_ARGS))
    assert r.status == "success", r.summary.error
    assert r.step_result("b") == {"got": 42, "whole": {"v": 42}}


def test_structural_next_args_cannot_read_the_loop_item_after_the_loop() -> None:
    text = legacy_000(
        """
        - step: start
          loop: {in: [1, 2], iterator: item}
          tool: {kind: noop, result: "{{ item }}"}
          next: [{step: b, args: {last: "{{ item }}"}}]
        - step: b
          tool: {kind: noop}
        """
    )
    found = errors(text)
    assert len(found) == 1 and "it reads 'item' after the step ended" in found[0], found


# -- 10. outcome['status'] == 'success' ------------------------------------------------------------------

SUBSCRIPT = """
- step: start
  tool:
    - a:
        kind: noop
        eval:
          - expr: "{{ outcome['status'] == 'success' }}"
            do: continue
            set_shared: {matched: true}
          - else:
              do: fail
"""


def test_subscript_status_success_is_translated() -> None:
    text = legacy(SUBSCRIPT)
    rule = step(text, "start")["tool"][0]["spec"]["policy"]["rules"][0]
    assert rule["when"] == "{{ outcome.status == 'ok' }}"
    assert "11:21: warning: 002 outcome status 'success' translated to 'ok'" in report(text)


async def test_subscript_status_success_matches_at_run_time(runtime: Runtime) -> None:
    r = await run(runtime, legacy(SUBSCRIPT))
    assert r.status == "success", r.summary.error
    assert r.summary.ctx == {"matched": True}


# -- 11. diagnostics: where, and on which stream ----------------------------------------------------------

QUANTUM_END = """
- step: start
  tool: {kind: python, code: "result = 1"}
  case:
    - when: "{{ event.name == 'step.exit' }}"
      then:
        sink:
          tool: {kind: python, code: "result = 'ok'"}
          args: {n: "{{ result }}"}
  next: end
"""


def test_a_missing_structural_target_is_reported_at_the_next_the_author_wrote() -> None:
    found = errors(legacy_000(QUANTUM_END))
    assert len(found) == 1, found
    assert found[0].startswith("15:11: ") and "arc target 'end' is not a step" in found[0]


def test_show_canonical_keeps_warnings_off_stdout(tmp_path: Path) -> None:
    path = tmp_path / "old.yaml"
    path.write_text(legacy_000(NEXT_ARGS))
    cli = Path(sys.executable).parent / "noetl-stream"
    proc = subprocess.run(
        [str(cli), "validate", "--legacy", "--show-canonical", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "warning: root 'name', 'path' translated to metadata" in proc.stderr
    assert "warning" not in proc.stdout
    data = YAML(typ="safe", pure=True).load(proc.stdout)
    assert data["workflow"] == canonical(legacy_000(NEXT_ARGS))["workflow"]


# -- 9. validate --help says what it reports -------------------------------------------------------------


def test_validate_help_does_not_promise_every_problem_in_one_pass() -> None:
    from click.testing import CliRunner

    from noetl_stream.cli import main

    text = " ".join(CliRunner().invoke(main, ["validate", "--help"]).output.split())
    assert "every problem" not in text
    assert "once the step itself is well formed" in text
