"""Reading what a stream or a KV bucket holds now, to its end.

nats-py's ``KeyValue.watch`` (and ``watchall`` and ``keys``, built on it) decides that the current values
are all delivered by comparing its consumer's pending count with the messages its callback has handled.
When the server has pushed every value before the answer to the consumer-info request is read, the count
is 0 and no value has been handled yet: the watcher says "no more" before the first value (seen with a
few hundred keys, in a few percent of reads). A reader that trusts it sees an empty bucket: `prune` took
running executions for gone and deleted the results they held, a controller taking over a partition
would have missed its executions' deadlines, a lease round would have seen no members.

`last_messages` reads through an ephemeral pull consumer instead: nothing is delivered that was not
asked for, so the pending count each message carries is exact, and the read ends when it reaches 0
(or raises `ScanError` when messages stop coming before). `entries` and `keys` read a bucket that way.

`direct_entries` reads a small bucket read often (the leases, every few seconds per controller) in one
batched direct get instead (``multi_last``, nats-server 2.11+): one request and its replies, no
consumer to create and delete (on a cluster each is a proposal to the meta group).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
from collections.abc import AsyncGenerator
from typing import NamedTuple

import nats.errors
from nats.aio.msg import Msg
from nats.js import api
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

from noetl_stream.errors import NoetlError
from noetl_stream.jetstream.fastpath import num_pending

__all__ = ["Entry", "ScanError", "direct_entries", "entries", "keys", "last_messages"]

FETCH_WAIT_S = 5.0
"""How long one fetch waits for messages the consumer counts as pending before it is asked again."""

MAX_READ_FACTOR = 4
MAX_READ_EXTRA = 10_000
"""A read gives up after this many messages beyond `MAX_READ_FACTOR` times what was there at its start."""

_DELETED = frozenset({"DEL", "PURGE"})


class ScanError(NoetlError):
    """A stream or bucket could not be read to its end (messages stopped coming)."""


class Entry(NamedTuple):
    """A key of a bucket that has a value, as `entries` reads it."""

    key: str
    value: bytes
    """Empty when read with ``headers_only``."""
    revision: int
    created: datetime.datetime


async def last_messages(
    js: JetStreamContext,
    stream: str,
    subjects: str,
    batch: int = 256,
    *,
    headers_only: bool = False,
) -> AsyncGenerator[Msg, None]:
    """The last message of each subject of `stream` matching `subjects`, up to the last one stored when
    the read ends, `batch` at a time, through an ephemeral pull consumer (deleted at the end). Raises
    `ScanError` if messages stop coming before the end, or if they come faster than they are read (more
    than `MAX_READ_FACTOR` times what was there at the start, and `MAX_READ_EXTRA` more, are read without
    reaching the end: a bounded read never hides a key, so it gives up instead). Close it
    (``contextlib.aclosing``) when leaving early, so the consumer goes at once rather than after its
    inactivity threshold."""
    config = api.ConsumerConfig(
        ack_policy=api.AckPolicy.NONE,
        deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT,
        filter_subject=subjects,
        inactive_threshold=60.0,
        mem_storage=True,
        headers_only=headers_only or None,
    )
    sub = await js.pull_subscribe(subjects, stream=stream, config=config)
    name = None
    try:
        info = await sub.consumer_info()
        name = info.name
        remaining = info.num_pending or 0
        budget = remaining * MAX_READ_FACTOR + MAX_READ_EXTRA
        stalled = 0
        while remaining > 0:
            if budget <= 0:
                raise ScanError(
                    f"{stream}: {remaining} messages still to read after {subjects} kept changing"
                )
            try:
                msgs = await sub.fetch(min(batch, remaining), timeout=FETCH_WAIT_S)
            except (TimeoutError, nats.errors.TimeoutError):
                # none came: messages counted as pending may have gone since (a TTL expired)
                remaining = (await sub.consumer_info()).num_pending or 0
                stalled += 1
                if remaining and stalled > 1:
                    raise ScanError(f"{remaining} messages of {stream} could not be read") from None
                continue
            stalled = 0
            budget -= len(msgs)
            for msg in msgs:
                remaining = num_pending(msg)
                yield msg
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        if name:  # else its inactivity threshold removes it
            with contextlib.suppress(Exception):
                await js.delete_consumer(stream, name)


def _deleted(msg: Msg) -> bool:
    """A delete or purge marker, or one the server placed when a value's TTL or the bucket's age ended."""
    headers = msg.headers or {}
    return headers.get("KV-Operation") in _DELETED or "Nats-Marker-Reason" in headers


async def entries(
    kv: KeyValue, match: str = ">", *, batch: int = 64, headers_only: bool = False
) -> AsyncGenerator[Entry, None]:
    """Every key of `kv` matching `match` (a key filter: ``deadline.3.*``) that has a value, with its
    value (none with `headers_only`), to the end (`last_messages`)."""
    prefix: str = kv._pre
    stream: str = kv._stream
    async with contextlib.aclosing(
        last_messages(kv._js, stream, prefix + match, batch, headers_only=headers_only)
    ) as msgs:
        async for msg in msgs:
            if _deleted(msg):
                continue
            meta = msg.metadata
            yield Entry(msg.subject[len(prefix) :], msg.data, meta.sequence.stream, meta.timestamp)


async def keys(kv: KeyValue, match: str = ">") -> list[str]:
    """The keys of `kv` matching `match` that have a value, to the end (empty for an empty bucket)."""
    return [e.key async for e in entries(kv, match, batch=256, headers_only=True)]


async def direct_entries(kv: KeyValue, match: str = ">", *, timeout: float = 2.0) -> list[Entry] | None:
    """Every key of `kv` matching `match` that has a value, with its value, in one batched direct get
    (``multi_last``): the server answers with the last message of every matching subject, as of one
    sequence, then an end-of-batch. No consumer is created.

    None when the server cannot answer that way: the bucket does not allow direct gets (a bucket
    provisioned before it did), more keys match than one batch holds (the server's limit is 1,024),
    or a server without batched direct gets. Read with `entries` then. Raises
    `nats.errors.TimeoutError` when the answer does not end within `timeout` seconds. On a cluster
    any replica may answer (a follower may be a moment behind its leader): for readers that
    compare-and-set what they then write, such as the leases."""
    js = kv._js
    nc = js._nc
    prefix: str = kv._pre
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    sub = await nc.subscribe(nc.new_inbox())
    found: list[Entry] = []
    try:
        body = json.dumps({"multi_last": [prefix + match]}).encode()
        await nc.publish(f"{js._prefix}.DIRECT.GET.{kv._stream}", body, reply=sub.subject)
        while True:
            msg = await sub.next_msg(timeout=max(0.001, deadline - loop.time()))
            headers = msg.headers or {}
            status = headers.get("Status")
            if status == "204":  # end of batch: complete only when nothing is left pending
                return found if headers.get("Nats-Num-Pending", "0") == "0" else None
            if status == "404":  # nothing matches
                return []
            if status:  # 503 no direct gets, 413 too many results, 400 a server without multi_last
                return None
            if _deleted(msg):
                continue
            subject = headers.get("Nats-Subject", "")
            found.append(
                Entry(
                    subject[len(prefix) :],
                    msg.data,
                    int(headers.get("Nats-Sequence", "0")),
                    _timestamp(headers.get("Nats-Time-Stamp", "")),
                )
            )
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


def _timestamp(value: str) -> datetime.datetime:
    """A direct get's ``Nats-Time-Stamp`` (RFC 3339, nanoseconds) as an aware datetime."""
    head, dot, rest = value.partition(".")
    if dot:  # keep microseconds: fromisoformat reads at most 6 fractional digits
        digits = "".join(c for c in rest if c.isdigit())
        zone = rest[len(digits) :]
        value = f"{head}.{digits[:6].ljust(6, '0')}{zone}"
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return datetime.datetime.fromtimestamp(0, datetime.UTC)
