"""The REST API while NATS is down, against a real nats-server stopped under it: a submission that cannot
be stored is a 503 ``unavailable``, like every other route's, not a 500 ``internal`` (the intake's
publish gives up with a plain `TimeoutError`, which the API did not count as NATS not answering)."""

from __future__ import annotations

import uuid

import pytest
from apiserver import serve
from helpers import playbook

from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.jetstream.outbox import Outbox
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import local_runtime

GOOD = playbook("- step: start\n  tool: {kind: noop}\n")


async def test_a_submission_while_nats_is_down_is_a_503(
    own_server: EmbeddedNats, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The outbox's ack timeout and retry window, 10 s and 30 s by default, made short: the same give-up.
    monkeypatch.setattr(Outbox.__init__, "__defaults__", (1.0, 2.0))
    topology = Topology(prefix="t" + uuid.uuid4().hex[:10])
    async with local_runtime(own_server.url, topology=topology, workers=0) as rt, serve(rt) as api:
        await api.json("POST", "/api/executions", 201, json={"playbook": GOOD})
        own_server.stop()
        try:
            reply = await api.json("POST", "/api/executions", 503, json={"playbook": GOOD})
            assert reply["error"] == "unavailable" and "NATS did not answer" in reply["detail"], reply
        finally:
            own_server.start()
