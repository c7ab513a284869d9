"""A distributed loop's result is assembled from the iteration events the reducer applied: a forged one
the controller refused (invalid UTF-8 in its result) is skipped too, not taken as the first for its
index (the loop's ``loop.done`` then failed to publish, for ever). Real nats-server."""

from __future__ import annotations

import msgspec

from noetl_stream.control.core.effects import LoopResults
from noetl_stream.control.loopresults import assemble
from noetl_stream.protocol import events as E
from noetl_stream.protocol.wire import Event, now_iso
from noetl_stream.runtime.local import Runtime


def iteration(index: int, result: object) -> bytes:
    return msgspec.json.encode(
        Event(
            event_id=f"asm:each-1.{index}:{E.LOOP_ITERATION_DONE}",
            execution_id="asm",
            name=E.LOOP_ITERATION_DONE,
            source="worker",
            entity_type="loop",
            entity_id=f"each-1.{index}",
            status="success",
            timestamp=now_iso(),
            step="each",
            step_run_id="each-1",
            payload={"index": index, "result": result},
        )
    )


async def test_an_iteration_event_with_invalid_utf8_is_not_assembled(runtime: Runtime) -> None:
    js, topology = runtime.nc.jetstream(), runtime.topology
    subject = topology.event_subject("asm", E.LOOP_ITERATION_DONE)
    forged = iteration(0, "FORGED").replace(b'"FORGED"', b'"\xff\xfe"')
    for data in (forged, iteration(0, "a"), iteration(1, {"b": 2})):
        await js.publish(subject, data)

    data = await assemble(js, topology, "asm", LoopResults("asm:each-1:loop.done", "each-1", 2, 0))

    assert msgspec.json.decode(data) == ["a", {"b": 2}]
