"""Provisioning creates the DESIGN.md §3 topology on a real server, idempotently."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest
from nats.js import JetStreamContext, api
from nats.js.errors import APIError

from noetl_stream.kv.forget import forget_key
from noetl_stream.kv.provision import (
    ProvisionError,
    _check_kept,
    _kv_stream,
    _transient,
    kv_configs,
    provision,
    stream_names,
)
from noetl_stream.protocol import events
from noetl_stream.protocol.subjects import SubjectError, Topology


async def test_provision_twice_changes_nothing(js: JetStreamContext, topology: Topology) -> None:
    first = await provision(js, topology, pools=("default", "gpu"))
    assert first.changed and not first.updated and not first.unchanged
    assert len(first.created) == 4 + topology.partitions + 4 + 6 + 1  # streams, consumers, buckets, store

    second = await provision(js, topology, pools=("default", "gpu"))
    assert not second.changed
    assert sorted(second.unchanged) == sorted(first.created)


async def test_streams_have_the_designed_config(js: JetStreamContext, topology: Topology) -> None:
    await provision(js, topology)
    ev = (await js.stream_info(topology.events_stream)).config
    assert ev.subjects == [f"{topology.prefix}.events.>"]
    assert ev.retention == api.RetentionPolicy.LIMITS
    assert ev.storage == api.StorageType.FILE
    assert ev.duplicate_window == topology.duplicate_window_s
    assert ev.max_age == topology.events_max_age_s
    assert ev.allow_direct
    for name in (topology.commands_stream, topology.requests_stream):
        assert (await js.stream_info(name)).config.retention == api.RetentionPolicy.WORK_QUEUE


async def test_consumers_have_the_designed_config(js: JetStreamContext, topology: Topology) -> None:
    await provision(js, topology, pools=("default", "gpu"), pool_max_ack_pending=7)
    ctl = (await js.consumer_info(topology.events_stream, "controller-0")).config
    assert ctl.ack_policy == api.AckPolicy.EXPLICIT
    assert set(ctl.filter_subjects or ()) == set(topology.controller_event_filters(0))
    assert f"{topology.prefix}.events.*.0.step.done" in (ctl.filter_subjects or ())
    assert ctl.ack_wait == topology.lease_ttl_s
    assert (ctl.max_ack_pending or 0) >= 1000
    req = (await js.consumer_info(topology.requests_stream, "controller-requests")).config
    assert req.filter_subject == topology.request_subject
    for pool in ("default", "gpu"):
        cfg = (await js.consumer_info(topology.commands_stream, topology.pool_consumer(pool))).config
        assert cfg.filter_subject == topology.pool_filter(pool)
        assert cfg.ack_policy == api.AckPolicy.EXPLICIT
        assert cfg.max_deliver == topology.command_max_deliver
        assert cfg.max_ack_pending == 7
        assert cfg.ack_wait == topology.command_ack_wait_s


async def test_messages_route_to_the_right_consumers(js: JetStreamContext, topology: Topology) -> None:
    await provision(js, topology, pools=("default", "gpu"))
    await js.publish(topology.event_subject("e1", events.STEP_DONE), b"{}")
    await js.publish(topology.event_subject("e1", events.STEP_STARTED), b"{}")  # not a controller input
    await js.publish(topology.command_subject("gpu", "e1"), b"{}")
    await js.publish(topology.request_subject, b'{"path": "x"}')

    async def pending(stream: str, consumer: str) -> int:
        return (await js.consumer_info(stream, consumer)).num_pending or 0

    ctl = topology.controller_events_consumer(topology.partition_of("e1"))
    assert await pending(topology.events_stream, ctl) == 1
    assert await pending(topology.commands_stream, topology.pool_consumer("gpu")) == 1
    assert await pending(topology.commands_stream, topology.pool_consumer("default")) == 0
    assert await pending(topology.requests_stream, "controller-requests") == 1


async def test_commands_are_deduplicated_by_msg_id(js: JetStreamContext, topology: Topology) -> None:
    await provision(js, topology)
    subject = topology.command_subject("default", "e1")
    first = await js.publish(subject, b"{}", headers={"Nats-Msg-Id": "e1:s1"})
    again = await js.publish(subject, b"{}", headers={"Nats-Msg-Id": "e1:s1"})
    assert not first.duplicate and again.duplicate


async def test_buckets_and_object_store_work(js: JetStreamContext, topology: Topology) -> None:
    await provision(js, topology)
    for bucket in topology.kv_buckets:
        kv = await js.key_value(bucket)
        rev = await kv.put("e1", b"v1")
        rev = await kv.update("e1", b"v2", last=rev)
        assert (await kv.get("e1")).value == b"v2"
        info = (await js.stream_info("KV_" + bucket)).config
        assert info.max_msgs_per_subject == 1
    assert (await js.stream_info("KV_" + topology.executions_bucket)).config.allow_direct
    assert not (await js.stream_info("KV_" + topology.keychain_bucket)).config.allow_direct
    store = await js.object_store(topology.results_store)
    await store.put("e1/s1/result.json", msgspec.json.encode({"rows": 3}))
    assert (await store.get("e1/s1/result.json")).data == b'{"rows":3}'


async def test_drift_is_updated(js: JetStreamContext, topology: Topology) -> None:
    await provision(js, topology, pool_max_ack_pending=10)
    changed = msgspec.structs.replace(topology, events_max_age_s=3600.0, command_ack_wait_s=60.0)
    report = await provision(js, changed, pool_max_ack_pending=20)
    assert f"stream:{topology.events_stream}" in report.updated
    assert f"consumer:{topology.commands_stream}/pool-default" in report.updated
    assert (await js.stream_info(topology.events_stream)).config.max_age == 3600.0
    pool = (await js.consumer_info(topology.commands_stream, "pool-default")).config
    assert (pool.max_ack_pending, pool.ack_wait) == (20, 60.0)
    assert not (await provision(js, changed, pool_max_ack_pending=20)).changed


async def test_kv_buckets_allow_per_message_ttls(js: JetStreamContext, topology: Topology) -> None:
    """`kv.forget` removes keys with a purge marker that expires: the bucket must allow it."""
    await provision(js, topology)
    for bucket in topology.kv_buckets:
        assert (await js.stream_info("KV_" + bucket)).config.allow_msg_ttl, bucket


async def test_a_bucket_without_per_message_ttls_is_updated(js: JetStreamContext, topology: Topology) -> None:
    """A bucket created before `allow_msg_ttl` was provisioned is drift: the next run turns it on."""
    await provision(js, topology)
    for bucket in (topology.executions_bucket, topology.loops_bucket):
        await js.delete_stream("KV_" + bucket)
        old = dataclasses.replace(_kv_stream(_kv_config(topology, bucket)), allow_msg_ttl=None)
        await js.add_stream(old)
        assert not (await js.stream_info("KV_" + bucket)).config.allow_msg_ttl
        kv = await js.key_value(bucket)
        await kv.put("k", b"v")
        with pytest.raises(APIError):  # the server refuses an expiring marker on such a bucket
            await kv.purge("k", msg_ttl=1)

    report = await provision(js, topology, keep_replicas=True)  # what a runtime process does at start
    assert sorted(report.updated) == sorted(
        f"kv:{b}" for b in (topology.executions_bucket, topology.loops_bucket)
    )
    for bucket in (topology.executions_bucket, topology.loops_bucket):
        assert (await js.stream_info("KV_" + bucket)).config.allow_msg_ttl
        kv = await js.key_value(bucket)
        assert (await kv.get("k")).value == b"v"  # the update kept the bucket's contents
        await forget_key(kv, "k", ttl_s=1)
    assert not (await provision(js, topology)).changed


def _kv_config(topology: Topology, bucket: str) -> api.KeyValueConfig:
    return next(c for c in kv_configs(topology) if c.bucket == bucket)


async def test_change_the_server_cannot_apply_is_a_clear_error(
    js: JetStreamContext, topology: Topology
) -> None:
    await provision(js, topology)
    in_memory = msgspec.structs.replace(topology, storage="memory")
    with pytest.raises(ProvisionError, match=f"stream:{topology.events_stream}"):
        await provision(js, in_memory)


async def test_bad_pool_is_rejected_before_anything_is_created(
    js: JetStreamContext, topology: Topology
) -> None:
    with pytest.raises(SubjectError, match="invalid pool name"):
        await provision(js, topology, pools=("default", "gpu.large"))
    names = {s.config.name for s in await js.streams_info()}
    assert not names & set(stream_names(topology))


def test_bad_prefix_is_rejected() -> None:
    with pytest.raises(SubjectError, match="invalid prefix"):
        Topology(prefix="noetl.prod")


async def test_each_partition_has_its_consumer_and_the_server_partitions_like_partition_of(
    js: JetStreamContext, topology: Topology
) -> None:
    """The events stream stores each event under its execution's partition (the server's
    ``partition()`` transform), each partition's controller consumer sees exactly its executions, and
    `partition_of` computes the same partition as the server."""
    topo = msgspec.structs.replace(topology, partitions=4)
    await provision(js, topo, pools=("default",))
    ids = [f"e{i:03d}" for i in range(64)]
    for eid in ids:
        await js.publish(topo.event_subject(eid, events.STEP_DONE), b"{}")
    info = await js.stream_info(
        topo.events_stream, subjects_filter=topo.stored_any_execution_filter("step.done")
    )
    stored = set((info.state.subjects or {}).keys())
    assert stored == {f"{topo.prefix}.events.{eid}.{topo.partition_of(eid)}.step.done" for eid in ids}
    for p in range(4):
        n = (await js.consumer_info(topo.events_stream, topo.controller_events_consumer(p))).num_pending
        assert n == sum(1 for eid in ids if topo.partition_of(eid) == p) > 0


async def test_a_runtime_process_keeps_the_installations_partition_count(
    js: JetStreamContext, topology: Topology
) -> None:
    """A controller or worker provisions at start with its own defaults: that must not repartition."""
    await provision(js, msgspec.structs.replace(topology, partitions=4, lease_ttl_s=3.0))
    report = await provision(js, topology, keep_replicas=True)
    assert not report.updated
    info = await js.stream_info(topology.events_stream)
    assert info.config.subject_transform is not None
    assert "partition(4,1)" in (info.config.subject_transform.dest or "")


def test_only_cluster_formation_errors_are_retried() -> None:
    """A peer the meta leader has not heard from yet (a cluster still forming) and JetStream briefly
    unavailable are retried; a placement that can never succeed fails at once."""
    offline = APIError(code=500, err_code=10005, description="no suitable peers for placement, peer offline")
    unavailable = APIError(code=503, err_code=10008, description="JetStream system temporarily unavailable")
    too_few = APIError(code=500, err_code=10005, description="no suitable peers for placement")
    bad_config = APIError(
        code=400, err_code=10058, description="stream name already in use with a different configuration"
    )
    assert _transient(offline) and _transient(unavailable)
    assert not _transient(too_few) and not _transient(bad_config)


def test_a_server_that_drops_allow_msg_ttl_is_a_clear_error() -> None:
    """nats-server before 2.11 does not know ``allow_msg_ttl``: the created stream comes back without it."""
    topology = Topology()
    wanted = _kv_stream(_kv_config(topology, topology.loops_bucket))
    kept = api.StreamInfo(
        config=wanted, state=api.StreamState(messages=0, bytes=0, first_seq=0, last_seq=0, consumer_count=0)
    )
    _check_kept(wanted, kept, "kv:noetl_loops")
    dropped = api.StreamInfo(config=dataclasses.replace(wanted, allow_msg_ttl=None), state=kept.state)
    with pytest.raises(ProvisionError, match=r"kv:noetl_loops.*nats-server 2\.11 or later"):
        _check_kept(wanted, dropped, "kv:noetl_loops")
