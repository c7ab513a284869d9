"""The timeline `run` and `submit --wait` print (no server: events fed directly)."""

from __future__ import annotations

import io
import json

import msgspec
import pytest
from helpers import event

from noetl_stream.client.progress import Progress


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


def _finish(p: Progress, summary: dict[str, object], capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """What `finish` prints: (stdout, the progress's own stream)."""
    p.finish(summary)
    assert isinstance(p.out, io.StringIO)
    return capsys.readouterr().out, p.out.getvalue()


def test_a_failure_is_named_once_and_prints_no_result(capsys: pytest.CaptureFixture[str]) -> None:
    """The step's own line says its error; the end names the step alone, and stdout stays empty: the
    result of the step before it is not the outcome of a failed execution."""
    p = Progress(io.StringIO())
    error = {"kind": "python_error", "message": "LookupError: nothing here (line 1)", "step": "explode"}
    p.on_event(event("step.failed", "explode", "error", error=error))
    summary = {
        "execution_id": "e1",
        "status": "failed",
        "result": {"a": 1},
        "ctx": {},
        "error": error,
        "duration_s": 0.023938,
    }
    out, err = _finish(p, summary, capsys)
    assert out == ""
    assert err.splitlines() == [
        "  ✘ explode failed: python_error: LookupError: nothing here (line 1)",
        "✘ execution e1 failed in 24ms: step explode",
    ]


def test_an_error_no_step_line_showed_is_said_at_the_end(capsys: pytest.CaptureFixture[str]) -> None:
    p = Progress(io.StringIO())
    summary = {
        "execution_id": "e2",
        "status": "cancelled",
        "result": None,
        "error": {"kind": "cancelled", "message": "operator"},
        "duration_s": 125.2,
    }
    out, err = _finish(p, summary, capsys)
    assert (out, err) == ("", "✘ execution e2 cancelled in 2m05s: cancelled: operator\n")
    p = Progress(io.StringIO())
    summary = {"execution_id": "e3", "status": "failed", "duration_s": 1.5}
    summary["error"] = {"kind": "template_error", "message": "'x' is undefined", "step": "route"}
    assert _finish(p, summary, capsys)[1] == (
        "✘ execution e3 failed in 1.50s: step route: template_error: 'x' is undefined\n"
    )


def test_a_success_prints_its_result_and_ctx_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    p = Progress(io.StringIO())
    summary = {"execution_id": "e4", "status": "success", "result": [1], "ctx": {"k": 2}, "duration_s": 0.5}
    out, err = _finish(p, summary, capsys)
    assert json.loads(out) == {"result": [1], "ctx": {"k": 2}}
    assert err == "✔ execution e4 success in 500ms\n"
