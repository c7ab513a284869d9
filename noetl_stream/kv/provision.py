"""Create or update every JetStream object of a `Topology`, idempotently.

Streams (DESIGN.md §3):

- events: limits retention, ``duplicate_window`` (Nats-Msg-Id dedup), ``max_age``, direct get.
- commands: work-queue retention, one ``pool-<pool>`` consumer per pool (non-overlapping filters).
- requests: work-queue retention. A request is a to-do item: once the controller has written
  ``playbook.execution.requested`` to the events stream and acked, the request message has no
  further use, and the events stream is the audit history. ``duplicate_window`` makes
  submissions with a ``Nats-Msg-Id`` idempotent.

KV buckets and the object store are created from stream configs built here (the same shape
nats-py's ``create_key_value``/``create_object_store`` use), so that they get the same
create-or-update treatment as the streams. Running `provision` again changes nothing; a stream or
consumer whose managed settings drifted is updated (the server rejects changes it cannot apply,
such as the storage type, and that surfaces as `ProvisionError`).

Every KV bucket allows per-message TTLs (``allow_msg_ttl``, nats-server >= 2.11), as nats-py's own
``create_key_value`` sets it: `noetl_stream.kv.forget` removes deadline index keys (executions bucket)
and pipeline checkpoints (loops bucket) with a purge marker that expires; the other buckets do not
use it, and enabling it changes nothing for them. A bucket created without it is updated (the server
can turn it on, not off again). A server that does not keep the setting (older than 2.11) is a
`ProvisionError`.

Every stream, KV bucket and the object store get `Topology.replicas` replicas (3 on a 3-node
cluster); consumers inherit their stream's.

``keep_existing=True`` is what controllers and workers do at start: they create what is missing, with
their own settings, but an existing object keeps the settings an installation chooses (`SETTINGS`:
replicas, storage, retention, ack wait, deliveries, pending limit; and the partition count and lease
TTL, `provisioned_topology`). One process started with other ``NOETL_*`` values must not rewrite
the installation for every other process (30 days of events cut to an hour at once). Each existing
object whose settings differ from the process's gets one ``provision.settings_differ`` warning naming
them, the installation's value and the process's. Changing them is the job of ``noetl-stream
provision`` (no `keep_existing`). What the code itself requires of an object (its subjects, retention
policy, ``allow_msg_ttl`` ...) is still brought up to date at start.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import NamedTuple, TypeVar

import msgspec
import nats.errors
import structlog
from nats.js import api
from nats.js.errors import APIError, NotFoundError
from nats.js.manager import JetStreamManager

from noetl_stream.protocol.subjects import Topology, TopologyError, check_pool

__all__ = [
    "SETTINGS",
    "ConsumerSpec",
    "ProvisionError",
    "ProvisionReport",
    "consumer_configs",
    "kv_configs",
    "object_store_configs",
    "provision",
    "stream_configs",
    "stream_names",
]

DEFAULT_POOL_MAX_ACK_PENDING = 1000
CONTROLLER_MAX_ACK_PENDING = 20_000
# Buckets read far more often than written, where a direct get (any replica answers) pays off.
# The keychain is read rarely and prefers leader reads.
_DIRECT_BUCKETS = ("executions", "ctx", "loops", "catalog", "leases")
# How long a create/update keeps retrying while a cluster is still forming.
_TRANSIENT_RETRY_S = 30.0
# JSClusterNotAvailErr: "JetStream system temporarily unavailable".
_CLUSTER_NOT_AVAILABLE = 10008

log = structlog.get_logger(__name__)
_T = TypeVar("_T")


def _transient(e: APIError) -> bool:
    """An error the cluster outgrows by itself: a peer not yet seen by the meta leader ("no suitable
    peers for placement, peer offline", 10005) or JetStream briefly unavailable. A placement error
    without "offline" (R3 asked of a two-node cluster) is permanent and fails at once."""
    return e.err_code == _CLUSTER_NOT_AVAILABLE or "offline" in (e.description or "")


# Duration fields travel as integer nanoseconds; float round trips may differ by a few ns.
_DURATIONS = frozenset({"max_age", "duplicate_window", "ack_wait", "idle_heartbeat", "inactive_threshold"})

SETTINGS = {
    "stream": ("num_replicas", "storage", "max_age", "duplicate_window"),
    "consumer": ("ack_wait", "max_deliver", "max_ack_pending"),
}
"""The config fields an installation chooses (``NOETL_REPLICAS``, ``NOETL_STORAGE``,
``NOETL_EVENTS_MAX_AGE_S``, ``NOETL_COMMAND_ACK_WAIT_S``, ``NOETL_COMMAND_MAX_DELIVER``, ``provision``
options), of streams (KV buckets and the object store included) and of consumers: what
``keep_existing`` leaves as the server has it."""
_FIX = (
    "this process uses the installation's settings; to change them on purpose, run `noetl-stream provision` "
    "with the new settings (as a NATS user that may change JetStream objects)"
)


class ProvisionError(TopologyError):
    """The server refused to create or update a JetStream object."""


class ConsumerSpec(NamedTuple):
    stream: str
    config: api.ConsumerConfig


class ProvisionReport(msgspec.Struct, frozen=True):
    """What `provision` did, as ``kind:name`` labels (``stream:NOETL_EVENTS``, ``kv:noetl_ctx``)."""

    created: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated)


def _storage(t: Topology) -> api.StorageType:
    return api.StorageType(t.storage)


def stream_configs(topology: Topology, *, include_buckets: bool = False) -> list[api.StreamConfig]:
    """The events, commands and requests stream configs (plus the KV/object store streams)."""
    t = topology
    out = [
        _stream(
            t,
            t.events_stream,
            "events (source of truth)",
            t.events_subjects,
            api.RetentionPolicy.LIMITS,
            max_age=t.events_max_age_s,
            allow_direct=True,
            subject_transform=api.SubjectTransform(*t.events_subject_transform),
        ),
        _stream(
            t,
            t.commands_stream,
            "commands for worker pools",
            t.commands_subjects,
            api.RetentionPolicy.WORK_QUEUE,
        ),
        _stream(
            t, t.requests_stream, "execution requests", t.request_subject, api.RetentionPolicy.WORK_QUEUE
        ),
        _stream(
            t,
            t.advisories_stream,
            "commands given up after max_deliver (poison commands)",
            t.max_deliveries_subject,
            api.RetentionPolicy.WORK_QUEUE,
        ),
    ]
    if include_buckets:
        out += [_kv_stream(c) for c in kv_configs(t)]
        out += [_object_stream(c) for c in object_store_configs(t)]
    return out


def _stream(
    t: Topology,
    name: str,
    description: str,
    subject: str,
    retention: api.RetentionPolicy,
    *,
    max_age: float = 0,
    allow_direct: bool = False,
    subject_transform: api.SubjectTransform | None = None,
) -> api.StreamConfig:
    return api.StreamConfig(
        name=name,
        description=f"noetl-stream {description}",
        subjects=[subject],
        retention=retention,
        storage=_storage(t),
        num_replicas=t.replicas,
        duplicate_window=t.duplicate_window_s,
        max_age=max_age,
        allow_direct=allow_direct,
        discard=api.DiscardPolicy.OLD,
        max_msgs=-1,
        max_bytes=-1,
        max_consumers=-1,
        max_msg_size=-1,
        max_msgs_per_subject=-1,
        subject_transform=subject_transform,
    )


def consumer_configs(
    topology: Topology,
    pools: Iterable[str] = ("default",),
    *,
    pool_max_ack_pending: int = DEFAULT_POOL_MAX_ACK_PENDING,
) -> list[ConsumerSpec]:
    """The controller consumers and one ``pool-<pool>`` consumer per pool."""
    t = topology
    if pool_max_ack_pending < 1:
        raise TopologyError("pool_max_ack_pending must be >= 1")
    # One consumer per partition. Its ack wait is the lease TTL: the events a dead controller held
    # come back about when its partitions are taken over.
    specs = [
        ConsumerSpec(
            t.events_stream,
            _pull_consumer(
                t.controller_events_consumer(p),
                f"controller: boundary and iteration events of partition {p}",
                filter_subjects=list(t.controller_event_filters(p)),
                ack_wait=t.lease_ttl_s,
                max_deliver=-1,
                max_ack_pending=CONTROLLER_MAX_ACK_PENDING,
            ),
        )
        for p in range(t.partitions)
    ]
    specs += [
        ConsumerSpec(
            t.requests_stream,
            _pull_consumer(
                t.controller_requests_consumer,
                "controller: execution requests",
                filter_subject=t.request_subject,
                ack_wait=t.command_ack_wait_s,
                max_deliver=-1,
                max_ack_pending=CONTROLLER_MAX_ACK_PENDING,
            ),
        ),
    ]
    specs.append(
        ConsumerSpec(
            t.advisories_stream,
            _pull_consumer(
                t.controller_advisories_consumer,
                "controller: commands that reached max_deliver",
                filter_subject=t.max_deliveries_subject,
                ack_wait=t.command_ack_wait_s,
                max_deliver=-1,
                max_ack_pending=CONTROLLER_MAX_ACK_PENDING,
            ),
        )
    )
    for pool in dict.fromkeys(check_pool(p) for p in pools):
        specs.append(
            ConsumerSpec(
                t.commands_stream,
                _pull_consumer(
                    t.pool_consumer(pool),
                    f"worker pool {pool}",
                    filter_subject=t.pool_filter(pool),
                    ack_wait=t.command_ack_wait_s,
                    max_deliver=t.command_max_deliver,
                    max_ack_pending=pool_max_ack_pending,
                ),
            )
        )
    return specs


def _pull_consumer(
    name: str,
    description: str,
    *,
    ack_wait: float,
    max_deliver: int,
    max_ack_pending: int,
    filter_subject: str | None = None,
    filter_subjects: list[str] | None = None,
) -> api.ConsumerConfig:
    return api.ConsumerConfig(
        name=name,
        durable_name=name,
        description=description,
        deliver_policy=api.DeliverPolicy.ALL,
        ack_policy=api.AckPolicy.EXPLICIT,
        replay_policy=api.ReplayPolicy.INSTANT,
        ack_wait=ack_wait,
        max_deliver=max_deliver,
        max_ack_pending=max_ack_pending,
        filter_subject=filter_subject,
        filter_subjects=filter_subjects,
    )


def kv_configs(topology: Topology) -> list[api.KeyValueConfig]:
    """The KV buckets: history 1, direct get where reads dominate; leases expire after their TTL."""
    t = topology
    return [
        api.KeyValueConfig(
            bucket=bucket,
            history=1,
            storage=_storage(t),
            replicas=t.replicas,
            direct=bucket.endswith(_DIRECT_BUCKETS),
            ttl=t.lease_ttl_s if bucket == t.leases_bucket else None,
        )
        for bucket in t.kv_buckets
    ]


def object_store_configs(topology: Topology) -> list[api.ObjectStoreConfig]:
    """The results object store."""
    t = topology
    return [api.ObjectStoreConfig(bucket=t.results_store, storage=_storage(t), replicas=t.replicas)]


def stream_names(topology: Topology) -> list[str]:
    """Every stream `provision` manages, including the ones behind the KV buckets and object store."""
    return [str(c.name) for c in stream_configs(topology, include_buckets=True)]


def _kv_stream(cfg: api.KeyValueConfig) -> api.StreamConfig:
    # Mirrors nats.js.client.JetStreamContext.create_key_value, with the server's defaults spelled
    # out so that a second run compares equal. Like nats-py (2.16), every bucket allows per-message
    # TTLs: `noetl_stream.kv.forget` needs it on the executions and loops buckets.
    return api.StreamConfig(
        name=f"KV_{cfg.bucket}",
        subjects=[f"$KV.{cfg.bucket}.>"],
        allow_direct=bool(cfg.direct),
        allow_rollup_hdrs=True,
        deny_delete=True,
        discard=api.DiscardPolicy.NEW,
        duplicate_window=min(120.0, cfg.ttl) if cfg.ttl else 120.0,  # the server wants <= max_age
        max_age=cfg.ttl or 0,
        max_bytes=-1,
        max_consumers=-1,
        max_msg_size=-1,
        max_msgs=-1,
        max_msgs_per_subject=cfg.history,
        num_replicas=cfg.replicas,
        storage=cfg.storage,
        allow_msg_ttl=True,
    )


def _object_stream(cfg: api.ObjectStoreConfig) -> api.StreamConfig:
    # Mirrors nats.js.client.JetStreamContext.create_object_store.
    return api.StreamConfig(
        name=f"OBJ_{cfg.bucket}",
        subjects=[f"$O.{cfg.bucket}.C.>", f"$O.{cfg.bucket}.M.>"],
        max_age=cfg.ttl or 0,
        max_bytes=-1,
        max_consumers=-1,
        storage=cfg.storage,
        num_replicas=cfg.replicas,
        discard=api.DiscardPolicy.NEW,
        duplicate_window=120.0,
        allow_rollup_hdrs=True,
        allow_direct=True,
    )


_PARTITION_RE = re.compile(r"\{\{\s*partition\((\d+)\s*,")


async def events_max_age_s(js: JetStreamManager, topology: Topology, missing: float = 0.0) -> float:
    """The events stream's ``max_age`` on the server, in seconds (0: events are kept forever); `missing`
    when there is no stream (yet, or for a moment: a cluster electing its leader)."""
    try:
        info = await js.stream_info(topology.events_stream)
    except NotFoundError:
        return missing
    return float(info.config.max_age or 0)


async def provisioned_topology(js: JetStreamManager, topology: Topology, pool: str | None = None) -> Topology:
    """`topology` with the partition count and lease TTL the server already has, where it has them; with
    `pool`, also the command ack wait and deliveries of its consumer (a worker keeps a long command alive
    at a third of the ack wait the server applies, not of its own setting's)."""
    changes: dict[str, object] = {}
    if pool is not None:
        try:
            consumer = await js.consumer_info(topology.commands_stream, topology.pool_consumer(pool))
            if consumer.config.ack_wait:
                changes["command_ack_wait_s"] = float(consumer.config.ack_wait)
            if consumer.config.max_deliver and consumer.config.max_deliver > 0:
                changes["command_max_deliver"] = consumer.config.max_deliver
        except NotFoundError:
            pass
    try:
        info = await js.stream_info(topology.events_stream)
    except NotFoundError:
        return msgspec.structs.replace(topology, **changes) if changes else topology
    transform = info.config.subject_transform
    match = _PARTITION_RE.search(transform.dest or "") if transform is not None else None
    if match is not None:
        changes["partitions"] = int(match.group(1))
    try:
        leases = await js.stream_info(f"KV_{topology.leases_bucket}")
        if leases.config.max_age:
            changes["lease_ttl_s"] = float(leases.config.max_age)
    except NotFoundError:
        pass
    return msgspec.structs.replace(topology, **changes) if changes else topology


def _drift(
    desired: api.StreamConfig | api.ConsumerConfig, actual: dict[str, object], *, ignore: frozenset[str]
) -> list[str]:
    """Names of the settings we manage whose value on the server differs from `desired`."""
    out = []
    for key, want in desired.as_dict().items():
        if key in ignore:
            continue
        have = actual.get(key)
        if key in _DURATIONS and isinstance(want, int | float) and isinstance(have, int | float):
            if abs(want - have) > 1_000:
                out.append(key)
        elif have != want:
            out.append(key)
    return out


def _check_kept(cfg: api.StreamConfig, info: api.StreamInfo, label: str) -> None:
    """A server older than 2.11 may drop ``allow_msg_ttl`` (and then keep every forget marker)."""
    if cfg.allow_msg_ttl and not info.config.allow_msg_ttl:
        raise ProvisionError(
            f"{label}: the server did not enable per-message TTLs (allow_msg_ttl); noetl-stream needs "
            "nats-server 2.11 or later"
        )


_Config = TypeVar("_Config", api.StreamConfig, api.ConsumerConfig)


def _shown(value: object) -> object:
    return value.value if isinstance(value, enum.Enum) else value


_Differences = dict[str, dict[str, object]]
"""Settings that differ, by name: ``{"existing": <the server's>, "this_process": <ours>}``."""


def _keeping(
    label: str,
    desired: _Config,
    existing: _Config,
    settings: tuple[str, ...],
    adopted: _Differences | None = None,
) -> _Config:
    """`desired` with the `settings` an `existing` object has where they differ. One warning names them,
    with the differences `adopted` already (the partition count, the lease TTL)."""
    wanted = desired.as_dict()
    differing = _drift(desired, existing.as_dict(), ignore=frozenset(wanted).difference(settings))
    said = dict(adopted or {})
    for key in differing:
        said[key] = {
            "existing": _shown(getattr(existing, key)),
            "this_process": _shown(getattr(desired, key)),
        }
    if said:
        log.warning("provision.settings_differ", object=label, settings=said, fix=_FIX)
    return dataclasses.replace(desired, **{key: getattr(existing, key) for key in differing})


def _adopted(mine: Topology, installed: Topology) -> dict[str, _Differences]:
    """What `provisioned_topology` took from the server instead of `mine`, by object label."""
    out: dict[str, _Differences] = {}
    if mine.partitions != installed.partitions:
        out[f"stream:{mine.events_stream}"] = {
            "partitions": {"existing": installed.partitions, "this_process": mine.partitions}
        }
    if abs(mine.lease_ttl_s - installed.lease_ttl_s) > 1e-6:
        out[f"kv:{mine.leases_bucket}"] = {
            "max_age": {"existing": installed.lease_ttl_s, "this_process": mine.lease_ttl_s}
        }
    return out


class _Provisioner:
    def __init__(
        self,
        js: JetStreamManager,
        *,
        keep_existing: bool = False,
        adopted: dict[str, _Differences] | None = None,
    ) -> None:
        self.js = js
        self.keep_existing = keep_existing
        self._adopted = adopted or {}
        self.created: list[str] = []
        self.updated: list[str] = []
        self.unchanged: list[str] = []

    async def stream(self, cfg: api.StreamConfig, label: str) -> None:
        try:
            info = await self.js.stream_info(str(cfg.name))
        except NotFoundError:
            _check_kept(cfg, await self._call(label, "create", lambda: self.js.add_stream(cfg)), label)
            self.created.append(label)
            return
        if self.keep_existing:
            cfg = _keeping(label, cfg, info.config, SETTINGS["stream"], self._adopted.get(label))
        if _drift(cfg, info.config.as_dict(), ignore=frozenset()):
            _check_kept(cfg, await self._call(label, "update", lambda: self.js.update_stream(cfg)), label)
            self.updated.append(label)
        else:
            self.unchanged.append(label)

    async def consumer(self, spec: ConsumerSpec) -> None:
        label = f"consumer:{spec.stream}/{spec.config.name}"
        try:
            info = await self.js.consumer_info(spec.stream, str(spec.config.name))
        except NotFoundError:
            await self._call(label, "create", lambda: self.js.add_consumer(spec.stream, spec.config))
            self.created.append(label)
            return
        cfg = spec.config
        if self.keep_existing:
            cfg = _keeping(label, cfg, info.config, SETTINGS["consumer"])
        if _drift(cfg, info.config.as_dict(), ignore=frozenset()):
            # Consumer create without an action is create-or-update on the server.
            await self._call(label, "update", lambda: self.js.add_consumer(spec.stream, cfg))
            self.updated.append(label)
        else:
            self.unchanged.append(label)

    @staticmethod
    async def _call(label: str, what: str, call: Callable[[], Awaitable[_T]]) -> _T:
        deadline = time.monotonic() + _TRANSIENT_RETRY_S
        delay = 0.2
        while True:
            try:
                return await call()
            except APIError as e:
                if _transient(e) and time.monotonic() + delay < deadline:
                    # A cluster that is still forming (or re-forming after a restart): the meta
                    # leader has not heard from every peer yet. It settles in seconds.
                    log.info("provision.retry", object=label, error=e.description, err_code=e.err_code)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
                    continue
                raise ProvisionError(f"cannot {what} {label}: {e.description} (err_code {e.err_code})") from e
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError, TimeoutError) as e:
                raise ProvisionError(
                    f"cannot {what} {label}: no answer from the JetStream API ({type(e).__name__}); this NATS "
                    "user may not be allowed to change JetStream objects: provision as an admin user "
                    "(`noetl-stream provision`) and check the server's permissions"
                ) from e


async def provision(
    js: JetStreamManager,
    topology: Topology,
    pools: Iterable[str] = ("default",),
    *,
    pool_max_ack_pending: int = DEFAULT_POOL_MAX_ACK_PENDING,
    keep_existing: bool = False,
    keep_replicas: bool = False,
) -> ProvisionReport:
    """Create or update the streams, consumers, KV buckets and object store of `topology`.

    With `keep_existing` (how the controller and workers provision at start), missing objects are
    created, existing ones keep their `SETTINGS` (each one whose settings differ from `topology`'s is
    named in a warning), and an installation keeps its partition count and lease TTL: a process
    started with other settings must not change them for the whole installation. `keep_replicas` is
    this option's former name (it kept only the replica count).
    """
    keep_existing = keep_existing or keep_replicas
    adopted: dict[str, _Differences] = {}
    if keep_existing:
        installed = await provisioned_topology(js, topology)
        adopted = _adopted(topology, installed)
        topology = installed
    specs = consumer_configs(topology, pools, pool_max_ack_pending=pool_max_ack_pending)
    p = _Provisioner(js, keep_existing=keep_existing, adopted=adopted)
    for cfg in stream_configs(topology):
        await p.stream(cfg, f"stream:{cfg.name}")
    for spec in specs:
        await p.consumer(spec)
    for kv in kv_configs(topology):
        await p.stream(_kv_stream(kv), f"kv:{kv.bucket}")
    for obj in object_store_configs(topology):
        await p.stream(_object_stream(obj), f"object_store:{obj.bucket}")
    return ProvisionReport(tuple(p.created), tuple(p.updated), tuple(p.unchanged))
