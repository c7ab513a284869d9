"""Remove a KV key without leaving a marker behind.

``KeyValue.delete`` and ``KeyValue.purge`` remove a key by *publishing* a marker (a ``KV-Operation:
DEL``/``PURGE`` message) on its subject, and that marker stays in the bucket's stream forever: every
finished execution with a deadline, every checkpointed pipeline run would leave one. Keys that we only
ever list by their current values (watchers with ``ignore_deletes``, ``get``) never need the marker, so
we purge the bucket's stream filtered on exactly the key's subject instead: no message is left for the
key at all (all its revisions go). A missing key is not an error (the purge removes nothing).

A watcher listing the bucket concurrently may still report a key removed a moment ago (it was
delivered before the purge); this was already so with delete markers, and the callers handle it (a
stale deadline key, a checkpoint read after its run ended, are harmless).

The subject is computed from the bucket name as nats-py and the server do for a bucket of this account
(stream ``KV_<bucket>``, subject ``$KV.<bucket>.<key>``); bucket and key are validated first, so nothing
unvalidated ever reaches a subject.
"""

from __future__ import annotations

import re

from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

_BUCKET_RE = re.compile(r"^[a-zA-Z0-9_-]+$")
_KEY_RE = re.compile(r"^[-/_=.a-zA-Z0-9]+$")


def _valid_key(key: str) -> bool:
    return bool(_KEY_RE.match(key)) and not key.startswith(".") and not key.endswith(".") and ".." not in key


async def forget_key(js: JetStreamContext, bucket: str, key: str) -> None:
    """Remove ``key`` from ``bucket`` leaving no message (not even a delete marker) in its stream."""
    if not _BUCKET_RE.match(bucket):
        raise ValueError(f"invalid KV bucket name: {bucket!r}")
    if not _valid_key(key):
        raise ValueError(f"invalid KV key: {key!r}")
    await js.purge_stream(f"KV_{bucket}", subject=f"$KV.{bucket}.{key}")


def handle_of(kv: KeyValue) -> tuple[JetStreamContext, str]:
    """The JetStream context and bucket name a nats-py ``KeyValue`` was opened with.

    nats-py keeps them in the private ``_js`` and ``_name`` attributes (no public accessor); used only
    where a caller hands us a bare ``KeyValue``.
    """
    js: JetStreamContext = kv._js
    name: str = kv._name
    return js, name
