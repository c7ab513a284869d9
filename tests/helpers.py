"""Helpers for end-to-end runtime tests: build playbooks, run them, read their events."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import random
import socket
import textwrap
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from noetl_stream.client.submit import request_for
from noetl_stream.client.tracking import RunSummary
from noetl_stream.control.core.keychaincheck import CHECK_FLAG
from noetl_stream.jetstream.acks import Acks
from noetl_stream.jetstream.connection import connect
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.keychain import CredentialNotFoundError
from noetl_stream.kv.provision import provision
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event, event_id, now_iso
from noetl_stream.runtime.local import Runtime

RUN_TIMEOUT_S = 30.0


@contextlib.asynccontextmanager
async def own_stream(js: JetStreamContext, prefix: str = "S", **config: Any) -> AsyncIterator[str]:
    """A stream of the test's own (``<name>.>``) with `config`, deleted afterwards; its name is the
    subject root."""
    name = prefix + uuid.uuid4().hex[:8].upper()
    await js.add_stream(name=name, subjects=[f"{name}.>"], duplicate_window=120, **config)
    try:
        yield name
    finally:
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(name)


@contextlib.asynccontextmanager
async def own_connection(
    server: EmbeddedNats, prefix: str
) -> AsyncIterator[tuple[NATS, JetStreamContext, Topology]]:
    """A connection to a server of the test's own (`own_server`, one it freezes, kills and starts again)
    and the topology `prefix` provisioned on it (pool ``default``); the connection is closed afterwards."""
    topology = Topology(prefix=prefix)
    nc = await connect(server.url, name=f"pytest-{prefix}", connect_wait_s=10)
    try:
        js = nc.jetstream(timeout=10)
        await provision(js, topology, ("default",))
        yield nc, js, topology
    finally:
        await nc.close()


class LostAcks:
    """While `dropping`, the JetStream publish acks that reach this process's publishers are dropped
    (counted in `dropped`): the server stored the message, its publisher never hears of it.

    It patches ``Acks._on_ack``, which a connection's publisher binds when it subscribes its ack inbox
    (on its first acked publish): make it before the connection under test is made."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.dropping = False
        self.dropped = 0
        on_ack = Acks._on_ack

        def on_ack_unless_dropping(acks: Acks, msg: Msg) -> None:
            if self.dropping:
                self.dropped += 1
            else:
                on_ack(acks, msg)

        monkeypatch.setattr(Acks, "_on_ack", on_ack_unless_dropping)

    async def stored_then_restart(
        self, server: EmbeddedNats, js: JetStreamContext, stream: str, messages: int
    ) -> None:
        """With a publish under way while `dropping`: once `stream` holds `messages` and an ack was dropped,
        acks pass again and `server` is killed and started again on its store (the stored messages and
        the stream's duplicate window survive it). The publisher learns of the lost ack with the lost
        connection; what it publishes again must carry the same ``Nats-Msg-Id`` to be stored once."""
        assert self.dropping, "set `dropping` before the publish"
        held = -1
        try:
            async with asyncio.timeout(10):
                while self.dropped == 0 or held != messages:
                    held = (await js.stream_info(stream)).state.messages
                    await asyncio.sleep(0.01)
        except TimeoutError:
            hint = " (was LostAcks made after the publisher subscribed?)" if self.dropped == 0 else ""
            raise AssertionError(
                f"{stream} holds {held} messages, not {messages}; {self.dropped} acks dropped{hint}"
            ) from None
        self.dropping = False
        server.kill()
        await asyncio.to_thread(server.start)


@dataclass
class Clustered:
    """The `r3` fixture: a connection to a 3-node cluster and a topology provisioned on it with R3."""

    nc: NATS
    js: JetStreamContext
    topology: Topology


def event(name: str, step: str | None = None, event_status: str = "success", **payload: Any) -> Event:
    """An event of execution ``e`` (of `step`, run ``<step>-1``, when given): to feed a fold directly."""
    return Event(
        event_id=f"e:{step}:{name}",
        execution_id="e",
        name=name,
        source="server",
        entity_type="step" if step else "playbook",
        entity_id=step or "e",
        status=event_status,  # type: ignore[arg-type]
        timestamp=now_iso(),
        step=step,
        step_run_id=f"{step}-1" if step else None,
        payload=payload,
    )


def step_started(execution_id: str, step: str) -> Event:
    """A worker's ``step.started`` for `step` (its id names the execution and the step): an event to
    publish when only its id and subject matter."""
    return Event(
        event_id=f"{execution_id}:{step}:step.started",
        execution_id=execution_id,
        name="step.started",
        source="worker",
        entity_type="step",
        entity_id=step,
        status="in_progress",
        timestamp=now_iso(),
        step=step,
    )


def step_done(
    execution_id: str, run_id: str, result: Any, ctx_patches: Iterable[dict[str, Any]] = ()
) -> Event:
    """The ``step.done`` a worker records for run `run_id` (``<step>-<n>``) of `execution_id`."""
    patches = list(ctx_patches)
    return Event(
        event_id=f"{execution_id}:{run_id}:1:step.done",
        execution_id=execution_id,
        name=E.STEP_DONE,
        source="worker",
        entity_type="step",
        entity_id=run_id,
        status="success",
        timestamp=now_iso(),
        step=run_id.rsplit("-", 1)[0],
        step_run_id=run_id,
        payload={"result": result, "ctx_patches": patches} if patches else {"result": result},
    )


def requested(eid: str, text: str, file: str = "t.yaml") -> Event:
    """The ``playbook.execution.requested`` event the controller's intake records for playbook `text`
    (to drive the reducer directly, or to store an execution's start as intake would)."""
    return Event(
        event_id=event_id(eid, "execution", E.EXECUTION_REQUESTED),
        execution_id=eid,
        name=E.EXECUTION_REQUESTED,
        source="server",
        entity_type="playbook",
        entity_id=file,
        status="in_progress",
        timestamp=now_iso(),
        payload={"request": msgspec.to_builtins(request_for(text, file, execution_id=eid)), CHECK_FLAG: True},
    )


def playbook(workflow: str, *, workload: dict[str, Any] | None = None, name: str = "t") -> str:
    """A playbook whose ``workflow:`` is `workflow` (YAML list items, any common indentation)."""
    lines = [
        "apiVersion: noetl.io/v2",
        "kind: Playbook",
        f"metadata: {{name: {name}, path: tests/{name}}}",
    ]
    if workload is not None:
        lines.append(f"workload: {json.dumps(workload)}")
    lines.append("workflow:")
    body = textwrap.indent(textwrap.dedent(workflow).strip("\n"), "  ")
    return "\n".join(lines) + "\n" + body + "\n"


@dataclass
class Run:
    """One finished execution: what the client saw and every event, in stream order."""

    summary: RunSummary
    events: list[Event] = field(default_factory=list)

    @property
    def status(self) -> str:
        return self.summary.status

    @property
    def result(self) -> Any:
        return self.summary.result

    def named(self, *names: str, step: str | None = None) -> list[Event]:
        return [e for e in self.events if e.name in names and (step is None or e.step == step)]

    def names(self) -> list[str]:
        return [e.name for e in self.events]

    def started(self, step: str) -> int:
        """How many times a worker started `step` (runs of a step with tasks)."""
        return len(self.named("step.started", step=step))

    def ran(self) -> list[str]:
        """Steps that reached a boundary event, in the order they did."""
        return [e.step for e in self.events if e.name in ("step.done", "step.failed", "loop.done") and e.step]

    def tasks(self, step: str, task: str | None = None, name: str = "task.done") -> list[Event]:
        return [e for e in self.named(name, step=step) if task is None or e.payload.get("task") == task]

    def step_result(self, step: str) -> Any:
        (boundary,) = self.named("step.done", "loop.done", step=step)
        return boundary.payload.get("result")

    def step_error(self, step: str) -> dict[str, Any]:
        (boundary,) = self.named("step.failed", step=step)
        error = boundary.payload.get("error")
        assert isinstance(error, dict), boundary
        return error

    def matched(self, step: str) -> list[list[str]]:
        """The arcs each ``next.evaluated`` of `step` fired, per run."""
        return [list(e.payload.get("matched") or []) for e in self.named("next.evaluated", step=step)]


async def run(
    rt: Runtime,
    text: str,
    payload: dict[str, Any] | None = None,
    *,
    file: str = "t.yaml",
    timeout: float = RUN_TIMEOUT_S,
) -> Run:
    events: list[Event] = []
    summary = await rt.run_playbook(text, file, payload, events.append, timeout)
    return Run(summary=summary, events=events)


def ts(event: Event) -> datetime.datetime:
    return datetime.datetime.fromisoformat(event.timestamp.replace("Z", "+00:00"))


# -- observing concurrency from inside python tasks -----------------------------------------------

# A python task that appends "+i" when it starts and "-i" when it ends to a journal file (appends
# with O_APPEND are atomic for lines this short), sleeping in between so overlaps are observable.
JOURNAL_CODE = """\
import os, time
def main(path, i, hold):
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"+{i}\\n".encode())
        time.sleep(hold)
        os.write(fd, f"-{i}\\n".encode())
    finally:
        os.close(fd)
    return i * 10
"""


def journal(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def max_concurrency(entries: Iterable[str]) -> int:
    """The largest number of tasks between their "+" and "-" entries at any point."""
    running = peak = 0
    for entry in entries:
        running += 1 if entry.startswith("+") else -1
        peak = max(peak, running)
    return peak


def indent(text: str, by: int) -> str:
    """Indent a block (e.g. python code) for embedding under a YAML block scalar."""
    return textwrap.indent(textwrap.dedent(text), " " * by)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a fixture's server, or one nothing listens on)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(count: int) -> int:
    """The first of `count` consecutive TCP ports on 127.0.0.1 that were free a moment ago, below the
    kernel's ephemeral range, so a `free_port()` elsewhere (the kernel's pick) does not take the next."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20_000, 30_000 - count)
        with contextlib.ExitStack() as stack:
            try:
                for port in range(base, base + count):
                    s = stack.enter_context(socket.socket())
                    s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return base
    raise RuntimeError(f"no {count} consecutive free ports found")


def credentials(entries: Mapping[str, Mapping[str, Any]]) -> Callable[[str], Awaitable[dict[str, Any]]]:
    """A worker's credential resolver (`WorkerServices.credentials`) over fixed keychain entries: a copy of
    the named entry, or `CredentialNotFoundError` like the keychain's."""

    async def resolve(name: str) -> dict[str, Any]:
        if name not in entries:
            raise CredentialNotFoundError(name)
        return dict(entries[name])

    return resolve
