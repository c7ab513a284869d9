"""The timeline `run` and `submit --wait` print (no server: events fed directly)."""

from __future__ import annotations

import io

import pytest

from noetl_stream.progress import Progress
from noetl_stream.wire import Event, now_iso


def failed(kind: str, message: str) -> Event:
    return Event(
        event_id="e:b:step.failed",
        execution_id="e",
        name="step.failed",
        source="worker",
        entity_type="step",
        entity_id="b",
        status="error",
        timestamp=now_iso(),
        step="b",
        payload={"error": {"kind": kind, "message": message}},
    )


@pytest.mark.parametrize(
    ("kind", "message", "line"),
    [
        ("ValueError", "ValueError: b exploded (line 2)", "  ✘ b failed: ValueError: b exploded (line 2)"),
        ("http_error", "GET https://x/ -> 500", "  ✘ b failed: http_error: GET https://x/ -> 500"),
    ],
)
def test_a_failed_step_names_its_error_kind_once(kind: str, message: str, line: str) -> None:
    out = io.StringIO()
    Progress(out).on_event(failed(kind, message))
    assert out.getvalue() == line + "\n"
