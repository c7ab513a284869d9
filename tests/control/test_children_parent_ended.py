"""A parent that ends otherwise than with success has its running child executions cancelled by the
controller that holds them, wherever the parent's worker is (control/children.py).

The worker whose task waits for a child cancels it when the wait is cut short; these tests take that
worker away (SIGKILL) and check the controllers do it instead: for a child and its own child, for a
child whose controller did not hear the parent's end (it was not running, its partition moved, the
child's index key was lost), and that a parent that succeeds cancels nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec
import pytest
from eventlog import cancels
from helpers import playbook
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from procs import Processes, provisioned, run_cli

from noetl_stream.client.submit import request_for, submit
from noetl_stream.client.tracking import RunSummary, follow
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.children import ChildIndex
from noetl_stream.kv.provision import provision
from noetl_stream.protocol import events as E
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import derived_execution_id, new_execution_id
from noetl_stream.runtime.local import Runtime

LEASE_TTL_S = 3.0

LONG = playbook(
    """
    - step: start
      tool: {kind: python, code: "import time; time.sleep(120); result = 1"}
    """,
    name="long",
)


def _parent_of(child_file: str, name: str = "parent") -> str:
    """A playbook whose one step waits for the child playbook `child_file` (task ``kid``)."""
    return playbook(
        f"""
        - step: start
          tool:
            - {{name: kid, kind: playbook, path: {child_file}, return_step: start}}
        """,
        name=name,
    )


def _kid_of(parent: str) -> str:
    """The id of the child that task ``kid`` of step ``start`` starts (its first attempt)."""
    return derived_execution_id(parent, "start-1", "kid", 1)


TAKEOVER_LEASE_TTL_S = 6.0
"""The lease TTL of the test whose other controller takes the killed one's partition: long enough that it
cannot take it before the parent's end is stored (a CLI started on a loaded machine can take seconds)."""
RESTART_LEASE_TTL_S = 10.0
"""The lease TTL of the tests that kill a controller and start it again: it must take its partition back
before the other controller may take it over (a restart on a loaded machine can take seconds)."""


@pytest.fixture
def topo(topology: Topology, request: pytest.FixtureRequest) -> Topology:
    ttl = getattr(request, "param", LEASE_TTL_S)
    return msgspec.structs.replace(topology, partitions=2, lease_ttl_s=ttl, command_ack_wait_s=2.0)


@pytest.fixture
async def procs(
    nats_server: EmbeddedNats, js: JetStreamContext, topo: Topology, tmp_path: Path
) -> AsyncIterator[Processes]:
    await provision(js, topo, ("default", "kids"))
    async with provisioned(nats_server.url, js, topo, tmp_path / "logs") as p:
        yield p


async def _stored(js: JetStreamContext, topo: Topology, eid: str, name: str) -> bool:
    try:
        await js.get_last_msg(topo.events_stream, topo.stored_event_filter(eid, name))
    except NotFoundError:
        return False
    return True


async def _until(
    check: Callable[[], Awaitable[bool]], timeout: float, what: str, procs: Processes | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            logs = procs.logs() if procs is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{logs}")
        await asyncio.sleep(0.05)


async def _ended(nc: NATS, topo: Topology, eid: str, procs: Processes, timeout: float) -> RunSummary:
    try:
        return await follow(nc, topo, eid, timeout=timeout)
    except TimeoutError:
        raise AssertionError(f"execution {eid} did not end within {timeout}s\n{procs.logs()}") from None


def _assert_cancelled_for(summary: RunSummary, parent: str, status: str) -> None:
    assert summary.status == "cancelled", summary
    assert summary.error is not None and summary.error["kind"] == "cancelled", summary.error
    assert summary.error["message"] == f"parent execution {parent} ended ({status})", summary.error


# --- the parent's worker is gone --------------------------------------------------------------------


@pytest.mark.parametrize("end", ["cancel", "deadline"])
async def test_a_parent_ended_after_its_worker_was_killed_cancels_its_child_and_grandchild(
    procs: Processes, topo: Topology, js: JetStreamContext, nc: NATS, tmp_path: Path, end: str
) -> None:
    """The worker running a parent, its child and the child's child (a long step) is killed; then the
    parent is cancelled by an operator, or fails on its deadline. Nothing waits for the children any
    more: the controller cancels the child, and the child's end cancels the grandchild."""
    (tmp_path / "grand.yaml").write_text(LONG)
    (tmp_path / "kid.yaml").write_text(_parent_of("grand.yaml", name="kid"))
    text = _parent_of("kid.yaml")
    procs.controller("ctl")
    worker = procs.worker("w1")
    request = request_for(text, str(tmp_path / "parent.yaml"), execution_id=new_execution_id())
    if end == "deadline":
        request = msgspec.structs.replace(request, deadline_s=12.0)
    parent = await submit(nc, topo, request)
    kid, grand = _kid_of(parent), _kid_of(_kid_of(parent))

    await _until(lambda: _stored(js, topo, grand, E.STEP_STARTED), 30, "the grandchild's long step", procs)
    worker.kill()
    if end == "cancel":
        code, out, err = await run_cli(procs.env, "cancel", parent, "--reason", "operator")
        assert code == 0, f"{out}{err}"
    status = "cancelled" if end == "cancel" else "failed"
    assert (await _ended(nc, topo, parent, procs, 20)).status == status

    _assert_cancelled_for(await _ended(nc, topo, kid, procs, 10), parent, status)
    _assert_cancelled_for(await _ended(nc, topo, grand, procs, 10), kid, "cancelled")
    for child in (kid, grand):  # one cancel each, recorded by the controller
        assert [c for c, _ in await cancels(js, topo, child)] == ["ctl"], child


# --- the child's controller did not hear the parent's end ---------------------------------------------


async def _two_controllers(procs: Processes, js: JetStreamContext, topo: Topology) -> dict[str, int]:
    """Controllers ``ctl-a`` and ``ctl-b``, holding one of the two partitions each: which one."""
    leases = await js.key_value(topo.leases_bucket)
    held: dict[str, int] = {}

    async def one_each() -> bool:
        owners: dict[str, list[int]] = {}
        for p in range(topo.partitions):
            try:
                entry = await leases.get(f"partition.{p}")
            except Exception:  # not taken (yet)
                return False
            owners.setdefault(msgspec.json.decode(entry.value or b"{}")["owner"], []).append(p)
        held.clear()
        held.update({owner: ps[0] for owner, ps in owners.items() if len(ps) == 1})
        return set(held) == {"ctl-a", "ctl-b"}

    procs.controller("ctl-a")
    procs.controller("ctl-b")
    await _until(one_each, 30, "one partition for each controller", procs)
    return held


def _parent_id(topo: Topology, parent_partition: int, kid_partition: int) -> str:
    """A new parent id in `parent_partition` whose child (task ``kid``) is in `kid_partition`."""
    while True:
        eid = new_execution_id()
        if topo.partition_of(eid) == parent_partition and topo.partition_of(_kid_of(eid)) == kid_partition:
            return eid


KIDS_LOOP = playbook(
    """
    - step: start
      loop: {in: "{{ range(400) | list }}", iterator: n}
      tool: {kind: python, code: "import time; time.sleep(0.25); result = 1"}
    """,
    name="kidsloop",
).replace("workflow:", "executor: {spec: {pool: kids}}\nworkflow:", 1)


@pytest.mark.parametrize(
    ("how", "topo"),
    [
        ("restarted", RESTART_LEASE_TTL_S),
        ("taken_over", TAKEOVER_LEASE_TTL_S),
        ("index_key_lost", RESTART_LEASE_TTL_S),
    ],
    indirect=["topo"],
)
async def test_a_child_whose_controller_missed_the_parents_end_is_cancelled_when_it_is_taken(
    procs: Processes, topo: Topology, js: JetStreamContext, nc: NATS, tmp_path: Path, how: str
) -> None:
    """The parent (ctl-a's) and its child (ctl-b's) run; the parent's worker and ctl-b are killed; the
    parent is cancelled, which ctl-b does not hear. The controller that takes the child's partition
    cancels the child: ctl-b restarted (its partition back at once) or ctl-a taking it over (after the
    lease TTL), both from the partition's index of running children; and with that index key lost, when
    the child's next event loads it (a child on another pool, whose worker still runs it)."""
    held = await _two_controllers(procs, js, topo)
    a_part, b_part = held["ctl-a"], held["ctl-b"]
    kid_text = KIDS_LOOP if how == "index_key_lost" else LONG
    (tmp_path / "kid.yaml").write_text(kid_text)
    parent_worker = procs.worker("w1")
    if how == "index_key_lost":
        procs.worker("w2", pool="kids")
    parent = _parent_id(topo, a_part, b_part)
    kid = _kid_of(parent)
    index = await ChildIndex.open(js, topo)
    await submit(
        nc, topo, request_for(_parent_of("kid.yaml"), str(tmp_path / "parent.yaml"), execution_id=parent)
    )

    async def kid_indexed() -> bool:
        return (kid, parent) in await index.of_partition(b_part)

    # (ctl-b writes the child's index key right after the child's first fold: long before its step starts)
    await _until(lambda: _stored(js, topo, kid, E.STEP_STARTED), 30, "the child's step", procs)
    ctl_b = next(p for p in procs.all if p.name == "ctl-b")
    parent_worker.kill()
    ctl_b.kill()
    code, out, err = await run_cli(procs.env, "cancel", parent)
    assert code == 0, f"{out}{err}"
    assert (await _ended(nc, topo, parent, procs, 20)).status == "cancelled"
    assert not await _stored(js, topo, kid, E.PLAYBOOK_PROCESSED)  # nobody held it when the parent ended

    if how == "index_key_lost":  # only its next event (its loop's) makes a controller load it
        await index.remove(b_part, kid)
        assert not await kid_indexed()
    if how != "taken_over":
        ctl_b.start()
    _assert_cancelled_for(await _ended(nc, topo, kid, procs, 20), parent, "cancelled")
    by = "ctl-a" if how == "taken_over" else "ctl-b"
    assert [c for c, _ in await cancels(js, topo, kid)] == [by]

    async def unindexed() -> bool:
        return not await kid_indexed()

    await _until(unindexed, 10, "the ended child's index key to go", procs)


# --- a parent that succeeds -------------------------------------------------------------------------


async def test_a_parent_that_succeeds_cancels_nothing_and_leaves_no_index_key(
    runtime: Runtime, tmp_path: Path
) -> None:
    """While the child runs it is indexed (its key names its parent); once the parent has succeeded,
    neither execution has a cancel on record and the index is empty."""
    (tmp_path / "kid.yaml").write_text(
        playbook(
            """
            - step: start
              loop: {in: "{{ range(6) | list }}", iterator: n}
              tool: {kind: python, args: {n: "{{ iter.n }}"}, code: "import time; time.sleep(0.25); result = n"}
            """,
            name="kid",
        )
    )
    nc, topo = runtime.nc, runtime.topology
    js = nc.jetstream()
    parent = new_execution_id()
    kid = _kid_of(parent)
    index = await ChildIndex.open(js, topo)
    await submit(
        nc, topo, request_for(_parent_of("kid.yaml"), str(tmp_path / "parent.yaml"), execution_id=parent)
    )

    async def kid_indexed() -> bool:
        return (kid, parent) in await index.of_partition(topo.partition_of(kid))

    await _until(kid_indexed, 20, "the running child's index key")
    assert runtime.controller.children.parent_of == {kid: parent}
    summary = await follow(nc, topo, parent, timeout=30)
    assert summary.status == "success", summary.error
    assert summary.result["data"] == [0, 1, 2, 3, 4, 5]

    async def unindexed() -> bool:
        return not await kid_indexed() and not runtime.controller.children.parent_of

    await _until(unindexed, 10, "the index to be empty")
    assert await cancels(js, topo, parent) == []
    assert await cancels(js, topo, kid) == []
