"""Say when a step is scheduled on a pool that nothing runs.

A command waits in the commands stream until a worker of its pool takes it (a work queue): a pool with
no consumer provisioned, or a consumer no worker pulls from, holds the execution back with nothing in
the history to say why (the step stays ``scheduled``). Temporal shows such a task queue as having "no
pollers"; the controller logs it, once per pool per `interval_s`, off the fold's path (the first
command for a pool in that time spawns a check of its consumer).

Only commands a fold publishes are looked at: an execution already waiting on such a pool when the
controller starts is reported when its pool next gets a command.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import structlog
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from noetl_stream.protocol.subjects import Topology

log = structlog.get_logger(__name__)

__all__ = ["MAX_POOLS", "PoolWatch"]

MAX_POOLS = 1024
"""Pools remembered as checked lately; past this, those not checked within `interval_s` are forgotten."""


class PoolWatch:
    def __init__(
        self,
        js: JetStreamContext,
        spawn: Callable[[Coroutine[Any, Any, Any]], None],
        interval_s: float = 60.0,
        confirm_after_s: float = 2.0,
    ) -> None:
        """`spawn` runs a check in the background; `confirm_after_s`: a consumer found idle is looked
        at again after this long before it is reported (a worker between two pull requests)."""
        self.js = js
        self.topology = Topology()
        self._spawn = spawn
        self.interval_s = interval_s
        self.confirm_after_s = confirm_after_s
        self._due: dict[str, float] = {}

    def scheduled(self, pool: str, execution_id: str, step: str) -> None:
        """A command for `pool` was published (called per command: a dict lookup when not due)."""
        now = time.monotonic()
        if now < self._due.get(pool, 0.0):
            return
        if len(self._due) >= MAX_POOLS:  # pool names come from requests: keep only those seen lately
            self._due = {p: due for p, due in self._due.items() if due > now}
        self._due[pool] = now + self.interval_s
        self._spawn(self.check(pool, execution_id, step))

    async def check(self, pool: str, execution_id: str, step: str) -> str | None:
        """What is wrong with the pool (logged), or None: ``not_provisioned`` or ``no_workers``."""
        stream, consumer = self.topology.commands_stream, self.topology.pool_consumer(pool)
        where = {"pool": pool, "consumer": consumer, "execution_id": execution_id, "step": step}
        try:
            info = await self.js.consumer_info(stream, consumer)
            if info.num_waiting or info.num_ack_pending:
                return None  # a worker is waiting for work, or running some
            await asyncio.sleep(self.confirm_after_s)
            info = await self.js.consumer_info(stream, consumer)
        except NotFoundError:
            log.warning(
                "controller.pool_not_provisioned",
                **where,
                hint=f"its commands wait in {stream} until a worker of the pool starts "
                f"(`noetl-stream worker --pool {pool}`, which provisions the consumer, or a Helm pool)",
            )
            return "not_provisioned"
        except Exception as exc:  # NATS slow or down: nothing to say about the pool
            log.debug("controller.pool_check_failed", pool=pool, error=str(exc) or type(exc).__name__)
            return None
        if info.num_waiting or info.num_ack_pending:
            return None
        log.warning(
            "controller.pool_has_no_workers",
            **where,
            pending=info.num_pending,
            hint=f"no worker pulls from {consumer}: start one with `noetl-stream worker --pool {pool}`",
        )
        return "no_workers"
