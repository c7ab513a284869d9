"""The timeline `run` and `submit --wait` print (no server: events fed directly)."""

from __future__ import annotations

import io

import msgspec
import pytest
from helpers import event

from noetl_stream.progress import Progress


@pytest.mark.parametrize(
    ("kind", "message", "line"),
    [
        ("ValueError", "ValueError: b exploded (line 2)", "  ✘ b failed: ValueError: b exploded (line 2)"),
        ("http_error", "GET https://x/ -> 500", "  ✘ b failed: http_error: GET https://x/ -> 500"),
    ],
)
def test_a_failed_step_names_its_error_kind_once(kind: str, message: str, line: str) -> None:
    out = io.StringIO()
    Progress(out).on_event(event("step.failed", "b", "error", error={"kind": kind, "message": message}))
    assert out.getvalue() == line + "\n"


def test_a_redelivered_run_says_it_started_again() -> None:
    out = io.StringIO()
    p = Progress(out)
    p.on_event(event("step.started", "b", "in_progress", pool="default"))
    second = event("step.started", "b", "in_progress", pool="default", delivery=2)
    p.on_event(msgspec.structs.replace(second, worker="w2"))
    assert out.getvalue() == "  ▸ b started\n  ▸ b started again (delivery 2, worker w2)\n"
