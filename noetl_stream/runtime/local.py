"""Everything in one process: an embedded ``nats-server`` (or a given URL), a controller, workers."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client as NATS

from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import RunSummary, follow
from noetl_stream.control.controller import Controller
from noetl_stream.control.leases import default_controller_id
from noetl_stream.dataplane.tools.base import WorkerServices
from noetl_stream.dataplane.worker import Worker
from noetl_stream.dsl.budget import set_cpu_seconds
from noetl_stream.jetstream.connection import connect
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.keychain import Keychain, KeychainKey
from noetl_stream.kv.provision import provision
from noetl_stream.logs import configure_unless_configured
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event
from noetl_stream.runtime.plugins import load_plugins
from noetl_stream.settings import Settings


@dataclass
class Runtime:
    nc: NATS
    topology: Topology
    controller: Controller
    workers: list[Worker] = field(default_factory=list)
    server: EmbeddedNats | None = None

    async def run_playbook(
        self,
        text: str,
        file: str = "<playbook>",
        payload: dict[str, Any] | None = None,
        on_event: Callable[[Event], None] | None = None,
        timeout: float | None = None,
        extensions: tuple[str, ...] = (),
    ) -> RunSummary:
        request = request_for(text, file, payload, extensions=extensions)
        execution_id = await submit(self.nc, self.topology, request)
        return await follow(self.nc, self.topology, execution_id, on_event, timeout)


_RUNS = itertools.count(1)

GRACE_S = 5.0
"""How long shutting the runtime down waits for a worker's commands of executions still running."""

ABANDONED_GRACE_S = 0.5
"""The wait when every command still running on a worker belongs to an execution that ended (a child
cancelled at its parent's ``child_timeout_s``): nothing waits for their results. Also the wait of an
interrupted (Ctrl-C) run."""


def _worker_grace(worker: Worker, grace_s: float) -> float:
    """`grace_s` while `worker` runs a command of an execution that has not ended (its work is kept:
    it finishes, or it is handed back); else `ABANDONED_GRACE_S`."""
    running = worker.running_executions()
    return grace_s if running.difference(worker.ended) else min(grace_s, ABANDONED_GRACE_S)


@contextlib.asynccontextmanager
async def local_runtime(
    nats_url: str | None = None,
    *,
    topology: Topology | None = None,
    workers: int = 1,
    concurrency: int = 16,
    pools: tuple[str, ...] = ("default",),
    keychain_key: KeychainKey | None = None,
    extensions: tuple[str, ...] = (),
    task_events: str = "all",
    connect_wait_s: float = 10.0,
) -> AsyncIterator[Runtime]:
    """Start (and afterwards stop) a NATS server if no URL is given, a controller and workers.

    ``extensions`` (``legacy``) are DSL extensions the controller compiles every request with.
    ``task_events``: the workers' (`Worker`; ``all`` or ``informative``).

    Workers resolve ``auth`` credentials from the keychain bucket, decrypting with `keychain_key`
    (default: ``NOETL_KEYCHAIN_KEY`` / ``NOETL_KEYCHAIN_KEY_FILE``, read when a secret is first needed).
    """
    load_plugins()
    configure_unless_configured()
    topology = topology or Topology()
    server: EmbeddedNats | None = None
    try:
        if nats_url is None:
            server = EmbeddedNats()
            await asyncio.to_thread(server.start)
            nats_url = server.url
        nc = await connect(nats_url, name="noetl-local", connect_wait_s=connect_wait_s)
        try:
            await provision(nc.jetstream(), topology, pools, keep_replicas=True)
            # Its own controller id: several local runs may share a server (and a host) at once.
            settings = Settings.from_env(os.environ)
            set_cpu_seconds(settings.template_cpu_s)
            controller_id = (
                f"{default_controller_id(settings.controller_id)}-local-{os.getpid()}-{next(_RUNS)}"
            )
            controller = Controller(
                nc,
                topology,
                default_pool=pools[0],
                extensions=extensions,
                controller_id=controller_id,
                settings=settings,
            )
            await controller.start()
            runtime = Runtime(nc=nc, topology=topology, controller=controller, server=server)
            grace_s = GRACE_S
            try:
                for i in range(workers):
                    keychain = Keychain(nc.jetstream(), topology, keychain_key)
                    w = Worker(
                        nc,
                        topology,
                        pool=pools[0],
                        concurrency=concurrency,
                        name=f"local-{i}",
                        task_events=task_events,
                        services=WorkerServices(credentials=keychain.resolver()),
                    )
                    await w.start()
                    runtime.workers.append(w)
                yield runtime
            except (asyncio.CancelledError, KeyboardInterrupt):
                grace_s = ABANDONED_GRACE_S  # interrupted (Ctrl-C): running tasks are abandoned
                raise
            finally:
                for w in runtime.workers:
                    await w.shutdown(grace_s=_worker_grace(w, grace_s))
                await controller.shutdown(grace_s=grace_s)
        finally:
            with contextlib.suppress(Exception):
                await nc.drain() if nc.is_connected else await nc.close()
    finally:
        if server is not None:
            await asyncio.to_thread(server.close)  # it made its own temp directory: removed with it
