"""Helpers of the invalid-playbook tables: a header to append steps to, and the exact-report check."""

from __future__ import annotations

import re

import pytest

from noetl_stream.dsl import PlaybookError, compile_playbook, load_playbook

# Cases built with ``steps(...)`` are appended to this header: their first step is on line 7.
HEADER = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: t
  path: tests/t
workflow:
"""


LIBRARY = "…"
"""In an expected diagnostic, where a library's own description stands (Jinja's or ruamel's account of a
syntax error, which changes between their releases): any text matches it, so a case asserts only the
project's words around it (position, prefix, hint, YAML path)."""


def steps(text: str) -> str:
    return HEADER + text


def assert_reported(actual: list[str], expected: list[str]) -> None:
    """`actual` is `expected`, each `LIBRARY` in it standing for any text."""
    patterns = [re.compile(".+?".join(re.escape(part) for part in e.split(LIBRARY))) for e in expected]
    if len(actual) != len(expected) or not all(p.fullmatch(a) for p, a in zip(patterns, actual, strict=True)):
        assert actual == expected  # shows the difference


def assert_rejected_with(text: str, expected: list[str]) -> None:
    """Every diagnostic, in order, complete with file:line:col, text and YAML path."""
    result = compile_playbook(text, "bad.yaml")
    assert_reported([d.format() for d in result.diagnostics], expected)
    assert result.playbook is None
    with pytest.raises(PlaybookError) as info:
        load_playbook(text, "bad.yaml")
    assert_reported([d.format() for d in info.value.diagnostics], expected)


def assert_accepted_with(text: str, expected: list[str]) -> None:
    """Warnings only: reported exactly, and the playbook still compiles."""
    result = compile_playbook(text, "bad.yaml")
    assert_reported([d.format() for d in result.diagnostics], expected)
    assert result.playbook is not None
    assert not result.errors
