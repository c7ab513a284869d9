"""CLI commands that inspect executions: ``status``, ``events``, ``replay``, ``executions`` and ``ctx``."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import TYPE_CHECKING, Any, cast

import click
import msgspec

from noetl_stream.cli.common import (
    EXIT_FAILED,
    EXIT_INVALID,
    echo_json,
    nats_option,
    prefix_option,
    topology_for,
    with_nats,
)
from noetl_stream.cli.main import main

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    from noetl_stream.protocol.wire import Event


@main.command()
@click.argument("execution_id")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One line of JSON (what it prints when stdout is not a terminal).",
)
@click.option("--tree", "as_tree", is_flag=True, help="The tree, even when stdout is not a terminal.")
@nats_option
@prefix_option
def status(execution_id: str, as_json: bool, as_tree: bool, nats_url: str, prefix: str) -> None:
    """Show an execution's status, step by step (folded from its events): on a terminal a tree of its
    steps with their status, duration, attempts and errors; else (or with --json) one line of JSON.
    Exit 1 if there is no such execution."""
    from noetl_stream.client.tracking import Tracker
    from noetl_stream.kv.history import read_events
    from noetl_stream.protocol.subjects import SubjectError

    if as_json and as_tree:
        raise click.UsageError("--json and --tree cannot be used together")
    tree = as_tree or (not as_json and sys.stdout.isatty())
    topology = topology_for(prefix)

    async def go(nc: Any) -> tuple[Tracker, list[tuple[int, Event]]]:
        tracker = Tracker(execution_id)
        events: list[tuple[int, Event]] = []
        async for seq, ev in read_events(nc.jetstream(), topology, execution_id):
            tracker.apply(ev)
            if tree:
                events.append((seq, ev))
        return tracker, events

    try:
        tracker, events = with_nats(nats_url, "noetl-status", go)
    except SubjectError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_INVALID)
    summary = msgspec.to_builtins(tracker.summary)
    if not summary["events"]:
        click.echo(f"error: no execution {execution_id} (no events under prefix '{prefix}')", err=True)
        sys.exit(EXIT_FAILED)
    if tree:
        from noetl_stream.api.graph import fold_graph
        from noetl_stream.cli.statustree import render_status, step_attempts

        graph = fold_graph(execution_id, events)
        click.echo("\n".join(render_status(graph, step_attempts(events))))
        return
    summary.pop("duration_s", None)
    echo_json(summary)


FOLLOW_NOTE_AFTER_S = 1.0
"""``events --follow`` of an execution without events says it is waiting after this long."""


@main.command()
@click.argument("execution_id")
@click.option("--follow", "follow_", is_flag=True, help="Keep printing until the execution finishes.")
@click.option("--json", "as_json", is_flag=True, help="One JSON event per line (the raw events).")
@click.option("--no-headers", is_flag=True, help="No line of column names above the timeline.")
@nats_option
@prefix_option
def events(
    execution_id: str, follow_: bool, as_json: bool, no_headers: bool, nats_url: str, prefix: str
) -> None:
    """Print an execution's events as a timeline under a line of column names: time since the request,
    event, step, step run / task run / iteration, status, duration and error."""
    from noetl_stream.client.timeline import Timeline
    from noetl_stream.client.tracking import follow
    from noetl_stream.kv.history import read_events

    topology = topology_for(prefix)
    timeline = Timeline()

    headed = as_json or no_headers

    def show(ev: Event) -> None:
        nonlocal headed
        if not headed:  # above the first event (none: nothing but the error line)
            click.echo(Timeline.HEADER)
            headed = True
        click.echo(msgspec.json.encode(ev).decode() if as_json else timeline.line(ev))

    async def go(nc: Any) -> int:
        if follow_:
            shown = 0

            def counted(ev: Event) -> None:
                nonlocal shown
                shown += 1
                show(ev)

            async def note() -> None:  # it may be about to start: say so, and keep waiting
                await asyncio.sleep(FOLLOW_NOTE_AFTER_S)
                if not shown:
                    click.echo(
                        f"no events of execution {execution_id} yet: waiting for it to start (Ctrl-C to stop)",
                        err=True,
                    )

            waiting = asyncio.create_task(note())
            try:
                await follow(nc, topology, execution_id, counted)
            finally:
                waiting.cancel()
            return 1
        shown = 0
        async for _, ev in read_events(nc.jetstream(), topology, execution_id):
            show(ev)
            shown += 1
        return shown

    if not with_nats(nats_url, "noetl-events", go):
        click.echo(f"error: no execution {execution_id}", err=True)
        sys.exit(EXIT_FAILED)  # as status: a well-formed question about an execution that is not there


def _event_time(value: str) -> str:
    """An ISO time as the events write theirs (UTC, milliseconds, ``Z``), so that they compare as text;
    a time without a zone is UTC."""
    from datetime import UTC, datetime

    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is neither a stream sequence nor an ISO time", param_hint="--until"
        ) from None
    at = at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


@main.command()
@click.argument("execution_id")
@click.option("--until", "until", default=None, help="Stop at a stream sequence (number) or an ISO time.")
@click.option(
    "--verify", is_flag=True, help="Compare with the controller's live projection; exit 1 on a difference."
)
@click.option("--json", "as_json", is_flag=True, help="Print the folded state as JSON.")
@nats_option
@prefix_option
def replay(
    execution_id: str, until: str | None, verify: bool, as_json: bool, nats_url: str, prefix: str
) -> None:
    """Rebuild an execution's state by folding its stored events with the controller's reducer."""
    from noetl_stream.control import replay as rp
    from noetl_stream.control.core.state import ExecutionState
    from noetl_stream.kv.history import read_events
    from noetl_stream.protocol import events as E

    topology = topology_for(prefix)
    until_seq = int(until) if until is not None and until.isascii() and until.isdigit() else None
    until_time = _event_time(until) if until is not None and until_seq is None else None

    async def go(nc: Any) -> tuple[ExecutionState | None, list[str], bool, tuple[int, str] | None]:
        js = nc.jetstream()
        if verify:
            diffs, state = await rp.verify(js, topology, execution_id)
        else:
            state = await rp.replay(js, topology, execution_id, until_seq=until_seq, until_time=until_time)
            diffs = []
        rejected = False
        first: tuple[int, str] | None = None
        if state is None:  # a request rejected before it was recorded has a history, but no state
            async for _ in read_events(js, topology, execution_id, names=(E.REQUEST_REJECTED,)):
                rejected = True
            if until is not None and not verify and not rejected:  # maybe it begins after --until
                inputs = read_events(js, topology, execution_id, names=E.CONTROLLER_INPUT_EVENTS)
                # (an async generator: closed at once, its consumer deleted, when left early)
                async with contextlib.aclosing(
                    cast("AsyncGenerator[tuple[int, Event], None]", inputs)
                ) as folded:
                    async for seq, ev in folded:
                        first = seq, ev.timestamp
                        break
        return state, diffs, rejected, first

    state, diffs, rejected, first = with_nats(nats_url, "noetl-replay", go)
    if state is None:
        if rejected:
            why = (
                "was rejected before it was recorded as a request (playbook.request.rejected): it has no "
                f"state to replay; `noetl-stream status {execution_id}` shows why"
            )
        elif first is not None:  # it used to say "has no events"
            seq, at = first
            why = (
                f"has no events up to --until {until}: that is before its first event, "
                f"stream sequence {seq} (at {at})"
            )
        else:
            why = "has no live snapshot to verify" if verify and diffs else "has no events"
        click.echo(f"error: execution {execution_id} {why}", err=True)
        sys.exit(EXIT_INVALID)
    if verify:
        if diffs:
            for d in diffs:
                click.echo(f"differs: {d}", err=True)
            sys.exit(EXIT_FAILED)
        click.echo(f"replay matches the live projection (stream sequence {state.last_seq})")
        return
    data = msgspec.to_builtins(state)
    if as_json:
        echo_json(data)
    else:
        click.echo(
            f"execution {data['execution_id']}: {data['status']} (through stream sequence {data['last_seq']})"
        )
        for step, st in data["step_status"].items():
            click.echo(f"  {step}: {st}")
        if data.get("ctx"):
            click.echo(f"  ctx: {msgspec.json.encode(data['ctx']).decode()}")
        if data.get("error"):
            click.echo(f"  error: {msgspec.json.encode(data['error']).decode()}")


@main.command()
@click.option("--status", default=None, help="Only executions with this status (running, failed, ...).")
@click.option("--playbook", default=None, help="Only executions of this playbook path or name.")
@click.option("--since", default=None, help="Only executions updated at or after this ISO time.")
@click.option("--limit", default=50, show_default=True)
@click.option("--offset", default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the page as JSON.")
@click.option("--no-headers", is_flag=True, help="No line of column names above the table.")
@nats_option
@prefix_option
def executions(
    status: str | None,
    playbook: str | None,
    since: str | None,
    limit: int,
    offset: int,
    as_json: bool,
    no_headers: bool,
    nats_url: str,
    prefix: str,
) -> None:
    """List executions from the controller's snapshots, newest update first: a table under a line of
    column names (--no-headers: without it), or the page as JSON."""
    from noetl_stream.control.inspect import Inspector, QueryError, check_page
    from noetl_stream.protocol.operations import ListExecutions

    query = ListExecutions(status=status, playbook=playbook, since=since, limit=limit, offset=offset)
    topology = topology_for(prefix)

    async def action(nc: Any) -> Any:
        return await Inspector(nc.jetstream(), topology).executions(query)

    try:
        check_page(offset, limit)  # before connecting (the rest of the query is checked with the list)
        page = with_nats(nats_url, "noetl-executions", action)
    except QueryError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_INVALID)
    if as_json:
        echo_json(page)
        return
    if not page.items:  # on stderr, as `catalog list` does: stdout stays an (empty) listing
        click.echo(_no_executions(status, playbook, since, offset, page.total), err=True)
    rows: list[tuple[str, ...]] = [
        (s.execution_id, s.status + (" (paused)" if s.paused else ""), s.path or s.file, s.updated_at or "")
        for s in page.items
    ]
    if rows and not no_headers:
        rows.insert(0, ("EXECUTION", "STATUS", "PLAYBOOK", "UPDATED"))
    for line in _table(rows):
        click.echo(line)
    if page.total > page.offset + len(page.items):
        click.echo(f"... {page.total - page.offset - len(page.items)} more (--offset)", err=True)


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    """`rows` as lines of left-aligned columns two spaces apart."""
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def _no_executions(
    status: str | None, playbook: str | None, since: str | None, offset: int, total: int
) -> str:
    """What ``executions`` says when its page is empty: the filters it applied, or that the page is past
    the end of the list."""
    filters = [
        f"{name} {value!r}"
        for name, value in (("status", status), ("playbook", playbook), ("updated since", since))
        if value is not None
    ]
    said = f"no executions with {', '.join(filters)}" if filters else "no executions"
    if total:
        return f"{said} at --offset {offset}: {total} in all"
    return said


@main.command()
@click.argument("execution_id")
@nats_option
@prefix_option
def ctx(execution_id: str, nats_url: str, prefix: str) -> None:
    """Print an execution's ctx as JSON (the controller's live view, else its snapshot)."""
    from noetl_stream.control.inspect import Inspector, QueryError

    topology = topology_for(prefix)

    async def action(nc: Any) -> Any:
        try:
            msg = await nc.request(
                topology.api_subject("ctx"), msgspec.json.encode({"execution_id": execution_id}), timeout=5
            )
            if not (msg.headers or {}).get("Nats-Service-Error-Code"):
                return msgspec.json.decode(msg.data)
        except Exception:
            pass  # no controller answering: read the snapshot
        reply = await Inspector(nc.jetstream(), topology).ctx(execution_id)
        return None if reply is None else msgspec.to_builtins(reply)

    try:
        reply = with_nats(nats_url, "noetl-ctx", action)
    except QueryError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_INVALID)
    if reply is None:
        click.echo(f"error: no execution {execution_id}", err=True)
        sys.exit(EXIT_FAILED)
    echo_json(reply["ctx"])
