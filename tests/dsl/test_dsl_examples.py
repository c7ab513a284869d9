"""Our fixture playbooks (tests/data): canonical ones compile, legacy ones are rejected.

The fragments (one step, or several documents each holding a step spec, a task policy, a router or
a tool shape) are embedded into a complete playbook here, the way an author would paste them.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from noetl_stream.dsl import Playbook, compile_playbook, kinds, known_kinds
from noetl_stream.dsl.kinds import KindInfo

DATA = Path(__file__).resolve().parents[1] / "data"


def example(name: str) -> str:
    """A fixture under tests/data, by its path there (``dsl/...``, ``legacy/...``)."""
    return (DATA / name).read_text(encoding="utf-8")


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


def test_keychain_and_admission_fixture_compiles_cleanly() -> None:
    playbook = compile_clean(example("dsl/keychain_admit.yaml"), "keychain_admit.yaml")
    assert [(k.name, k.kind) for k in playbook.keychain] == [
        ("slack_webhook", "secret_manager"),
        ("warehouse_pg", "postgres_credential"),
    ]
    gated = playbook.step("gated")
    assert gated.admit is not None
    assert [(r.when, r.allow, r.is_else) for r in gated.admit.rules] == [
        ("{{ workload.nightly }}", True, False),
        (None, False, True),
    ]
    assert [t.name for t in gated.tasks] == ["gated_task"]
    assert playbook.step("done").admit is None


def test_minimal_fixture_compiles_with_exactly_the_two_label_as_key_warnings() -> None:
    file = "minimal_label_as_key.yaml"
    result = compile_playbook(example(f"dsl/{file}"), file)
    assert [d.format() for d in result.diagnostics] == [
        f"{file}:18:9: warning: step 'probe': task 'ping' uses the label-as-key shape; write it as "
        "'- name: ping' with 'kind: ...' (003 §7) (at workflow[1].tool[0].ping)",
        f"{file}:38:9: warning: step 'finish': task 'record' uses the label-as-key shape; write it as "
        "'- name: record' with 'kind: ...' (003 §7) (at workflow[2].tool[0].record)",
    ]
    playbook = result.playbook
    assert playbook is not None
    ping = playbook.step("probe").tasks[0]
    assert (ping.name, ping.kind, ping.config) == (
        "ping",
        "http",
        {"method": "HEAD", "url": "{{ workload.service_url }}/healthz"},
    )
    assert (ping.line, ping.col) == (18, 9)
    assert ping.policy is not None
    assert [r.then.do for r in ping.policy.rules] == ["retry", "fail", "break"]
    retry = ping.policy.rules[0].then
    assert (retry.attempts, retry.backoff, retry.delay) == (3, "linear", 1)
    assert [(t.name, t.kind) for t in playbook.step("finish").tasks] == [("record", "noop")]


def test_streaming_pagination_step_compiles_inside_a_playbook() -> None:
    text = (
        HEADER
        + """\
keychain:
  - name: warehouse_pg
    kind: postgres_credential
workload:
  base_url: "http://127.0.0.1:8080"
  feeds: [{name: f, path: /f, size: 2}]
workflow:
  - step: start
    next:
      arcs:
        - step: harvest_feeds
"""
        + indent(example("dsl/streaming_pagination_step.yaml"), 2)
        + """\
  - step: check_totals
    tool: {kind: noop}
  - step: abandon
    tool: {kind: noop}
"""
    )
    playbook = compile_clean(text, "pagination.yaml")
    step = playbook.step("harvest_feeds")
    assert [t.name for t in step.tasks] == [
        "begin",
        "fetch",
        "route",
        "save_rows",
        "save_missing",
        "turn_page",
    ]
    assert step.loop is not None
    assert (step.loop.iterator, step.loop.in_) == ("feed", "{{ workload.feeds }}")
    assert (step.loop.spec.mode, step.loop.spec.max_in_flight, step.loop.spec.exec) == (
        "parallel",
        4,
        "distributed",
    )
    assert (step.failure_mode, step.timeout_s) == ("best_effort", 900.0)
    assert step.admit is not None
    assert [(r.is_else, r.allow) for r in step.admit.rules] == [(True, True)]
    route = step.tasks[2].policy
    assert route is not None
    assert [(r.then.do, r.then.to) for r in route.rules] == [("jump", "save_missing"), ("jump", "save_rows")]
    turn_page = step.tasks[-1].policy
    assert turn_page is not None
    jump = turn_page.rules[0].then
    assert (jump.do, jump.to, jump.set_iter) == (
        "jump",
        "fetch",
        {"page": "{{ iter.page + 1 }}"},
    )
    assert turn_page.rules[1].then.do == "break"
    assert step.next is not None
    assert step.next.mode == "exclusive"
    assert [a.step for a in step.next.arcs] == ["check_totals", "abandon"]


def test_policy_shapes_compile_at_their_scopes() -> None:
    step_spec, task_spec, router = documents("dsl/policy_shapes.yaml")
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
  - step: left
    tool: {kind: noop}
  - step: right
    tool: {kind: noop}
"""
    )
    playbook = compile_clean(text, "policy_shapes.yaml")
    start = playbook.step("start")
    assert start.admit is not None
    assert (start.admit.mode, len(start.admit.rules)) == ("exclusive", 2)
    assert (start.failure_mode, start.timeout_s) == ("fail_fast", 120.0)
    work = start.tasks[0]
    assert work.policy is not None
    retry, fail, otherwise = work.policy.rules
    assert (retry.then.do, retry.then.attempts, retry.then.backoff, retry.then.delay) == (
        "retry",
        3,
        "linear",
        0.25,
    )
    assert fail.then.do == "fail"
    assert otherwise.is_else
    assert otherwise.then.set_ctx == {"previous": "{{ outcome.result }}"}
    assert start.next is not None
    assert start.next.mode == "inclusive"
    assert [(a.step, a.args) for a in start.next.arcs] == [
        ("left", {"key": "{{ ctx.key }}"}),
        ("right", None),
    ]
    assert start.deadline_s == 480.0


def test_task_shapes_normalize_to_named_tasks() -> None:
    named, unnamed, single = documents("dsl/task_shapes.yaml")
    text = (
        HEADER
        + """\
workload:
  base_url: "http://127.0.0.1:8080"
workflow:
  - step: start
"""
        + indent(named, 4)
        + """\
    next:
      arcs:
        - step: unnamed
          when: "{{ event.name == 'step.done' }}"
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
        ("prepare", "noop"),
        ("download", "http"),
    ]
    assert [(t.name, t.kind) for t in playbook.step("unnamed").tasks] == [
        ("task_0", "http"),
        ("task_1", "python"),
    ]
    [task] = playbook.step("single").tasks
    assert (task.name, task.kind, task.config) == (
        "single_task",
        "http",
        {"method": "POST", "url": "{{ workload.base_url }}/notify"},
    )


LEGACY_000 = "case_retry_sink.yaml"
LEGACY_002 = "eval_step.yaml"
ROUTER = "use a router object 'next: {spec: {mode: exclusive}, arcs: [{step: %s}]}'"
LEGACY = (
    " (enable legacy extensions to translate it): validate or run with --legacy, or declare "
    "executor.spec.extensions: [legacy]"
)
V10 = "is not part of noetl.io/v2 (v10)"


def test_legacy_case_fixture_is_rejected_with_the_canonical_replacements() -> None:
    result = compile_playbook(example(f"legacy/{LEGACY_000}"), LEGACY_000)
    assert result.playbook is None
    assert [d.format() for d in result.diagnostics] == [
        f"{LEGACY_000}:2:1: missing 'metadata' (with 'name' and 'path') (at <root>)",
        f"{LEGACY_000}:4:1: root 'name' {V10}; use metadata.name{LEGACY} (at name)",
        f"{LEGACY_000}:5:1: root 'path' {V10}; use metadata.path{LEGACY} (at path)",
        f"{LEGACY_000}:12:11: step 'start': 'next' as a string {V10}; {ROUTER % 'load_owner'}{LEGACY} "
        "(at workflow[0].next)",
        f"{LEGACY_000}:17:5: step 'load_owner': 'vars' {V10}; use set_ctx or set_iter in task "
        f"spec.policy.rules{LEGACY} (at workflow[1].vars)",
        f"{LEGACY_000}:20:11: step 'load_owner': 'next' as a string {V10}; "
        f"{ROUTER % 'walk_feeds'}{LEGACY} (at workflow[1].next)",
        f"{LEGACY_000}:30:5: step 'walk_feeds': 'retry' {V10}; use task spec.policy.rules with "
        f"'do: retry'{LEGACY} (at workflow[2].retry)",
        f"{LEGACY_000}:40:5: step 'walk_feeds': 'case' {V10}; use task spec.policy.rules and "
        f"next.arcs{LEGACY} (at workflow[2].case)",
        f"{LEGACY_000}:55:11: step 'report_failure': 'next' as a string {V10}; {ROUTER % 'finish'}{LEGACY} "
        "(at workflow[3].next)",
    ]


def test_legacy_eval_fixture_is_rejected_with_the_canonical_replacements() -> None:
    result = compile_playbook(example(f"legacy/{LEGACY_002}"), LEGACY_002)
    assert result.playbook is None
    step = "step 'crawl_sources'"
    label_as_key = "uses the label-as-key shape; write it as '- name: %s' with 'kind: ...' (003 §7)"
    assert [d.format() for d in result.diagnostics] == [
        f"{LEGACY_002}:1:1: this document is a list of steps, not a playbook: a playbook is a mapping "
        "with apiVersion, kind, metadata and workflow (put the steps under 'workflow:') (at <root>)",
        f"{LEGACY_002}:7:3: {step}: 'when' {V10}; use spec.policy.admit.rules{LEGACY} (at [0].when)",
        f"{LEGACY_002}:9:5: {step}: 'spec.next_mode' {V10}; use next.spec.mode{LEGACY} (at [0].spec.next_mode)",
        f"{LEGACY_002}:11:7: warning: {step}: task 'reset' {label_as_key % 'reset'} (at [0].tool[0].reset)",
        f"{LEGACY_002}:13:9: {step} task 'reset': 'eval' {V10}; use spec.policy.rules{LEGACY} "
        "(at [0].tool[0].reset.eval)",
        f"{LEGACY_002}:15:7: warning: {step}: task 'get_page' {label_as_key % 'get_page'} "
        "(at [0].tool[1].get_page)",
        f"{LEGACY_002}:20:9: {step} task 'get_page': 'eval' {V10}; use spec.policy.rules{LEGACY} "
        "(at [0].tool[1].get_page.eval)",
        f"{LEGACY_002}:32:7: warning: {step}: task 'advance' {label_as_key % 'advance'} "
        "(at [0].tool[2].advance)",
        f"{LEGACY_002}:34:9: {step} task 'advance': 'eval' {V10}; use spec.policy.rules{LEGACY} "
        "(at [0].tool[2].advance.eval)",
        f"{LEGACY_002}:41:5: {step}: 'next' as a list {V10}; {ROUTER % '...'}{LEGACY} (at [0].next)",
    ]


def test_legacy_eval_step_inside_a_playbook_is_rejected_at_the_same_lines() -> None:
    """Pasted under ``workflow:`` the legacy step fails for its constructs only, not for its shape."""
    text = HEADER + "workflow:\n" + indent(example(f"legacy/{LEGACY_002}"), 2)
    result = compile_playbook(text, "embedded.yaml")
    offset = HEADER.count("\n") + 1  # fragment line n is line n + offset here; `workflow:` is line 0
    errors = [(d.line - offset, d.message.split(";")[0]) for d in result.errors]
    step = "step 'crawl_sources'"
    assert errors == [
        (0, "workflow has no 'start' step (execution begins at the step named 'start')"),
        (7, f"{step}: 'when' {V10}"),
        (9, f"{step}: 'spec.next_mode' {V10}"),
        (13, f"{step} task 'reset': 'eval' {V10}"),
        (20, f"{step} task 'get_page': 'eval' {V10}"),
        (34, f"{step} task 'advance': 'eval' {V10}"),
        (41, f"{step}: 'next' as a list {V10}"),
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
