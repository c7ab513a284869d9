"""What a user reads when bytes from outside do not decode: our words, whatever msgspec's release says.

msgspec 0.23 changed what it raises for invalid UTF-8 inside a JSON string (a ``DecodeError`` with its own
text, where older releases raised ``UnicodeDecodeError``), and its messages change between releases. The
project classifies a failure from the bytes themselves (`noetl_stream.protocol.decoding`): each case below is
decoded for real, and then explained again from an exception saying nothing, which must read the same.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
import pytest

from noetl_stream.protocol.decoding import DecodingError, ShapeError, explain, shape_error
from noetl_stream.protocol.wire import Event, ExecutionRequest, decode_event, decode_json, decode_request


class Token(msgspec.Struct, forbid_unknown_fields=True):
    step: str
    args: dict[str, Any] = {}


class Shape(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    mode: Literal["fast", "safe"] = "fast"
    limit: int | None = None
    tokens: list[Token] = []
    extra: dict[str, Any] = {}


CASES = [
    pytest.param(b'{"name": "\xff"}', "utf8", "not valid UTF-8: byte 0xff at offset 10", id="utf8"),
    pytest.param(
        '{"name": "é'.encode()[:-1],
        "utf8",
        "not valid UTF-8: byte 0xc3 at offset 10",
        id="utf8-cut-in-a-character",
    ),
    pytest.param(b"", "json", "not valid JSON: it is empty", id="empty"),
    pytest.param(b" \n ", "json", "not valid JSON: it is empty", id="only-whitespace"),
    pytest.param(
        b'{"name": "x", "tokens": [',
        "json",
        "not valid JSON: it ends at offset 25, before its value is complete",
        id="truncated",
    ),
    pytest.param(
        b'{\n  "name": "x",\n  "limit": 3,,\n}',
        "json",
        "not valid JSON at line 3, column 14 (offset 30)",
        id="syntax",
    ),
    pytest.param(
        '{"name": "é", "limit": NaN}'.encode(),
        "json",
        "not valid JSON at line 1, column 24 (offset 24)",
        id="nan-after-a-two-byte-character",
    ),
    pytest.param(
        b'{"name": "x"} trailing', "json", "not valid JSON at line 1, column 15 (offset 14)", id="trailing"
    ),
    pytest.param(
        b'{"name": "\\ud800"}',
        "json",
        "not valid JSON: the string at line 1, column 10 (offset 9) holds an unpaired UTF-16 surrogate escape",
        id="unpaired-surrogate",
    ),
    pytest.param(
        b'{"extra": {"x": %s}}' % (b"[" * 5000 + b"]" * 5000), "depth", "JSON nested too deeply", id="deep"
    ),
    pytest.param(b"[]", "shape", "wrong shape at $: expected an object, got an array", id="not-an-object"),
    pytest.param(b'{"extra": {}}', "shape", "wrong shape at $: missing field 'name'", id="missing-field"),
    pytest.param(
        b'{"name": "x", "surprise": 1}', "shape", "wrong shape at $: unknown field 'surprise'", id="unknown"
    ),
    pytest.param(
        b'{"name": "x", "limit": "3"}',
        "shape",
        "wrong shape at $.limit: expected an integer or null, got a string",
        id="wrong-type",
    ),
    pytest.param(
        b'{"name": "x", "mode": "slow"}',
        "shape",
        "wrong shape at $.mode: expected one of 'fast', 'safe', got 'slow'",
        id="not-a-literal",
    ),
    pytest.param(
        b'{"name": "x", "tokens": [{"step": "a"}, {"step": true}]}',
        "shape",
        "wrong shape at $.tokens[1].step: expected a string, got true",
        id="inside-a-list",
    ),
    pytest.param(
        b'{"name": "x", "extra": {"a b": [1, 1e999]}}',
        "shape",
        'wrong shape at $.extra["a b"][1]: a number out of range',
        id="number-out-of-range",
    ),
]


@pytest.mark.parametrize(("raw", "kind", "message"), CASES)
def test_a_decode_failure_is_said_in_our_words(raw: bytes, kind: str, message: str) -> None:
    with pytest.raises(msgspec.DecodeError) as info:  # what every consumer catches
        decode_json(raw, Shape)

    error = info.value
    assert isinstance(error, DecodingError) and (error.kind, str(error)) == (kind, message)
    assert isinstance(error, msgspec.ValidationError) == (kind == "shape")


@pytest.mark.parametrize(("raw", "kind", "message"), CASES)
def test_the_words_do_not_depend_on_what_msgspec_said(raw: bytes, kind: str, message: str) -> None:
    """Explained from an exception with nothing in it (the fast path's decode already failed), a
    failure reads the same: nothing of msgspec's text or exception type is needed."""
    said_nothing = RecursionError() if kind == "depth" else msgspec.ValidationError("")
    assert str(explain(raw, said_nothing, Shape)) == message


def test_the_wire_decoders_name_the_field_path_of_a_message() -> None:
    with pytest.raises(msgspec.ValidationError) as info:
        decode_request(b'{"playbook": "x", "resume": {"execution_id": "e", "tokens": [{"step": 1}]}}')
    assert str(info.value) == "wrong shape at $.resume.tokens[0].step: expected a string, got an integer"

    with pytest.raises(msgspec.ValidationError) as info:
        decode_event(
            b'{"event_id": "e:s:n", "execution_id": "e", "name": "n", "source": "robot", "entity_type": "step", '
            b'"entity_id": "s", "status": "success", "timestamp": "t"}'
        )
    assert str(info.value) == "wrong shape at $.source: expected one of 'server', 'worker', got 'robot'"


def test_a_value_converted_from_a_record_is_explained_the_same_way() -> None:
    """The controller converts a recorded request (already decoded) with ``msgspec.convert``."""
    value = {"playbook": "x", "payload": [1, 2]}
    with pytest.raises(msgspec.ValidationError) as info:
        msgspec.convert(value, ExecutionRequest)

    error = shape_error(value, ExecutionRequest, info.value)
    assert isinstance(error, ShapeError)
    assert (error.path, str(error)) == (
        "$.payload",
        "wrong shape at $.payload: expected an object, got an array",
    )


def test_bytes_that_decode_are_decoded_as_they_were() -> None:
    assert decode_json(b'{"name": "x", "tokens": [{"step": "a"}]}', Shape) == Shape(
        name="x", tokens=[Token("a")]
    )
    ok = b'{"event_id": "e:s:n", "execution_id": "e", "name": "n", "source": "worker", "entity_type": "step"'
    ok += b', "entity_id": "s", "status": "success", "timestamp": "t"}'
    assert decode_event(ok) == msgspec.json.decode(ok, type=Event)


def test_the_path_into_a_value_nested_deep_stops_after_a_few_dozen_levels() -> None:
    """Each level down re-checks the part below it: a hostile message 900 levels deep cost a second of
    the controller's time. The path stops, and msgspec's detail says the rest."""
    inner = b"1e999"
    for _ in range(900):
        inner = b'["%s", %s]' % (b"x" * 100, inner)
    with pytest.raises(msgspec.ValidationError) as info:
        decode_json(b'{"name": "x", "extra": {"a": %s}}' % inner, Shape)

    path = str(info.value).removeprefix("wrong shape at ").split(": ", 1)[0]
    assert path == "$.extra.a" + "[1]" * path.count("[1]") and 20 < path.count("[1]") < 40, path
