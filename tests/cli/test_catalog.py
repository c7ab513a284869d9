"""The playbook catalog: versions, content hashes, large texts, running by path, replay, the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import playbook
from nats.js import JetStreamContext
from nats.js.errors import ObjectNotFoundError

from noetl_stream.client.tracking import follow
from noetl_stream.control.replay import replay, verify
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.catalog import (
    Catalog,
    CatalogConflictError,
    CatalogError,
    CatalogNotFoundError,
    decode_part,
    encode_part,
    parse_ref,
)
from noetl_stream.kv.history import read_events
from noetl_stream.kv.provision import provision
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import ExecutionRequest, content_hash, encode
from noetl_stream.runtime.local import Runtime

NOETL_STREAM = Path(sys.executable).parent / "noetl-stream"


def text(result: object = 1, *, version: str | None = None, path: str = "demo/calc") -> str:
    meta = f"{{name: calc, path: {path}" + (f", version: '{version}'" if version else "") + "}"
    body = playbook(f"- step: start\n  tool: {{kind: noop, result: {json.dumps(result)}}}\n", name="calc")
    return body.replace("metadata: {name: calc, path: tests/calc}", f"metadata: {meta}")


@pytest.fixture
async def catalog(js: JetStreamContext, topology: Topology) -> Catalog:
    await provision(js, topology)
    return Catalog(js, topology, inline_limit=2048)


@pytest.mark.parametrize(
    "value", ["examples/hello", "1.2.0", "a_b-c", "x=y", "ünï/cödé", "a.b/c d", "latest-ish"]
)
def test_key_parts_are_one_token_and_reversible(value: str) -> None:
    token = encode_part(value)
    assert "." not in token and "/" not in token and " " not in token
    assert decode_part(token) == value


def test_refs() -> None:
    assert parse_ref("examples/hello@2") == ("examples/hello", "2")
    assert parse_ref("examples/hello") == ("examples/hello", None)
    assert parse_ref("a@b/c@1.0") == ("a@b/c", "1.0")


async def test_versions_are_numbered_immutable_and_idempotent(catalog: Catalog) -> None:
    one, created = await catalog.register(text(1))
    assert (one.path, one.version, one.latest, created) == ("demo/calc", "1", True, True)
    assert one.content_hash == content_hash(text(1))
    same, created = await catalog.register(text(1))
    assert (same.version, created) == ("1", False)
    two, _ = await catalog.register(text(2))
    assert two.version == "2"
    pinned, _ = await catalog.register(text(3, version="2024.1"))
    assert pinned.version == "2024.1"
    with pytest.raises(CatalogConflictError, match=r"demo/calc@2024\.1 is already registered"):
        await catalog.register(text(4, version="2024.1"))
    four, _ = await catalog.register(text(4))
    assert four.version == "4"  # the next registration number, whatever explicit versions came between

    listed = await catalog.list()
    assert [(e.version, e.latest) for e in listed] == [
        ("1", False),
        ("2", False),
        ("2024.1", False),
        ("4", True),
    ]
    entry, body = await catalog.resolve("demo/calc", "2")
    assert body == text(2) and entry.content_hash == content_hash(text(2))
    assert (await catalog.resolve("demo/calc"))[0].version == "4"
    assert (await catalog.resolve("demo/calc", "latest"))[0].version == "4"


async def test_an_entry_that_cannot_be_read_does_not_hide_the_others(
    catalog: Catalog, js: JetStreamContext, topology: Topology
) -> None:
    """A key of the bucket written by something else (``nats kv put``) is skipped and logged: listing,
    showing and deleting the other playbooks still work (they failed, every one)."""
    one, _ = await catalog.register(text(1))
    kv = await js.key_value(topology.catalog_bucket)
    await kv.put("corrupt.1", b"{garbage")
    await kv.put("corrupt.latest", b"{garbage")
    assert [(e.path, e.version) for e in await catalog.list()] == [("demo/calc", "1")]
    assert (await catalog.info("demo/calc")).content_hash == one.content_hash
    assert await catalog.delete("demo/calc") == ["1"]
    assert await catalog.list() == []


async def test_bad_playbooks_and_unknown_refs(catalog: Catalog) -> None:
    with pytest.raises(CatalogError, match="invalid playbook") as info:
        await catalog.register("apiVersion: noetl.io/v2\nkind: Playbook\n", "x.yaml")
    assert info.value.diagnostics and info.value.diagnostics[0].startswith("x.yaml:")
    with pytest.raises(CatalogError, match="invalid version"):
        await catalog.register(text(version="latest"))
    with pytest.raises(CatalogNotFoundError, match="unknown playbook path 'demo/none'"):
        await catalog.resolve("demo/none")
    await catalog.register(text())
    with pytest.raises(CatalogNotFoundError, match="has no version '9'"):
        await catalog.resolve("demo/calc", "9")
    with pytest.raises(CatalogNotFoundError):
        await catalog.delete("demo/calc", "9")


async def test_delete_moves_latest_back_and_removes_the_path_at_the_end(catalog: Catalog) -> None:
    for n in (1, 2, 3):
        await catalog.register(text(n))
    assert await catalog.delete("demo/calc", "3") == ["3"]
    assert (await catalog.resolve("demo/calc"))[0].version == "2"
    assert await catalog.delete("demo/calc", "latest") == ["2"]
    assert (await catalog.resolve("demo/calc"))[0].version == "1"
    assert await catalog.delete("demo/calc") == ["1"]
    assert await catalog.list() == []
    with pytest.raises(CatalogNotFoundError):
        await catalog.resolve("demo/calc")


async def test_large_playbooks_live_in_the_object_store(
    catalog: Catalog, js: JetStreamContext, topology: Topology
) -> None:
    big = text({"blob": "x" * 5000})
    entry, _ = await catalog.register(big)
    assert entry.storage == "object_store" and entry.size > catalog.inline_limit
    assert (await catalog.resolve("demo/calc"))[1] == big
    store = await js.object_store(topology.results_store)
    assert (await store.get(f"catalog/{entry.content_hash}")).data == big.encode()
    await catalog.delete("demo/calc")
    with pytest.raises(ObjectNotFoundError):
        await store.get(f"catalog/{entry.content_hash}")


async def test_run_by_path_pins_the_content_and_replay_uses_it(runtime: Runtime) -> None:
    js = runtime.nc.jetstream()
    catalog = Catalog(js, runtime.topology)
    first, _ = await catalog.register(text("first"))

    execution_id = "by-path-1"
    request = ExecutionRequest(path="demo/calc", execution_id=execution_id)
    await js.publish(runtime.topology.request_subject, encode(request))
    summary = await follow(runtime.nc, runtime.topology, execution_id, timeout=20)
    assert (summary.status, summary.result) == ("success", "first")

    events = {
        ev.name: ev for _, ev in [item async for item in read_events(js, runtime.topology, execution_id)]
    }
    requested = events[E.EXECUTION_REQUESTED].payload
    assert requested["catalog"] == {"path": "demo/calc", "version": "1", "content_hash": first.content_hash}
    assert requested["request"]["playbook"] == text("first")
    assert events[E.REQUEST_EVALUATED].payload["content_hash"] == first.content_hash

    # the catalog moves on: version 1 deleted, another text is latest; the execution does not change
    await catalog.register(text("second"))
    await catalog.delete("demo/calc", "1")
    state = await replay(js, runtime.topology, execution_id)
    assert state is not None and state.content_hash == first.content_hash and state.status == "success"
    diffs: list[str] = []
    for _ in range(100):  # the terminal snapshot follows playbook.processed closely
        diffs, live = await verify(js, runtime.topology, execution_id)
        if live is not None:
            break
        await asyncio.sleep(0.02)
    assert diffs == []

    # an explicit version, and the latest by default
    pinned = ExecutionRequest(path="demo/calc", version="2", execution_id="by-path-2")
    await js.publish(runtime.topology.request_subject, encode(pinned))
    assert (await follow(runtime.nc, runtime.topology, "by-path-2", timeout=20)).result == "second"


async def test_an_unknown_path_or_version_is_rejected_clearly(runtime: Runtime) -> None:
    js = runtime.nc.jetstream()
    await Catalog(js, runtime.topology).register(text())
    for eid, request in (
        ("unknown-path", ExecutionRequest(path="demo/none", execution_id="unknown-path")),
        ("unknown-version", ExecutionRequest(path="demo/calc", version="7", execution_id="unknown-version")),
    ):
        await js.publish(runtime.topology.request_subject, encode(request))
        summary = await follow(runtime.nc, runtime.topology, eid, timeout=20)
        assert summary.status == "rejected"
        assert summary.error is not None and summary.error["kind"] == "unknown_playbook"
    assert "unknown playbook path 'demo/none'" in str(
        (await follow(runtime.nc, runtime.topology, "unknown-path", timeout=5)).error
    )


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(NOETL_STREAM), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        stdin=subprocess.DEVNULL,
    )


async def test_cli_register_list_show_delete(
    nats_server: EmbeddedNats, js: JetStreamContext, topology: Topology, tmp_path: Path
) -> None:
    await provision(js, topology)
    env = {**os.environ, "NOETL_NATS_URL": nats_server.url, "NOETL_PREFIX": topology.prefix}
    file = tmp_path / "calc.yaml"
    file.write_text(text(1))
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: noetl.io/v2\nkind: Playbook\nworkflow: 3\n")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return _cli(env, "catalog", *args)

    out = await asyncio.to_thread(run, "register", str(file))
    assert out.returncode == 0 and out.stdout.startswith("registered demo/calc@1 (sha256 "), out.stderr
    out = await asyncio.to_thread(run, "register", str(file), "--json")
    assert json.loads(out.stdout)["created"] is False
    file.write_text(text(2))
    await asyncio.to_thread(run, "register", str(file))
    # Commands that change nothing run at the same time.
    listed, first, latest = await asyncio.gather(
        asyncio.to_thread(run, "list"),
        asyncio.to_thread(run, "show", "demo/calc@1"),
        asyncio.to_thread(run, "show", "demo/calc", "--json"),
    )
    assert [line.split("\t")[0] for line in listed.stdout.splitlines()] == ["  demo/calc@1", "* demo/calc@2"]
    assert first.stdout == text(1)
    assert json.loads(latest.stdout)["entry"]["version"] == "2"
    out = await asyncio.to_thread(run, "delete", "demo/calc@2")
    assert out.returncode == 0 and out.stdout.strip() == "deleted demo/calc@2"
    out, refused = await asyncio.gather(
        asyncio.to_thread(run, "show", "demo/calc@2"),
        asyncio.to_thread(run, "register", str(bad)),  # invalid: registers nothing
    )
    assert out.returncode == 1 and "has no version '2'" in out.stderr
    assert refused.returncode == 2 and "bad.yaml:" in refused.stderr
    out = await asyncio.to_thread(run, "list", "no/such")  # an empty listing, said on stderr
    assert (out.returncode, out.stdout, out.stderr.strip()) == (
        0,
        "",
        "no playbooks registered under 'no/such'",
    )
