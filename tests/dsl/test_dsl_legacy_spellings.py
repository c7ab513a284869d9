"""Legacy spellings inside templates: event name aliases (000) and ``outcome.status == 'success'`` (002).

Rejected by default with the canonical replacement; translated with the legacy extension."""

from __future__ import annotations

import pytest
from dsl_support import LIBRARY, assert_rejected_with, steps

from noetl_stream.dsl import compile_playbook

LEGACY = "executor: {spec: {extensions: [legacy]}}\nworkflow:\n"


def with_legacy(text: str) -> str:
    return text.replace("workflow:\n", LEGACY, 1)


def arc(when: str) -> str:
    return steps(
        f"""\
  - step: start
    tool: {{kind: noop}}
    next: {{arcs: [{{step: after, when: "{when}"}}]}}
  - step: after
    tool: {{kind: noop}}
"""
    )


def test_step_exit_in_a_canonical_playbook_is_an_error() -> None:
    """``call.done``/``call.error`` in an arc condition are NoETL's names, accepted (tests/
    test_dsl_dialect_routing.py); ``step.exit`` is 000's alone."""
    assert_rejected_with(
        arc("{{ event.name == 'step.exit' }}"),
        [
            "bad.yaml:9:39: step 'start': 'step.exit' is a legacy event alias; use 'step.done' or "
            "'step.failed' or 'loop.done' (enable legacy extensions to translate it): validate or run with "
            "--legacy, or declare executor.spec.extensions: [legacy] (at workflow[0].next.arcs[0].when)"
        ],
    )


@pytest.mark.parametrize(
    ("alias", "use"), [("call.done", "'step.done' or 'loop.done'"), ("call.error", "'step.failed'")]
)
def test_an_event_alias_outside_an_arc_condition_is_an_error(alias: str, use: str) -> None:
    text = steps(
        f"""\
  - step: start
    tool: {{kind: noop}}
    next: {{arcs: [{{step: after}}]}}
  - step: after
    spec: {{policy: {{admit: {{rules: [{{when: "{{{{ event.name == '{alias}' }}}}", then: {{allow: true}}}}]}}}}}}
    tool: {{kind: noop}}
"""
    )
    assert_rejected_with(
        text,
        [
            LIBRARY,  # (admit-all)
            f"bad.yaml:11:44: step 'after': '{alias}' is a legacy event alias; use {use} (enable legacy "
            "extensions to translate it): validate or run with --legacy, or declare executor.spec.extensions: "
            "[legacy] (at workflow[1].spec.policy.admit.rules[0].when)",
        ],
    )


@pytest.mark.parametrize(
    ("when", "canonical"),
    [
        ("{{ event.name == 'call.done' }}", "{{ event.name in ['step.done', 'loop.done'] }}"),
        (
            "{{ event.name != 'call.error' and workload.x }}",
            "{{ event.name not in ['step.failed'] and workload.x }}",
        ),
        ("{{ 'step.exit' == event.name }}", "{{ event.name in ['step.done', 'step.failed', 'loop.done'] }}"),
        (
            "{{ event.name in ['call.done', 'step.failed'] }}",
            "{{ event.name in ['step.done', 'loop.done', 'step.failed'] }}",
        ),
    ],
)
def test_the_legacy_extension_translates_event_aliases(when: str, canonical: str) -> None:
    result = compile_playbook(with_legacy(arc(when)), "old.yaml")
    assert result.errors == ()
    assert result.playbook is not None
    (translated,) = result.playbook.workflow[0].next.arcs  # type: ignore[union-attr]
    assert translated.when == canonical
    assert any("legacy event alias" in d.message for d in result.warnings)


def test_an_event_alias_in_a_form_the_translation_does_not_rewrite_is_an_error_naming_the_forms() -> None:
    text = with_legacy(arc("{{ event.name.startswith('x') or 'call.done' in [event.name] }}"))
    messages = [d.message for d in compile_playbook(text, "old.yaml").errors]
    assert messages == [
        "step 'start': 'call.done' is a legacy event alias; use 'step.done' or 'loop.done' (the legacy "
        "translation rewrites only comparisons with it: == 'call.done', != 'call.done' or in [...])"
    ]


def test_event_name_equals_only_its_canonical_name_in_a_canonical_playbook() -> None:
    result = compile_playbook(arc("{{ event.name == 'step.done' }}"), "ok.yaml")
    assert result.diagnostics == ()


STATUS = steps(
    """\
  - step: start
    tool:
      kind: noop
      spec: {policy: {rules: [{when: "{{ outcome.status == 'success' }}", then: {do: break}}]}}
"""
)


def test_outcome_status_success_is_an_error_without_the_legacy_extension() -> None:
    assert_rejected_with(
        STATUS,
        [
            "bad.yaml:10:38: step 'start' task 'start_task': outcome.status is 'ok' or 'error' (001 §11); "
            "'success' is the legacy (002) spelling (enable legacy extensions to translate it): validate or "
            "run with --legacy, or declare executor.spec.extensions: [legacy] "
            "(at workflow[0].tool.spec.policy.rules[0].when)"
        ],
    )


def test_the_subscript_spelling_of_outcome_status_success_is_an_error_too() -> None:
    """``outcome['status'] == 'success'`` never matches (the status is 'ok'): it passed `validate` and the
    rule silently never fired."""
    text = STATUS.replace("outcome.status", "outcome['status']")
    result = compile_playbook(text, "bad.yaml")
    assert [d.code for d in result.errors] == ["legacy-status"], result.errors
    legacy = compile_playbook(with_legacy(text), "old.yaml")
    assert legacy.errors == () and legacy.playbook is not None
    (rule,) = legacy.playbook.workflow[0].tasks[0].policy.rules  # type: ignore[union-attr]
    assert "'ok'" in str(rule.when) and "'success'" not in str(rule.when)


def test_an_event_status_subscript_compared_with_an_impossible_value_is_an_error() -> None:
    (error,) = compile_playbook(arc("{{ event['status'] == 'ok' }}"), "bad.yaml").errors
    assert error.code == "unknown-status" and "event.status is never 'ok'" in error.message


def test_outcome_status_success_is_translated_to_ok_with_the_legacy_extension() -> None:
    result = compile_playbook(with_legacy(STATUS), "old.yaml")
    assert result.errors == ()
    assert result.playbook is not None
    (rule,) = result.playbook.workflow[0].tasks[0].policy.rules  # type: ignore[union-attr]
    assert rule.when == "{{ outcome.status == 'ok' }}"
    assert [d.message for d in result.warnings] == ["002 outcome status 'success' translated to 'ok'"]


@pytest.mark.parametrize(
    ("when", "said"),
    [
        (
            "{{ event.status == 'ok' }}",
            "event.status is never 'ok': it is 'success' or 'error' or 'skipped' or 'in_progress' ('ok' is "
            "outcome.status, a task's, which routing does not see)",
        ),
        (
            "{{ event.status in ['success', 'failed'] }}",
            "event.status is never 'failed': it is 'success' or 'error' or 'skipped' or 'in_progress' (a "
            "failed step's boundary is step.failed, status 'error')",
        ),
    ],
)
def test_a_status_compared_with_a_value_it_never_has_is_an_error(when: str, said: str) -> None:
    """A condition that can never be true (the mirror image of outcome.status == 'success')."""
    result = compile_playbook(arc(when), "bad.yaml")
    assert [(d.code, d.message.split(": ", 1)[1]) for d in result.errors] == [("unknown-status", said)]


def test_statuses_each_side_has_are_accepted() -> None:
    assert (
        compile_playbook(arc("{{ event.status in ['success', 'error', 'skipped'] }}"), "ok.yaml").errors == ()
    )


def test_legacy_spellings_in_a_step_with_other_errors_are_reported_in_the_same_pass() -> None:
    """A step that does not compile (a misplaced loop 'mode') still has its templates' legacy spellings
    reported with that error; they showed only once it was fixed."""
    text = steps(
        """\
  - step: start
    loop:
      in: "{{ [1] }}"
      iterator: it
      mode: parallel
    tool:
      kind: noop
      spec: {policy: {rules: [{when: "{{ outcome.status == 'success' }}", then: {do: break}}]}}
    next: {arcs: [{step: after, when: "{{ event.name == 'step.exit' }}"}]}
  - step: after
    tool: {kind: noop}
"""
    )
    codes = [d.code for d in compile_playbook(text, "bad.yaml").errors]
    assert "legacy-status" in codes and "legacy-event" in codes, codes
    assert len(codes) >= 3, codes  # and the loop's own error
