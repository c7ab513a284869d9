"""A running execution's snapshot follows it even while nothing happens in it (real server)."""

from __future__ import annotations

import asyncio

import msgspec
from helpers import playbook
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError

from noetl_stream.client import Completions, request_for, submit
from noetl_stream.local import Runtime
from noetl_stream.subjects import Topology

SLOW_FIRST_STEP = playbook(
    """
    - step: start
      tool:
        kind: python
        code: |
          import time
          def main():
              time.sleep(4)
              return "late"
    """
)


async def test_an_execution_quiet_in_its_first_step_is_snapshotted_while_it_runs(
    runtime: Runtime, js: JetStreamContext, topology: Topology
) -> None:
    """The fold that schedules the first step writes no snapshot (short executions write one, at the
    end). If the step runs long, the controller writes it about a second later anyway, once: the
    execution shows as running to `executions` and to ``nats kv get``."""
    kv = await js.key_value(topology.executions_bucket)
    async with Completions(runtime.nc, topology) as done:
        eid = await submit(runtime.nc, topology, request_for(SLOW_FIRST_STEP, "slow.yaml"))
        entry = None
        async with asyncio.timeout(4):
            while entry is None:
                try:
                    entry = await kv.get(eid)
                except KeyNotFoundError:
                    await asyncio.sleep(0.05)
        assert entry.value is not None
        snapshot = msgspec.json.decode(entry.value)
        assert snapshot["status"] == "running" and snapshot["runs"]["start-1"]["status"] == "scheduled"
        await asyncio.sleep(1.5)  # still in the step: nothing changed, nothing written again
        assert (await kv.get(eid)).revision == entry.revision
        final = await done.wait(eid, timeout=30)
    assert final.payload["status"] == "success"
    # The final snapshot follows the fold's events (playbook.processed among them).
    async with asyncio.timeout(10):
        while (last := msgspec.json.decode((await kv.get(eid)).value or b"{}"))["status"] == "running":
            await asyncio.sleep(0.02)
    assert last["status"] == "success" and last["results"]["start"] == "late"
