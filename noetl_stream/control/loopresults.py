"""A distributed loop's result, assembled once when the loop ends.

The controller does not keep the iterations' results in the execution state (it would grow with the
items, and be re-encoded in every snapshot): they stay in their ``loop.iteration.done`` events. When
the reducer ends a loop it asks (`LoopResults`) for its ``loop.done`` to carry the list of results in
item order, ``null`` for a failed iteration (what the state's result dict gave before). The controller
reads the loop's iteration events back once, in stream order, keeping the first event of each index
(the one the reducer applied: later ones are duplicates it ignored), and passes each result through
as the encoded JSON it was stored as. A list above the message limit goes to the object store, and
``loop.done`` carries its reference, as any large result does.
"""

from __future__ import annotations

import time
from array import array
from typing import Any

import msgspec
import structlog
from nats.js.client import JetStreamContext

from noetl_stream.control.core.effects import LoopResults
from noetl_stream.kv.history import scan
from noetl_stream.kv.results import ResultStore
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event, encode, guarded

log = structlog.get_logger(__name__)

SAFE_MESSAGE_BYTES = 512 * 1024
"""Above this, the controller moves results into the object store (the server's default limit is 1 MiB)."""

_NAMES = (E.LOOP_ITERATION_DONE, E.LOOP_ITERATION_FAILED)
_NULL = b"null"


class _Payload(msgspec.Struct):
    index: Any = None
    result: msgspec.Raw = msgspec.Raw(_NULL)


class _Iteration(msgspec.Struct):
    """The fields of an iteration event the assembly reads (decoding skips the rest)."""

    name: str
    payload: _Payload
    step_run_id: str | None = None


_decode = guarded(msgspec.json.Decoder(_Iteration))


async def assemble(
    js: JetStreamContext, topology: Topology, execution_id: str, spec: LoopResults
) -> bytearray:
    """The JSON array of the loop's results in item order (``null`` for a failed iteration)."""
    total = spec.total
    if total == 0:
        return bytearray(b"[]")
    buf = bytearray()  # the results, in the order their events were stored
    starts = array("Q", bytes(8 * total))
    sizes = array("I", bytes(4 * total))  # 0: no event for this index (a JSON value is never empty)
    settled = 0

    def take(data: bytes) -> bool:
        nonlocal settled
        try:
            it = _decode(data)
            bytes(it.payload.result).decode()  # a result is skipped, not checked, by the decoder
        except (msgspec.DecodeError, UnicodeDecodeError):
            return True  # not an iteration event (or not valid UTF-8): the controller never applied it either
        index = it.payload.index
        if it.step_run_id != spec.step_run_id or not isinstance(index, int) or not 0 <= index < total:
            return True
        if sizes[index]:
            return True  # a duplicate: the reducer applied the first one
        raw = it.payload.result if it.name == E.LOOP_ITERATION_DONE else _NULL
        starts[index], sizes[index] = len(buf), len(raw)
        buf.extend(raw)
        settled += 1
        return settled < total  # every iteration settled: what follows are duplicates

    await scan(js, topology, execution_id, take, names=_NAMES, after_seq=spec.after_seq)
    out = bytearray(b"[")
    with memoryview(buf) as view:
        for i in range(total):
            if i:
                out += b","
            size = sizes[i]
            out += view[starts[i] : starts[i] + size] if size else _NULL
    out += b"]"
    return out


async def fit(results: ResultStore, ev: Event, data: bytes | None = None) -> tuple[Event, bytes]:
    """``ev`` encoded (``data``, if the caller has it); a result that makes it larger than the limit is
    moved to the object store (a boundary the controller writes itself with a large result)."""
    if data is None:
        data = encode(ev)
    if len(data) > SAFE_MESSAGE_BYTES and "result" in ev.payload:
        ref = await results.put(f"{ev.execution_id}/{ev.entity_id}/result", ev.payload["result"])
        ev = msgspec.structs.replace(ev, payload={**ev.payload, "result": ref})
        data = encode(ev)
    return ev, data


async def complete(
    js: JetStreamContext,
    topology: Topology,
    results: ResultStore,
    ev: Event,
    spec: LoopResults,
    limit: int = SAFE_MESSAGE_BYTES,
) -> Event:
    """``ev`` (the loop's ``loop.done``) with its ``result``: inline, or a reference when large."""
    started = time.perf_counter()
    data = await assemble(js, topology, ev.execution_id, spec)
    result: Any
    stored = len(encode(ev)) + len(data) + len(b'"result":,') > limit
    if stored:
        result = await results.put_encoded(f"{ev.execution_id}/{ev.entity_id}/result", data)
    else:
        result = msgspec.json.decode(data)
    log.info(
        "controller.loop_result",
        execution_id=ev.execution_id,
        step_run_id=spec.step_run_id,
        total=spec.total,
        size=len(data),
        stored=stored,
        seconds=round(time.perf_counter() - started, 3),
    )
    return msgspec.structs.replace(ev, payload={"result": result, **ev.payload})
