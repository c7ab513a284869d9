"""The items of a distributed loop, kept out of the execution state.

A distributed loop's ``in`` is rendered once, when the loop starts, and packed: each item encoded as
JSON, one per line (JSON never holds a raw newline). Small packs stay in the state (`LoopRun.items`);
larger ones are stored once, immutably, in the results object store (the controller writes them
before it publishes anything that depends on them, and deletes them when the loop finishes, or after the
final snapshot of an execution that ends mid-loop) and the state keeps their key and checksum. The
reducer reads items from `LoopItems`, a cache by execution and step run that the controller fills
from the object store before it folds a resumed execution (as it compiles a resumed execution's plan).

Items are dispatched in order, so `Packed` keeps a cursor: reading the next item costs one ``find``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import msgspec

from noetl_stream.errors import NoetlError

INLINE_ITEMS_BYTES = 16 * 1024
"""Packed items up to this size stay in the execution state; larger ones go to the object store."""

_encoder = msgspec.json.Encoder()
_NL = b"\n"


class ItemsMissingError(NoetlError, LookupError):
    """The items of a running distributed loop are not loaded (the controller loads them first)."""


def pack(items: Iterable[Any]) -> bytearray:
    """Items as JSON lines (no trailing newline). Raises ``TypeError`` for a value JSON cannot hold.

    A bytearray, not copied into bytes: the rendered list is still alive while this runs (the peak
    memory of a loop's start); whoever stores it copies it once the list is gone."""
    buf = bytearray()
    first = True
    for item in items:
        if not first:
            buf += _NL
        first = False
        try:
            _encoder.encode_into(item, buf, -1)
        except msgspec.EncodeError as exc:
            raise TypeError(str(exc)) from None
    return buf


def checksum(data: bytes | bytearray) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Packed:
    """Random access to packed items, cheap when sequential (a cursor remembers the last line)."""

    __slots__ = ("_at", "_index", "data")

    def __init__(self, data: bytes | bytearray) -> None:
        self.data = data
        self._index = 0
        self._at = 0

    def __getitem__(self, index: int) -> Any:
        data = self.data
        if index < self._index:
            self._index, self._at = 0, 0
        at = self._at
        while self._index < index:
            at = data.index(_NL, at) + 1
            self._index += 1
        self._at = at
        end = data.find(_NL, at)
        return msgspec.json.decode(data[at : end if end >= 0 else len(data)])


class LoopItems:
    """Packed items of the running distributed loops, by execution and step run."""

    def __init__(self) -> None:
        self._items: dict[str, dict[str, Packed]] = {}

    def put(self, execution_id: str, run_id: str, data: bytes | bytearray) -> None:
        self._items.setdefault(execution_id, {})[run_id] = Packed(data)

    def get(self, execution_id: str, run_id: str) -> Packed | None:
        return self._items.get(execution_id, {}).get(run_id)

    def drop(self, execution_id: str, run_id: str) -> None:
        runs = self._items.get(execution_id)
        if runs is not None:
            runs.pop(run_id, None)
            if not runs:
                del self._items[execution_id]

    def forget(self, execution_id: str) -> None:
        self._items.pop(execution_id, None)

    def __len__(self) -> int:
        return sum(len(runs) for runs in self._items.values())
