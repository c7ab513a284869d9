"""Authoring sugar (003 §14): choose, while and until compile to canonical jump/break tasks."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from helpers import playbook, run
from legacy_support import report, yaml

from noetl_stream.cli import main
from noetl_stream.dsl import compile_playbook
from noetl_stream.dsl.canonical import expand
from noetl_stream.dsl.source import load_yaml
from noetl_stream.runtime.local import Runtime


def set_iter(**values: object) -> str:
    items = ", ".join(f"{k}: {v!r}" if not isinstance(v, str) else f'{k}: "{v}"' for k, v in values.items())
    return f"{{policy: {{rules: [{{else: {{then: {{do: continue, set_iter: {{{items}}}}}}}}}]}}}}"


LADDER = playbook(
    f"""
    - step: start
      tool:
        - name: init
          kind: noop
          spec: {set_iter(n=0)}
        - name: route
          choose:
            - when: "{{{{ workload.status == 404 }}}}"
              then:
                - {{kind: noop, result: missing}}
            - when: "{{{{ workload.status == 500 }}}}"
              then: {{kind: noop, result: broken}}
            - else:
                - {{name: fine, kind: noop, result: fine}}
        - name: picked
          kind: noop
          spec: {set_iter(picked="{{ _prev }}")}
        - while: "{{{{ iter.n < 3 }}}}"
          do:
            - kind: noop
              spec: {set_iter(n="{{ iter.n + 1 }}", ran_while=True)}
        - until: "{{{{ iter.n >= workload.until }}}}"
          do:
            - name: bump
              kind: noop
              spec: {set_iter(n="{{ iter.n + 1 }}")}
        - kind: python
          args: {{picked: "{{{{ iter.picked }}}}", n: "{{{{ iter.n }}}}"}}
          code: "result = {{'picked': picked, 'n': n}}"
    """,
    workload={"status": 404, "until": 5},
)


def tasks_of(text: str) -> list[dict[str, object]]:
    data, smap = load_yaml(text, "t.yaml")
    tool = expand(data, smap).data["workflow"][0]["tool"]
    assert isinstance(tool, list)
    return tool


def test_choose_is_a_router_with_a_merge_point_after_each_branch() -> None:
    tasks = tasks_of(LADDER)
    names = [t["name"] for t in tasks]
    assert names[:9] == [
        "init",
        "route",
        "route_when0_task_0",
        "route_when0_end",
        "route_when1_task_0",
        "route_when1_end",
        "fine",
        "route_end",
        "picked",
    ]
    assert tasks[1] == yaml(
        """
        name: route
        kind: noop
        spec:
          policy:
            rules:
              - when: "{{ workload.status == 404 }}"
                then: {do: jump, to: route_when0_task_0}
              - when: "{{ workload.status == 500 }}"
                then: {do: jump, to: route_when1_task_0}
              - else: {then: {do: jump, to: fine}}
        """
    )
    # no branch falls through into the next one
    assert tasks[3] == yaml(
        "{name: route_when0_end, kind: noop, spec: {policy: {rules: [{else: {then: {do: jump, to: route_end}}}]}}}"
    )
    assert tasks[7] == {"name": "route_end", "kind": "noop"}


def test_while_checks_first_and_until_checks_after_the_body() -> None:
    tasks = tasks_of(LADDER)
    names = [t["name"] for t in tasks]
    assert names[9:] == [
        "while_3",
        "while_3_task_0",
        "while_3_repeat",
        "while_3_end",
        "until_4",
        "bump",
        "until_4_until",
        "task_5",
    ]
    assert tasks[9]["spec"] == yaml(
        """
        policy:
          rules:
            - when: "{{ iter.n < 3 }}"
              then: {do: continue}
            - else: {then: {do: jump, to: while_3_end}}
        """
    )
    assert tasks[11]["spec"] == yaml("{policy: {rules: [{else: {then: {do: jump, to: while_3}}}]}}")
    assert tasks[13]["name"] == "until_4" and "spec" not in tasks[13]
    assert tasks[15]["spec"] == yaml(
        """
        policy:
          rules:
            - when: "{{ iter.n >= workload.until }}"
              then: {do: continue}
            - else: {then: {do: jump, to: until_4}}
        """
    )


def test_labels_are_stable_and_unnamed_pipeline_tasks_keep_their_synthetic_names() -> None:
    assert tasks_of(LADDER) == tasks_of(LADDER)
    result = compile_playbook(LADDER, "t.yaml")
    assert result.playbook is not None and not result.diagnostics
    assert result.playbook.workflow[0].tasks[-1].name == "task_5"  # its index in the authored list


@pytest.mark.parametrize(
    ("status", "until", "expected"),
    [
        (404, 5, {"picked": "missing", "n": 5}),
        (500, 0, {"picked": "broken", "n": 4}),
        (200, 7, {"picked": "fine", "n": 7}),
    ],
)
async def test_the_expansion_runs_the_branch_and_the_loops(
    runtime: Runtime, status: int, until: int, expected: dict[str, object]
) -> None:
    r = await run(runtime, LADDER, {"status": status, "until": until})
    assert r.status == "success", r.summary.error
    assert r.result == expected
    ran = [e.payload.get("task") for e in r.tasks("start")]
    assert ran.count("bump") == expected["n"] - 3  # type: ignore[operator]
    assert "route_end" in ran


NESTED = playbook(
    """
    - step: start
      tool:
        - choose:
            - when: "{{ workload.a }}"
              then:
                - choose:
                    - when: "{{ workload.b }}"
                      then: [{kind: noop, result: ab}]
                    - else: [{kind: noop, result: a}]
            - else:
                - until: "{{ true }}"
                  do: [{kind: noop, result: other}]
        - {kind: noop}
    """,
    workload={"a": True, "b": False},
)


def test_nested_blocks_get_labels_from_their_parents() -> None:
    assert [t["name"] for t in tasks_of(NESTED)] == [
        "choose_0",
        "choose_0_when0_choose_0",
        "choose_0_when0_choose_0_when0_task_0",
        "choose_0_when0_choose_0_when0_end",
        "choose_0_when0_choose_0_else_task_0",
        "choose_0_when0_choose_0_end",
        "choose_0_when0_end",
        "choose_0_else_until_0",
        "choose_0_else_until_0_task_0",
        "choose_0_else_until_0_until",
        "choose_0_end",
        "task_1",
    ]


async def test_nested_blocks_run(runtime: Runtime) -> None:
    for payload, expected in (({"a": True, "b": True}, "ab"), ({"a": True}, "a"), ({"a": False}, "other")):
        r = await run(runtime, NESTED, payload)
        assert (r.status, r.result) == ("success", expected), r.summary.error


@pytest.mark.parametrize(
    ("tool", "expected"),
    [
        pytest.param(
            "- choose:\n    - else: [{kind: noop}]\n    - when: '{{ true }}'\n      then: [{kind: noop}]\n",
            ["8:13: step 'start': the 'else' branch of choose must come last"],
            id="else-not-last",
        ),
        pytest.param(
            "- while: '{{ true }}'\n  do: []\n",
            ["8:9: step 'start': 'while' has an empty body"],
            id="empty-body",
        ),
        pytest.param(
            "- until: '{{ true }}'\n",
            ["7:9: step 'start': 'until' needs 'do: [tasks]' (the body)"],
            id="no-body",
        ),
        pytest.param(
            "- while: iter.more\n  do: [{kind: noop}]\n",
            ["7:9: step 'start': 'while' must be a template like \"{{ iter.has_more }}\" or a boolean"],
            id="plain-condition",
        ),
        pytest.param(
            "- choose: [{when: '{{ true }}', then: [{kind: noop}]}]\n  retry: 3\n",
            ["8:9: step 'start': unknown key 'retry' in a 'choose' block (allowed: choose, name)"],
            id="unknown-key",
        ),
        pytest.param(
            "- {name: pages_end, kind: noop}\n- name: pages\n  while: '{{ false }}'\n  do: [{kind: noop}]\n",
            ["8:15: step 'start': task label 'pages_end' is used twice in this pipeline (first at line 7)"],
            id="label-clash",
        ),
        pytest.param(
            "- while: '{{ true }}'\n  do:\n    - {kind: nope}\n",
            ["9:20: step 'start' task 'while_0_task_0': unknown tool kind 'nope'; did you mean 'noop'?"],
            id="error-inside-a-body-at-its-line",
        ),
    ],
)
def test_malformed_blocks_are_reported_at_their_position(tool: str, expected: list[str]) -> None:
    text = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: t, path: t}\nworkflow:\n  - step: start\n    tool:\n"
    text += "".join(f"      {line}\n" for line in tool.splitlines())
    assert [line.split(" (known: ")[0] for line in report(text)] == expected


def test_validate_show_canonical_prints_the_expansion(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "ladder.yaml"
    path.write_text(LADDER)
    out = CliRunner().invoke(main, ["validate", "--show-canonical", str(path)])
    assert out.exit_code == 0, out.output
    assert "- name: route_when0_end\n" in out.output
    assert '          - when: "{{ iter.n >= workload.until }}"\n' in out.output
    assert out.output.rstrip().endswith(f"{path}: ok (t, 1 steps)")
