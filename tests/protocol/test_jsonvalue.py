"""The JSON form of Python values, and the wire encoder that uses it only for what it cannot encode."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from noetl_stream.protocol.jsonvalue import NotJSONError, to_json
from noetl_stream.protocol.wire import encode


class Name(str):
    """A ``str`` subclass, like the routing helpers' names."""


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (Name("step.done"), "step.done"),
        ({"n": Name("x"), 1: (1, 2)}, {"n": "x", "1": [1, 2]}),
        (range(3), [0, 1, 2]),
        ({3}, [3]),
        ((x for x in "ab"), ["a", "b"]),
        ({"a": 1}.items(), [["a", 1]]),
    ],
)
def test_values_with_a_json_form_are_converted(value: Any, expected: Any) -> None:
    converted = to_json(value)
    assert converted == expected
    assert type(converted) is type(expected)
    assert msgspec.json.decode(encode(converted)) == expected


def test_plain_json_is_returned_as_it_is() -> None:
    value = {"a": [1, {"b": None}], "c": "d"}
    assert to_json(value) is value


@pytest.mark.parametrize(("value", "where"), [(object(), ""), ({"a": [1, len]}, " at a[1]")])
def test_a_value_without_a_json_form_names_its_type_and_place(value: Any, where: str) -> None:
    with pytest.raises(NotJSONError) as info:
        to_json(value)
    name = type(value).__name__ if not where else "builtin_function_or_method"
    assert str(info.value) == f"a value of type '{name}'{where} is not JSON"


def test_the_wire_encoder_converts_str_subclasses_and_ranges() -> None:
    assert msgspec.json.decode(encode({"n": Name("a"), "r": range(2)})) == {"n": "a", "r": [0, 1]}
    with pytest.raises(NotJSONError):
        encode({"o": object()})
