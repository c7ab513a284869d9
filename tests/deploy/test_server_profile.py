"""bench.server_profile reads nats-server's pprof CPU profiles without a Go toolchain."""

from __future__ import annotations

import gzip

from bench.server_profile import read_profile, report


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _packed(*values: int) -> bytes:
    return b"".join(_varint(v) for v in values)


def _profile() -> bytes:
    strings = ["", "samples", "count", "cpu", "nanoseconds", "main.loop", "store.write"]
    functions = [_field(1, 1) + _field(2, 5), _field(1, 2) + _field(2, 6)]  # id, name (string index)
    # Location 10 is in store.write, called from location 20 in main.loop.
    locations = [_field(1, 10) + _field(4, _field(1, 2)), _field(1, 20) + _field(4, _field(1, 1))]
    samples = [
        _field(1, _packed(10, 20)) + _field(2, _packed(3, 300)),  # location ids (innermost first), values
        _field(1, 20) + _field(2, 1) + _field(2, 100),  # unpacked repeated fields
    ]
    body = b"".join(
        [_field(2, s) for s in samples]
        + [_field(4, loc) for loc in locations]
        + [_field(5, fn) for fn in functions]
        + [_field(6, s.encode()) for s in strings]
        + [_field(9, 123)]  # time_nanos: a field the reader skips
    )
    return body


def test_own_and_total_weights_come_from_the_last_sample_value() -> None:
    for data in (_profile(), gzip.compress(_profile())):
        profile = read_profile(data)
        assert profile.weight == 400
        assert profile.own() == {"store.write": 300, "main.loop": 100}
        assert profile.total() == {"main.loop": 400, "store.write": 300}
        text = report(profile, 5)
        assert " 75.0 %  store.write" in text
        assert "100.0 %  main.loop" in text
