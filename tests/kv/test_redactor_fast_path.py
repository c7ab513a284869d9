"""A redactor looks at a container whole before walking it (its MessagePack form holds every string, key
and bytes value as it is): what it returns is what the walk returns, for any value and any secrets, and a
container holding no secret comes back as it is (no copy)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from noetl_stream.kv.keychain import MASK, Redactor

TEXT = st.text(alphabet='ab"\\é€-1.0', max_size=8)
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2000, 2000),
    st.floats(allow_nan=False),
    TEXT,
    st.binary(max_size=6),
)
VALUES = st.recursive(
    LEAVES,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=16,
)


@settings(max_examples=600, deadline=None)
@given(value=VALUES, secrets=st.lists(st.one_of(TEXT, st.integers(0, 2000).map(str)), max_size=3))
def test_the_fast_look_returns_what_the_walk_returns(value: Any, secrets: list[str]) -> None:
    redactor = Redactor(secrets)
    assert redactor(value) == (redactor._walk(value) if redactor else value)


def test_a_container_without_secrets_is_returned_as_it_is_and_one_with_them_masked() -> None:
    redactor = Redactor({"s3cr3t-token"})
    clean = {"rows": [{"id": 1, "name": "a"}], "status": "ok"}
    assert redactor(clean) is clean
    dirty = {"rows": [{"id": 1, "note": "Bearer s3cr3t-token"}], b"k": [b"x s3cr3t-token"]}
    masked = redactor({"a": dirty})
    assert masked == {"a": {"rows": [{"id": 1, "note": f"Bearer {MASK}"}], b"k": [f"x {MASK}".encode()]}}
    assert dirty["rows"][0]["note"] == "Bearer s3cr3t-token"  # (the original is not changed)


def test_a_numeric_secret_is_masked_in_numbers() -> None:
    redactor = Redactor({"4711"})
    assert redactor({"pin": 4711, "other": [4711.5, "4711"]}) == {"pin": MASK, "other": [4711.5, MASK]}
