"""CLI commands that run the installation: ``controller``, ``worker`` and ``provision``."""

from __future__ import annotations

import sys
from typing import Any

import click

from noetl_stream.cli.common import (
    CONCURRENCY,
    EXIT_INVALID,
    GRACE,
    LOG_LEVEL,
    echo_json,
    nats_option,
    prefix_option,
    run_async,
    topology_for,
    with_nats,
)
from noetl_stream.cli.main import main


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
@click.option(
    "--grace",
    default=30.0,
    show_default=True,
    type=GRACE,
    help="Seconds to finish in-flight work on SIGTERM.",
)
@click.option("--log-level", default="info", show_default=True, type=LOG_LEVEL)
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
    "--api-read-token",
    "api_read_tokens",
    multiple=True,
    help="A bearer token that may only read: the GET routes, 403 for the others (repeat; also "
    "NOETL_API_READ_TOKENS, comma-separated).",
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
    api_read_tokens: tuple[str, ...] = (),
    legacy: bool = False,
    controller_id: str | None = None,
) -> None:
    """Run the control plane (consumes boundary events and requests, schedules steps).

    Several controllers share the executions: each holds the leases of some partitions."""
    from noetl_stream.api import parse_listen, tokens_from
    from noetl_stream.api.app import check_token_kinds
    from noetl_stream.api.server import READ_TOKENS_ENV
    from noetl_stream.errors import ConfigurationError
    from noetl_stream.logs import configure
    from noetl_stream.runtime.services import run_controller

    configure(log_level)
    listen: tuple[str, int] | None = None
    tokens: tuple[str, ...] = ()
    read_tokens: tuple[str, ...] = ()
    if http is not None:
        try:
            listen = parse_listen(http)
            tokens, read_tokens = check_token_kinds(
                tokens_from(api_tokens), tokens_from(api_read_tokens, name=READ_TOKENS_ENV)
            )
        except ConfigurationError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_INVALID)
    extensions: tuple[str, ...] = ("legacy",) if legacy else ()
    run_async(
        run_controller(
            nats_url,
            topology_for(prefix),
            pools,
            grace,
            listen,
            tokens,
            extensions,
            controller_id,
            api_read_tokens=read_tokens,
        ),
        nats_url,
    )


@main.command()
@nats_option
@prefix_option
@click.option("--pool", default="default", show_default=True, help="The pool whose commands to run.")
@click.option(
    "--concurrency",
    default=16,
    show_default=True,
    type=CONCURRENCY,
    help="Commands run at once by this process.",
)
@click.option("--name", default=None, help="Worker name in events (default host-pid).")
@click.option(
    "--grace",
    default=30.0,
    show_default=True,
    type=GRACE,
    help="Seconds to finish in-flight commands on SIGTERM.",
)
@click.option("--log-level", default="info", show_default=True, type=LOG_LEVEL)
@click.option(
    "--task-events",
    type=click.Choice(["all", "separate", "informative"]),
    default="all",
    show_default=True,
    help="all: every task run writes task.started/task.done (the spec's recommended event set); a step "
    "that ends before its events are published stores its step.started and task events inside its "
    "boundary's message. separate: the same events, each a message of its own. informative: a step whose "
    "one task succeeded at once, with no rule fired and no captured output, writes only its step events "
    "(docs/architecture.md, 'Task events').",
)
@click.option(
    "--processes",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Worker processes on this machine, supervised (restarted if they die); all share the pool.",
)
@click.option(
    "--metrics",
    "metrics",
    default=None,
    metavar="HOST:PORT",
    help="Serve /metrics (Prometheus text format, no token) here; with --processes N, process i on "
    "PORT + i - 1.",
)
def worker(
    nats_url: str,
    prefix: str,
    pool: str,
    concurrency: int,
    name: str | None,
    grace: float,
    log_level: str,
    task_events: str = "all",
    processes: int = 1,
    metrics: str | None = None,
) -> None:
    """Run a worker of one pool (any number may share a pool)."""
    from noetl_stream.api import parse_listen
    from noetl_stream.errors import ConfigurationError
    from noetl_stream.logs import configure
    from noetl_stream.runtime.services import run_worker

    configure(log_level)
    topology = topology_for(prefix)
    metrics_at: tuple[str, int] | None = None
    if metrics is not None:
        try:
            metrics_at = parse_listen(metrics, "--metrics")
        except ConfigurationError as exc:
            raise click.BadParameter(str(exc), param_hint="--metrics") from None
        if processes > 1 and metrics_at[1] == 0:
            raise click.BadParameter("give a port (process i serves on PORT + i - 1)", param_hint="--metrics")
        if metrics_at[1] + processes - 1 > 65535:
            raise click.BadParameter(f"{processes} processes need ports up to 65535", param_hint="--metrics")
    if processes > 1:
        from noetl_stream.protocol.subjects import SubjectError, check_pool
        from noetl_stream.runtime.supervisor import supervise_workers

        try:
            check_pool(pool)  # before starting children that would all fail on it
        except SubjectError as exc:
            raise click.BadParameter(str(exc), param_hint="--pool") from None
        argv = ["--pool", pool, "--concurrency", str(concurrency), "--grace", str(grace)]
        argv += ["--log-level", log_level, "--task-events", task_events]
        sys.exit(supervise_workers(processes, argv, nats_url, topology.prefix, grace, name, metrics_at))
    run_async(
        run_worker(nats_url, topology, pool, concurrency, grace, name, task_events, metrics_at), nats_url
    )
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
    "controllers you will run (default: env NOETL_PARTITIONS, else 8).",
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

    topology = topology_for(prefix, replicas=replicas, partitions=partitions, lease_ttl_s=lease_ttl)

    async def go(nc: Any) -> object:
        return await do_provision(nc.jetstream(), topology, pools)

    echo_json(with_nats(nats_url, "noetl-provision", go))
