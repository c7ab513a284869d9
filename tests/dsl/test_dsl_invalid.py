"""Invalid playbooks, the document: YAML syntax, the root, metadata, workload, keychain and executor.
Each case asserts every diagnostic, complete.

The workflow's steps and routers: test_dsl_invalid_steps.py. Inside a step: test_dsl_invalid_tasks.py,
_policies.py (and admission), _loops.py, _templates.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from dsl_support import LIBRARY, assert_rejected_with, steps

from noetl_stream.cli import main
from noetl_stream.dsl import PlaybookError, load_playbook

CASES = [
    pytest.param(
        """\
apiVersion: noetl.io/v2
workload:
  ids: [1, 2
workflow: []
""",
        [
            f"bad.yaml:4:9: YAML syntax error: {LIBRARY} (in {LIBRARY} that starts at 3:8) (at <root>)",
        ],
        id="yaml-unclosed-flow-sequence",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: t
  path: tests/t
  name: u
""",
        [
            "bad.yaml:6:3: YAML syntax error: duplicate key 'name' (first at line 4) (at <root>)",
        ],
        id="yaml-duplicate-key",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop, kind: python}
"""),
        [
            "bad.yaml:8:24: YAML syntax error: duplicate key 'kind' (first at line 8) (at <root>)",
        ],
        id="yaml-duplicate-key-in-flow-mapping",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
metadata:
\tname: t
""",
        [
            f"bad.yaml:3:1: YAML syntax error: {LIBRARY}; indent with spaces, not tabs (at <root>)",
        ],
        id="yaml-tab-indentation",
    ),
    pytest.param(
        steps("""\
  - step: start
    tool: {kind: noop}
    next:
      arcs:
        - step: start
          when: {{ ctx.again }}
"""),
        [
            'bad.yaml:12:17: unquoted template: YAML reads {{ ctx.again }} as a mapping; quote it: "{{ ctx.again }}" (at workflow[0].next.arcs[0].when)',
        ],
        id="yaml-unquoted-template",
    ),
    pytest.param(
        steps("""\
  - step: start
    desc: note: this breaks
    tool: {kind: noop}
"""),
        [
            f"bad.yaml:8:15: YAML syntax error: {LIBRARY}; quote a value that contains ': ', or check the indentation (at <root>)",
        ],
        id="yaml-colon-in-plain-value",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
---
kind: Playbook
""",
        [
            "bad.yaml:1:1: expected one playbook document, found 2 YAML documents (at <root>)",
        ],
        id="yaml-several-documents",
    ),
    pytest.param(
        """\
# nothing here
""",
        [
            "bad.yaml:1:1: expected one playbook document, found no YAML document (at <root>)",
        ],
        id="yaml-empty-document",
    ),
    pytest.param(
        """\
a: &a [x, x, x, x, x, x, x, x, x, x]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
""",
        [
            "bad.yaml:1:1: document is too large (more than 200000 nodes after alias expansion) (at <root>)",
        ],
        id="yaml-alias-bomb",
    ),
    pytest.param(
        """\
- step: start
  tool: {kind: noop}
""",
        [
            "bad.yaml:1:1: this document is a list of steps, not a playbook: a playbook is a mapping with apiVersion, kind, metadata and workflow (put the steps under 'workflow:') (at <root>)",
        ],
        id="root-is-a-list",
    ),
    pytest.param(
        """\
just text
""",
        [
            "bad.yaml:1:1: this document is a string, not a playbook: a playbook is a mapping with apiVersion, kind, metadata and workflow (at <root>)",
        ],
        id="root-is-a-scalar",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v1
kind: playbook
metadata: {name: t, path: tests/t}
workflow:
  - step: start
    tool: {kind: noop}
""",
        [
            "bad.yaml:1:13: apiVersion must be 'noetl.io/v2', got 'noetl.io/v1' (at apiVersion)",
            "bad.yaml:2:7: kind must be 'Playbook', got 'playbook' (at kind)",
        ],
        id="root-bad-api-version-and-kind",
    ),
    pytest.param(
        """\
# a playbook without its header
metadata: {name: t, path: tests/t}
workflow:
  - step: start
    tool: {kind: noop}
""",
        [
            "bad.yaml:2:1: missing 'apiVersion' (must be 'noetl.io/v2') (at <root>)",
            "bad.yaml:2:1: missing 'kind' (must be 'Playbook') (at <root>)",
        ],
        id="root-missing-api-version-and-kind",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: tests/t}
workflows:
  - step: start
    tool: {kind: noop}
""",
        [
            "bad.yaml:1:1: missing 'workflow' (a list of steps with a 'start' step) (at <root>)",
            "bad.yaml:4:1: unknown root key 'workflows'; did you mean 'workflow'? (allowed: apiVersion, kind, metadata, keychain, executor, workload, workflow, workbook) (at workflows)",
        ],
        id="root-unknown-key-did-you-mean",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: tests/t}
vars:
  limit: 10
workflow:
  - step: start
    tool: {kind: noop}
""",
        [
            "bad.yaml:4:1: root 'vars' is not part of noetl.io/v2 (v10); use ctx (set_ctx in task policies) for mutable state and workload for inputs (at vars)",
        ],
        id="root-vars-deprecated",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
name: t
path: tests/t
workflow:
  - step: start
    tool: {kind: noop}
""",
        [
            "bad.yaml:1:1: missing 'metadata' (with 'name' and 'path') (at <root>)",
            "bad.yaml:3:1: root 'name' is not part of noetl.io/v2 (v10); use metadata.name (enable legacy extensions to translate it): validate or run with --legacy, or declare executor.spec.extensions: [legacy] (at name)",
            "bad.yaml:4:1: root 'path' is not part of noetl.io/v2 (v10); use metadata.path (enable legacy extensions to translate it): validate or run with --legacy, or declare executor.spec.extensions: [legacy] (at path)",
        ],
        id="root-name-and-path-of-older-drafts",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  version: "1"
workflow:
  - step: start
    tool: {kind: noop}
""",
        [
            "bad.yaml:3:1: metadata: missing 'name' (at metadata)",
            "bad.yaml:3:1: metadata: missing 'path' (at metadata)",
        ],
        id="metadata-missing-name-and-path",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata:
workflow:
  - step: start
    tool: {kind: noop}
""",
        [
            "bad.yaml:3:1: metadata is empty; it needs 'name' and 'path' (at metadata)",
        ],
        id="metadata-empty",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: ""
  path: tests/t
  descripton: typo
workflow:
  - step: start
    tool: {kind: noop}
""",
        [
            "bad.yaml:4:9: metadata: 'name' must be a non-empty string (at metadata.name)",
            "bad.yaml:6:3: metadata: unknown key 'descripton'; did you mean 'description'? (at metadata.descripton)",
        ],
        id="metadata-unknown-key-and-empty-name",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: tests/t}
workload: {n: 1}
""",
        [
            "bad.yaml:1:1: missing 'workflow' (a list of steps with a 'start' step) (at <root>)",
        ],
        id="workflow-missing",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: tests/t}
workflow: []
""",
        [
            "bad.yaml:4:1: workflow must be a non-empty list of steps, got empty (at workflow)",
        ],
        id="workflow-empty",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: tests/t}
workflow:
  start:
    tool: {kind: noop}
""",
        [
            "bad.yaml:4:1: workflow must be a non-empty list of steps, got a mapping (at workflow)",
        ],
        id="workflow-is-a-mapping",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: tests/t}
workload: [1, 2]
workflow:
  - step: start
    tool: {kind: noop}
""",
        [
            "bad.yaml:4:11: workload must be a mapping of input names to default values (at workload)",
        ],
        id="workload-not-a-mapping",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: tests/t}
keychain:
  - name: pg
    kind: postgres_credential
  - name: pg
    kind: postgres_credential
  - name: token
workflow:
  - step: start
    tool: {kind: noop}
""",
        [
            "bad.yaml:7:11: keychain entry 'pg' is declared twice (first at line 5) (at keychain[1].name)",
            "bad.yaml:9:5: keychain entry 'token' needs a 'kind' (e.g. postgres_credential, secret_manager) (at keychain[2])",
        ],
        id="keychain-duplicate-and-missing-kind",
    ),
    pytest.param(
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: tests/t}
executor:
  spec:
    policy:
      rules: []
workflow:
  - step: start
    tool: {kind: noop}
""",
        [
            "bad.yaml:7:7: executor: control 'rules' is not allowed at executor scope; task control belongs in a task's spec.policy.rules (at executor.spec.policy.rules)",
        ],
        id="executor-control-in-policy",
    ),
    pytest.param(  # JSON has no .inf or .nan: they travelled as null (`timeout: .inf` meant no limit)
        """\
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: t, path: tests/t}
workload: {limit: .nan}
workflow:
  - step: start
    tool: {kind: python, code: "result = 1", spec: {timeout: .inf}}
""",
        [
            "bad.yaml:4:19: nan is not a JSON number: values travel as JSON, where it would become null; write a finite number (or leave the key out) (at workload.limit)",
            "bad.yaml:7:62: inf is not a JSON number: values travel as JSON, where it would become null; write a finite number (or leave the key out) (at workflow[0].tool.spec.timeout)",
        ],
        id="non-finite-numbers",
    ),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_invalid_playbook_is_reported_exactly(text: str, expected: list[str]) -> None:
    assert_rejected_with(text, expected)


def test_playbook_error_counts_the_other_errors() -> None:
    text = steps('  - step: begin\n    tool: {kind: noop}\n    when: "{{ true }}"\n')
    with pytest.raises(PlaybookError) as info:
        load_playbook(text, "bad.yaml")
    assert str(info.value) == (
        "bad.yaml:6:1: workflow has no 'start' step (execution begins at the step named 'start') "
        "(at workflow) (and 1 more)"
    )


def test_validate_cli_exit_codes_and_json(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(steps("  - step: start\n    tool: {kind: noop}\n    next: start\n"))
    good = tmp_path / "good.yaml"
    good.write_text(steps("  - step: start\n    tool: {kind: noop}\n"))
    runner = CliRunner()
    ok = runner.invoke(main, ["validate", str(good)])
    assert ok.exit_code == 0, ok.output
    assert "ok (t, 1 steps)" in ok.output
    failed = runner.invoke(main, ["validate", str(good), str(bad)])
    assert failed.exit_code == 2
    assert f"{bad}:9:11: step 'start': 'next' as a string is not part of noetl.io/v2 (v10)" in failed.output
    as_json = runner.invoke(main, ["validate", "--json", str(bad)])
    assert as_json.exit_code == 2
    [diag] = json.loads(as_json.output)
    assert (diag["line"], diag["col"], diag["path"], diag["code"]) == (
        9,
        11,
        "workflow[0].next",
        "deprecated",
    )
