"""What may stand in a ``spec``.

* An unknown key in a spec (executor, step, loop, task, their policies, a router's policy) is ignored,
  so the validator warns (``unknown-spec-key``) naming the key, its place and the keys known there;
  the playbook still compiles (spec is the extension point).
* The vocabulary holds every spec key the package reads, and only those (scanned from the source).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from dsl_support import HEADER, assert_accepted_with, steps

import noetl_stream
from noetl_stream.dsl import compile_playbook, kinds
from noetl_stream.dsl import vocabulary as V
from noetl_stream.dsl.kinds import KindInfo
from noetl_stream.dsl.speckeys import task_spec_keys

PACKAGE = Path(noetl_stream.__file__).resolve().parent
PLAYBOOKS = PACKAGE.parent / "playbooks"
NEW_CODES = {"unknown-spec-key"}

# -- the vocabulary is what the code reads -----------------------------------------------------------

NOT_SPECS = {
    "dataplane/tools/duckdb.py": "its `spec` is an item of the task's `attach` list",
    "dsl/budget.py": "its `spec` is a Python format spec",
}


def _spec_reads() -> Iterator[tuple[str, str, str]]:
    """``(module, receiver, key)`` for every ``<x>spec.get("key")``, ``<x>spec["key"]`` and
    ``"key" in <x>spec`` in the package."""
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module in NOT_SPECS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            receiver: ast.expr | None = None
            key: object = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
                if node.func.attr in ("get", "pop", "setdefault") and isinstance(node.args[0], ast.Constant):
                    receiver, key = node.func.value, node.args[0].value
            elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                receiver, key = node.value, node.slice.value
            elif (
                isinstance(node, ast.Compare)
                and isinstance(node.ops[0], (ast.In, ast.NotIn))
                and isinstance(node.left, ast.Constant)
            ):
                receiver, key = node.comparators[0], node.left.value
            if receiver is not None and isinstance(key, str) and ast.unparse(receiver).endswith("spec"):
                yield module, ast.unparse(receiver), key


def _scope(module: str, receiver: str) -> str:
    if module.startswith("dataplane/tools/"):
        return f"tool:{Path(module).stem}"
    if "executor" in receiver:
        return "executor"
    if receiver == "step.spec":
        return "step"
    if module == "dataplane/pipeline.py":
        return "task"
    return "any"


VOCABULARY = {
    "executor": set(V.EXECUTOR_SPEC_KEYS),
    "step": set(V.STEP_SPEC_KEYS),
    "task": set(V.TASK_SPEC_KEYS),
    **{f"tool:{kind}": set(keys) for kind, keys in V.TOOL_SPEC_KEYS.items()},
}
EVERY_KEY = (
    set(V.EXECUTOR_SPEC_KEYS)
    | set(V.STEP_SPEC_KEYS)
    | set(V.LOOP_SPEC_KEYS)
    | set(V.NEXT_SPEC_KEYS)
    | set(V.TASK_SPEC_KEYS)
    | set(V.TOOL_KNOBS)
    | set(V.SPEC_REJECTED)
)


def test_every_spec_key_the_package_reads_is_in_the_vocabulary_of_its_scope() -> None:
    found: dict[str, set[str]] = {}
    for module, receiver, key in _spec_reads():
        scope = _scope(module, receiver)
        found.setdefault(scope, set()).add(key)
        allowed = VOCABULARY.get(scope, EVERY_KEY)
        assert key in allowed, f"{module} reads {receiver}[{key!r}]: add it to vocabulary.py ({scope})"
    # The scan sees the readers (else this test could pass on nothing), and the vocabulary holds no
    # knob that nothing reads: each tool's knobs and the executor's own keys are all read somewhere.
    for scope in ("executor", *(f"tool:{kind}" for kind in V.TOOL_SPEC_KEYS)):
        assert found.get(scope, set()) == VOCABULARY[scope], scope
    assert {"timeout_s"} <= found["task"] and {"pool"} <= found["step"]


def test_every_built_in_kind_has_its_knobs_in_the_vocabulary() -> None:
    for kind in kinds.known_kinds():
        info = kinds.kind_info(kind)
        assert info is not None
        if kind != "workbook":
            assert kind in V.TOOL_SPEC_KEYS, f"say which spec keys the '{kind}' tool reads"
        known = task_spec_keys(kind)
        assert known is not None and set(info.defaults) <= set(known), kind  # kind defaults are knobs


# -- unknown spec keys: warnings ---------------------------------------------------------------------

KNOWN_EVERYWHERE = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: tests/t}
executor:
  spec:
    pool: default
    deadline_s: 60
    max_task_runs: 100
    timeout_s: 30
    timeout: {connect: 5}
    policy: {defaults: {}, results: {}, limits: {max_payload_bytes: 1000}, placement: {}}
workflow:
  - step: start
    spec:
      pool: default
      timeout: 10
      max_body_bytes: 1000
      pool_size: 2
      child_timeout_s: 5
      policy:
        lifecycle: {timeout_s: 60}
        emit: {}
        tracing: {}
        quotas: {}
        compensation: {}
    loop:
      in: [1]
      iterator: n
      spec:
        mode: parallel
        max_in_flight: 2
        timeout_s: 3
        policy: {exec: local, ordering: {}, reducers: {}, backpressure: {}, partitioning: {}}
    tool:
      - {name: a, kind: http, url: "http://127.0.0.1:1/", spec: {timeout: 1, max_body_bytes: 10, timeout_s: 2}}
      - {name: b, kind: postgres, query: "select 1", spec: {timeout: {statement: 1}, pool_size: 1}}
      - {name: c, kind: python, code: "result = 1", spec: {timeout: 1}}
      - {name: d, kind: playbook, path: child.yaml, spec: {child_timeout_s: 1}}
      - name: e
        kind: noop
        spec:
          timeout_s: 1
          policy: {mode: exclusive, on_unmatched: continue, before: [], after: [], finally: [], rules: []}
    next:
      spec: {mode: exclusive, policy: {priority: 1, dedupe: true, partitioning: {}}}
      arcs: [{step: end, spec: {anything: 1}}]
  - step: end
    tool: {kind: noop}
"""


def test_every_known_key_and_reserved_placeholder_compiles_without_a_warning() -> None:
    result = compile_playbook(KNOWN_EVERYWHERE, "known.yaml")
    assert [d.format() for d in result.diagnostics] == []
    assert result.playbook is not None


KNOWN_STEP = "known: child_timeout_s, max_body_bytes, policy, pool, pool_size, timeout, timeout_s"
KNOWN_LOOP = "known: child_timeout_s, frame, max_body_bytes, max_in_flight, mode, policy, pool_size, timeout, timeout_s"
KNOWN_EXECUTOR = (
    "known: child_timeout_s, deadline_s, extensions, max_body_bytes, max_task_runs, policy, pool, pool_size, "
    "timeout, timeout_s"
)

WARNED = [
    pytest.param(
        steps("  - step: start\n    spec: {timout: 5}\n    tool: {kind: noop}\n"),
        [
            "bad.yaml:8:12: warning: step 'start': unknown step.spec key 'timout', ignored; did you mean "
            f"'timeout'? ({KNOWN_STEP}) (at workflow[0].spec.timout)"
        ],
        id="step-spec-typo",
    ),
    pytest.param(
        steps("  - step: start\n    tool: {kind: noop, spec: {retri: 3}}\n"),
        [
            "bad.yaml:8:31: warning: step 'start' task 'start_task': unknown task.spec key 'retri' for kind "
            "'noop', ignored; retrying is task policy: spec.policy.rules with 'then: {do: retry, attempts: "
            "N}' (known: policy, timeout_s) (at workflow[0].tool.spec.retri)"
        ],
        id="task-spec-retry-knob",
    ),
    pytest.param(
        steps(
            "  - step: start\n"
            "    loop:\n"
            "      in: [1, 2]\n"
            "      iterator: n\n"
            "      spec: {mode: parallel, max_in_flight: 4, distributed: true}\n"
            "    tool: {kind: noop}\n"
        ),
        [
            "bad.yaml:11:48: warning: step 'start': unknown loop.spec key 'distributed', ignored; did you "
            f"mean 'policy: {{exec: distributed}}'? ({KNOWN_LOOP}) (at workflow[0].loop.spec.distributed)"
        ],
        id="loop-distributed-as-a-key",
    ),
    pytest.param(
        steps(
            "  - step: start\n"
            "    loop: {in: [1], iterator: n, spec: {exec: distributed, parallel: true}}\n"
            "    tool: {kind: noop}\n"
        ),
        [
            "bad.yaml:8:41: warning: step 'start': unknown loop.spec key 'exec', ignored; 'exec' is a key "
            f"of loop.spec.policy ({KNOWN_LOOP}) (at workflow[0].loop.spec.exec)",
            "bad.yaml:8:60: warning: step 'start': unknown loop.spec key 'parallel', ignored; did you mean "
            f"'mode: parallel'? ({KNOWN_LOOP}) (at workflow[0].loop.spec.parallel)",
        ],
        id="loop-exec-and-mode-misplaced",
    ),
    pytest.param(
        steps("  - step: start\n    spec: {mode: parallel, admit: {rules: []}}\n    tool: {kind: noop}\n"),
        [
            "bad.yaml:8:12: warning: step 'start': unknown step.spec key 'mode', ignored; 'mode' is a key of "
            f"loop.spec, next.spec, loop.spec.policy ({KNOWN_STEP}) (at workflow[0].spec.mode)",
            "bad.yaml:8:28: warning: step 'start': unknown step.spec key 'admit', ignored; 'admit' is a key "
            f"of step.spec.policy ({KNOWN_STEP}) (at workflow[0].spec.admit)",
        ],
        id="step-spec-keys-of-other-places",
    ),
    pytest.param(
        steps(
            "  - step: start\n"
            "    tool:\n"
            "      - {name: a, kind: python, code: 'result = 1', spec: {max_body_bytes: 10, pool: p}}\n"
        ),
        [
            "bad.yaml:9:60: warning: step 'start' task 'a': unknown task.spec key 'max_body_bytes' for kind "
            "'python', ignored; kind 'python' does not read it (kinds that do: http) (known: policy, timeout, "
            "timeout_s) (at workflow[0].tool[0].spec.max_body_bytes)",
            "bad.yaml:9:80: warning: step 'start' task 'a': unknown task.spec key 'pool' for kind 'python', "
            "ignored; 'pool' is a key of executor.spec, step.spec (known: policy, timeout, timeout_s) "
            "(at workflow[0].tool[0].spec.pool)",
        ],
        id="task-spec-knob-of-another-kind",
    ),
    pytest.param(
        HEADER.replace("workflow:\n", "executor:\n  spec: {pol: a, policy: {limit: {}}}\nworkflow:\n")
        + "  - step: start\n    tool: {kind: noop}\n",
        [
            "bad.yaml:7:10: warning: executor: unknown executor.spec key 'pol', ignored; did you mean 'pool'? "
            f"({KNOWN_EXECUTOR}) (at executor.spec.pol)",
            "bad.yaml:7:27: warning: executor: unknown executor.spec.policy key 'limit', ignored; did you mean "
            "'limits'? (known: defaults, limits, placement, results) (at executor.spec.policy.limit)",
        ],
        id="executor-spec-and-policy",
    ),
    pytest.param(
        steps(
            "  - step: start\n"
            "    tool: {kind: noop}\n"
            "    next: {spec: {policy: {priorty: 1}}, arcs: [{step: start, when: '{{ false }}'}]}\n"
        ),
        [
            "bad.yaml:9:28: warning: step 'start': unknown next.spec.policy key 'priorty', ignored; did you "
            "mean 'priority'? (known: dedupe, partitioning, priority) (at workflow[0].next.spec.policy.priorty)"
        ],
        id="router-policy",
    ),
    pytest.param(
        steps(
            "  - step: start\n"
            "    loop: {in: [1], iterator: n, spec: {policy: {order: fifo}}}\n"
            "    tool: {kind: noop}\n"
        ),
        [
            "bad.yaml:8:50: warning: step 'start': unknown loop.spec.policy key 'order', ignored; did you "
            "mean 'ordering'? (known: backpressure, exec, max_in_flight, mode, ordering, partitioning, "
            "reducers) (at workflow[0].loop.spec.policy.order)"
        ],
        id="loop-policy",
    ),
    pytest.param(
        HEADER.replace(
            "workflow:\n",
            "workbook:\n  tpl: {kind: python, code: 'result = 1', spec: {tmeout: 1}}\nworkflow:\n",
        )
        + "  - step: start\n    tool: {name: tpl, kind: workbook, spec: {timeout: 1, max_body_bytes: 5}}\n",
        [
            "bad.yaml:7:50: warning: workbook 'tpl' task 'tpl': unknown task.spec key 'tmeout' for kind 'python', "
            "ignored; did you mean 'timeout'? (known: policy, timeout, timeout_s) (at workbook.tpl.spec.tmeout)"
        ],
        id="workbook-template-and-a-task-running-it",
    ),
]


@pytest.mark.parametrize(("text", "expected"), WARNED)
def test_an_unknown_spec_key_is_a_warning_naming_it_its_place_and_the_known_keys(
    text: str, expected: list[str]
) -> None:
    assert_accepted_with(text, expected)
    result = compile_playbook(text, "bad.yaml")
    assert {d.code for d in result.diagnostics} == {"unknown-spec-key"}


def test_the_specs_around_a_kind_the_vocabulary_does_not_know_are_not_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(kinds._REGISTRY, "quantum", KindInfo(name="quantum", keys=None))  # a plugin's
    text = steps(
        "  - step: start\n"
        "    spec: {shots: 100}\n"
        "    tool: {kind: quantum, spec: {backend: sim}}\n"
        "    next: {arcs: [{step: other}]}\n"
        "  - step: other\n"
        "    spec: {shots: 100}\n"
        "    tool: {kind: noop}\n"
    )
    assert [d.message for d in compile_playbook(text, "q.yaml").diagnostics] == [
        "step 'other': unknown step.spec key 'shots', ignored "
        "(known: child_timeout_s, max_body_bytes, policy, pool, pool_size, timeout, timeout_s)"
    ]


def test_no_shipped_playbook_or_spec_example_gets_a_new_diagnostic() -> None:
    files = sorted(PLAYBOOKS.rglob("*.yaml"))
    assert files
    for file in files:
        result = compile_playbook(file.read_text(encoding="utf-8"), str(file))
        assert [d.format() for d in result.diagnostics if d.code in NEW_CODES] == []
