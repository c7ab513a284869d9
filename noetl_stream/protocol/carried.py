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
    ready: list[tuple[Event, bytes]],
    max_message_bytes: int,
    carry_max_bytes: int = CARRY_MAX_BYTES,
    *,
    iterations: bool = False,
) -> list[tuple[Event, bytes]]:
    """``ready`` (events in publishing order, each with its encoding) with each carrier's carried events
    moved into its message: the longest run right before it of the names it carries (`E.CARRIED_BY`),
    from the same execution, source and step run, within `carry_max_bytes` and with the carrier within
    ``max_message_bytes``. A carrier formed earlier in the same list is taken whole, flattened (what it
    carries, then itself), when the later one may carry all of it: a local loop's batch of iterations is
    one message. `iterations` (a local loop's events only): iteration events (`E.ITERATION_EVENTS`) may be
    carried too; a distributed loop's iteration boundaries, which the controller folds, never are. The
    same list (the same object) when there is nothing to carry. Deterministic: the same events give the
    same messages, so a publish retried after a crash has the same ``Nats-Msg-Id``s."""
    if len(ready) < 2:
        return ready
    out: list[_Held] = []
    for ev, data in ready:
        names = E.CARRIED_BY.get(ev.name)
        if names is not None and not iterations:
            names = E.CARRIED_EVENTS
        if names is None or ev.carried or not out:
            out.append(_Held(ev, data))
            continue
        key = (ev.execution_id, ev.source, ev.step_run_id)
        start = end = len(out)
        size = count = 0
        room = min(carry_max_bytes, max_message_bytes - len(data) - 32)  # (32: the field's name)
        while start > 0:
            group = out[start - 1]
            if group.key != key or not group.names <= names:
                break
            if size + group.size > room or count + len(group.records) > MAX_CARRIED:
                break
            size, count = size + group.size, count + len(group.records)
            start -= 1
        if start == end:
            out.append(_Held(ev, data))
            continue
        merged = out[start]  # taken whole: what it holds, then the others, then this carrier
        for group in out[start + 1 : end]:
            merged.records += group.records
            merged.names |= group.names
        merged.records.append((ev, data))
        merged.names |= {ev.name}
        merged.size = size + len(data) + 1
        merged.key = key
        del out[start + 1 :]
    if len(out) == len(ready):
        return ready
    return [group.message() for group in out]


class _Held:
    """One message of `carry`'s output: the events it holds, each as it was given (uncarried), the last
    its carrier; and what a later carrier needs to know to take it whole: their names, their bytes, and
    whose they are (None when one is a carrier given as such: it is never carried)."""

    __slots__ = ("key", "names", "records", "size")

    def __init__(self, ev: Event, data: bytes) -> None:
        self.records = [(ev, data)]
        self.names = frozenset((ev.name,))
        self.size = len(data) + 1  # (a comma between them)
        self.key = None if ev.carried else (ev.execution_id, ev.source, ev.step_run_id)

    def message(self) -> tuple[Event, bytes]:
        """The message: the carrier, carrying the others."""
        if len(self.records) == 1:
            return self.records[0]
        ev = self.records[-1][0]
        carrier = msgspec.structs.replace(ev, carried=[msgspec.Raw(d) for _, d in self.records[:-1]])
        return carrier, encode(carrier)


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
