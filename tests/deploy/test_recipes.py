"""The `nats` CLI recipes of docs/operations.md, done with nats-py against a running installation.

Each recipe in the doc is tagged (``<!-- recipe: NAME -->`` before its code block) and has a
``test_recipe_<name>`` here that reads the command from the doc, maps the default names (``noetl``) to the
test's own prefix, checks they are the names `Topology` builds, does the same operation and checks the
answer. Every ``nats`` command in the doc and the README must name real streams, subjects, consumers,
buckets and endpoints.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import re
import shlex
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from helpers import playbook
from nats.js.errors import KeyNotFoundError, NoKeysError

from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import Completions, follow
from noetl_stream.control.controller import Controller
from noetl_stream.control.endpoints import ENDPOINTS
from noetl_stream.control.intake import CONTROL_ENDPOINTS
from noetl_stream.dataplane.worker import Worker
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.history import read_events
from noetl_stream.protocol import events as E
from noetl_stream.protocol.carried import decode_all
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import Event, ExecutionRequest, decode_event
from noetl_stream.runtime.local import Runtime, local_runtime

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "operations.md"
HELLO = (ROOT / "playbooks" / "hello.yaml").read_text()
DEFAULT = Topology()

DOUBLE = playbook(
    """
    - step: start
      tool: {kind: python, args: {n: "{{ workload.n }}"}, code: "result = n * 2"}
    """,
    workload={"n": 1},
    name="double",
)
FAILING = playbook(
    """
    - step: start
      next: {arcs: [{step: boom}]}
    - step: boom
      tool:
        - name: divide
          kind: python
          code: "result = 1 / 0"
    """,
    name="failing",
)
NOOP = playbook("- step: start\n  tool: {kind: noop}", name="noop")
SLOW_CHILD = playbook(
    """
    - step: start
      tool: {kind: python, code: "import time; time.sleep(4); result = 1"}
    """,
    name="slow",
)
PARENT_OF_SLOW = playbook(
    """
    - step: start
      tool:
        - {name: kid, kind: playbook, path: slow.yaml, return_step: start}
    """,
    name="parent",
)

_TAG = re.compile(r"<!-- recipe: ([a-z0-9-]+) -->\s*```sh\n(.*?)```", re.S)


def recipes(path: Path = OPERATIONS) -> dict[str, list[list[str]]]:
    """Tagged recipes: name -> the ``nats`` commands of its code block, split like a shell would."""
    return {
        name: [shlex.split(line) for line in body.splitlines() if line.startswith("nats ")]
        for name, body in _TAG.findall(path.read_text(encoding="utf-8"))
    }


def recipe(name: str) -> list[str]:
    (command,) = recipes()[name]
    return command


def local(value: str, topology: Topology) -> str:
    """A name of the doc (default prefix) as it is in `topology`'s installation."""
    for default, ours in (
        (f"{DEFAULT.prefix}.", f"{topology.prefix}."),
        (f"{DEFAULT.prefix.upper()}_", f"{topology.prefix.upper()}_"),
        (f"{DEFAULT.prefix}_", f"{topology.prefix}_"),
    ):
        if value.startswith(default):
            return ours + value[len(default) :]
    return topology.service_name if value == DEFAULT.service_name else value


def fill(value: str, **placeholders: str) -> str:
    for key, real in placeholders.items():
        value = value.replace(f"<{key}>", real)
    return value


async def history(rt: Runtime, stream: str, subject: str) -> list[Event]:
    """``nats stream view STREAM --subject SUBJECT``: an ordered consumer from the first message."""
    out: list[Event] = []
    done = asyncio.Event()

    async def cb(msg: Any) -> None:
        out.extend(decode_all(msg.data))  # what a boundary's message carries, in its "carried" list
        if out[-1].name == E.PLAYBOOK_PROCESSED:
            done.set()

    sub = await rt.nc.jetstream().subscribe(subject, stream=stream, cb=cb, ordered_consumer=True)
    try:
        async with asyncio.timeout(10):
            await done.wait()
    finally:
        await sub.unsubscribe()
    return out


def in_order(names: list[str], expected: list[str]) -> bool:
    it = iter(names)
    return all(name in it for name in expected)


# -- the doc and the topology agree ---------------------------------------------------------------


def test_every_tagged_recipe_has_a_test_and_every_recipe_test_a_tag() -> None:
    tags = set(recipes())
    tests = {
        n.removeprefix("test_recipe_").replace("_", "-") for n in globals() if n.startswith("test_recipe_")
    }
    assert tags, "no tagged recipes in docs/operations.md"
    assert tags - tests == set(), "recipes without a test"
    assert tests - tags == set(), "tests of recipes the doc no longer has"
    assert all(recipes()[t] for t in tags), "a tagged block without a nats command"


def _api_subjects(t: Topology) -> set[str]:
    names = ["execute", *CONTROL_ENDPOINTS, *(suffix for suffix, _, _ in ENDPOINTS.values())]
    return {t.api_subject(n) for n in names}


def _check_request_body(body: str) -> None:
    msgspec.json.decode(fill(body, id="x"), type=ExecutionRequest)


def _check(argv: list[str]) -> None:
    """One documented ``nats`` command names only what the default `Topology` builds."""
    t = DEFAULT
    eid = "0123abcd"
    if "|" in argv:  # a pipeline: the `nats` command is its first part (a filter reads its output)
        argv = argv[: argv.index("|")]
    streams = {t.events_stream, t.commands_stream, t.requests_stream}
    consumers = {t.controller_events_consumer(p) for p in range(t.partitions)}
    consumers |= {t.controller_requests_consumer, t.pool_consumer("default")}
    args = [fill(a, execution_id=eid, id=eid, pool="default") for a in argv[1:]]
    match args:
        case ["stream", "view" | "info", stream, *rest]:
            assert stream in streams
            if rest:
                assert rest[0] == "--subject"
                assert rest[1] in {
                    t.events_filter(eid),
                    t.stored_event_filter(eid, "step") + ".>",
                }
        case ["sub", subject]:
            assert subject in {t.any_execution_filter(n) for n in E.ALL_EVENTS} | {t.events_filter(eid)}
        case ["consumer", "info", stream, consumer]:
            assert stream in streams and consumer in consumers
        case ["kv", "get" | "watch", bucket, *_]:
            assert bucket in t.kv_buckets
        case ["kv", "ls", bucket]:
            assert bucket in t.kv_buckets
        case ["pub", subject, body]:
            assert subject == t.request_subject
            _check_request_body(body)
        case ["req", subject, body]:
            assert subject in _api_subjects(t)
            json.loads(body)
            if subject == t.api_subject("execute"):
                _check_request_body(body)
        case ["micro", "ls"]:
            pass
        case ["micro", "info", service]:
            assert service == t.service_name
        case _:
            raise AssertionError("a nats command the recipe check does not know")


@pytest.mark.parametrize("doc", ["docs/operations.md", "README.md"])
def test_every_documented_nats_command_uses_real_names(doc: str) -> None:
    text = (ROOT / doc).read_text(encoding="utf-8")
    commands = [
        part.strip()
        for line in text.splitlines()
        for part in line.split(";")
        if part.strip().startswith("nats ") and not line.lstrip().startswith("#")
    ]
    assert commands
    for command in commands:
        argv = shlex.split(command.split("  #")[0])
        try:
            _check(argv)
        except (AssertionError, msgspec.ValidationError, msgspec.DecodeError, ValueError) as exc:
            raise AssertionError(f"{doc}: {command}: {exc}") from None


# -- the recipes -----------------------------------------------------------------------------------


async def test_recipe_history(runtime: Runtime) -> None:
    _, _, verb, stream, flag, subject = recipe("history")
    assert (verb, flag) == ("view", "--subject")
    execution_id = await submit(runtime.nc, runtime.topology, request_for(HELLO, "hello.yaml"))
    stream = local(stream, runtime.topology)
    subject = fill(local(subject, runtime.topology), execution_id=execution_id)
    assert (stream, subject) == (runtime.topology.events_stream, runtime.topology.events_filter(execution_id))

    events = await history(runtime, stream, subject)

    names = [e.name for e in events]
    assert names[0] == E.EXECUTION_REQUESTED and names[-1] == E.PLAYBOOK_PROCESSED
    assert {e.execution_id for e in events} == {execution_id}
    assert in_order(
        names,
        [
            *(E.REQUEST_EVALUATED, E.WORKFLOW_STARTED, E.STEP_SCHEDULED, E.STEP_STARTED),
            *(E.TASK_STARTED, E.TASK_DONE, E.STEP_DONE, E.NEXT_EVALUATED, E.WORKFLOW_FINISHED),
        ],
    ), names
    assert [e.step for e in events if e.name == E.STEP_DONE] == ["start", "stats", "report"]
    assert events[-1].payload["status"] == "success"


async def test_recipe_failures(runtime: Runtime, eventually: Callable[..., Any]) -> None:
    _, verb, subject = recipe("failures")
    assert verb == "sub"
    subject = local(subject, runtime.topology)
    assert subject == runtime.topology.any_execution_filter(E.STEP_FAILED)
    seen: list[Event] = []

    async def cb(msg: Any) -> None:
        seen.append(decode_event(msg.data))

    sub = await runtime.nc.subscribe(subject, cb=cb)
    try:
        ok = await submit(runtime.nc, runtime.topology, request_for(DOUBLE, "double.yaml"))
        bad = await submit(runtime.nc, runtime.topology, request_for(FAILING, "failing.yaml"))
        for eid in (ok, bad):
            await follow(runtime.nc, runtime.topology, eid, timeout=30)
        await eventually(lambda: len(seen) >= 1)
    finally:
        await sub.unsubscribe()

    (failure,) = seen
    assert (failure.name, failure.execution_id, failure.step) == (E.STEP_FAILED, bad, "boom")
    assert failure.payload["error"]["kind"] == "python_error"
    assert "division by zero" in failure.payload["error"]["message"]


async def test_recipe_pool_lag(
    nats_server: EmbeddedNats, topology: Topology, eventually: Callable[..., Any]
) -> None:
    _, _, verb, stream, consumer = recipe("pool-lag")
    assert verb == "info"
    stream = local(stream, topology)
    assert (stream, consumer) == (topology.commands_stream, topology.pool_consumer("default"))
    async with local_runtime(nats_server.url, topology=topology, workers=0) as rt:
        js = rt.nc.jetstream()

        async def lag() -> tuple[int, int]:
            info = await js.consumer_info(stream, consumer)
            return info.num_pending, info.num_ack_pending

        assert await lag() == (0, 0)
        async with Completions(rt.nc, topology) as done:
            ids = [await submit(rt.nc, topology, request_for(NOOP, "noop.yaml")) for _ in range(5)]

            async def waiting(expected: tuple[int, int]) -> bool:
                return await lag() == expected

            await eventually(lambda: waiting((5, 0)))  # no worker yet: every command waits
            worker = Worker(rt.nc, topology, pool="default", concurrency=4, name="late")
            rt.workers.append(worker)  # local_runtime shuts it down
            await worker.start()
            finished = [await done.wait(eid, timeout=30) for eid in ids]
        await eventually(lambda: waiting((0, 0)))
        assert {ev.payload["status"] for ev in finished} == {"success"}


async def test_recipe_controller_lag(runtime: Runtime, eventually: Callable[..., Any]) -> None:
    _, _, verb, stream, consumer = recipe("controller-lag")
    assert verb == "info"
    stream = local(stream, runtime.topology)
    assert (stream, consumer) == (
        runtime.topology.events_stream,
        runtime.topology.controller_events_consumer(0),
    )
    summary = await _run_in_partition_0(runtime)
    assert summary.status == "success"
    js = runtime.nc.jetstream()

    async def caught_up() -> bool:
        info = await js.consumer_info(stream, consumer)
        return info.num_pending == 0 and info.num_ack_pending == 0

    await eventually(caught_up)
    info = await js.consumer_info(stream, consumer)
    assert set(info.config.filter_subjects or []) == set(runtime.topology.controller_event_filters(0))
    assert info.ack_floor is not None and (info.ack_floor.stream_seq or 0) > 0  # it folded the run's events


async def test_recipe_snapshot(runtime: Runtime, eventually: Callable[..., Any]) -> None:
    _, _, verb, bucket, key = recipe("snapshot")
    assert verb == "get"
    bucket = local(bucket, runtime.topology)
    assert bucket == runtime.topology.executions_bucket
    summary = await runtime.run_playbook(HELLO, "hello.yaml", timeout=30)
    kv = await runtime.nc.jetstream().key_value(bucket)
    key = fill(key, execution_id=summary.execution_id)

    async def snapshot() -> dict[str, Any] | None:
        try:
            entry = await kv.get(key)
        except Exception:
            return None
        value = json.loads(entry.value or b"{}")
        return value if value.get("status") == "success" else None

    await eventually(lambda: snapshot())
    value = await snapshot()
    assert value is not None
    assert value["execution_id"] == summary.execution_id
    assert value["ctx"] == {"total": 31}
    assert value["step_status"] == {"start": "done", "stats": "done", "report": "done"}
    assert value["last_seq"] > 0


async def test_recipe_snapshot_watch(runtime: Runtime) -> None:
    _, _, verb, bucket = recipe("snapshot-watch")
    assert verb == "watch"
    bucket = local(bucket, runtime.topology)
    assert bucket == runtime.topology.executions_bucket
    kv = await runtime.nc.jetstream().key_value(bucket)
    watcher = await kv.watchall()
    try:
        assert await watcher.updates(timeout=5) is None  # the bucket has nothing yet
        execution_id = await submit(runtime.nc, runtime.topology, request_for(DOUBLE, "double.yaml"))
        statuses: list[str] = []
        async with asyncio.timeout(30):
            while "success" not in statuses:
                entry = await watcher.updates(timeout=30)
                if entry is not None and entry.key == execution_id and entry.value:
                    statuses.append(json.loads(entry.value)["status"])
    finally:
        await watcher.stop()
    assert statuses[-1] == "success"


async def test_recipe_child_keys(runtime: Runtime, eventually: Callable[..., Any], tmp_path: Path) -> None:
    ls, get = recipes()["child-keys"]
    assert ls[1:3] == ["kv", "ls"] and ls[4:] == ["|", "grep", r"^child\."]
    assert get[1:3] == ["kv", "get"] and get[3] == ls[3]
    bucket = local(ls[3], runtime.topology)
    assert bucket == runtime.topology.executions_bucket
    (tmp_path / "slow.yaml").write_text(SLOW_CHILD)
    parent_file = tmp_path / "parent.yaml"
    parent_file.write_text(PARENT_OF_SLOW)
    parent = await submit(runtime.nc, runtime.topology, request_for(PARENT_OF_SLOW, str(parent_file)))
    kv = await runtime.nc.jetstream().key_value(bucket)
    pattern = re.compile(ls[-1])

    async def child_keys() -> list[str]:
        """`nats kv ls ... | grep ...`: the keys of the bucket's current values that match."""
        try:
            return [k for k in await kv.keys() if pattern.search(k)]
        except NoKeysError:
            return []

    await eventually(lambda: _equals(_len(child_keys()), 1))
    (key,) = await child_keys()
    _, partition, child = key.split(".")
    assert fill(get[4], partition=partition, child_id=child) == key
    assert int(partition) == runtime.topology.partition_of(child)
    assert json.loads((await kv.get(key)).value or b"{}") == {"parent": parent}

    summary = await follow(runtime.nc, runtime.topology, parent, timeout=30)
    assert summary.status == "success"
    await eventually(lambda: _equals(child_keys(), []))  # the child ended: its key is removed


async def _len(value: Awaitable[list[str]]) -> int:
    return len(await value)


async def test_recipe_submit_pub(runtime: Runtime) -> None:
    _, verb, subject, body = recipe("submit-pub")
    assert verb == "pub"
    subject = local(subject, runtime.topology)
    assert subject == runtime.topology.request_subject
    request = json.loads(body)
    assert request["playbook"] == "<yaml text>"
    request["playbook"] = DOUBLE
    execution_id = request["execution_id"]

    await runtime.nc.publish(subject, json.dumps(request).encode())  # core publish, as `nats pub`
    summary = await follow(runtime.nc, runtime.topology, execution_id, timeout=30)

    assert summary.status == "success"
    assert summary.result == request["payload"]["n"] * 2


async def test_recipe_submit_req(runtime: Runtime) -> None:
    _, verb, subject, body = recipe("submit-req")
    assert verb == "req"
    subject = local(subject, runtime.topology)
    assert subject == runtime.topology.api_subject("execute")
    request = json.loads(body)
    request["playbook"] = DOUBLE

    reply = await runtime.nc.request(subject, json.dumps(request).encode(), timeout=10)

    assert not (reply.headers or {}).get("Nats-Service-Error-Code")
    execution_id = json.loads(reply.data)["execution_id"]
    summary = await follow(runtime.nc, runtime.topology, execution_id, timeout=30)
    assert (summary.status, summary.result) == ("success", 6)

    request["playbook"] = "apiVersion: noetl.io/v2\nkind: Playbook\nworkflow: []\n"
    refused = await runtime.nc.request(subject, json.dumps(request).encode(), timeout=10)
    assert (refused.headers or {}).get("Nats-Service-Error-Code") == "400"
    assert json.loads(refused.data)["diagnostics"]


async def test_recipe_service(runtime: Runtime) -> None:
    ls, info = recipes()["service"]
    assert ls == ["nats", "micro", "ls"] and info[:3] == ["nats", "micro", "info"]
    name = local(info[3], runtime.topology)
    assert name == runtime.topology.service_name
    nc = runtime.nc

    # `nats micro ls`: every service answers $SRV.PING; ours is among them.
    inbox = nc.new_inbox()
    pongs: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def on_pong(msg: Any) -> None:
        await pongs.put(json.loads(msg.data))

    sub = await nc.subscribe(inbox, cb=on_pong)
    try:
        await nc.publish("$SRV.PING", b"", reply=inbox)
        async with asyncio.timeout(5):
            while (pong := await pongs.get())["name"] != name:
                pass
    finally:
        await sub.unsubscribe()
    assert pong["type"] == "io.nats.micro.v1.ping_response"

    # `nats micro info noetl`: the endpoints and their subjects.
    reply = await nc.request(f"$SRV.INFO.{name}", b"", timeout=5)
    endpoints = {e["name"]: e["subject"] for e in json.loads(reply.data)["endpoints"]}
    assert endpoints["execute"] == runtime.topology.api_subject("execute")
    assert set(endpoints.values()) == _api_subjects(runtime.topology)


async def test_recipe_leases(
    nats_server: EmbeddedNats, topology: Topology, eventually: Callable[..., Any]
) -> None:
    _, _, verb, bucket = recipe("leases")
    assert verb == "ls"
    topo = msgspec.structs.replace(topology, partitions=4, lease_ttl_s=2.0)
    bucket = local(bucket, topo)
    assert bucket == topo.leases_bucket
    partitions = {f"partition.{p}" for p in range(4)}
    async with local_runtime(nats_server.url, topology=topo, workers=0) as rt:
        kv = await rt.nc.jetstream().key_value(bucket)
        first = rt.controller.controller_id

        async def keys() -> set[str]:
            try:
                return set(await kv.keys())
            except NoKeysError:  # nats-py's keys() can miss everything while keys change: try again
                return set()

        async def owners() -> collections.Counter[str]:
            out: collections.Counter[str] = collections.Counter()
            for key in await keys() & partitions:
                with contextlib.suppress(KeyNotFoundError):  # released between the listing and the get
                    out[json.loads((await kv.get(key)).value or b"{}")["owner"]] += 1
            return out

        # One controller: a key per partition, all of them its own, and its membership.
        await eventually(lambda: _equals(keys(), partitions | {f"member.{first}"}))
        assert await owners() == {first: 4}

        # A second one joins: two members, two partitions each once the first has handed two over.
        second = Controller(rt.nc, topo, controller_id="second")
        await second.start()
        try:
            await eventually(lambda: _equals(owners(), {first: 2, "second": 2}))
            await eventually(lambda: _equals(keys(), partitions | {f"member.{first}", "member.second"}))
        finally:
            await second.shutdown()
        # It leaves: its membership is gone and the first takes every partition back.
        await eventually(lambda: _equals(owners(), {first: 4}))
        await eventually(lambda: _equals(keys(), partitions | {f"member.{first}"}))


async def _run_in_partition_0(runtime: Runtime) -> Any:
    """Run HELLO as an execution of partition 0 (the one the recipes name): a client may choose the id."""
    import uuid

    eid = next(e for e in iter(lambda: uuid.uuid4().hex, "") if runtime.topology.partition_of(e) == 0)
    await submit(runtime.nc, runtime.topology, request_for(HELLO, "hello.yaml", execution_id=eid))
    return await follow(runtime.nc, runtime.topology, eid, timeout=30)


async def _equals(value: Awaitable[object], expected: object) -> bool:
    return await value == expected


async def test_recipe_lease_owner(runtime: Runtime, eventually: Callable[..., Any]) -> None:
    _, _, verb, bucket, key = recipe("lease-owner")
    assert verb == "get"
    bucket = local(bucket, runtime.topology)
    assert (bucket, key) == (runtime.topology.leases_bucket, "partition.0")
    controller = runtime.controller
    assert controller.leases is not None
    summary = await _run_in_partition_0(runtime)
    assert runtime.topology.partition_of(summary.execution_id) == 0

    entry = await (await runtime.nc.jetstream().key_value(bucket)).get(key)
    value = json.loads(entry.value or b"{}")
    fence = controller.leases.fence(0)
    assert value["owner"] == controller.controller_id
    assert fence is not None and (entry.revision or 0) >= fence  # renewals move the revision on

    # The owner and its fencing token are on every event the controller wrote when folding (intake
    # records the request before any partition owner sees it), and on the snapshot.
    stamps: dict[tuple[str | None, int | None], set[str]] = collections.defaultdict(set)
    async for _, ev in read_events(runtime.nc.jetstream(), runtime.topology, summary.execution_id):
        if ev.source == "server":
            stamps[(ev.controller, ev.fence)].add(ev.name)
    assert stamps.pop((None, None)) == {E.EXECUTION_REQUESTED}
    assert set(stamps) == {(value["owner"], fence)}
    assert E.WORKFLOW_FINISHED in stamps[(value["owner"], fence)]
    snapshots = await runtime.nc.jetstream().key_value(runtime.topology.executions_bucket)

    async def snapshot_fence() -> int | None:
        try:
            snap = json.loads((await snapshots.get(summary.execution_id)).value or b"{}")
        except Exception:
            return None
        return snap.get("fence") if snap.get("status") == "success" else None

    await eventually(lambda: _equals(snapshot_fence(), fence))
