"""Reading one execution's events back from the events stream (replay, resume, inspection)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

import nats.errors
from nats.js import api
from nats.js.client import JetStreamContext

from noetl_stream.errors import NoetlError
from noetl_stream.subjects import Topology
from noetl_stream.wire import Event, decode_event


class HistoryReadError(NoetlError):
    """An execution's history could not be read completely (never mistaken for a shorter history)."""


async def read_events(
    js: JetStreamContext,
    topology: Topology,
    execution_id: str,
    *,
    names: Iterable[str] | None = None,
    after_seq: int = 0,
    before_seq: int | None = None,
    batch: int = 500,
) -> AsyncIterator[tuple[int, Event]]:
    """Yield ``(stream sequence, event)`` of one execution in stream order.

    ``names`` restricts to some event names (e.g. the controller's inputs). Reads with an
    ephemeral pull consumer that is deleted at the end; stops at the stream's end or ``before_seq``.
    """
    if names is None:
        filters = [topology.events_filter(execution_id)]
    else:
        filters = sorted(topology.stored_event_filter(execution_id, n) for n in names)
    config = api.ConsumerConfig(
        ack_policy=api.AckPolicy.NONE,
        deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE if after_seq else api.DeliverPolicy.ALL,
        opt_start_seq=after_seq + 1 if after_seq else None,
        inactive_threshold=5.0,
        mem_storage=True,
        filter_subjects=filters if len(filters) > 1 else None,
        filter_subject=filters[0] if len(filters) == 1 else None,
    )
    sub = await js.pull_subscribe(
        filters[0] if len(filters) == 1 else "", stream=topology.events_stream, config=config
    )
    name = None
    try:
        info = await sub.consumer_info()
        name = info.name
        remaining = info.num_pending or 0
        while remaining > 0:
            try:
                msgs = await sub.fetch(min(batch, remaining), timeout=5)
            except (TimeoutError, nats.errors.TimeoutError):
                raise HistoryReadError(
                    f"execution {execution_id}: {remaining} events could not be read from {topology.events_stream}"
                ) from None
            for msg in msgs:
                remaining -= 1
                seq = msg.metadata.sequence.stream
                if before_seq is not None and seq >= before_seq:
                    return
                yield seq, decode_event(msg.data)
    finally:
        try:
            await sub.unsubscribe()
            if name:
                await js.delete_consumer(topology.events_stream, name)
        except Exception:
            pass
