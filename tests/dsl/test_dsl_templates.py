"""Template rendering: native values, strict names, chains with defaults, the sandbox."""

from __future__ import annotations

from typing import Any

import pytest

from noetl_stream.dsl import RenderError, evaluate_when, render_value
from noetl_stream.dsl.templates import compile_template

SCOPE: dict[str, Any] = {
    "workload": {"n": 3, "name": "demo", "items": [1, 2], "flags": {"on": True}},
    "ctx": {"total": 10},
    "iter": {"page": 2, "endpoint": {"path": "/a"}},
    "outcome": {"status": "ok", "result": {"data": {"rows": []}}},
    "fetch": {"items": ["from", "the", "result"], "data": {"count": 7}},
    "execution_id": "e-1",
}


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{ workload.n }}", 3),
        ("{{ workload.items }}", [1, 2]),
        ("{{ workload.flags }}", {"on": True}),
        ("{{ workload.n > 2 }}", True),
        ("{{ none }}", None),
        ("  {{ workload.items | length }}  ", 2),
        ("{{ (iter.page | int) + 1 }}", 3),
        ("{{ {'page': iter.page, 'path': iter.endpoint.path} }}", {"page": 2, "path": "/a"}),
        ("{{ range(3) | list }}", [0, 1, 2]),
    ],
)
def test_a_single_expression_renders_its_native_value(template: str, expected: Any) -> None:
    value = render_value(template, SCOPE)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("page {{ iter.page }}", "page 2"),
        ("{{ workload.n }}{{ workload.n }}", "33"),
        ("{{ workload.name ~ '-' ~ workload.n }}", "demo-3"),
        ("{% if ctx.total > 5 %}big{% else %}small{% endif %}", "big"),
        ("/api{{ iter.endpoint.path }}?page={{ iter.page }}", "/api/a?page=2"),
        ("no template at all", "no template at all"),
    ],
)
def test_text_around_or_between_expressions_renders_a_string(template: str, expected: str) -> None:
    assert render_value(template, SCOPE) == expected


def test_values_inside_lists_and_mappings_are_rendered() -> None:
    value = {"ids": ["{{ workload.n }}", "x"], "nested": {"items": "{{ workload.items }}", "k": 1}}
    assert render_value(value, SCOPE) == {"ids": [3, "x"], "nested": {"items": [1, 2], "k": 1}}


def test_an_undefined_name_fails_with_where_it_was_read() -> None:
    with pytest.raises(RenderError) as info:
        render_value({"args": {"n": "{{ nope + 1 }}"}}, SCOPE, "step 'calc' task 'run'")
    assert str(info.value) == "step 'calc' task 'run'.args.n: 'nope' is undefined"


def test_a_missing_key_fails_when_its_value_is_used() -> None:
    with pytest.raises(RenderError) as info:
        render_value("{{ workload.missing }}", SCOPE)
    assert info.value.message == "no key 'missing' in the mapping"


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{{ workload.items[5] }}", "no item 5 in the list of 2"),
        ("{{ workload.n.digits }}", "a value of type 'int' has no attribute 'digits'"),
        ("{{ workload.n[0] }}", "a value of type 'int' has no item 0"),
    ],
)
def test_what_is_not_there_is_said_in_our_words(template: str, message: str) -> None:
    with pytest.raises(RenderError) as info:
        render_value(template, SCOPE)
    assert info.value.message == message


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{ outcome.result.data.paging.hasMore | default(false) }}", False),
        ("{{ outcome.result.data.paging.page | default(iter.page) }}", 2),
        ("{{ outcome.http.status | default(200) }}", 200),
        ("{{ outcome.result.data.rows | default([1]) }}", []),
    ],
)
def test_default_works_at_the_end_of_a_chain_of_missing_keys(template: str, expected: Any) -> None:
    assert render_value(template, SCOPE) == expected


def test_attribute_access_on_a_mapping_reads_the_key_first() -> None:
    assert render_value("{{ fetch.items }}", SCOPE) == ["from", "the", "result"]
    assert render_value("{{ fetch.data.count }}", SCOPE) == 7


@pytest.mark.parametrize(
    "template",
    [
        "{{ workload.__class__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ workload.items.append(3) }}",
        "{{ ctx.update({'total': 0}) }}",
    ],
)
def test_the_sandbox_blocks_internals_and_mutation(template: str) -> None:
    with pytest.raises(RenderError) as info:
        render_value(template, SCOPE)
    assert info.value.message.startswith("not allowed in a template: access to attribute")
    assert SCOPE["workload"]["items"] == [1, 2]
    assert SCOPE["ctx"] == {"total": 10}


def test_a_syntax_error_at_render_time_is_a_render_error() -> None:
    with pytest.raises(RenderError) as info:
        render_value("{{ workload.n + }}", SCOPE, "arc")
    assert str(info.value).startswith("arc: template syntax error: ")  # then Jinja's account of it


def test_runtime_errors_inside_expressions_are_render_errors() -> None:
    with pytest.raises(RenderError) as info:
        render_value("{{ workload.n / 0 }}", SCOPE)
    assert info.value.message == "ZeroDivisionError: division by zero"


def test_templates_are_compiled_once() -> None:
    source = "{{ workload.n * 7 }}"
    assert compile_template(source) is compile_template(source)
    assert render_value(source, SCOPE) == 21


@pytest.mark.parametrize(
    ("when", "expected"),
    [
        (None, True),
        (True, True),
        (False, False),
        ("{{ ctx.total > 5 }}", True),
        ("{{ ctx.total > 50 }}", False),
        ("{{ 0 }}", False),
        ("{{ [] }}", False),
        ("{{ 'false' }}", False),
        ("{{ 'False' }}", False),
        ("{{ workload.name }}", True),
    ],
)
def test_evaluate_when(when: Any, expected: bool) -> None:
    assert evaluate_when(when, SCOPE) is expected


def test_a_when_reading_an_undefined_name_fails_loudly() -> None:
    with pytest.raises(RenderError) as info:
        evaluate_when("{{ missing_flag }}", SCOPE, "next.arcs[0].when")
    assert str(info.value) == "next.arcs[0].when: 'missing_flag' is undefined"


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{ (ctx.items | default([])) | length }}", 0),  # failed: "builtin_function_or_method has no len()"
        ("{{ ctx.keys | default('none') }}", "none"),
        ("{{ ctx.items is defined }}", False),
        ("{{ ctx.values is undefined }}", True),
        ("{{ ctx.items() | list }}", [["total", 10]]),  # the method, when called
        ("{{ ctx.get('missing', 5) }}", 5),
        ("{{ ctx.keys() | list }}", ["total"]),
        ("{{ fetch.items }}", ["from", "the", "result"]),  # a key of that name wins
    ],
)
def test_a_missing_key_named_like_a_mapping_method_is_undefined_unless_called(
    template: str, expected: Any
) -> None:
    assert render_value(template, SCOPE) == expected


def test_using_a_missing_key_named_like_a_method_says_the_key_is_missing() -> None:
    with pytest.raises(RenderError, match="no key 'items'"):
        render_value("{{ ctx.items | length }}", SCOPE)
    with pytest.raises(RenderError):  # calling a mutating method is still refused by the sandbox
        render_value("{{ ctx.update({'a': 1}) }}", SCOPE)
    assert SCOPE["ctx"] == {"total": 10}
