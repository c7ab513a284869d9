"""``kind: playbook`` as NoETL playbooks use it, end to end: without ``return_step`` it starts the child
and returns at once (fire-and-forget); with it, it waits and returns that step's result with the child's
``status`` and ``execution_id``. The child's workload is ``input`` (when not empty) or ``payload``;
``timeout`` bounds the wait; ``version`` picks a catalog version."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import playbook, run

from noetl_stream.client.tracking import follow
from noetl_stream.dataplane.tools.playbook import DEFAULT_TIMEOUT_S, _wait_limit
from noetl_stream.kv.catalog import Catalog
from noetl_stream.protocol import events as E
from noetl_stream.runtime.local import Runtime

GATED = playbook(
    """
    - step: start
      tool:
        kind: python
        args: {gate: "{{ workload.gate }}"}
        code: |
          import time
          open(gate + ".started", "w").close()
          for _ in range(600):  # until the test opens the gate (30 s at most)
              if os.path.exists(gate):
                  break
              time.sleep(0.05)
          result = {"opened": os.path.exists(gate)}
    """,
    workload={"gate": ""},
    name="gated",
)
"""A child that runs until the test creates the file `gate`."""

SCORES = playbook(
    """
    - step: start
      tool: {kind: python, args: {n: "{{ workload.n }}"}, code: "result = {'profile_score': n * 10}"}
      next: {arcs: [{step: plain}]}
    - step: plain
      tool: {kind: noop, result: "{{ workload.n }}"}
      next: {arcs: [{step: never, when: "{{ workload.n < 0 }}"}]}
    - step: never
      tool: {kind: noop, result: unreachable}
    """,
    workload={"n": 0},
    name="scores",
)


def _files(tmp_path: Path, parent: str) -> Path:
    (tmp_path / "gated.yaml").write_text(GATED)
    (tmp_path / "scores.yaml").write_text(SCORES)
    path = tmp_path / "parent.yaml"
    path.write_text(parent)
    return path


async def test_without_return_step_the_child_is_started_and_runs_on_after_its_parent_succeeded(
    runtime: Runtime, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    parent = _files(
        tmp_path,
        playbook(
            f"""
            - step: start
              tool: {{name: kid, kind: playbook, path: gated.yaml, input: {{gate: "{gate}"}}}}
            """,
            name="parent",
        ),
    )
    r = await run(runtime, parent.read_text(), file=str(parent))
    # The parent ended (at once: the task was its last) while its child waits for the gate.
    assert r.status == "success", r.summary.error
    child_id = r.result["execution_id"]
    assert r.result == {"status": "started", "execution_id": child_id, "path": "gated.yaml", "async": True}
    gate.touch()
    child = await follow(runtime.nc, runtime.topology, child_id, timeout=30)
    assert child.status == "success", child.error  # the parent's success cancelled nothing
    assert child.result == {"opened": True}


async def test_a_fire_and_forget_child_is_cancelled_when_its_parent_fails(
    runtime: Runtime, tmp_path: Path
) -> None:
    # Today's design (control/children.py): a parent that ends with any status but success cancels the
    # children still running, whether or not a task waits for them.
    gate = tmp_path / "gate"
    parent = _files(
        tmp_path,
        playbook(
            f"""
            - step: start
              tool:
                - {{name: kid, kind: playbook, path: gated.yaml, input: {{gate: "{gate}"}}}}
                - name: boom
                  kind: python
                  code: |
                    import time
                    while not os.path.exists("{gate}.started"):  # the child runs
                        time.sleep(0.05)
                    raise ValueError("parent fails")
                  spec: {{timeout: 30}}
            """,
            name="parent",
        ),
    )
    r = await run(runtime, parent.read_text(), file=str(parent))
    assert r.status == "failed"
    [kid] = r.tasks("start", "kid")
    child = await follow(runtime.nc, runtime.topology, kid.payload["result"]["execution_id"], timeout=30)
    assert child.status == "cancelled", child


async def test_return_step_waits_and_returns_that_steps_result_with_status_and_execution_id(
    runtime: Runtime, tmp_path: Path
) -> None:
    parent = _files(
        tmp_path,
        playbook(
            """
            - step: start
              tool:
                - {name: mapping, kind: playbook, path: scores.yaml, return_step: start, input: {n: 4}}
                - {name: scalar, kind: playbook, path: scores.yaml, return_step: plain, input: {n: 5}}
                - name: both
                  kind: noop
                  result:
                    mapping: "{{ mapping }}"
                    scalar: "{{ scalar }}"
                    score: "{{ mapping.profile_score | default(0) }}"
            """,
            name="parent",
        ),
    )
    r = await run(runtime, parent.read_text(), file=str(parent))
    assert r.status == "success", r.summary.error
    mapping, scalar = r.result["mapping"], r.result["scalar"]
    assert mapping == {"status": "success", "execution_id": mapping["execution_id"], "profile_score": 40}
    assert scalar == {"status": "success", "execution_id": scalar["execution_id"], "data": 5}
    assert r.result["score"] == 40
    for task, child_id in (("mapping", mapping["execution_id"]), ("scalar", scalar["execution_id"])):
        [started] = [e for e in r.tasks("start", task)]
        assert started.payload["result"]["execution_id"] == child_id
        child = await follow(runtime.nc, runtime.topology, child_id, timeout=10)
        assert child.status == "success"  # it had ended before the task returned


@pytest.mark.parametrize(
    ("return_step", "message"),
    [
        pytest.param("nowhere", "'return_step' 'nowhere' is not a step of the playbook", id="no-such-step"),
        pytest.param("never", "ended success but never ran its return_step 'never'", id="never-reached"),
    ],
)
async def test_a_return_step_the_child_does_not_reach_is_a_clear_error(
    runtime: Runtime, tmp_path: Path, return_step: str, message: str
) -> None:
    parent = _files(
        tmp_path,
        playbook(
            f"""
            - step: start
              tool: {{name: kid, kind: playbook, path: scores.yaml, return_step: {return_step}, input: {{n: 1}}}}
            """,
            name="parent",
        ),
    )
    r = await run(runtime, parent.read_text(), file=str(parent))
    assert r.status == "failed"
    error = r.step_error("start")
    assert error["kind"] == "child_failed" and "scores.yaml" in error["message"], error
    assert message in error["message"], error


async def test_a_non_empty_input_wins_over_payload(runtime: Runtime, tmp_path: Path) -> None:
    parent = _files(
        tmp_path,
        playbook(
            """
            - step: start
              tool:
                - name: by_input
                  kind: playbook
                  path: scores.yaml
                  return_step: plain
                  input: {n: "{{ workload.a }}"}
                  payload: {n: 1}
                - name: by_payload
                  kind: playbook
                  path: scores.yaml
                  return_step: plain
                  input: {}
                  payload: {n: "{{ workload.b }}"}
                - {name: both, kind: noop, result: ["{{ by_input.data }}", "{{ by_payload.data }}"]}
            """,
            workload={"a": 2, "b": 3},
            name="parent",
        ),
    )
    r = await run(runtime, parent.read_text(), file=str(parent))
    assert r.status == "success", r.summary.error
    assert r.result == [2, 3]


async def test_timeout_bounds_the_wait_and_cancels_the_child(runtime: Runtime, tmp_path: Path) -> None:
    gate = tmp_path / "gate"  # never opened: only the timeout ends the wait
    parent = _files(
        tmp_path,
        playbook(
            f"""
            - step: start
              tool:
                name: kid
                kind: playbook
                path: gated.yaml
                return_step: start
                timeout: 0.5
                input: {{gate: "{gate}"}}
            """,
            name="parent",
        ),
    )
    r = await run(runtime, parent.read_text(), file=str(parent))
    assert r.status == "failed"
    error = r.step_error("start")
    assert error["kind"] == "timeout" and error["retryable"] is True, error
    assert "within 0.5 s (cancelled)" in error["message"]
    [requested] = r.named(E.TASK_DONE, step="start")
    child_id = error["message"].split("(")[1].split(")")[0]
    child = await follow(runtime.nc, runtime.topology, child_id, timeout=30)
    assert child.status == "cancelled", (child, requested.payload)


def test_the_wait_limit_is_timeout_else_spec_child_timeout_s_else_300_s() -> None:
    assert _wait_limit({}, {}) == DEFAULT_TIMEOUT_S == 300
    assert _wait_limit({}, {"child_timeout_s": 7}) == 7
    assert _wait_limit({"timeout": "2.5"}, {"child_timeout_s": 7}) == 2.5
    assert _wait_limit({"timeout": 0}, {}) is None  # 0: no limit
    with pytest.raises(ValueError, match="playbook task 'timeout'"):
        _wait_limit({"timeout": "soon"}, {})


async def test_version_picks_a_catalog_version(runtime: Runtime) -> None:
    catalog = Catalog(runtime.nc.jetstream(), runtime.topology)
    for answer in ("one", "two"):  # versions 1 and 2 of lib/answer
        text = playbook(f"- step: start\n  tool: {{kind: noop, result: {answer}}}", name="answer")
        await catalog.register(text.replace("path: tests/answer", "path: lib/answer"), "answer.yaml")
    parent = playbook(
        """
        - step: start
          tool:
            - {name: pinned, kind: playbook, path: lib/answer, version: 1, return_step: start}
            - {name: latest, kind: playbook, path: lib/answer, return_step: start}
            - {name: both, kind: noop, result: ["{{ pinned.data }}", "{{ latest.data }}"]}
        """,
        name="parent",
    )
    r = await run(runtime, parent)
    assert r.status == "success", r.summary.error
    assert r.result == ["one", "two"]


async def test_a_fire_and_forget_child_that_is_rejected_fails_the_task(runtime: Runtime) -> None:
    parent = playbook("- step: start\n  tool: {kind: playbook, path: lib/nope}", name="parent")
    r = await run(runtime, parent)
    assert r.status == "failed"
    error = r.step_error("start")
    assert error["kind"] == "child_failed" and "'lib/nope'" in error["message"], error
    assert "was not started" in error["message"], error
