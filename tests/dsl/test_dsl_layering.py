"""Spec layering (003 §3.1): kind defaults -> executor -> step -> loop -> task, deep-merged."""

from __future__ import annotations

from noetl_stream.dsl import deep_merge, effective_task_spec, load_playbook


def test_deep_merge_merges_maps_and_replaces_scalars_and_lists() -> None:
    outer = {"timeout": {"connect": 5, "read": 60}, "tags": ["a", "b"], "retries": 1, "keep": True}
    inner = {"timeout": {"read": 15}, "tags": ["c"], "retries": 0, "new": {"x": 1}}
    assert deep_merge(outer, inner) == {
        "timeout": {"connect": 5, "read": 15},
        "tags": ["c"],
        "retries": 0,
        "keep": True,
        "new": {"x": 1},
    }
    assert outer["timeout"] == {"connect": 5, "read": 60}  # inputs are not modified


def test_deep_merge_lets_a_scalar_replace_a_map_and_back() -> None:
    assert deep_merge({"a": {"b": 1}}, {"a": 2}) == {"a": 2}
    assert deep_merge({"a": 2}, {"a": {"b": 1}}) == {"a": {"b": 1}}


PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: layers, path: tests/layers}
executor:
  spec:
    timeout: {read: 30}
    labels: [executor]
    level: executor
    only_executor: 1
workflow:
  - step: start
    spec:
      timeout: {connect: 3}
      labels: [step]
      level: step
      only_step: 2
    loop:
      in: [1, 2]
      iterator: n
      spec:
        mode: parallel
        max_in_flight: 2
        level: loop
        batch: {size: 10}
    tool:
      - name: fetch
        kind: http
        url: http://127.0.0.1:1/
        spec:
          timeout: {read: 15}
          batch: {flush: true}
          level: task
      - name: plain
        kind: noop
"""


def test_effective_task_spec_applies_every_layer_in_order() -> None:
    playbook = load_playbook(PLAYBOOK, "layers.yaml")
    step = playbook.step("start")
    fetch, plain = step.tasks
    assert effective_task_spec(playbook, step, fetch) == {
        "timeout": {"connect": 3, "read": 15},  # http default connect 10 -> step 3; read 60 -> 30 -> 15
        "labels": ["step"],
        "level": "task",
        "only_executor": 1,
        "only_step": 2,
        "batch": {"size": 10, "flush": True},
    }
    assert effective_task_spec(playbook, step, plain) == {
        "timeout": {"connect": 3, "read": 30},
        "labels": ["step"],
        "level": "loop",
        "only_executor": 1,
        "only_step": 2,
        "batch": {"size": 10},
    }
