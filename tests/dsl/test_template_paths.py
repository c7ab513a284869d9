"""A template that is a name and keys (``{{ iter.n }}``, ``{{ workload.rows[0]['id'] }}``) is looked up
directly, without the template engine (the most common template in a loop's task), and so is text around
such paths (``item-{{ iter.i }}``). Its value, and its error when the path is not there, are the engine's:
checked against the same lookup written so the engine evaluates it (``{{ [path][0] }}``)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from noetl_stream.dsl.templates import RenderError, compile_template, render_value
from noetl_stream.dsl.views import ResultView

KEYS = st.sampled_from(["a", "b", "items", "keys", "n", "rows", "_x"])
LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=3))
VALUES = st.recursive(
    LEAVES,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(KEYS, inner, max_size=4)),
    max_leaves=12,
)
STEPS = st.lists(
    st.one_of(
        KEYS.map(lambda k: f".{k}"),
        KEYS.map(lambda k: f"['{k}']"),
        st.integers(-3, 3).map(lambda i: f"[{i}]"),
    ),
    max_size=4,
)


def outcome(source: str, scope: dict[str, Any]) -> tuple[str, Any]:
    try:
        return "value", render_value(source, scope, "t")
    except RenderError:
        return "error", None


@settings(max_examples=400, deadline=None)
@given(scope=st.dictionaries(KEYS, VALUES, max_size=4), name=KEYS, steps=STEPS)
def test_a_path_reads_what_the_engine_reads(scope: dict[str, Any], name: str, steps: list[str]) -> None:
    path = name + "".join(steps)
    assert outcome(f"{{{{ {path} }}}}", scope) == outcome(f"{{{{ [{path}][0] }}}}", scope)


@settings(max_examples=300, deadline=None)
@given(
    scope=st.dictionaries(KEYS, VALUES, max_size=4),
    paths=st.lists(st.tuples(KEYS, STEPS), min_size=1, max_size=3),
    text=st.text(alphabet="ab-/ {}%\n", max_size=4),
)
def test_text_around_paths_reads_what_the_engine_reads(
    scope: dict[str, Any], paths: list[tuple[str, list[str]]], text: str
) -> None:
    exprs = [name + "".join(steps) for name, steps in paths]
    direct = text.join(f"{{{{ {e} }}}}" for e in exprs) + text
    engine = text.join(f"{{{{ [{e}][0] }}}}" for e in exprs) + text
    if "{{" in text or "{%" in text or "{#" in text:
        return  # (not text around paths)
    assert outcome(direct, scope) == outcome(engine, scope)


@pytest.mark.parametrize(
    ("path", "expected"),
    [("iter.n", 3), ("iter['n']", 3), ("rows[1].id", 2), ("rows[-1]['id']", 2), ("ctx.items", [1])],
)
def test_paths_of_a_loops_scope(path: str, expected: Any) -> None:
    scope = {"iter": {"n": 3}, "rows": [{"id": 1}, {"id": 2}], "ctx": {"items": [1]}}
    assert compile_template(f"{{{{ {path} }}}}").render(scope) == expected


def test_a_view_in_the_path_is_read_as_the_engine_reads_it() -> None:
    envelope = {"status_code": 200, "headers": {}, "url": "u", "elapsed": 0.1, "data": {"id": 7}}
    scope = {"fetch": ResultView(envelope)}
    for path in ("fetch.data.id", "fetch.body.id", "fetch.status_code", "fetch.data", "fetch"):
        assert outcome(f"{{{{ {path} }}}}", scope) == outcome(f"{{{{ [{path}][0] }}}}", scope), path


def test_a_missing_name_or_key_is_the_engines_error() -> None:
    scope = {"iter": {"n": 3}}
    for path in ("nothing", "iter.m", "iter.n.x", "iter[0]", "range"):
        kind, _ = outcome(f"{{{{ {path} }}}}", scope)
        assert (kind, path) == (outcome(f"{{{{ [{path}][0] }}}}", scope)[0], path)
