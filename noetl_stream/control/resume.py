"""Resuming an execution: fold what the stream holds after its snapshot, and publish only what is missing.

A controller that loads an execution (after a restart, a takeover, or a failed batch) folds the input
events stored after the snapshot with the reducer. Some of those events were handled before (their
effects are stored), some maybe not (a controller died holding them). Publishing every effect again
would rely on JetStream's duplicate window, which a long outage outlives; publishing none would lose
the effects of the events nobody handled. So each effect is checked against what is stored:

- an event is stored if its id is among the execution's events after the snapshot (an effect is always
  stored after the event that caused it);
- a command is stored if it is still queued in the commands stream (its ``Nats-Msg-Id``), or if a
  worker wrote about its step run (or iteration), or its run already failed (a poison command): a
  command the workers took and finished is gone from the work queue, but not from the history.
"""

from __future__ import annotations

from collections.abc import Callable

from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from noetl_stream.control.core.effects import Blob, LoopResults
from noetl_stream.control.core.reducer import Reducer
from noetl_stream.control.core.state import ExecutionState
from noetl_stream.control.loopresults import complete, fit
from noetl_stream.jetstream.outbox import MSG_ID, Outbox
from noetl_stream.kv.history import read_events
from noetl_stream.kv.results import ResultStore
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Command, Event

_RUN_OVER = frozenset({E.STEP_FAILED, E.LOOP_ITERATION_FAILED, E.KEYCHAIN_FAILED})
"""Server events that end a command's run (the poison handler writes them for a worker)."""


class Resumed:
    __slots__ = ("commands", "events", "replayed", "state")

    def __init__(self) -> None:
        self.state: ExecutionState | None = None
        self.replayed = 0
        self.events: list[Event] = []
        self.commands: list[Command] = []


async def resume(
    js: JetStreamContext,
    topology: Topology,
    reducer: Reducer,
    execution_id: str,
    state: ExecutionState | None,
    *,
    after: int,
    before: int | None = None,
    stamp: Callable[[Event], None] | None = None,
    results: ResultStore | None = None,
) -> Resumed:
    """Fold the inputs stored after ``after`` into ``state`` and publish the effects not yet stored
    (as the controller does: blobs first, a loop's result assembled, large results by reference)."""
    out = Resumed()
    out.state = state
    stored: set[str] = set()
    worked: set[tuple[str | None, int | None]] = set()
    effects_events: list[Event] = []
    effects_commands: list[Command] = []
    blobs: dict[str, Blob] = {}
    loop_results: dict[str, LoopResults] = {}
    async for seq, event in read_events(js, topology, execution_id, after_seq=after, before_seq=before):
        stored.add(event.event_id)
        if event.source == "worker" or event.name in _RUN_OVER:
            index = event.payload.get("index")
            worked.add((event.step_run_id, index if isinstance(index, int) else None))
            worked.add((event.step_run_id, None))
        if event.name not in E.CONTROLLER_INPUT_EVENTS:
            continue
        out.state, fx = reducer.apply(out.state, event, seq)
        out.replayed += 1
        effects_events.extend(fx.events)
        effects_commands.extend(fx.commands)
        blobs.update((b.key, b) for b in fx.blobs)
        loop_results.update(fx.loop_results)
    out.events = [ev for ev in effects_events if ev.event_id not in stored]
    unknown = [cmd for cmd in effects_commands if not _worked_on(cmd, worked)]
    if unknown:
        queued = await queued_command_ids(js, topology, execution_id)
        out.commands = [cmd for cmd in unknown if cmd.command_id not in queued]
    results = results or ResultStore(js, topology)
    for blob in blobs.values():  # the state may refer to them (a loop the fold started)
        await results.put_encoded(blob.key, blob.data)
    if out.events or out.commands:
        outbox = Outbox(js, topology)
        for i, ev in enumerate(out.events):
            if stamp is not None:
                stamp(ev)
            spec = loop_results.get(ev.event_id)
            if spec is not None:
                ev = await complete(js, topology, results, ev, spec)
            ev, data = await fit(results, ev)
            out.events[i] = ev
            outbox.event(ev, data)
        for cmd in out.commands:
            outbox.command(cmd)
        await outbox.flush()
    return out


def _worked_on(cmd: Command, worked: set[tuple[str | None, int | None]]) -> bool:
    index = cmd.iteration.index if cmd.iteration is not None else None
    return (cmd.step_run_id, index) in worked


async def queued_command_ids(js: JetStreamContext, topology: Topology, execution_id: str) -> set[str]:
    """The ids of the execution's commands still in the work queue (read by direct get, no consumer:
    a work-queue stream allows no consumer that overlaps the pools')."""
    ids: set[str] = set()
    subject = topology.execution_commands_filter(execution_id)
    seq = 0
    while True:
        try:
            msg = await js.get_msg(topology.commands_stream, seq=seq + 1, subject=subject, next=True)
        except NotFoundError:
            return ids
        if msg.seq is None:
            return ids
        seq = msg.seq
        msg_id = (msg.headers or {}).get(MSG_ID)
        if msg_id:
            ids.add(msg_id)
