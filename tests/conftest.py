"""Shared fixtures: one real nats-server per session, a fresh client and topology per test."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import Clustered, own_stream
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from noetl_stream.dataplane.tools.duckdbfiles import DIR_ENV
from noetl_stream.jetstream.connection import connect
from noetl_stream.jetstream.embedded import EmbeddedCluster, EmbeddedNats
from noetl_stream.kv.provision import stream_names
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.services import provision_at_start

if TYPE_CHECKING:
    from pgserver import PgServer

Predicate = Callable[[], bool | Awaitable[bool]]


RAM_DIR = Path("/dev/shm")
RAM_DIR_MIN_FREE = 2 * 1024**3


def _ram_store_dir() -> Path | None:
    """A new directory in RAM (tmpfs) for a server's file store, or None if there is no roomy one."""
    try:
        if shutil.disk_usage(RAM_DIR).free < RAM_DIR_MIN_FREE:
            return None
        return Path(tempfile.mkdtemp(prefix="noetl-test-nats-", dir=RAM_DIR))
    except OSError:
        return None


@pytest.fixture(scope="session", autouse=True)
def duckdb_dir() -> Iterator[Path]:
    """The executions' DuckDB files of this session (a pytest-xdist worker's) in a directory of its own,
    removed at its end: not left in the system temp dir until their age removes them."""
    path = Path(tempfile.mkdtemp(prefix="noetl-test-duckdb-"))
    before = os.environ.get(DIR_ENV)
    os.environ[DIR_ENV] = str(path)
    try:
        yield path
    finally:
        if before is None:
            os.environ.pop(DIR_ENV, None)
        else:
            os.environ[DIR_ENV] = before
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def nats_server() -> Iterator[EmbeddedNats]:
    """A nats-server -js on a free port with a temp store, shared by the session.

    The store is in RAM when there is a tmpfs with room for it (else in a temp dir on disk): the same
    file store, but creating and deleting the streams and buckets of each test's topology takes a
    third of the time. (Tests of a store recovered after a crash use `own_server`, on disk.)"""
    store = _ram_store_dir()
    try:
        with EmbeddedNats(store) as server:
            yield server
    finally:
        if store is not None:
            shutil.rmtree(store, ignore_errors=True)


@pytest.fixture
async def nc(nats_server: EmbeddedNats) -> AsyncIterator[NATS]:
    client = await connect(nats_server.url, name="pytest", connect_wait_s=10)
    yield client
    await client.close()


@pytest.fixture
async def nc2(nats_server: EmbeddedNats) -> AsyncIterator[NATS]:
    """A second connection: another controller or worker process."""
    client = await connect(nats_server.url, name="pytest-2", connect_wait_s=10)
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
    await _delete_streams(client.jetstream(timeout=10), topo)
    await client.close()


async def _delete_streams(js: JetStreamContext, topo: Topology) -> None:
    """The topology's streams and buckets, those that exist (a test, or its provisioning, may have
    failed before creating them: its own error is the one to see)."""
    for name in stream_names(topo):
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(name)


@pytest.fixture
async def stream(js: JetStreamContext) -> AsyncIterator[str]:
    """A stream of this test's own (``<name>.>``), 1 KiB max message size; its name is the subject root."""
    async with own_stream(js, "PUB", max_msg_size=1024) as name:
        yield name


@pytest.fixture
async def other_stream(js: JetStreamContext) -> AsyncIterator[str]:
    """A second stream like `stream`'s."""
    async with own_stream(js, "PUB", max_msg_size=1024) as name:
        yield name


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    """A nats-server of this test alone, to freeze (SIGSTOP), kill and start again; its file store is in
    tmp_path (kept across restarts)."""
    with EmbeddedNats(tmp_path / "nats") as server:
        yield server


@pytest.fixture(scope="session")
def pg() -> Iterator[PgServer]:
    """One PostgreSQL for the session (initdb and start take a while), on a free port in a temp dir;
    stopped (only it) afterwards. Its users keep to tables or databases of their own."""
    from pgserver import PgServer

    server = PgServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    """A 3-node nats-server cluster on loopback, one per test module that asks for it."""
    with EmbeddedCluster(3, tmp_path_factory.mktemp("cluster")) as c:
        yield c


@pytest.fixture
async def r3(cluster3: EmbeddedCluster) -> AsyncIterator[Clustered]:
    """A topology with R3 streams on `cluster3`, provisioned as the processes do (retrying a cluster
    slow to answer), and a connection to it; its streams are deleted afterwards."""
    topo = Topology(prefix="r" + uuid.uuid4().hex[:10], replicas=3)
    nc = await connect(cluster3.url, name="pytest-r3", connect_wait_s=10)
    js = nc.jetstream(timeout=10)
    try:
        await provision_at_start(nc, topo, ("default",))
        yield Clustered(nc, js, topo)
    finally:
        await _delete_streams(js, topo)
        await nc.close()


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


# --- end-to-end runtime fixtures (tests/e2e/test_runtime_*.py) ------------------------------------------

from noetl_stream.runtime.local import Runtime, local_runtime  # noqa: E402


@pytest.fixture
async def runtime(nats_server: EmbeddedNats, topology: Topology) -> AsyncIterator[Runtime]:
    """A controller and one worker (16 concurrent commands) on the test's own topology."""
    async with local_runtime(nats_server.url, topology=topology, workers=1, concurrency=16) as rt:
        yield rt


@pytest.fixture
async def informative(nats_server: EmbeddedNats, topology: Topology) -> AsyncIterator[Runtime]:
    """The same with ``--task-events informative``."""
    async with local_runtime(nats_server.url, topology=topology, task_events="informative") as rt:
        yield rt


@pytest.fixture
def no_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers publish no progress while a command runs, however loaded the machine: a step's events all
    go out when it ends (with its boundary)."""
    from noetl_stream.dataplane import worker

    monkeypatch.setattr(worker, "PROGRESS_EVERY_S", 30.0)
