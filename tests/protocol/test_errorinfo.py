"""`ErrorInfo.to_dict` gives the dict the payloads have always held: same keys, same order, absent
optionals left out."""

from __future__ import annotations

import json

from noetl_stream.protocol.errorinfo import ErrorInfo


def _same(info: ErrorInfo, expected: dict[str, object]) -> None:
    got = info.to_dict()
    assert got == expected
    assert json.dumps(got) == json.dumps(expected)  # the key order too: the encoded bytes are the same


def test_kind_and_message() -> None:
    _same(ErrorInfo(kind="bad_request", message="no"), {"kind": "bad_request", "message": "no"})


def test_retryable_comes_before_the_message() -> None:
    _same(
        ErrorInfo(kind="timeout", retryable=False, message="late"),
        {"kind": "timeout", "retryable": False, "message": "late"},
    )


def test_a_policy_fail_names_its_task_before_the_message() -> None:
    _same(
        ErrorInfo(kind="policy_fail", retryable=False, task="t", message="m"),
        {"kind": "policy_fail", "retryable": False, "task": "t", "message": "m"},
    )


def test_a_credential_error_names_its_entry_last() -> None:
    _same(
        ErrorInfo(kind="credential_error", retryable=False, message="m", entry="pg"),
        {"kind": "credential_error", "retryable": False, "message": "m", "entry": "pg"},
    )


def test_an_invalid_playbook_lists_its_diagnostics() -> None:
    _same(
        ErrorInfo(kind="invalid_playbook", message="m", diagnostics=["a", "b"]),
        {"kind": "invalid_playbook", "message": "m", "diagnostics": ["a", "b"]},
    )


def test_retryable_true_is_kept() -> None:
    _same(ErrorInfo(kind="x", retryable=True, message="m"), {"kind": "x", "retryable": True, "message": "m"})
