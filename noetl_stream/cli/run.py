"""CLI commands that start executions: ``run`` (embedded), ``submit`` and ``retry``, and their outcome."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
import msgspec

from noetl_stream import tracing
from noetl_stream.cli.common import (
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_OK,
    checked_nats_url,
    connect_wait_s,
    echo_json,
    fail,
    nats_option,
    prefix_option,
    read_playbook,
    run_async,
    topology_for,
    with_nats,
)
from noetl_stream.cli.main import main
from noetl_stream.dsl import compile_playbook
from noetl_stream.protocol import events as E

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

    from noetl_stream.client.progress import Progress
    from noetl_stream.client.tracking import RunSummary
    from noetl_stream.logs import Hush
    from noetl_stream.protocol.subjects import Topology
    from noetl_stream.protocol.wire import Event
    from noetl_stream.runtime.local import Runtime


def _load_payload(payload: str | None, sets: tuple[str, ...]) -> dict[str, object]:
    import json

    data: dict[str, object] = {}
    if payload:
        text = payload
        if payload.startswith("@"):
            try:
                text = Path(payload[1:]).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                raise click.BadParameter(
                    f"cannot read {payload[1:]}: {reason}", param_hint="--payload"
                ) from None
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--payload") from None
        if not isinstance(loaded, dict):
            raise click.BadParameter("must be a JSON object", param_hint="--payload")
        data.update(loaded)
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--set")
        try:
            data[key] = json.loads(value)
        except json.JSONDecodeError:
            data[key] = value
    return data


EXIT_TIMEOUT = 124
"""``--timeout`` expired before the execution ended (as GNU ``timeout`` exits)."""
EXIT_INTERRUPTED = 130
"""Ctrl-C (128 + SIGINT, as a shell reports it)."""
CANCEL_WAIT_S = 30.0
"""How long ``run --timeout`` waits for the end of the execution it cancelled."""

timeout_option = click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help=f"Give up after SECONDS without an end: exit {EXIT_TIMEOUT} with a message.",
)


def _warn_undeclared(data: dict[str, object], workload: dict[str, Any] | None, file: Path) -> None:
    """A warning on stderr for each key of the request's payload (``--payload``, ``--set``) that the
    playbook's workload does not declare: a misspelt key would otherwise pass unseen while the
    playbook runs with its default. The request goes on as given."""
    declared = set(workload or {})
    unknown = [key for key in data if key not in declared]
    if not unknown:
        return
    names = ", ".join(repr(key) for key in unknown)
    known = ", ".join(sorted(declared)) or "none"
    said = "a key" if len(unknown) == 1 else "keys"
    click.echo(
        f"warning: {file}: the payload has {said} its workload does not declare: {names} "
        f"(declared: {known}); passed on as given",
        err=True,
    )


async def _follow_within(
    nc: NATS,
    topology: Topology,
    execution_id: str,
    on_event: Callable[[Event], None] | None,
    timeout: float | None,
) -> RunSummary | None:
    """`follow` the execution to its end; None when `timeout` seconds passed first."""
    from noetl_stream.client.tracking import follow

    if timeout is None:
        return await follow(nc, topology, execution_id, on_event)
    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            return await follow(nc, topology, execution_id, on_event)
    except TimeoutError:
        if deadline.expired():
            return None
        raise  # NATS's own


async def _cancel_late(rt: Runtime, execution_id: str, timeout: float) -> tuple[RunSummary | None, bool]:
    """Cancel an execution ``run --timeout`` gave up on, and its end: (summary, whether it was cancelled
    here; False when it ended just before the request could be recorded)."""
    from noetl_stream.client.tracking import follow
    from noetl_stream.control.endpoints import ApiError

    reason = f"noetl-stream run --timeout {timeout:g}: no end after {timeout:g}s"
    cancelled = True
    try:
        await rt.controller.intake.control(execution_id, E.EXECUTION_CANCEL_REQUESTED, reason)
    except ApiError:  # 409: it has ended meanwhile
        cancelled = False
    try:
        return await follow(rt.nc, rt.topology, execution_id, timeout=CANCEL_WAIT_S), cancelled
    except TimeoutError:
        return None, cancelled


def _run_interruptible(
    work: Callable[[], Awaitable[int]], hush: Hush, nats_url: str | None
) -> tuple[int, bool]:
    """Run `work` to its exit code, as `run_async` does; a Ctrl-C cancels it (its runtime shuts down,
    what that says below an error unsaid: `Hush.quiet`) and gives (`EXIT_INTERRUPTED`, True)."""
    interrupted = False

    async def main() -> int:
        nonlocal interrupted
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()

        def on_sigint() -> None:
            nonlocal interrupted
            interrupted = True
            hush.quiet()
            if task is not None:
                task.cancel()  # a second Ctrl-C cancels the shutdown too

        handled = True
        try:
            loop.add_signal_handler(signal.SIGINT, on_sigint)
        except (NotImplementedError, RuntimeError, ValueError):
            handled = False  # no signal handlers here: a Ctrl-C is asyncio's KeyboardInterrupt
        try:
            return await work()
        except asyncio.CancelledError:
            if interrupted:
                return EXIT_INTERRUPTED
            raise
        finally:
            if handled:
                loop.remove_signal_handler(signal.SIGINT)

    try:
        code = run_async(main(), nats_url)
    except SystemExit as exc:
        if exc.code != EXIT_INTERRUPTED:  # (a Ctrl-C before the handler was set)
            raise
        return EXIT_INTERRUPTED, True
    return code, interrupted


def _echo_execution_id(execution_id: str, as_json: bool) -> None:
    click.echo(msgspec.json.encode({"execution_id": execution_id}).decode() if as_json else execution_id)


def _print_outcome(summary: dict[str, Any], as_json: bool, progress: Progress | None) -> int:
    """Print a finished execution's summary (JSON, or the progress's last lines), flushed; its exit code.
    An execution that did not succeed has no result: its last step's is not its outcome (null)."""
    if summary.get("status") != "success":
        summary = {**summary, "result": None}
    if as_json:
        echo_json(summary)
    elif progress is not None:
        progress.finish(summary)
    sys.stdout.flush()
    status = summary.get("status")
    return EXIT_OK if status == "success" else EXIT_INVALID if status == "rejected" else EXIT_FAILED


def _exit_with_outcome(summary: dict[str, Any], as_json: bool, progress: Progress | None) -> NoReturn:
    """Print a finished execution's summary and exit like `run`."""
    sys.exit(_print_outcome(summary, as_json, progress))


@main.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--payload", help="Workload overrides: a JSON object, or @file.json.")
@click.option(
    "--set", "sets", multiple=True, help="Workload override KEY=VALUE (VALUE parsed as JSON if it can be)."
)
@click.option(
    "--nats",
    "nats_url",
    envvar="NOETL_NATS_URL",
    default=None,
    callback=lambda _ctx, _param, value: checked_nats_url(value),
    help="NATS URL (env NOETL_NATS_URL): run on that installation's pools, with a controller and worker in this process; without either, start an embedded nats-server.",
)
@click.option(
    "--workers", default=1, show_default=True, type=click.IntRange(min=1), help="In-process workers."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the outcome.")
@click.option(
    "--legacy",
    is_flag=True,
    help="Compile with the legacy extension: legacy DSL forms (000/004, 002) are translated.",
)
@timeout_option
@prefix_option
def run(
    file: Path,
    payload: str | None,
    sets: tuple[str, ...],
    nats_url: str | None,
    workers: int,
    as_json: bool,
    prefix: str,
    legacy: bool = False,
    timeout: float | None = None,
) -> None:
    """Run a playbook end to end and print its outcome (exit 0 success, 1 failed, 2 invalid; with
    --timeout, 124 when it had not ended by then: it is cancelled; 130 on Ctrl-C)."""

    from noetl_stream.client.progress import Progress
    from noetl_stream.logs import Hush, configure

    # A failed step's warning would say what the progress (or the JSON outcome) says.
    hush = Hush(frozenset({E.STEP_FAILED}))
    configure("warning", hush=hush)
    # The controller's and the workers' spans, when the environment enables tracing (OTEL_*): a console
    # exporter prints them on stderr (stdout is the outcome's); all are exported before the process ends.
    if tracing.setup_from_env("noetl-stream", console=sys.stderr):
        click.get_current_context().call_on_close(tracing.flush)
    started: list[str] = []
    try:
        text = read_playbook(file)
        extensions: tuple[str, ...] = ("legacy",) if legacy else ()
        result = compile_playbook(text, str(file), extensions=extensions)
        for d in result.diagnostics:
            click.echo(d.format(), err=True)
        if result.playbook is None:
            sys.exit(EXIT_INVALID)
        data = _load_payload(payload, sets)
        _warn_undeclared(data, result.playbook.workload, file)
        topology = topology_for(prefix)
        progress = None if as_json else Progress()
        wait_s = connect_wait_s()

        async def go() -> int:
            from noetl_stream.client.submit import request_for
            from noetl_stream.client.submit import submit as do_submit
            from noetl_stream.runtime.local import local_runtime

            async with local_runtime(
                nats_url, topology=topology, workers=workers, connect_wait_s=wait_s
            ) as rt:
                on_event = progress.on_event if progress else None
                request = request_for(text, str(file), data, extensions=extensions)
                execution_id = await do_submit(rt.nc, topology, request)
                started.append(execution_id)
                began = time.monotonic()
                summary = await _follow_within(rt.nc, topology, execution_id, on_event, timeout)
                expired = summary is None
                if summary is None:
                    assert timeout is not None
                    hush.quiet()  # what the shutdown says about the task it abandons is no news
                    summary, expired = await _cancel_late(rt, execution_id, timeout)
                    if summary is not None:  # (its end was read again: the time since it began)
                        summary.duration_s = round(time.monotonic() - began, 6)
                if summary is not None and summary.status == "success" and nats_url is None:
                    # the server goes away with the process: print the value, not a dead reference
                    from noetl_stream.kv.results import ResultStore

                    with contextlib.suppress(Exception):  # (unreadable: the reference says what it was)
                        summary.result = await ResultStore(rt.nc.jetstream(), topology).resolve(
                            summary.result
                        )
                if expired or summary is None:
                    assert timeout is not None
                    return _timed_out(execution_id, timeout, summary, as_json)
                # The outcome as soon as the execution ends: shutting the runtime down afterwards may
                # wait for tasks it left running (a child abandoned at its child_timeout_s).
                return _print_outcome(msgspec.to_builtins(summary), as_json, progress)

        try:
            code, interrupted = _run_interruptible(go, hush, nats_url)
        except BrokenPipeError:
            raise
        except (OSError, RuntimeError) as exc:  # the embedded nats-server could not start, ...
            fail(str(exc), EXIT_FAILED)
    except KeyboardInterrupt:  # before the run began (reading, compiling)
        code, interrupted = EXIT_INTERRUPTED, True
    if interrupted:
        click.echo(_interrupted_line(started[0] if started else None, nats_url), err=True)
    sys.exit(code)


def _interrupted_line(execution_id: str | None, nats_url: str | None) -> str:
    if execution_id is None:
        return "interrupted"
    if nats_url is None:
        return f"interrupted: execution {execution_id} stopped unfinished (with the embedded NATS server)"
    return (
        f"interrupted: execution {execution_id} did not end here (`noetl-stream status {execution_id}` "
        f"shows where it is, `noetl-stream cancel {execution_id}` ends it)"
    )


def _timed_out(execution_id: str, timeout: float, summary: RunSummary | None, as_json: bool) -> int:
    """``run --timeout``: the execution it cancelled (the JSON outcome on stdout with --json) and one line
    on stderr; `EXIT_TIMEOUT`."""
    ended = "cancelled" if summary is not None else f"cancel requested (no end within {CANCEL_WAIT_S:g}s)"
    stopped = [
        name for name, step in (summary.steps.items() if summary else ()) if step.status == "cancelled"
    ]
    if stopped:
        ended += f" (stopped: {', '.join(stopped)})"
    if as_json and summary is not None:
        echo_json({**msgspec.to_builtins(summary), "result": None})
    sys.stdout.flush()
    click.echo(
        f"error: execution {execution_id} did not end within --timeout {timeout:g}s: {ended}", err=True
    )
    return EXIT_TIMEOUT


def _checked_pool(value: str | None) -> str | None:
    from noetl_stream.protocol.subjects import SubjectError, check_new_id

    try:
        return None if value is None else check_new_id(value, "pool name")
    except SubjectError as exc:
        raise click.BadParameter(str(exc)) from None


UNCLAIMED_HINT_AFTER_S = 5.0
"""``submit --wait`` (and ``retry --wait``) says that no controller has taken the request after this long."""


async def _follow_submitted(
    nc: Any, topology: Topology, execution_id: str, progress: Progress | None, timeout: float | None = None
) -> RunSummary | None:
    """Follow an execution just submitted to its end, as `follow` does, saying on stderr (stdout is the
    outcome) which execution it waits for and, if no controller has written any of its events (the
    first is ``playbook.execution.requested``) after `UNCLAIMED_HINT_AFTER_S`, that none has taken it
    (it waited in silence for ever); it goes on waiting, for `timeout` seconds at most (then None)."""
    click.echo(f"execution {execution_id} submitted: waiting for it to end", err=True)
    recorded = asyncio.Event()

    def seen(ev: Event) -> None:
        recorded.set()
        if progress is not None:
            progress.on_event(ev)

    async def hint() -> None:
        try:
            async with asyncio.timeout(UNCLAIMED_HINT_AFTER_S):
                await recorded.wait()
        except TimeoutError:
            click.echo(
                f"no controller has taken execution {execution_id} yet (no {E.EXECUTION_REQUESTED} after "
                f"{UNCLAIMED_HINT_AFTER_S:g}s): is a controller running for prefix '{topology.prefix}' on "
                "this NATS? Still waiting (Ctrl-C stops waiting, not the execution)",
                err=True,
            )

    # Not a TaskGroup: it would wrap `follow`'s NATS errors in an ExceptionGroup the edge does not map.
    waiting = asyncio.create_task(hint())
    try:
        return await _follow_within(nc, topology, execution_id, seen, timeout)
    finally:
        waiting.cancel()
        await asyncio.wait([waiting])


@main.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--payload", help="Workload overrides: a JSON object, or @file.json.")
@click.option("--set", "sets", multiple=True, help="Workload override KEY=VALUE.")
@click.option("--wait", is_flag=True, help="Follow the execution and exit like `run`.")
@click.option("--json", "as_json", is_flag=True)
@click.option(
    "--legacy",
    is_flag=True,
    help="Have the controller compile it with the legacy extension (recorded with the request).",
)
@click.option(
    "--pool",
    callback=lambda _ctx, _param, value: _checked_pool(value),
    help="Run the steps that name no pool of their own on this worker pool "
    "(instead of the playbook's executor.spec.pool or the controller's default).",
)
@timeout_option
@nats_option
@prefix_option
def submit(
    file: Path,
    payload: str | None,
    sets: tuple[str, ...],
    wait: bool,
    as_json: bool,
    nats_url: str,
    prefix: str,
    legacy: bool = False,
    pool: str | None = None,
    timeout: float | None = None,
) -> None:
    """Publish an execution request onto the request subject; print the execution id. With --wait,
    follow it and exit like `run` (with --timeout, 124 when it had not ended by then: it goes on)."""
    from noetl_stream.client.progress import Progress
    from noetl_stream.client.submit import request_for
    from noetl_stream.client.submit import submit as do_submit

    if timeout is not None and not wait:
        raise click.UsageError("--timeout is how long --wait waits: give --wait too")
    text = read_playbook(file)
    data = _load_payload(payload, sets)
    extensions = ("legacy",) if legacy else ()
    compiled = compile_playbook(text, str(file), extensions=extensions)
    if compiled.playbook is not None:  # (else the controller says what is wrong with it)
        _warn_undeclared(data, compiled.playbook.workload, file)
    topology = topology_for(prefix)
    progress = None if as_json else Progress()
    submitted: list[str] = []

    async def go(nc: Any) -> object:
        request = request_for(text, str(file), data, extensions=extensions)
        if pool is not None:
            request.pool = pool
        eid = await do_submit(nc, topology, request)
        if not wait:
            return eid
        submitted.append(eid)
        return await _follow_submitted(nc, topology, eid, progress, timeout)

    out = with_nats(nats_url, "noetl-submit", go)
    if isinstance(out, str):
        _echo_execution_id(out, as_json)
        return
    _exit_after_wait(out, submitted, timeout, as_json, progress)


def _exit_after_wait(
    out: Any, submitted: list[str], timeout: float | None, as_json: bool, progress: Any
) -> None:
    """``--wait``'s end: exit like `run` with the outcome, or `EXIT_TIMEOUT` (the execution goes on)."""
    if out is None:
        eid = submitted[0]
        fail(
            f"execution {eid} did not end within --timeout {timeout:g}s; it goes on "
            f"(`noetl-stream status {eid}` shows where it is, `noetl-stream cancel {eid}` ends it)",
            EXIT_TIMEOUT,
        )
    _exit_with_outcome(msgspec.to_builtins(out), as_json, progress)


@main.command()
@click.argument("execution_id")
@click.option(
    "--from-step",
    "from_steps",
    multiple=True,
    help="Re-run from this step (repeat); default: the failed ones.",
)
@click.option("--wait", is_flag=True, help="Follow the new execution and exit like `run`.")
@click.option("--json", "as_json", is_flag=True)
@timeout_option
@nats_option
@prefix_option
def retry(
    execution_id: str,
    from_steps: tuple[str, ...],
    wait: bool,
    as_json: bool,
    nats_url: str,
    prefix: str,
    timeout: float | None = None,
) -> None:
    """Re-run a failed or cancelled execution from its failed or interrupted step(s), reusing the results of
    what succeeded (with --wait --timeout, 124 when the new one had not ended by then: it goes on)."""
    from noetl_stream.client.progress import Progress
    from noetl_stream.client.submit import RetryError, check_from_steps, retry_request
    from noetl_stream.client.submit import submit as do_submit

    if timeout is not None and not wait:
        raise click.UsageError("--timeout is how long --wait waits: give --wait too")
    topology = topology_for(prefix)
    progress = None if as_json else Progress()
    submitted: list[str] = []

    async def go(nc: Any) -> Any:
        request = await retry_request(nc, topology, execution_id, from_steps)
        check_from_steps(request, execution_id, from_steps)  # a --from-step its playbook has not
        new_id = await do_submit(nc, topology, request)
        if not wait:
            return new_id
        submitted.append(new_id)
        return await _follow_submitted(nc, topology, new_id, progress, timeout)

    try:
        out = with_nats(nats_url, "noetl-retry", go)
    except RetryError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_INVALID)
    if isinstance(out, str):
        _echo_execution_id(out, as_json)
        return
    _exit_after_wait(out, submitted, timeout, as_json, progress)  # as `submit --wait` does
