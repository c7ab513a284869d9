"""Remove a KV key without leaving a marker behind for good.

``KeyValue.delete`` and ``KeyValue.purge`` remove a key by *publishing* a marker (a ``KV-Operation:
DEL``/``PURGE`` message) on its subject, and that marker stays in the bucket's stream forever: every
finished execution with a deadline, every checkpointed pipeline run would leave one. Keys that we only
ever list by their current values (watchers with ``ignore_deletes``, ``get``) never need the marker, so
`forget_key` publishes a purge marker with a per-message TTL (``Nats-TTL``, nats-server >= 2.11):

- the marker is a rollup on the key's subject, so the key's earlier values go at once (``get`` finds
  nothing, a watcher with ``ignore_deletes`` skips it);
- the marker itself expires after `FORGET_TTL_S`, so after that nothing is left for the key. A
  missing key is not an error (a marker is published and expires all the same).

This takes only a publish on ``$KV.<bucket>.<key>``, which an identity that writes the bucket has
anyway; unlike a stream purge filtered on the subject (``$JS.API.STREAM.PURGE.KV_<bucket>``, which
NATS cannot restrict to one subject and so would let the identity wipe the whole bucket).

The bucket's stream must allow per-message TTLs (``allow_msg_ttl``): `noetl_stream.kv.provision`
sets it on the buckets whose keys are forgotten (executions, loops). Without it the server rejects the
marker (``per-message TTL is disabled``).

`FORGET_TTL_S` is 60 s: long enough that a watcher or a consumer replaying the bucket a moment after
the removal still sees a purge (not a key that silently vanished mid-read), short enough that markers
never pile up (at most a minute's worth of removals). The server accepts whole seconds, at least 1.

A watcher listing the bucket concurrently may still report a key removed a moment ago (it was
delivered before the marker); this was already so with plain delete markers, and the callers handle it
(a stale deadline key, a checkpoint read after its run ended, are harmless).

nats-py does not validate the key in ``purge``; we do, so that nothing unvalidated (a wildcard, an
empty token) ever reaches a subject.
"""

from __future__ import annotations

from nats.js.kv import VALID_KEY_RE, KeyValue

FORGET_TTL_S = 60
"""Seconds a forget marker stays in the bucket's stream before the server removes it."""


def _valid_key(key: str) -> bool:
    """nats-py's own key rule (which ``purge`` does not apply), and no empty subject token."""
    return (
        bool(VALID_KEY_RE.match(key))
        and not key.startswith(".")
        and not key.endswith(".")
        and ".." not in key
    )


async def forget_key(kv: KeyValue, key: str, ttl_s: float = FORGET_TTL_S) -> None:
    """Remove ``key`` from ``kv``: every value goes now, the purge marker after ``ttl_s`` seconds."""
    if not _valid_key(key):
        raise ValueError(f"invalid KV key: {key!r}")
    if ttl_s < 1:
        raise ValueError(f"a forget marker's TTL must be at least 1 s, not {ttl_s!r}")
    await kv.purge(key, msg_ttl=ttl_s)
