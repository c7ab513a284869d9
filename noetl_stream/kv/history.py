"""Reading one execution's events back from the events stream (replay, resume, inspection)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable

import msgspec
import nats.errors
import structlog
from nats.aio.msg import Msg
from nats.js import api
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from noetl_stream.errors import NoetlError
from noetl_stream.jetstream.fastpath import num_pending
from noetl_stream.protocol import events as E
from noetl_stream.protocol.carried import expand, subject_names
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event, decode_event

log = structlog.get_logger(__name__)


class HistoryReadError(NoetlError):
    """An execution's history could not be read completely (never mistaken for a shorter history)."""


async def last_event(js: JetStreamContext, topology: Topology, execution_id: str, name: str) -> Event | None:
    """The execution's last stored event named `name` (one read of its subject), or None: none is stored,
    or what is stored is not an event (logged; the controller refused it too)."""
    if name in E.CARRIED_EVENTS:
        raise ValueError(f"last_event reads one subject: a '{name}' event may be carried (read_events)")
    subject = topology.stored_event_filter(execution_id, name)
    try:
        raw = await js.get_last_msg(topology.events_stream, subject)
    except NotFoundError:
        return None
    try:
        return decode_event(raw.data or b"")
    except msgspec.DecodeError as exc:  # ValidationError included
        log.warning("history.bad_record", subject=raw.subject, seq=raw.seq, error=str(exc))
        return None


def end_status(finished: Event) -> str:
    """How an execution ended, from its ``workflow.finished``: ``success``, ``failed``, ``cancelled``..."""
    return str(finished.payload.get("status") or finished.status)


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
    """Yield ``(stream sequence, event)`` of one execution in stream order; the events one message carries
    (`carried.expand`) come out one by one, before their carrier and with its sequence.

    ``names`` restricts to some event names (e.g. the controller's inputs). Reads with an
    ephemeral pull consumer that is deleted at the end; stops at the stream's end or ``before_seq``.
    A stored message that is not an event (anyone who may publish on the events subjects can store
    one) is skipped and logged, as the controller's consumer terminates it: it was never applied, so
    a fold without it is the live projection, and one bad message does not stop an execution's resume.
    """
    wanted = None if names is None else frozenset(names)
    carried_wanted = wanted is None or bool(wanted & E.MAY_BE_CARRIED)
    filters = _filters(topology, execution_id, None if wanted is None else subject_names(wanted))
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
                try:
                    event = decode_event(msg.data)
                except msgspec.DecodeError as exc:  # ValidationError included
                    log.warning("history.bad_event", subject=msg.subject, seq=seq, error=str(exc))
                    continue
                if event.execution_id != execution_id:  # stored on its subject by someone else
                    log.warning(
                        "history.bad_event",
                        subject=msg.subject,
                        seq=seq,
                        error=f"an event of execution {event.execution_id} on this execution's subject",
                    )
                    continue
                if not event.carried:
                    if wanted is None or event.name in wanted:
                        yield seq, event
                    continue
                if not carried_wanted:  # (what it carries is not asked for: not decoded)
                    if event.name in wanted:  # type: ignore[operator]
                        yield seq, msgspec.structs.replace(event, carried=[])
                    continue
                for one in expand(event):
                    if wanted is None or one.name in wanted:
                        yield seq, one
    finally:
        try:
            await sub.unsubscribe()
            if name:
                await js.delete_consumer(topology.events_stream, name)
        except Exception:
            pass


async def scan(
    js: JetStreamContext,
    topology: Topology,
    execution_id: str,
    on_event: Callable[[bytes], bool],
    *,
    names: Iterable[str] | None = None,
    after_seq: int = 0,
    idle_timeout_s: float = 5.0,
) -> None:
    """Call ``on_event`` with each encoded event of the execution (of ``names``), in stream order, from
    after ``after_seq`` to the end of the stream as it is now; stop early when it returns False.

    For long histories read whole (a distributed loop's iterations): an ordered push consumer, several
    times faster than `read_events`' pull fetches (no task and timer per message), and nothing is
    buffered beyond what ``on_event`` keeps (it runs as each message arrives, under flow control).
    Raises `HistoryReadError` when no message arrives for ``idle_timeout_s`` before the end.
    """
    # (A distributed loop's iteration boundaries, which the controller scans, are never carried: only a
    # local loop's are, `E.ITERATION_EVENTS`; a scan for those is a local loop's, which none makes.)
    if names is not None and frozenset(names) & E.CARRIED_EVENTS:
        raise ValueError("scan reads stored messages: events that may be carried are read with read_events")
    filters = _filters(topology, execution_id, names)
    done = asyncio.Event()
    seen = 0
    failure: BaseException | None = None

    async def deliver(msg: Msg) -> None:
        nonlocal seen, failure
        if done.is_set():
            return
        seen += 1
        try:
            more = on_event(msg.data)
        except Exception as exc:  # nats-py would only log it: hand it to the caller
            failure, more = exc, False
        if not more or num_pending(msg) == 0:
            done.set()

    config = api.ConsumerConfig(
        opt_start_seq=after_seq + 1 if after_seq else None,
        filter_subjects=filters if len(filters) > 1 else None,
        filter_subject=filters[0] if len(filters) == 1 else None,
        mem_storage=True,
    )
    sub = await js.subscribe(
        filters[0] if len(filters) == 1 else "",
        stream=topology.events_stream,
        cb=deliver,
        ordered_consumer=True,
        config=config,
        deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE if after_seq else api.DeliverPolicy.ALL,
        inactive_threshold=idle_timeout_s,
    )
    try:
        info = await sub.consumer_info()
        if not info.num_pending and not (info.delivered.consumer_seq if info.delivered else 0):
            done.set()  # nothing to read
        while not done.is_set():
            before = seen
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), idle_timeout_s)
            if not done.is_set() and seen == before:
                raise HistoryReadError(
                    f"execution {execution_id}: its events stopped arriving from {topology.events_stream}"
                )
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    if failure is not None:
        raise failure


def _filters(topology: Topology, execution_id: str, names: Iterable[str] | None) -> list[str]:
    if names is None:
        return [topology.events_filter(execution_id)]
    return sorted(topology.stored_event_filter(execution_id, n) for n in names)
