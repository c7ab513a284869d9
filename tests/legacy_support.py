"""Helpers of the legacy translation tests: build legacy playbooks, read their canonical form."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from noetl_stream.dsl import compile_playbook
from noetl_stream.dsl.canonical import expand
from noetl_stream.dsl.source import load_yaml

# The legacy fixtures: a whole playbook in 000/004 forms, and one step (a fragment) in 002 forms.
DATA = Path(__file__).resolve().parent / "data" / "legacy"
CASE_FILE = DATA / "case_retry_sink.yaml"
EVAL_STEP_FILE = DATA / "eval_step.yaml"

# Steps given to ``legacy(...)`` start on line 6 (the first ``- step:``).
HEADER = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: tests/t}
executor: {spec: {extensions: [legacy]}}
workflow:
"""


def legacy(steps: str, *, workload: dict[str, Any] | None = None) -> str:
    """A playbook with the legacy extension on; ``steps`` are YAML list items (any indentation)."""
    text = HEADER
    if workload is not None:
        text = text.replace("workflow:\n", f"workload: {_flow(workload)}\nworkflow:\n")
    return text + textwrap.indent(textwrap.dedent(steps).strip("\n"), "  ") + "\n"


def _flow(value: Any) -> str:
    import json

    return json.dumps(value)


def yaml(text: str) -> Any:
    """Plain data of a YAML snippet (the expected canonical form, written as YAML)."""
    return YAML(typ="safe", pure=True).load(textwrap.dedent(text))


def canonical(text: str, file: str = "t.yaml") -> dict[str, Any]:
    """The canonical data the compiler validates (after legacy translation, sugar and dialect)."""
    data, smap = load_yaml(text, file)
    out = expand(data, smap).data
    assert isinstance(out, dict)
    return out


def step(text: str, name: str) -> dict[str, Any]:
    for s in canonical(text)["workflow"]:
        if s.get("step") == name:
            return dict(s)
    raise KeyError(name)


def report(text: str, file: str = "t.yaml") -> list[str]:
    """Every diagnostic as ``line:col: [warning: ]message``, in order (no file name, no YAML path)."""
    result = compile_playbook(text, file)
    return [
        f"{d.line}:{d.col}: {'warning: ' if d.severity == 'warning' else ''}{d.message}"
        for d in result.diagnostics
    ]


def compiles(text: str) -> None:
    result = compile_playbook(text, "t.yaml")
    assert result.playbook is not None, [d.format() for d in result.errors]


# -- the 002 fixture (one step) in a playbook around it ------------------------------------------------

WRAP_002 = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: legacy_eval, path: tests/legacy_eval}}
{executor}workload:
  base_url: "http://127.0.0.1:8080"
  sources: [{{path: "/pages/a"}}]
workflow:
  - step: start
    next: {{arcs: [{{step: crawl_sources}}]}}
{steps}
  - step: summarize
    tool:
      kind: python
      args: {{pages: "{{{{ crawl_sources }}}}"}}
      code: |
        result = {{"last_pages": [p["data"]["paging"]["page"] for p in pages]}}
      spec:
        policy:
          rules:
            - else:
                then: {{do: continue, set_ctx: {{summary: "{{{{ outcome.result }}}}"}}}}
  - step: tidy_up
    tool: {{kind: noop}}
"""


def wrap_002(steps: str, *, legacy: bool = False) -> str:
    executor = "executor: {spec: {extensions: [legacy]}}\n" if legacy else ""
    return WRAP_002.format(executor=executor, steps=textwrap.indent(steps.rstrip("\n"), ""))


def fragment_002() -> str:
    """The 002 fixture step, indented as an item of ``workflow:``."""
    return textwrap.indent(EVAL_STEP_FILE.read_text(), "  ")


def example_002(*, legacy: bool = False) -> str:
    """The 002 fixture step, as authored, in a playbook (asking for the extension itself if `legacy`)."""
    return wrap_002(fragment_002(), legacy=legacy)
