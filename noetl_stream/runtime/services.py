"""Long-running processes for the CLI: controller and worker, with graceful SIGTERM/SIGINT shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

import nats.errors
import structlog
from aiohttp import web
from nats.aio.client import Client as NATS

from noetl_stream.api.server import http_url
from noetl_stream.control.controller import Controller
from noetl_stream.dataplane.metrics import WorkerMetrics
from noetl_stream.dataplane.tools.base import WorkerServices
from noetl_stream.dataplane.worker import Worker
from noetl_stream.errors import ConfigurationError
from noetl_stream.jetstream.connection import connect
from noetl_stream.kv.keychain import Keychain
from noetl_stream.kv.provision import ProvisionError, provision, provisioned_topology
from noetl_stream.prometheus import CONTENT_TYPE
from noetl_stream.protocol.subjects import Topology
from noetl_stream.settings import Settings

log = structlog.get_logger(__name__)

T = TypeVar("T")


async def provision_at_start(nc: NATS, topology: Topology, pools: tuple[str, ...]) -> None:
    """Check the JetStream objects and create the missing ones, retrying what passes by itself: a
    clustered stream electing a leader after its node died, a reconnect. A refusal (`ProvisionError`)
    is final.

    Existing objects keep the installation's settings (`provision` with ``keep_existing``): a process
    whose ``NOETL_*`` settings differ warns (``provision.settings_differ``) and starts, using the
    installation's where it depends on them (`run_worker`); `noetl-stream provision` changes them."""
    delay = 0.2
    for attempt in itertools.count(1):
        try:
            await provision(nc.jetstream(), topology, pools, keep_existing=True)
            return
        except ProvisionError as exc:
            if not isinstance(exc.__cause__, (nats.errors.TimeoutError, TimeoutError)) or attempt >= 20:
                raise
            error: Exception = exc
        except (nats.errors.TimeoutError, nats.errors.ConnectionReconnectingError, TimeoutError) as exc:
            if attempt >= 20:
                raise
            error = exc
        log.warning("provision.retry", attempt=attempt, error=str(error) or type(error).__name__)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 5.0)


def _stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)


async def _unless_stopped(work: Coroutine[Any, Any, T], stop: asyncio.Event) -> T | None:
    """The result of `work`, or None when `stop` is set first (a SIGTERM while NATS is unreachable:
    the process leaves at once, with a log line and exit status 0, instead of dying by the signal)."""
    task = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if task.done():
        return task.result()
    # Cancelled again until it ends: Python 3.11's asyncio.wait_for (nats-py's connect attempts use it)
    # loses a cancellation that comes as the attempt fails, and the connect loop then goes on.
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.5)
    with contextlib.suppress(asyncio.CancelledError, Exception):
        task.result()
    return None


async def _start(
    url: str, name: str, topology: Topology, pools: tuple[str, ...], stop: asyncio.Event
) -> NATS | None:
    """Connect (waiting for NATS as long as it takes) and check the installation, unless a signal
    comes first: then None, and the connection is closed."""
    nc = await _unless_stopped(connect(url, name=name, connect_wait_s=None), stop)
    if nc is None:
        log.info("stopped_before_start", process=name, reason="a signal came before NATS answered")
        return None
    try:
        if await _unless_stopped(_provisioned(nc, topology, pools), stop) is None:
            log.info("stopped_before_start", process=name, reason="a signal came while provisioning")
            await nc.close()
            return None
    except BaseException:
        await nc.close()
        raise
    return nc


async def _provisioned(nc: NATS, topology: Topology, pools: tuple[str, ...]) -> bool:
    await provision_at_start(nc, topology, pools)
    return True


async def run_controller(
    url: str,
    topology: Topology,
    pools: tuple[str, ...],
    grace_s: float,
    http: tuple[str, int] | None = None,
    api_tokens: tuple[str, ...] = (),
    extensions: tuple[str, ...] = (),
    controller_id: str | None = None,
    api_read_tokens: tuple[str, ...] = (),
) -> None:
    """Run a controller until SIGTERM/SIGINT; with ``http`` (host, port) it also serves the REST API
    (``api_tokens`` may do everything, ``api_read_tokens`` only read).

    ``extensions`` (``legacy``) are DSL extensions every request is compiled with."""
    from noetl_stream.api import ApiServer
    from noetl_stream.tracing import setup_from_env

    setup_from_env("noetl-stream-controller")  # OpenTelemetry spans, when installed and enabled
    stop = asyncio.Event()
    _stop_on_signals(stop)
    nc = await _start(url, "noetl-controller", topology, pools, stop)
    if nc is None:
        return
    try:
        controller = Controller(
            nc,
            topology,
            default_pool=pools[0],
            extensions=extensions,
            controller_id=controller_id,
            settings=Settings.from_env(os.environ),
        )
        api = (
            ApiServer(controller, http[0], http[1], api_tokens, api_read_tokens) if http is not None else None
        )
        if api is not None:  # the workers' task events are watched before any work is taken: none missed
            await api.metrics.start(nc)
        async with controller:
            if api is not None:
                try:
                    await api.start()
                except OSError as exc:  # the port is taken, the address is not ours: the controller leaves
                    await controller.shutdown(grace_s=grace_s)
                    raise ConfigurationError(
                        f"cannot serve the REST API on {api.host}:{api.port}: {exc.strerror or exc}"
                    ) from None
            try:
                await stop.wait()
                log.info("controller.stopping", grace_s=grace_s)
            finally:
                if api is not None:
                    await api.stop()
                await controller.shutdown(grace_s=grace_s)  # (the context exit then finds it stopped)
    finally:
        await nc.drain()


class MetricsServer:
    """``GET /metrics`` of a worker process (Prometheus text format), on its own port: ``worker
    --metrics HOST:PORT``. It serves nothing else and asks for no token (bind it to an address only the
    scraper reaches); each scrape reads the pool consumer's lag from JetStream."""

    def __init__(self, metrics: WorkerMetrics, js: Any, host: str, port: int) -> None:
        self.metrics = metrics
        self.js = js
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        await self.metrics.refresh(self.js)
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._serve)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except OSError as exc:  # the port is taken, the address is not this machine's
            await runner.cleanup()
            raise ConfigurationError(
                f"cannot serve /metrics on {self.host}:{self.port}: {exc.strerror or exc}"
            ) from None
        self._runner = runner
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        if sockets:  # (port 0: the one the system gave)
            self.port = int(sockets[0].getsockname()[1])
        log.info("worker.metrics_listening", url=f"{http_url(self.host, self.port)}/metrics")

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()


async def run_worker(
    url: str,
    topology: Topology,
    pool: str,
    concurrency: int,
    grace_s: float,
    name: str | None = None,
    task_events: str = "all",
    metrics_at: tuple[str, int] | None = None,
) -> None:
    """Run a worker until SIGTERM/SIGINT; with `metrics_at` (host, port) it serves its ``/metrics`` there."""
    from noetl_stream.tracing import setup_from_env

    setup_from_env("noetl-stream-worker")  # OpenTelemetry spans, when installed and enabled
    stop = asyncio.Event()
    _stop_on_signals(stop)
    nc = await _start(url, f"noetl-worker-{pool}", topology, (pool,), stop)
    if nc is None:
        return
    try:
        # The pool consumer's ack wait as the server has it (ours may differ): long commands are kept
        # alive at a third of it.
        topology = await provisioned_topology(nc.jetstream(), topology, pool=pool)
        keychain = Keychain(nc.jetstream(), topology)  # key from NOETL_KEYCHAIN_KEY(_FILE), when needed
        worker = Worker(
            nc,
            topology,
            pool=pool,
            concurrency=concurrency,
            name=name,
            task_events=task_events,
            services=WorkerServices(credentials=keychain.resolver()),
        )
        server = None
        if metrics_at is not None:  # listening before any work is taken: no task run goes uncounted
            worker.metrics = WorkerMetrics(topology, pool, worker.name)
            worker.metrics.track(worker.commands_running, concurrency)
            server = MetricsServer(worker.metrics, nc.jetstream(timeout=2.0), *metrics_at)
            await server.start()
        try:
            await worker.start()
            await stop.wait()
            log.info("worker.stopping", worker=worker.name, pool=pool, grace_s=grace_s)
            await worker.shutdown(grace_s=grace_s)
        finally:
            if server is not None:
                await server.stop()
    finally:
        await nc.drain()
