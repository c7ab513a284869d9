"""The spec's own examples (../shared/spec/examples): canonical ones compile, legacy ones are rejected.

The fragments (one step, or several documents each holding a step spec, a task policy, a router or
a tool shape) are embedded into a complete playbook here, the way an author would paste them.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from noetl_stream.dsl import Playbook, compile_playbook, kinds, known_kinds
from noetl_stream.dsl.kinds import KindInfo


def _examples_dir() -> Path | None:
    env = os.environ.get("NOETL_SPEC_EXAMPLES")
    if env:
        return Path(env)
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "shared" / "spec" / "examples"
        if candidate.is_dir():
            return candidate
    return None


EXAMPLES = _examples_dir()
pytestmark = pytest.mark.skipif(
    EXAMPLES is None, reason="the spec examples (../shared/spec/examples) are not next to this checkout"
)


def example(name: str) -> str:
    assert EXAMPLES is not None
    return (EXAMPLES / name).read_text(encoding="utf-8")


def documents(name: str) -> list[str]:
    """The YAML documents of a multi-document fragment, as text."""
    return [doc for doc in example(name).split("\n---\n") if doc.strip()]


def indent(text: str, spaces: int) -> str:
    return textwrap.indent(text.strip("\n"), " " * spaces) + "\n"


def compile_clean(text: str, file: str) -> Playbook:
    result = compile_playbook(text, file)
    assert [d.format() for d in result.diagnostics] == []
    assert result.playbook is not None
    return result.playbook


HEADER = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: embedded
  path: tests/embedded
"""


def test_keychain_and_admission_example_compiles_cleanly() -> None:
    playbook = compile_clean(example("001_keychain_and_admit.yaml"), "001_keychain_and_admit.yaml")
    assert [k.name for k in playbook.keychain] == ["openai_token", "pg_k8s"]
    guarded = playbook.step("guarded")
    assert guarded.admit is not None
    assert [(r.when, r.allow, r.is_else) for r in guarded.admit.rules] == [
        ("{{ workload.enabled }}", True, False),
        (None, False, True),
    ]
    assert [t.name for t in guarded.tasks] == ["guarded_task"]


def test_appendix_a_compiles_with_exactly_the_two_label_as_key_warnings() -> None:
    file = "001_appendix_a_minimal.yaml"
    result = compile_playbook(example(file), file)
    assert [d.format() for d in result.diagnostics] == [
        f"{file}:19:9: warning: step 'fetch': task 'call' uses the label-as-key shape; write it as "
        "'- name: call' with 'kind: ...' (003 §7) (at workflow[1].tool[0].call)",
        f"{file}:40:9: warning: step 'end': task 'done' uses the label-as-key shape; write it as "
        "'- name: done' with 'kind: ...' (003 §7) (at workflow[2].tool[0].done)",
    ]
    playbook = result.playbook
    assert playbook is not None
    call = playbook.step("fetch").tasks[0]
    assert (call.name, call.kind, call.config) == (
        "call",
        "http",
        {"method": "GET", "url": "{{ workload.api_url }}/ping"},
    )
    assert (call.line, call.col) == (19, 9)
    assert call.policy is not None
    assert [r.then.do for r in call.policy.rules] == ["retry", "fail", "break"]
    assert call.policy.rules[0].then.attempts == 5
    assert [(t.name, t.kind) for t in playbook.step("end").tasks] == [("done", "noop")]


def test_streaming_pagination_step_compiles_inside_a_playbook() -> None:
    text = (
        HEADER
        + """\
keychain:
  - name: pg_k8s
    kind: postgres_credential
workload:
  api_url: "http://127.0.0.1:8080"
  endpoints: [{path: /a, page_size: 2}]
workflow:
  - step: start
    next:
      arcs:
        - step: fetch_all_endpoints
"""
        + indent(example("003_streaming_pagination.yaml"), 2)
        + """\
  - step: validate_results
    tool: {kind: noop}
  - step: cleanup
    tool: {kind: noop}
"""
    )
    playbook = compile_clean(text, "pagination.yaml")
    step = playbook.step("fetch_all_endpoints")
    assert [t.name for t in step.tasks] == [
        "init_iter",
        "fetch_page",
        "route_by_status",
        "store_200",
        "store_404",
        "paginate",
    ]
    assert step.loop is not None
    assert (step.loop.iterator, step.loop.in_) == ("endpoint", "{{ workload.endpoints }}")
    assert (step.loop.spec.mode, step.loop.spec.max_in_flight, step.loop.spec.exec) == (
        "parallel",
        10,
        "distributed",
    )
    assert (step.failure_mode, step.timeout_s) == ("best_effort", 600.0)
    assert step.admit is not None
    assert [(r.is_else, r.allow) for r in step.admit.rules] == [(True, True)]
    paginate = step.tasks[-1].policy
    assert paginate is not None
    jump = paginate.rules[0].then
    assert (jump.do, jump.to, jump.set_iter) == (
        "jump",
        "fetch_page",
        {"page": "{{ (iter.page | int) + 1 }}"},
    )
    assert paginate.rules[1].then.do == "break"
    assert step.next is not None
    assert step.next.mode == "exclusive"
    assert [a.step for a in step.next.arcs] == ["validate_results", "cleanup"]


def test_policy_shapes_compile_at_their_scopes() -> None:
    step_spec, task_spec, router = documents("003_policy_shapes.yaml")
    text = (
        HEADER
        + """\
workflow:
  - step: start
"""
        + indent(step_spec, 4)
        + """\
    tool:
      - name: work
        kind: noop
"""
        + indent(task_spec, 8)
        + indent(router, 4)
        + """\
  - step: branch_a
    tool: {kind: noop}
  - step: branch_b
    tool: {kind: noop}
"""
    )
    playbook = compile_clean(text, "policy_shapes.yaml")
    start = playbook.step("start")
    assert start.admit is not None
    assert (start.admit.mode, len(start.admit.rules)) == ("exclusive", 2)
    assert (start.failure_mode, start.timeout_s) == ("fail_fast", 300.0)
    work = start.tasks[0]
    assert work.policy is not None
    retry, fail, otherwise = work.policy.rules
    assert (retry.then.do, retry.then.attempts, retry.then.backoff, retry.then.delay) == (
        "retry",
        5,
        "exponential",
        1.0,
    )
    assert fail.then.do == "fail"
    assert otherwise.is_else
    assert otherwise.then.set_ctx == {"last_ok": "{{ outcome.result }}"}
    assert start.next is not None
    assert start.next.mode == "inclusive"
    assert [(a.step, a.args) for a in start.next.arcs] == [
        ("branch_a", {"id": "{{ ctx.id }}"}),
        ("branch_b", None),
    ]


def test_task_shapes_normalize_to_named_tasks() -> None:
    named, unnamed, single = documents("003_task_shapes.yaml")
    text = (
        HEADER
        + """\
workload:
  api_url: "http://127.0.0.1:8080"
workflow:
  - step: start
"""
        + indent(named, 4)
        + """\
    next:
      arcs:
        - step: unnamed
  - step: unnamed
"""
        + indent(unnamed, 4)
        + """\
    next:
      arcs:
        - step: single
  - step: single
"""
        + indent(single, 4)
    )
    playbook = compile_clean(text, "task_shapes.yaml")
    assert [(t.name, t.kind) for t in playbook.step("start").tasks] == [
        ("init_iter", "noop"),
        ("fetch_page", "http"),
    ]
    assert [(t.name, t.kind) for t in playbook.step("unnamed").tasks] == [
        ("task_0", "http"),
        ("task_1", "python"),
    ]
    [task] = playbook.step("single").tasks
    assert (task.name, task.kind, task.config) == (
        "single_task",
        "http",
        {"method": "GET", "url": "{{ api_url }}"},
    )


LEGACY_000 = "000_004_legacy_case.yaml"
LEGACY_002 = "002_legacy_eval_step.yaml"
ROUTER = "use a router object 'next: {spec: {mode: exclusive}, arcs: [{step: %s}]}'"
LEGACY = (
    " (enable legacy extensions to translate it): validate or run with --legacy, or declare "
    "executor.spec.extensions: [legacy]"
)
V10 = "is not part of noetl.io/v2 (v10)"


def test_legacy_case_example_is_rejected_with_the_canonical_replacements() -> None:
    result = compile_playbook(example(LEGACY_000), LEGACY_000)
    assert result.playbook is None
    assert [d.format() for d in result.diagnostics] == [
        f"{LEGACY_000}:3:1: missing 'metadata' (with 'name' and 'path') (at <root>)",
        f"{LEGACY_000}:5:1: root 'name' {V10}; use metadata.name{LEGACY} (at name)",
        f"{LEGACY_000}:6:1: root 'path' {V10}; use metadata.path{LEGACY} (at path)",
        f"{LEGACY_000}:13:11: step 'start': 'next' as a string {V10}; {ROUTER % 'fetch_user'}{LEGACY} "
        "(at workflow[0].next)",
        f"{LEGACY_000}:18:5: step 'fetch_user': 'vars' {V10}; use set_ctx or set_iter in task "
        f"spec.policy.rules{LEGACY} (at workflow[1].vars)",
        f"{LEGACY_000}:21:11: step 'fetch_user': 'next' as a string {V10}; "
        f"{ROUTER % 'fetch_all_endpoints'}{LEGACY} (at workflow[1].next)",
        f"{LEGACY_000}:31:5: step 'fetch_all_endpoints': 'retry' {V10}; use task spec.policy.rules with "
        f"'do: retry'{LEGACY} (at workflow[2].retry)",
        f"{LEGACY_000}:41:5: step 'fetch_all_endpoints': 'case' {V10}; use task spec.policy.rules and "
        f"next.arcs{LEGACY} (at workflow[2].case)",
        f"{LEGACY_000}:56:11: step 'error_handler': 'next' as a string {V10}; {ROUTER % 'end'}{LEGACY} "
        "(at workflow[3].next)",
    ]


def test_legacy_eval_example_is_rejected_with_the_canonical_replacements() -> None:
    result = compile_playbook(example(LEGACY_002), LEGACY_002)
    assert result.playbook is None
    step = "step 'fetch_transform_store'"
    label_as_key = "uses the label-as-key shape; write it as '- name: %s' with 'kind: ...' (003 §7)"
    assert [d.format() for d in result.diagnostics] == [
        f"{LEGACY_002}:1:1: this document is a list of steps, not a playbook: a playbook is a mapping "
        "with apiVersion, kind, metadata and workflow (put the steps under 'workflow:') (at <root>)",
        f"{LEGACY_002}:3:11: {step}: 'spec.next_mode' {V10}; use next.spec.mode{LEGACY} (at [0].spec.next_mode)",
        f"{LEGACY_002}:4:3: {step}: 'when' {V10}; use spec.policy.admit.rules{LEGACY} (at [0].when)",
        f"{LEGACY_002}:10:7: warning: {step}: task 'init' {label_as_key % 'init'} (at [0].tool[0].init)",
        f"{LEGACY_002}:12:9: {step} task 'init': 'eval' {V10}; use spec.policy.rules{LEGACY} "
        "(at [0].tool[0].init.eval)",
        f"{LEGACY_002}:16:7: warning: {step}: task 'fetch_page' {label_as_key % 'fetch_page'} "
        "(at [0].tool[1].fetch_page)",
        f"{LEGACY_002}:22:9: {step} task 'fetch_page': 'eval' {V10}; use spec.policy.rules{LEGACY} "
        "(at [0].tool[1].fetch_page.eval)",
        f"{LEGACY_002}:34:7: warning: {step}: task 'paginate' {label_as_key % 'paginate'} "
        "(at [0].tool[2].paginate)",
        f"{LEGACY_002}:36:9: {step} task 'paginate': 'eval' {V10}; use spec.policy.rules{LEGACY} "
        "(at [0].tool[2].paginate.eval)",
        f"{LEGACY_002}:45:5: {step}: 'next' as a list {V10}; {ROUTER % '...'}{LEGACY} (at [0].next)",
    ]


def test_legacy_eval_step_inside_a_playbook_is_rejected_at_the_same_lines() -> None:
    """Pasted under ``workflow:`` the legacy step fails for its constructs only, not for its shape."""
    text = HEADER + "workflow:\n" + indent(example(LEGACY_002), 2)
    result = compile_playbook(text, "embedded.yaml")
    offset = HEADER.count("\n") + 1  # fragment line n is line n + offset here; `workflow:` is line 0
    errors = [(d.line - offset, d.message.split(";")[0]) for d in result.errors]
    step = "step 'fetch_transform_store'"
    assert errors == [
        (0, "workflow has no 'start' step (execution begins at the step named 'start')"),
        (3, f"{step}: 'spec.next_mode' {V10}"),
        (4, f"{step}: 'when' {V10}"),
        (12, f"{step} task 'init': 'eval' {V10}"),
        (22, f"{step} task 'fetch_page': 'eval' {V10}"),
        (36, f"{step} task 'paginate': 'eval' {V10}"),
        (45, f"{step}: 'next' as a list {V10}"),
    ]


CUSTOM = (
    HEADER
    + """\
workflow:
  - step: start
    tool:
      - name: anneal
        kind: quantum
        qubits: 8
"""
)


def test_an_unknown_kind_is_accepted_with_the_custom_kinds_extension() -> None:
    assert [d.code for d in compile_playbook(CUSTOM).errors] == ["unknown-kind"]
    [task] = compile_clean_with(CUSTOM, extensions=["custom_kinds"]).step("start").tasks
    assert (task.kind, task.config) == ("quantum", {"qubits": 8})
    in_the_playbook = CUSTOM.replace(
        "workflow:\n", "executor:\n  spec:\n    extensions: [custom_kinds]\nworkflow:\n"
    )
    assert compile_clean_with(in_the_playbook).step("start").tasks[0].kind == "quantum"


def test_a_registered_kind_is_known_with_its_own_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    info = KindInfo(name="quantum", keys=frozenset({"qubits"}), required_any=(("qubits",),))
    monkeypatch.setitem(kinds._REGISTRY, "quantum", info)  # what register_kind does, undone afterwards
    assert "quantum" in known_kinds()
    assert compile_clean_with(CUSTOM).step("start").tasks[0].config == {"qubits": 8}
    result = compile_playbook(CUSTOM.replace("qubits: 8", "qbits: 8"), "custom.yaml")
    assert [d.format() for d in result.errors] == [
        "custom.yaml:9:9: step 'start' task 'anneal': kind 'quantum' needs 'qubits' (at workflow[0].tool[0])",
        "custom.yaml:11:9: step 'start' task 'anneal': unknown key 'qbits' for kind 'quantum'; did you mean "
        "'qubits'? (at workflow[0].tool[0].qbits)",
    ]


def compile_clean_with(text: str, extensions: tuple[str, ...] | list[str] = ()) -> Playbook:
    result = compile_playbook(text, "custom.yaml", extensions=extensions)
    assert [d.format() for d in result.diagnostics] == []
    assert result.playbook is not None
    return result.playbook
