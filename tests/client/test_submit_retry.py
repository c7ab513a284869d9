"""`noetl_stream.client.submit.submit` when the request's ack is lost: it publishes again with the same ``Nats-Msg-Id``, so the
request is stored once and the caller gets its execution id, instead of an error after which a second
submission would start a second execution."""

from __future__ import annotations

import asyncio

import pytest
from helpers import LostAcks, own_connection

from noetl_stream.client import submit as client_submit
from noetl_stream.client.submit import request_for, submit
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.jetstream.publish import MSG_ID
from noetl_stream.protocol.wire import decode_request, request_msg_id

TEXT = """apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: r, path: r}
workflow:
  - step: start
    tool: {kind: noop}
"""


async def test_a_request_whose_ack_died_with_the_server_is_stored_once_after_the_restart(
    own_server: EmbeddedNats, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_submit, "SUBMIT_RETRY_S", 30.0)  # room for a restart on a loaded machine
    lost = LostAcks(monkeypatch)
    async with own_connection(own_server, "submitretry") as (nc, js, topo):
        request = request_for(TEXT, "r.yaml")
        assert request.execution_id is not None
        lost.dropping = True  # stored, the ack lost: then the server dies and comes back
        submitting = asyncio.create_task(submit(nc, topo, request))
        await lost.stored_then_restart(own_server, js, topo.requests_stream, 1)
        assert await asyncio.wait_for(submitting, 30) == request.execution_id
        info = await js.stream_info(topo.requests_stream)
        assert info.state.messages == 1  # once, however many times it was published
        stored = await js.get_msg(topo.requests_stream, info.state.last_seq)
        assert stored.headers is not None and stored.headers[MSG_ID] == request_msg_id(request.execution_id)
        assert stored.data is not None and decode_request(stored.data).execution_id == request.execution_id
