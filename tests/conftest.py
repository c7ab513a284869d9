"""Shared fixtures: one real nats-server per session, a fresh client and topology per test."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from noetl_stream.embedded import EmbeddedNats
from noetl_stream.kv.provision import stream_names
from noetl_stream.natsconn import connect
from noetl_stream.subjects import Topology

Predicate = Callable[[], bool | Awaitable[bool]]


@pytest.fixture(scope="session")
def nats_server() -> Iterator[EmbeddedNats]:
    """A nats-server -js on a free port with a temp store, shared by the session."""
    with EmbeddedNats() as server:
        yield server


@pytest.fixture
async def nc(nats_server: EmbeddedNats) -> AsyncIterator[NATS]:
    client = await connect(nats_server.url, name="pytest", connect_wait_s=10)
    yield client
    await client.close()


@pytest.fixture
def js(nc: NATS) -> JetStreamContext:
    return nc.jetstream(timeout=10)


@pytest.fixture
async def topology(nats_server: EmbeddedNats) -> AsyncIterator[Topology]:
    """A topology with a unique prefix, so tests are isolated on the shared server.

    Its streams and buckets (if a test created them) are deleted afterwards.
    """
    topo = Topology(prefix="t" + uuid.uuid4().hex[:10])
    yield topo
    client = await connect(nats_server.url, name="pytest-cleanup", connect_wait_s=10)
    jsm = client.jetstream(timeout=10)
    for name in stream_names(topo):
        try:
            await jsm.delete_stream(name)
        except NotFoundError:
            pass
    await client.close()


async def _eventually(check: Predicate, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while True:
            ok = check()
            if ok if isinstance(ok, bool) else await ok:
                return
            await asyncio.sleep(0.01)


@pytest.fixture
def eventually() -> Callable[..., Awaitable[None]]:
    """``await eventually(predicate)``: poll a sync or async predicate until true, else time out."""
    return _eventually


# --- end-to-end runtime fixtures (tests/test_runtime_*.py) ------------------------------------------

from noetl_stream.local import Runtime, local_runtime  # noqa: E402


@pytest.fixture
async def runtime(nats_server: EmbeddedNats, topology: Topology) -> AsyncIterator[Runtime]:
    """A controller and one worker (16 concurrent commands) on the test's own topology."""
    async with local_runtime(nats_server.url, topology=topology, workers=1, concurrency=16) as rt:
        yield rt
