"""The connection's header parser (`jetstream.fastpath.parse_header_lines`) reads every header block as nats-py's own does."""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from noetl_stream.jetstream.fastpath import parse_header_lines

_PIECES = st.sampled_from(
    [
        b"Nats-Msg-Id",
        b": ",
        b":",
        b"\r\n",
        b" ",
        b"\t",
        b"\x1c",
        b"\x0b",
        b"a",
        b"\xff",
        b"\xc3\xa9",
        b"-",
        b"\r",
        b"\n",
    ]
)


@settings(max_examples=2000)
@given(st.lists(st.one_of(_PIECES, st.binary(max_size=6)), max_size=24).map(b"".join))
def test_any_header_block_parses_as_nats_py_parses_it(raw: bytes) -> None:
    assert parse_header_lines(raw) == NATS._parse_header_lines(raw)


def test_each_ascii_character_in_a_name_is_kept_or_dropped_as_nats_py_does() -> None:
    for code in range(128):
        for raw in (b"a%cb: v\r\n" % code, b"%c: v\r\n" % code, b"x: %cv%c\r\n" % (code, code)):
            assert parse_header_lines(raw) == NATS._parse_header_lines(raw), raw


async def test_a_delivery_on_a_connection_of_the_runtime_has_its_headers(
    nc: NATS, js: JetStreamContext
) -> None:
    assert nc._parse_header_lines is parse_header_lines  # type: ignore[comparison-overlap]
    name = "HD" + uuid.uuid4().hex[:8].upper()
    await js.add_stream(name=name, subjects=[f"{name}.>"])
    try:
        await js.publish(f"{name}.x", b"1", headers={"Nats-Msg-Id": "id-1", "X-Other": "caf\u00e9 ok"})
        sub = await js.pull_subscribe(f"{name}.x", durable="d", stream=name)
        (msg,) = await sub.fetch(1, timeout=5)
        assert msg.headers == {"Nats-Msg-Id": "id-1", "X-Other": "caf\u00e9 ok"}
    finally:
        await js.delete_stream(name)
