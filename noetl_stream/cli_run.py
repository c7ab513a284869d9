"""CLI commands that start executions: ``run`` (embedded), ``submit`` and ``retry``, and their outcome."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
import msgspec

from noetl_stream import events as E
from noetl_stream.cli import (
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_OK,
    _connect_wait_s,
    _echo_json,
    _fail,
    _read_playbook,
    _run_async,
    _topology,
    _with_nats,
    checked_nats_url,
    main,
    nats_option,
    prefix_option,
)
from noetl_stream.dsl import compile_playbook

if TYPE_CHECKING:
    from noetl_stream.client import RunSummary
    from noetl_stream.progress import Progress
    from noetl_stream.subjects import Topology
    from noetl_stream.wire import Event


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


def _echo_execution_id(execution_id: str, as_json: bool) -> None:
    click.echo(msgspec.json.encode({"execution_id": execution_id}).decode() if as_json else execution_id)


def _print_outcome(summary: dict[str, Any], as_json: bool, progress: Progress | None) -> int:
    """Print a finished execution's summary (JSON, or the progress's last lines), flushed; its exit code."""
    if as_json:
        _echo_json(summary)
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
) -> None:
    """Run a playbook end to end and print its outcome (exit 0 success, 1 failed, 2 invalid)."""

    from noetl_stream.logs import configure
    from noetl_stream.progress import Progress

    configure("warning")

    text = _read_playbook(file)
    extensions: tuple[str, ...] = ("legacy",) if legacy else ()
    result = compile_playbook(text, str(file), extensions=extensions)
    for d in result.diagnostics:
        click.echo(d.format(), err=True)
    if result.playbook is None:
        sys.exit(EXIT_INVALID)
    data = _load_payload(payload, sets)
    topology = _topology(prefix)
    progress = None if as_json else Progress()
    wait_s = _connect_wait_s()

    async def go() -> int:
        from noetl_stream.local import local_runtime

        async with local_runtime(nats_url, topology=topology, workers=workers, connect_wait_s=wait_s) as rt:
            on_event = progress.on_event if progress else None
            summary = await rt.run_playbook(text, str(file), data, on_event, extensions=extensions)
            if nats_url is None and summary.result is not None:  # the server goes away with the process:
                from noetl_stream.kv.results import ResultStore  # print the value, not a dead reference

                with contextlib.suppress(Exception):  # (unreadable: the reference says what it was)
                    summary.result = await ResultStore(rt.nc.jetstream(), topology).resolve(summary.result)
            # The outcome as soon as the execution ends: shutting the runtime down afterwards may wait
            # for tasks it left running (a child abandoned at its child_timeout_s).
            return _print_outcome(msgspec.to_builtins(summary), as_json, progress)

    try:
        code = _run_async(go(), nats_url)
    except BrokenPipeError:
        raise
    except (OSError, RuntimeError) as exc:  # the embedded nats-server could not start, ...
        _fail(str(exc), EXIT_FAILED)
    sys.exit(code)


def _checked_pool(value: str | None) -> str | None:
    from noetl_stream.subjects import SubjectError, check_new_id

    try:
        return None if value is None else check_new_id(value, "pool name")
    except SubjectError as exc:
        raise click.BadParameter(str(exc)) from None


UNCLAIMED_HINT_AFTER_S = 5.0
"""``submit --wait`` (and ``retry --wait``) says that no controller has taken the request after this long."""


async def _follow_submitted(
    nc: Any, topology: Topology, execution_id: str, progress: Progress | None
) -> RunSummary:
    """Follow an execution just submitted to its end, as `follow` does, saying on stderr (stdout is the
    outcome) which execution it waits for and, if no controller has written any of its events (the
    first is ``playbook.execution.requested``) after `UNCLAIMED_HINT_AFTER_S`, that none has taken it
    (it waited in silence for ever); it goes on waiting."""
    from noetl_stream.client import follow

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
        return await follow(nc, topology, execution_id, seen)
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
) -> None:
    """Publish an execution request onto the request subject; print the execution id."""
    from noetl_stream.client import request_for
    from noetl_stream.client import submit as do_submit
    from noetl_stream.progress import Progress

    text = _read_playbook(file)
    data = _load_payload(payload, sets)
    topology = _topology(prefix)
    progress = None if as_json else Progress()

    async def go(nc: Any) -> object:
        request = request_for(text, str(file), data, extensions=("legacy",) if legacy else ())
        if pool is not None:
            request.pool = pool
        eid = await do_submit(nc, topology, request)
        if not wait:
            return eid
        return await _follow_submitted(nc, topology, eid, progress)

    out = _with_nats(nats_url, "noetl-submit", go)
    if isinstance(out, str):
        _echo_execution_id(out, as_json)
        return
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
@nats_option
@prefix_option
def retry(
    execution_id: str, from_steps: tuple[str, ...], wait: bool, as_json: bool, nats_url: str, prefix: str
) -> None:
    """Re-run a failed or cancelled execution from its failed or interrupted step(s), reusing the results of
    what succeeded."""
    from noetl_stream.client import RetryError, retry_request
    from noetl_stream.client import submit as do_submit
    from noetl_stream.progress import Progress

    topology = _topology(prefix)
    progress = None if as_json else Progress()

    async def go(nc: Any) -> Any:
        request = await retry_request(nc, topology, execution_id, from_steps)
        _check_from_steps(request, execution_id, from_steps)
        new_id = await do_submit(nc, topology, request)
        if not wait:
            return new_id
        return await _follow_submitted(nc, topology, new_id, progress)

    try:
        out = _with_nats(nats_url, "noetl-retry", go)
    except RetryError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_INVALID)
    if isinstance(out, str):
        _echo_execution_id(out, as_json)
        return
    _exit_with_outcome(msgspec.to_builtins(out), as_json, progress)  # as `submit --wait` does


def _check_from_steps(request: Any, execution_id: str, from_steps: tuple[str, ...]) -> None:
    """Refuse a ``--from-step`` the execution's playbook does not have, before submitting a retry the
    controller could only fail."""
    from noetl_stream.client import RetryError

    if not from_steps or not isinstance(request.playbook, str):
        return
    compiled = compile_playbook(
        request.playbook, request.file or "<playbook>", extensions=tuple(request.extensions)
    )
    if compiled.playbook is None:
        return  # the controller compiles it (maybe with its own extensions) and says what is wrong
    steps = compiled.playbook.steps
    unknown = [step for step in from_steps if step not in steps]
    if unknown:
        raise RetryError(
            f"execution {execution_id} has no step {', '.join(map(repr, unknown))} (steps: {', '.join(steps)})"
        )
