"""The CLI on an execution whose history holds a stored message that is not an event (anyone who may
publish on the events subjects can store one), against a real nats-server: one error line or the
answer, never a traceback (``status``, ``events``, ``replay`` and ``retry`` printed one)."""

from __future__ import annotations

import os

import pytest
from helpers import playbook
from procs import run_cli, topology_env

from noetl_stream.client.submit import submit
from noetl_stream.client.tracking import follow
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import ExecutionRequest
from noetl_stream.runtime.local import Runtime

GOOD = playbook("- step: start\n  tool: {kind: noop}\n")


@pytest.mark.parametrize("garbage", [b"{not json", b'{"event_id": "x", "status": "completed"}'])
async def test_reading_a_history_with_a_non_event_prints_no_traceback(
    runtime: Runtime, nats_server: EmbeddedNats, topology: Topology, garbage: bytes
) -> None:
    summary = await runtime.run_playbook(GOOD, timeout=20)
    eid = summary.execution_id
    await runtime.nc.jetstream().publish(topology.event_subject(eid, E.STEP_DONE), garbage)
    env = {**os.environ, **topology_env(topology), "NOETL_NATS_URL": nats_server.url}

    for args in (
        ("status", eid),
        ("events", eid),
        ("replay", eid),
        ("replay", eid, "--verify"),
        ("retry", eid),
    ):
        code, out, err = await run_cli(env, *args, timeout=30)
        assert "Traceback" not in err, f"{args}: exit {code}\n{err}"
        assert code == 0 or (code in (1, 2) and "\nerror: " in f"\n{err}"), f"{args}: exit {code}\n{out}{err}"


async def test_replay_of_a_request_rejected_before_it_was_recorded_says_so(
    runtime: Runtime, nats_server: EmbeddedNats, topology: Topology
) -> None:
    """An unknown catalog path is rejected at intake: the execution has a history (the rejection) but no
    request and no state. replay says that, not 'no events'."""
    eid = "rejected-at-intake"
    await submit(runtime.nc, topology, ExecutionRequest(path="no/such/playbook", execution_id=eid))
    assert (await follow(runtime.nc, topology, eid, timeout=20)).status == "rejected"
    env = {**os.environ, **topology_env(topology), "NOETL_NATS_URL": nats_server.url}
    for args in (("replay", eid), ("replay", eid, "--verify")):
        code, _, err = await run_cli(env, *args, timeout=30)
        assert code == 2 and err.strip() == (
            f"error: execution {eid} was rejected before it was recorded as a request "
            f"(playbook.request.rejected): it has no state to replay; `noetl-stream status {eid}` shows why"
        ), err
