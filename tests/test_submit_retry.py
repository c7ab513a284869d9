"""`client.submit` when the request's ack is lost: it publishes again with the same ``Nats-Msg-Id``, so the
request is stored once and the caller gets its execution id, instead of an error after which a second
submission would start a second execution."""

from __future__ import annotations

import asyncio
import os
import signal

from noetl_stream.client import request_for, submit
from noetl_stream.embedded import EmbeddedNats
from noetl_stream.kv.provision import provision
from noetl_stream.natsconn import connect
from noetl_stream.subjects import Topology

TEXT = """apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: r, path: r}
workflow:
  - step: start
    tool: {kind: noop}
"""


async def test_a_request_whose_ack_died_with_the_server_is_stored_once_after_the_restart(
    own_server: EmbeddedNats,
) -> None:
    topo = Topology(prefix="submitretry")
    nc = await connect(own_server.url, name="pytest-submit", connect_wait_s=10)
    try:
        js = nc.jetstream(timeout=10)
        await provision(js, topo, ("default",))
        request = request_for(TEXT, "r.yaml")
        assert own_server.pid is not None
        os.kill(own_server.pid, signal.SIGSTOP)  # the publish goes out, no ack comes
        await asyncio.sleep(0.1)
        submitting = asyncio.create_task(submit(nc, topo, request))
        await asyncio.sleep(0.3)
        own_server.kill()  # the ack is lost with the connection
        await asyncio.sleep(0.5)
        await asyncio.to_thread(own_server.start)
        assert await asyncio.wait_for(submitting, 30) == request.execution_id
        info = await js.stream_info(topo.requests_stream)
        assert info.state.messages == 1  # once, however many times it was published
    finally:
        await nc.close()
