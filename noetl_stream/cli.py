"""The ``noetl-stream`` command line. The edge: maps errors to exit codes, never tracebacks."""

from __future__ import annotations

import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import click
import msgspec

from noetl_stream import __version__
from noetl_stream.dsl import compile_playbook
from noetl_stream.errors import ConfigurationError
from noetl_stream.subjects import Topology

T = TypeVar("T")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"

nats_option = click.option(
    "--nats",
    "nats_url",
    envvar="NOETL_NATS_URL",
    default=DEFAULT_NATS_URL,
    show_default=True,
    help="NATS server URL, or several comma-separated (the nodes of a cluster) (env NOETL_NATS_URL).",
)
prefix_option = click.option(
    "--prefix",
    envvar="NOETL_PREFIX",
    default="noetl",
    show_default=True,
    help="Subject/stream prefix of the installation (env NOETL_PREFIX).",
)


TOPOLOGY_ENV = {
    "NOETL_COMMAND_ACK_WAIT_S": ("command_ack_wait_s", float),
    "NOETL_COMMAND_MAX_DELIVER": ("command_max_deliver", int),
    "NOETL_REPLICAS": ("replicas", int),
    "NOETL_STORAGE": ("storage", str),
    "NOETL_EVENTS_MAX_AGE_S": ("events_max_age_s", float),
    "NOETL_PARTITIONS": ("partitions", int),
    "NOETL_LEASE_TTL_S": ("lease_ttl_s", float),
}


def _topology(prefix: str, **overrides: Any) -> Topology:
    """The installation's names and JetStream settings: ``--prefix`` plus the ``NOETL_*`` variables above
    (and `overrides` from command-line options, which win)."""
    import os

    from noetl_stream.subjects import TopologyError

    settings: dict[str, Any] = {}
    for env, (field, cast) in TOPOLOGY_ENV.items():
        raw = os.environ.get(env)
        if raw:
            try:
                settings[field] = cast(raw)
            except ValueError:
                raise click.BadParameter(f"{env}={raw!r} is not a valid {cast.__name__}") from None
    settings.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return Topology(prefix=prefix, **settings)
    except (TopologyError, TypeError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="--prefix / NOETL_* settings") from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="noetl-stream")
def main() -> None:
    """Run NoETL playbooks (noetl.io/v2) on NATS JetStream."""
    from noetl_stream.logs import configure
    from noetl_stream.plugins import load_plugins

    configure("warning")
    load_plugins()


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print diagnostics as a JSON list.")
@click.option("--legacy", is_flag=True, help="Translate legacy DSL forms (000/004, 002) before validating.")
@click.option(
    "--show-canonical",
    is_flag=True,
    help="Print the canonical expansion (after legacy translation and sugar).",
)
def validate(
    files: tuple[Path, ...], as_json: bool, legacy: bool = False, show_canonical: bool = False
) -> None:
    """Compile playbooks and report every problem as FILE:LINE:COL: message."""
    extensions: tuple[str, ...] = ("legacy",) if legacy else ()
    all_diags: list[dict[str, object]] = []
    invalid = False
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            invalid = True
            msg = f"{path}: cannot read: {exc.strerror if isinstance(exc, OSError) else exc}"
            all_diags.append(
                {
                    "severity": "error",
                    "message": msg,
                    "file": str(path),
                    "line": 0,
                    "col": 0,
                    "path": "<root>",
                    "code": "io",
                }
            )
            if not as_json:
                click.echo(msg, err=True)
            continue
        result = compile_playbook(text, str(path), extensions=extensions)
        if result.errors:
            invalid = True
        for d in result.diagnostics:
            all_diags.append(msgspec.to_builtins(d))
            if not as_json:
                click.echo(d.format(), err=d.severity == "error")
        if show_canonical and not as_json:
            _show_canonical(text, str(path), extensions)
        if not as_json and not result.errors:
            name = result.playbook.metadata.name if result.playbook else "?"
            click.echo(
                f"{path}: ok ({name}, {len(result.playbook.workflow) if result.playbook else 0} steps)"
            )
    if as_json:
        click.echo(msgspec.json.encode(all_diags).decode())
    sys.exit(EXIT_INVALID if invalid else EXIT_OK)


def _load_payload(payload: str | None, sets: tuple[str, ...]) -> dict[str, object]:
    import json

    data: dict[str, object] = {}
    if payload:
        text = Path(payload[1:]).read_text(encoding="utf-8") if payload.startswith("@") else payload
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
    help="NATS URL (default: start an embedded nats-server).",
)
@click.option("--workers", default=1, show_default=True, help="In-process workers.")
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

    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        click.echo(f"{file}: cannot read: {exc}", err=True)
        sys.exit(EXIT_INVALID)
    extensions: tuple[str, ...] = ("legacy",) if legacy else ()
    result = compile_playbook(text, str(file), extensions=extensions)
    for d in result.diagnostics:
        click.echo(d.format(), err=True)
    if result.playbook is None:
        sys.exit(EXIT_INVALID)
    data = _load_payload(payload, sets)
    topology = _topology(prefix)
    progress = None if as_json else Progress()

    async def go() -> object:
        from noetl_stream.local import local_runtime

        async with local_runtime(nats_url, topology=topology, workers=workers) as rt:
            on_event = progress.on_event if progress else None
            return await rt.run_playbook(text, str(file), data, on_event, extensions=extensions)

    from noetl_stream.loop import run_event_loop

    try:
        summary = run_event_loop(go())
    except KeyboardInterrupt:
        sys.exit(130)
    except (OSError, ConnectionError, RuntimeError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    out = msgspec.to_builtins(summary)
    if as_json:
        click.echo(msgspec.json.encode(out).decode())
    else:
        assert progress is not None
        progress.finish(out)
    status = out.get("status") if isinstance(out, dict) else None
    sys.exit(EXIT_OK if status == "success" else EXIT_INVALID if status == "rejected" else EXIT_FAILED)


def _run_async(coro: Coroutine[Any, Any, T]) -> T:
    from noetl_stream.loop import run_event_loop

    try:
        return run_event_loop(coro)
    except KeyboardInterrupt:
        sys.exit(130)
    except ConnectionError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    except ConfigurationError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_INVALID)


@main.command()
@nats_option
@prefix_option
@click.option(
    "--pool",
    "pools",
    multiple=True,
    default=("default",),
    show_default=True,
    help="Worker pools to provision consumers for (repeat).",
)
@click.option("--grace", default=30.0, show_default=True, help="Seconds to finish in-flight work on SIGTERM.")
@click.option("--log-level", default="info", show_default=True)
@click.option(
    "--http", "http", default=None, metavar="HOST:PORT", help="Serve the REST API and /metrics here."
)
@click.option(
    "--api-token",
    "api_tokens",
    multiple=True,
    help="A bearer token the REST API accepts (repeat; also NOETL_API_TOKENS, comma-separated).",
)
@click.option(
    "--legacy",
    is_flag=True,
    envvar="NOETL_LEGACY",
    help="Compile every request (and catalog registration) with the legacy extension (env NOETL_LEGACY=1).",
)
@click.option(
    "--controller-id",
    envvar="NOETL_CONTROLLER_ID",
    default=None,
    help="This controller's id in the partition leases, unique among live controllers "
    "(env NOETL_CONTROLLER_ID; default: the host name, i.e. the pod name on Kubernetes).",
)
def controller(
    nats_url: str,
    prefix: str,
    pools: tuple[str, ...],
    grace: float,
    log_level: str,
    http: str | None,
    api_tokens: tuple[str, ...],
    legacy: bool = False,
    controller_id: str | None = None,
) -> None:
    """Run the control plane (consumes boundary events and requests, schedules steps).

    Several controllers share the executions: each holds the leases of some partitions."""
    from noetl_stream.api import parse_listen, tokens_from
    from noetl_stream.api.app import check_tokens
    from noetl_stream.errors import ConfigurationError
    from noetl_stream.logs import configure
    from noetl_stream.services import run_controller

    configure(log_level)
    listen: tuple[str, int] | None = None
    tokens: tuple[str, ...] = ()
    if http is not None:
        try:
            listen = parse_listen(http)
            tokens = check_tokens(tokens_from(api_tokens))
        except ConfigurationError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_INVALID)
    extensions: tuple[str, ...] = ("legacy",) if legacy else ()
    _run_async(
        run_controller(nats_url, _topology(prefix), pools, grace, listen, tokens, extensions, controller_id)
    )


@main.command()
@nats_option
@prefix_option
@click.option("--pool", default="default", show_default=True, help="The pool whose commands to run.")
@click.option("--concurrency", default=16, show_default=True, help="Commands run at once by this process.")
@click.option("--name", default=None, help="Worker name in events (default host-pid).")
@click.option(
    "--grace", default=30.0, show_default=True, help="Seconds to finish in-flight commands on SIGTERM."
)
@click.option("--log-level", default="info", show_default=True)
@click.option(
    "--processes",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Worker processes on this machine, supervised (restarted if they die); all share the pool.",
)
def worker(
    nats_url: str,
    prefix: str,
    pool: str,
    concurrency: int,
    name: str | None,
    grace: float,
    log_level: str,
    processes: int = 1,
) -> None:
    """Run a worker of one pool (any number may share a pool)."""
    from noetl_stream.logs import configure
    from noetl_stream.services import run_worker

    configure(log_level)
    topology = _topology(prefix)
    if processes > 1:
        from noetl_stream.subjects import SubjectError, check_pool
        from noetl_stream.supervisor import supervise_workers

        try:
            check_pool(pool)  # before starting children that would all fail on it
        except SubjectError as exc:
            raise click.BadParameter(str(exc), param_hint="--pool") from None
        argv = ["--pool", pool, "--concurrency", str(concurrency), "--grace", str(grace)]
        argv += ["--log-level", log_level]
        sys.exit(supervise_workers(processes, argv, nats_url, topology.prefix, grace, name))
    _run_async(run_worker(nats_url, topology, pool, concurrency, grace, name))
    _exit_now_if_tools_still_run()


def _exit_now_if_tools_still_run() -> None:
    """After the grace period, a tool still running in a thread (python, duckdb) must not keep the process
    alive: its command was left unacknowledged and will be redelivered. Exit without joining it."""
    import os
    import threading

    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


@main.command()
@nats_option
@prefix_option
@click.option("--pool", "pools", multiple=True, default=("default",), show_default=True)
@click.option(
    "--replicas",
    type=click.IntRange(1, 5),
    default=None,
    help="Replicas of every stream, KV bucket and the object store: 3 on a 3-node cluster "
    "(default: env NOETL_REPLICAS, else 1). Changes the count of existing objects too.",
)
@click.option(
    "--partitions",
    type=click.IntRange(1, 1024),
    default=None,
    help="Partitions of the executions, each owned by one controller at a time: at least the number of "
    "controllers you will run (default: env NOETL_PARTITIONS, else 1).",
)
@click.option(
    "--lease-ttl",
    type=click.FloatRange(1.0),
    default=None,
    help="Seconds after which a dead controller's partitions are taken over (default: env "
    "NOETL_LEASE_TTL_S, else 10).",
)
def provision(
    nats_url: str,
    prefix: str,
    pools: tuple[str, ...],
    replicas: int | None = None,
    partitions: int | None = None,
    lease_ttl: float | None = None,
) -> None:
    """Create or update the streams, consumers, KV buckets and object store (idempotent)."""
    from noetl_stream.kv.provision import provision as do_provision
    from noetl_stream.natsconn import connect

    topology = _topology(prefix, replicas=replicas, partitions=partitions, lease_ttl_s=lease_ttl)

    async def go() -> object:
        nc = await connect(nats_url, name="noetl-provision", connect_wait_s=10.0, max_reconnect_attempts=0)
        try:
            return await do_provision(nc.jetstream(), topology, pools)
        finally:
            await nc.close()

    report = _run_async(go())
    click.echo(msgspec.json.encode(report).decode())


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
) -> None:
    """Publish an execution request onto the request subject; print the execution id."""
    from noetl_stream.client import follow, request_for
    from noetl_stream.client import submit as do_submit
    from noetl_stream.natsconn import connect
    from noetl_stream.progress import Progress

    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        click.echo(f"{file}: cannot read: {exc}", err=True)
        sys.exit(EXIT_INVALID)
    data = _load_payload(payload, sets)
    topology = _topology(prefix)
    progress = None if as_json else Progress()

    async def go() -> object:
        nc = await connect(nats_url, name="noetl-submit", connect_wait_s=10.0, max_reconnect_attempts=0)
        try:
            request = request_for(text, str(file), data, extensions=("legacy",) if legacy else ())
            eid = await do_submit(nc, topology, request)
            if not wait:
                return eid
            return await follow(nc, topology, eid, progress.on_event if progress else None)
        finally:
            await nc.close()

    out = _run_async(go())
    if isinstance(out, str):
        click.echo(msgspec.json.encode({"execution_id": out}).decode() if as_json else out)
        return
    summary = msgspec.to_builtins(out)
    if as_json:
        click.echo(msgspec.json.encode(summary).decode())
    elif progress is not None:
        progress.finish(summary)
    status = summary.get("status")
    sys.exit(EXIT_OK if status == "success" else EXIT_INVALID if status == "rejected" else EXIT_FAILED)


@main.command()
@click.argument("execution_id")
@nats_option
@prefix_option
def status(execution_id: str, nats_url: str, prefix: str) -> None:
    """Show an execution's status, step by step (folded from its events)."""
    from noetl_stream.client import Tracker
    from noetl_stream.kv.history import read_events
    from noetl_stream.natsconn import connect
    from noetl_stream.subjects import SubjectError

    topology = _topology(prefix)

    async def go() -> Tracker:
        nc = await connect(nats_url, name="noetl-status", connect_wait_s=10.0, max_reconnect_attempts=0)
        try:
            tracker = Tracker(execution_id)
            async for _, ev in read_events(nc.jetstream(), topology, execution_id):
                tracker.apply(ev)
            return tracker
        finally:
            await nc.close()

    try:
        tracker = _run_async(go())
    except SubjectError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_INVALID)
    summary = msgspec.to_builtins(tracker.summary)
    if not summary["events"]:
        click.echo(f"error: no execution {execution_id}", err=True)
        sys.exit(EXIT_INVALID)
    summary.pop("duration_s", None)
    click.echo(msgspec.json.encode(summary).decode())


@main.command()
@click.argument("execution_id")
@click.option("--follow", "follow_", is_flag=True, help="Keep printing until the execution finishes.")
@click.option("--json", "as_json", is_flag=True, help="One JSON event per line (the raw events).")
@nats_option
@prefix_option
def events(execution_id: str, follow_: bool, as_json: bool, nats_url: str, prefix: str) -> None:
    """Print an execution's events as a timeline: time since the request, event, step, step run / task
    run / iteration, status, duration and error."""
    from noetl_stream.client import follow
    from noetl_stream.kv.history import read_events
    from noetl_stream.natsconn import connect
    from noetl_stream.timeline import Timeline
    from noetl_stream.wire import Event

    topology = _topology(prefix)
    timeline = Timeline()

    def show(ev: Event) -> None:
        click.echo(msgspec.json.encode(ev).decode() if as_json else timeline.line(ev))

    async def go() -> None:
        nc = await connect(nats_url, name="noetl-events", connect_wait_s=10.0, max_reconnect_attempts=0)
        try:
            if follow_:
                await follow(nc, topology, execution_id, show)
            else:
                async for _, ev in read_events(nc.jetstream(), topology, execution_id):
                    show(ev)
        finally:
            await nc.close()

    _run_async(go())


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
    from noetl_stream.control.state import ExecutionState
    from noetl_stream.natsconn import connect

    topology = _topology(prefix)
    until_seq = int(until) if until is not None and until.isdigit() else None
    until_time = until if until is not None and until_seq is None else None

    async def go() -> tuple[ExecutionState | None, list[str]]:
        nc = await connect(nats_url, name="noetl-replay", connect_wait_s=10.0, max_reconnect_attempts=0)
        try:
            js = nc.jetstream()
            if verify:
                diffs, live = await rp.verify(js, topology, execution_id)
                return live, diffs
            state = await rp.replay(js, topology, execution_id, until_seq=until_seq, until_time=until_time)
            return state, []
        finally:
            await nc.close()

    state, diffs = _run_async(go())
    if state is None:
        click.echo(f"error: no events for execution {execution_id}", err=True)
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
        click.echo(msgspec.json.encode(data).decode())
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
    """Re-run a failed execution from its failed step(s), reusing the results of what succeeded."""
    from noetl_stream.client import RetryError, follow, retry_request
    from noetl_stream.client import submit as do_submit
    from noetl_stream.natsconn import connect

    topology = _topology(prefix)

    async def go() -> Any:
        nc = await connect(nats_url, name="noetl-retry", connect_wait_s=10.0, max_reconnect_attempts=0)
        try:
            request = await retry_request(nc, topology, execution_id, from_steps)
            new_id = await do_submit(nc, topology, request)
            return await follow(nc, topology, new_id) if wait else new_id
        finally:
            await nc.close()

    try:
        out = _run_async(go())
    except RetryError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_INVALID)
    if isinstance(out, str):
        click.echo(msgspec.json.encode({"execution_id": out}).decode() if as_json else out)
        return
    summary = msgspec.to_builtins(out)
    click.echo(msgspec.json.encode(summary).decode())
    sys.exit(EXIT_OK if summary.get("status") == "success" else EXIT_FAILED)


# --- catalog, executions, ctx (cli_catalog.py registers them on `main`) -------------------------------

import noetl_stream.cli_catalog  # noqa: E402
import noetl_stream.cli_controls  # noqa: E402
import noetl_stream.cli_keychain  # noqa: E402, F401

# --- legacy DSL: `validate --legacy/--show-canonical`, `migrate` (noetl_stream/migrate.py) ---


def _show_canonical(text: str, file: str, extensions: tuple[str, ...]) -> None:
    from noetl_stream.dsl.canonical import dump_yaml, expand
    from noetl_stream.dsl.diagnostics import PlaybookError
    from noetl_stream.dsl.source import load_yaml

    try:
        data, smap = load_yaml(text, file)
    except PlaybookError:
        return
    click.echo(f"# {file}: canonical form")
    click.echo(dump_yaml(expand(data, smap, extensions).data), nl=False)


@main.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "-o", "--output", "out", type=click.Path(dir_okay=False, path_type=Path), help="Write the result here."
)
@click.option("--in-place", is_flag=True, help="Rewrite FILE itself.")
@click.option("-q", "--quiet", is_flag=True, help="Do not list the translated constructs.")
def migrate(file: Path, out: Path | None, in_place: bool, quiet: bool) -> None:
    """Rewrite a legacy playbook in the canonical v10 form (keeps comments and key order where it can).

    Prints the result unless -o or --in-place is given; writes nothing when the playbook has a
    construct without a faithful translation (exit 2, with the reason) or when the result would not
    validate.
    """
    from noetl_stream.migrate import migrate_text

    if out is not None and in_place:
        raise click.BadParameter("give -o or --in-place, not both", param_hint="--in-place")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        click.echo(f"{file}: cannot read: {exc.strerror if isinstance(exc, OSError) else exc}", err=True)
        sys.exit(EXIT_INVALID)
    migration = migrate_text(text, str(file))
    for d in migration.diagnostics:
        if d.severity == "error" or not quiet:
            click.echo(d.format(), err=True)
    if migration.text is None:
        sys.exit(EXIT_INVALID)
    target = file if in_place else out
    if target is None:
        click.echo(migration.text, nl=False)
        return
    try:
        target.write_text(migration.text, encoding="utf-8")
    except OSError as exc:
        click.echo(f"{target}: cannot write: {exc.strerror}", err=True)
        sys.exit(EXIT_FAILED)
    n = sum(1 for d in migration.diagnostics if d.severity == "warning")
    click.echo(f"{target}: migrated ({n} legacy constructs translated)", err=True)
