"""Property tests: whatever text comes in, the compiler answers with diagnostics, never a crash or a hang."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from noetl_stream.dsl import CompileResult, PlaybookError, compile_playbook, load_playbook

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"

BASE = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: base
  path: tests/base
  description: every construct, so that mutations reach every parser
keychain:
  - name: pg
    kind: postgres_credential
executor:
  spec:
    timeout: {read: 30}
    policy:
      defaults: {}
workload:
  endpoints: [{path: /a, page_size: 2}]
  n: 3
workbook:
  tasks:
    ping:
      kind: noop
workflow:
  - step: start
    desc: first step
    spec:
      policy:
        admit:
          rules:
            - when: "{{ workload.n > 0 }}"
              then: {allow: true}
            - else:
                then: {allow: false}
        lifecycle: {timeout_s: 60}
        failure: {mode: best_effort}
    loop:
      in: "{{ workload.endpoints }}"
      iterator: endpoint
      spec:
        mode: parallel
        max_in_flight: 2
        policy: {exec: local}
    tool:
      - name: init
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: {do: continue, set_iter: {page: 1}}
      - name: fetch
        kind: python
        args: {page: "{{ iter.page }}", path: "{{ iter.endpoint.path }}"}
        code: |
          result = {"page": page, "more": page < 3}
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                then: {do: retry, attempts: 3, backoff: exponential, delay: 0.1}
              - when: "{{ outcome.result.more }}"
                then: {do: jump, to: fetch, set_iter: {page: "{{ iter.page + 1 }}"}}
              - else:
                  then: {do: break, set_ctx: {done: true}}
    next:
      spec: {mode: exclusive}
      arcs:
        - step: report
          when: "{{ event.name == 'loop.done' }}"
          args: {n: "{{ workload.n }}"}
        - step: cleanup
          when: "{{ event.name == 'step.failed' }}"
  - step: report
    tool:
      kind: duckdb
      query: "SELECT {{ args.n }} AS n"
  - step: cleanup
    tool:
      - done:
          kind: noop
"""


def _bases() -> list[str]:
    texts = [BASE]
    texts += [p.read_text(encoding="utf-8") for p in sorted(PLAYBOOKS.glob("*.yaml"))]
    return texts


BASES = _bases()
_yaml = YAML(typ="safe", pure=True)
BASE_DATA = [_yaml.load(text) for text in BASES]

SETTINGS = settings(
    max_examples=int(os.environ.get("NOETL_FUZZ_EXAMPLES", "120")),  # raise it for a longer hunt
    deadline=timedelta(seconds=2),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)


def check(text: str) -> CompileResult:
    """The compiler's contract, for any input."""
    result = compile_playbook(text, "fuzz.yaml")
    assert isinstance(result, CompileResult)
    assert (result.playbook is None) == bool(result.errors) or result.playbook is None
    if result.playbook is None:
        assert result.errors, "a rejected playbook comes with at least one error"
    last = max(1, len(text.splitlines()) + 1)
    for d in result.diagnostics:
        assert 1 <= d.line <= last and d.col >= 1, d.format()
        assert d.format().startswith(f"fuzz.yaml:{d.line}:{d.col}: ")
    try:
        load_playbook(text, "fuzz.yaml")
    except PlaybookError as exc:
        assert exc.errors
    return result


YAML_BITS = st.sampled_from(
    [
        ":",
        ": ",
        "- ",
        "-",
        "{",
        "}",
        "[",
        "]",
        ",",
        "&a ",
        "*a",
        "!!str ",
        "!!binary ",
        "!custom ",
        "? ",
        "|",
        ">-",
        "#",
        "'",
        '"',
        "\t",
        "\n",
        "\n  ",
        "{{",
        "}}",
        "{%",
        "%}",
        "{{ x }}",
        "---",
        "...",
        "%YAML 1.2\n",
        "<<: *a",
        "step",
        "tool",
        "kind",
        "next",
        "arcs",
        "when",
        "workflow",
        "\x00",
        "\ufeff",
    ]
)


@SETTINGS
@given(st.lists(st.one_of(YAML_BITS, st.text(max_size=8)), max_size=40).map("".join))
def test_random_yamlish_text_never_crashes(text: str) -> None:
    check(text)


@SETTINGS
@given(st.text(max_size=300))
def test_random_unicode_never_crashes(text: str) -> None:
    check(text)


LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-5, max_value=10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(
        [
            "{{",
            "{{ x }}",
            "{{ workload.n + }}",
            "{% for %}",
            "start",
            "report",
            "fetch",
            "retry",
            "jump",
            "exclusive",
            "parallel",
            "noop",
            "python",
            "http",
            "task_0",
            "-1",
        ]
    ),
)
VALUES = st.recursive(
    LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.one_of(st.text(max_size=6), st.sampled_from(["kind", "name", "then"])), inner, max_size=3
        ),
    ),
    max_leaves=8,
)


def _containers(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path] if isinstance(node, (dict, list)) else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _containers(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _containers(v, (*path, i))
    return out


def _at(node: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        node = node[part]
    return node


def _mutate(data: Any, draw: st.DrawFn) -> Any:
    data = json.loads(json.dumps(data))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        paths = _containers(data)
        if not paths:
            return draw(VALUES)
        target = _at(data, draw(st.sampled_from(paths)))
        keys = list(target) if isinstance(target, dict) else list(range(len(target)))
        op = draw(st.sampled_from(["delete", "replace", "duplicate", "rename", "insert"]))
        if not keys:
            op = "insert"
        key = draw(st.sampled_from(keys)) if keys else None
        if op == "delete" and key is not None:
            del target[key]
        elif op == "replace" and key is not None:
            target[key] = draw(VALUES)
        elif op == "duplicate" and key is not None:
            if isinstance(target, list):
                target.insert(key, json.loads(json.dumps(target[key])))
            else:
                target[f"{key}_copy"] = target[key]
        elif op == "rename" and isinstance(target, dict) and key is not None:
            target[draw(st.text(min_size=1, max_size=8))] = target.pop(key)
        elif isinstance(target, list):
            target.insert(draw(st.integers(0, len(target))), draw(VALUES))
        else:
            target[draw(st.text(max_size=8))] = draw(VALUES)
    return data


def _dump(data: Any, block: bool) -> str:
    if not block:
        return json.dumps(data)
    stream = StringIO()
    dumper = YAML(typ="safe", pure=True)
    dumper.default_flow_style = False
    dumper.dump(data, stream)
    return stream.getvalue()


@SETTINGS
@given(st.data())
def test_mutated_playbooks_never_crash(data: st.DataObject) -> None:
    base = data.draw(st.sampled_from(BASE_DATA))
    mutated = _mutate(base, data.draw)
    text = _dump(mutated, data.draw(st.booleans()))
    check(text)


@SETTINGS
@given(st.data())
def test_edited_playbook_text_never_crashes(data: st.DataObject) -> None:
    text = data.draw(st.sampled_from(BASES))
    lines = text.splitlines(keepends=True)
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        if not lines:
            break
        i = data.draw(st.integers(0, len(lines) - 1))
        op = data.draw(
            st.sampled_from(["truncate", "drop", "duplicate", "indent", "dedent", "insert", "swap"])
        )
        if op == "truncate":
            cut = data.draw(st.integers(0, len("".join(lines))))
            lines = "".join(lines)[:cut].splitlines(keepends=True)
        elif op == "drop":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "indent":
            lines[i] = "  " + lines[i]
        elif op == "dedent":
            lines[i] = lines[i][2:] if lines[i].startswith("  ") else lines[i]
        elif op == "insert":
            col = data.draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:col] + data.draw(YAML_BITS) + lines[i][col:]
        else:
            j = data.draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
    check("".join(lines))


def test_the_unmutated_bases_are_valid() -> None:
    for text in BASES:
        result = check(text)
        assert result.playbook is not None, [d.format() for d in result.diagnostics]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("levels", [6, 9, 30])
def test_an_alias_bomb_is_too_large_not_a_hang(levels: int) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for n in range(1, levels):
        refs = ", ".join([f"*a{n - 1}"] * 10)
        lines.append(f"a{n}: &a{n} [{refs}]")
    result = check("\n".join(lines) + "\n")
    assert [d.format() for d in result.diagnostics] == [
        "fuzz.yaml:1:1: document is too large (more than 200000 nodes after alias expansion) (at <root>)"
    ]


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "text",
    [
        "workload: " + "[" * 3000 + "]" * 3000 + "\n",
        "workload: " + "{a: " * 500 + "1" + "}" * 500 + "\n",
        "workload:\n  " + "- " * 400 + "x\n",
        "".join(f"{'  ' * n}k{n}:\n" for n in range(300)),
    ],
    ids=["flow-sequences", "flow-mappings", "block-sequences", "block-mappings"],
)
def test_deep_nesting_is_reported_not_a_crash(text: str) -> None:
    result = check(text)
    [error] = result.errors
    assert error.message.startswith("document is nested too deeply")
