"""Worker events that travel inside the message of the boundary written right after them.

A noop step run writes four worker events: ``step.started``, ``task.started``, ``task.done`` and
``step.done``. A step run that ends before they are published (the usual case: the worker publishes a
command's events when it ends, or every ``PROGRESS_EVERY_S`` while it runs) sends the first three inside
the boundary's message, in its ``carried`` list (`wire.Event`): one stored message instead of four; a
loop iteration's boundary carries its task events alike. A local loop's iteration records are published
by batches, those finished in one turn of the event loop at a time (`RunEvents.record`): the batch's last
iteration boundary carries the rest of it, the earlier iterations' starts and boundaries too
(`ITERATIONS_MAX_BYTES`); a distributed loop's iteration boundaries, which the controller folds, never are. Each carried event is a whole event, with its
own id and the time it happened; nothing about it changes but where it is stored. The controller folds
the boundary and never looks at what it carries. Which names each carrier carries: `E.CARRIED_BY` (the
controller's own events are never carried: see there).

Readers take the carried events out in order, before their carrier (`expand`): an execution's history
reads the same either way. A reader that asks for a carried name by subject (``task.done``) also reads
the carriers (`subject_names`), since the name may be stored inside one of them.

``noetl-stream worker --task-events separate`` publishes every event as a message of its own (for a
consumer that subscribes to ``task.*`` subjects), as does a step whose carried events would exceed
`CARRY_MAX_BYTES` (a large task result: the controller would receive it twice for nothing).

Readers of an older version ignore the ``carried`` field (msgspec skips unknown fields): upgrade whatever
reads histories (controllers, API servers, CLIs) before the workers (docs/operations.md, "Upgrades").
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
import structlog

from noetl_stream.protocol import events as E
from noetl_stream.protocol.wire import Event, decode_event, encode

log = structlog.get_logger(__name__)

CARRY_MAX_BYTES = 8 * 1024
"""The most bytes of events one boundary carries; the earlier events are published on their own."""
ITERATIONS_MAX_BYTES = 64 * 1024
"""The most bytes of events a local loop's batch of iteration records carries (`RunEvents.record`)."""
MAX_CARRIED = 256
"""The most events one message carries, and a reader takes out of one: a message with more was forged (a
flood of tiny records would otherwise make one stored message a page no reader can return)."""


def carry(
    ready: list[tuple[Event, bytes]], max_message_bytes: int, carry_max_bytes: int = CARRY_MAX_BYTES
) -> list[tuple[Event, bytes]]:
    """``ready`` (events in publishing order, each with its encoding) with each carrier's carried events
    moved into its message: the longest run right before it of the names it carries (`E.CARRIED_BY`),
    from the same execution, source and step run, within `carry_max_bytes` and with the carrier within
    ``max_message_bytes``. A carrier formed earlier in the same list is taken whole, flattened (what it
    carries, then itself), when the later one may carry all of it: a local loop's batch of iterations is
    one message. The same list (the same object) when there is nothing to carry. Deterministic: the same
    events give the same messages, so a publish retried after a crash has the same ``Nats-Msg-Id``s."""
    if len(ready) < 2:
        return ready
    out: list[tuple[Event, bytes]] = []
    held: list[list[tuple[Event, bytes]]] = []
    """For each message of `out`, the events it holds in order, each as it was given (uncarried)."""
    for ev, data in ready:
        names = E.CARRIED_BY.get(ev.name)
        if names is None or ev.carried or not out:
            out.append((ev, data))
            held.append([(ev, data)])
            continue
        start = end = len(out)
        size = count = 0
        room = min(carry_max_bytes, max_message_bytes - len(data) - 32)  # (32: the field's name)
        while start > 0:
            group = held[start - 1]
            if not all(_carries(ev, names, before) for before, _ in group):
                break
            group_size = sum(len(d) + 1 for _, d in group)  # (a comma between them)
            if size + group_size > room or count + len(group) > MAX_CARRIED:
                break
            size, count = size + group_size, count + len(group)
            start -= 1
        if start == end:
            out.append((ev, data))
            held.append([(ev, data)])
            continue
        records = [item for group in held[start:end] for item in group]
        carrier = msgspec.structs.replace(ev, carried=[msgspec.Raw(d) for _, d in records])
        del out[start:], held[start:]
        out.append((carrier, encode(carrier)))
        held.append([*records, (ev, data)])
    return out if len(out) < len(ready) else ready


def _carries(carrier: Event, names: frozenset[str], before: Event) -> bool:
    """Whether `carrier` may carry `before` (an event as given, written before it)."""
    return (
        before.name in names
        and not before.carried
        and before.execution_id == carrier.execution_id
        and before.source == carrier.source
        and before.step_run_id == carrier.step_run_id
    )


def expand(event: Event) -> list[Event]:
    """The events one stored message holds, in the order they were written: what ``event`` carries, then
    itself (without them). A carried record that is not an event this carrier may carry (a name it
    carries, a worker's, of its execution and step run) is dropped and logged (a message forged by someone
    who may publish on the subject): the controller never reads it, so no reader may. So is everything a
    message carries beyond `MAX_CARRIED`, or that anything but a worker's boundary carries."""
    if not event.carried:
        return [event]
    names = E.CARRIED_BY.get(event.name)
    if names is None or event.source != "worker" or len(event.carried) > MAX_CARRIED:
        _bad(event, f"{len(event.carried)} records (at most {MAX_CARRIED}, and only in a worker's boundary)")
        return [msgspec.structs.replace(event, carried=[])]
    out: list[Event] = []
    for raw in event.carried:
        try:
            inner = decode_event(bytes(raw))
        except msgspec.DecodeError as exc:  # ValidationError included
            _bad(event, f"not an event: {exc}")
            continue
        if inner.execution_id != event.execution_id:
            _bad(event, f"an event of another execution ({inner.execution_id})")
        elif inner.name not in names:
            _bad(event, f"a '{inner.name}' event, which it never carries")
        elif inner.carried:
            _bad(event, "an event that carries events itself")
        elif inner.source != "worker" or inner.step_run_id != event.step_run_id:
            _bad(event, f"an event of another step run or source ({inner.source}, {inner.step_run_id})")
        else:
            out.append(inner)
    out.append(msgspec.structs.replace(event, carried=[]))
    return out


def decode_all(data: bytes) -> list[Event]:
    """The events of one stored message (`expand`); ``msgspec.DecodeError`` if it is not an event."""
    return expand(decode_event(data))


def subject_names(names: Iterable[str]) -> frozenset[str]:
    """The event names whose subjects hold the events named ``names``: a carried name's event may be
    stored inside a carrier's message."""
    wanted = frozenset(names)
    if not wanted & E.MAY_BE_CARRIED:
        return wanted
    return wanted | {carrier for carrier, carried in E.CARRIED_BY.items() if wanted & carried}


def _bad(carrier: Event, why: str) -> None:
    log.warning(
        "events.bad_carried",
        execution_id=carrier.execution_id,
        carrier=carrier.event_id,
        error=f"a '{carrier.name}' event carries {why}; it is skipped",
    )
