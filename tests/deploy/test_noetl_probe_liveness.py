"""noetl-probe: readiness follows NATS, liveness follows the process (deploy/docker/noetl-probe).

With liveness failing whenever the pod had no NATS connection, a NATS outage of a few minutes restarted
every controller and worker, killing running tasks that did not need NATS. ``noetl-probe --liveness``
fails only when a NATS server of the URL accepts connections from the pod and the process has none.
A real nats-server plays both situations: up with nobody connected, and gone.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

from noetl_stream.jetstream.connection import connect
from noetl_stream.jetstream.embedded import EmbeddedNats

PROBE = Path(__file__).resolve().parents[2] / "deploy" / "docker" / "noetl-probe"


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def probe(url: str, *args: str) -> tuple[int, str]:
    def run() -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "NOETL_NATS_URL": url}
        return subprocess.run(
            [sys.executable, str(PROBE), *args], env=env, capture_output=True, text=True, timeout=20
        )

    done = await asyncio.to_thread(run)
    return done.returncode, done.stderr


async def test_liveness_fails_only_when_a_reachable_nats_has_no_connection_from_the_pod(
    own_server: EmbeddedNats,
) -> None:
    url = f"nats://worker:secret@127.0.0.1:{own_server.port}"
    # NATS is up and nobody here is connected to it: not ready, and not alive (a stuck process that the
    # server dropped looks like this).
    code, err = await probe(url)
    assert code == 1 and str(own_server.port) in err
    code, err = await probe(url, "--liveness")
    assert code == 1 and "accepts connections" in err, err
    assert "secret" not in err
    # The same with a cluster URL whose first server is gone.
    code, err = await probe(f"nats://127.0.0.1:{unused_port()},{url}", "--liveness")
    assert code == 1, err

    nc = await connect(own_server.url, name="pytest-probe", connect_wait_s=5)
    try:
        assert (await probe(url))[0] == 0
        assert (await probe(url, "--liveness"))[0] == 0
    finally:
        await nc.close()

    # A NATS outage: not ready, but alive (restarting would only kill the running tasks).
    own_server.stop()
    code, err = await probe(url)
    assert code == 1
    code, err = await probe(url, "--liveness")
    assert code == 0, err
    assert "cannot reach" in err
