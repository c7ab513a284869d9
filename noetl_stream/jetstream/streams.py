"""Which streams may refuse one message of a connection and store a later one.

`publish.Publisher.confirm` asks for one ack per stream per write: JetStream processes one
connection's messages to one stream in order, so the ack of the last message proves the earlier ones
were processed. Processed is stored unless the stream refuses one message on its own and stores the
next, which only per-message limits do. `StreamConfigs` looks at a stream's configuration (one
``$JS.API.STREAM.INFO`` request) the first time a confirm names it, and again a minute later, on use,
without waiting; a stream that cannot be looked at counts as one that may refuse, and is looked at again
a few seconds later.
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections.abc import Iterable

import msgspec
from nats.aio.client import Client as NATS

from noetl_stream.jetstream.acks import ApiError

__all__ = ["RECHECK_S", "RETRY_S", "StreamConfigs", "may_refuse_one"]

_STREAM_INFO = "$JS.API.STREAM.INFO."  # the default JetStream API prefix, as the runtime's contexts use
RECHECK_S = 60.0
"""A stream's configuration is looked at again this long after (on use, without waiting)."""
RETRY_S = 5.0
"""After a failed look: "may refuse" meanwhile, looked at again this long after."""
_LOOKUP_TIMEOUT_S = 5.0
_CONNECTED = NATS.CONNECTED


class _StreamConfig(msgspec.Struct):
    """What of a stream's configuration says whether it may refuse one message and store a later one."""

    max_msg_size: int = -1
    discard: str = "old"
    discard_new_per_subject: bool = False
    mirror: dict[str, object] | None = None


class _StreamInfo(msgspec.Struct):
    config: _StreamConfig | None = None
    error: ApiError | None = None


_decode_info = msgspec.json.Decoder(_StreamInfo).decode


def may_refuse_one(config: _StreamConfig) -> bool:
    """Whether the stream may refuse one message of a connection and store a later one: only per-message
    limits do that, a maximum message size or a full limit with ``discard: new`` (``max_msgs``,
    ``max_bytes``, ``max_msgs_per_subject`` with ``discard_new_per_subject``). A mirror stores nothing
    published (its name is not where the messages go: nothing known). A sealed stream, or one whose
    every message the server refuses alike (no ack, counters), fails every caller of a group rightly."""
    return (
        config.max_msg_size > 0
        or config.discard == "new"
        or config.discard_new_per_subject
        or config.mirror is not None
    )


class StreamConfigs:
    """What is known of the streams one connection publishes to."""

    def __init__(self, nc: NATS) -> None:
        self._nc_ref = weakref.ref(nc)
        self.known: dict[str, tuple[bool, float]] = {}
        """stream -> (may it refuse one message and store a later one, when to look at it again)"""
        self.lookups: dict[str, asyncio.Task[None]] = {}
        """stream -> its stream info request in flight"""

    def start(self, nc: NATS, stream: str) -> asyncio.Task[None] | None:
        """The stream info request in flight for `stream`, started now if there is none (none while the
        connection is not connected)."""
        lookups = self.lookups
        task = lookups.get(stream)
        if task is None:
            if nc._status != _CONNECTED:
                return None
            task = lookups[stream] = asyncio.create_task(self._look(stream))
            task.add_done_callback(functools.partial(_forget, lookups, stream))
        return task

    async def look_up(self, nc: NATS, streams: Iterable[str], now: float, deadline: float) -> None:
        """Look at the configuration of the `streams` not looked at yet (awaited, until `deadline` at
        most) or a while ago (not awaited: the answer of then holds meanwhile). While the connection is
        not connected nothing is requested: a stream not looked at yet counts as one that may refuse."""
        known = self.known
        wait: set[asyncio.Task[None]] = set()
        for stream in streams:
            k = known.get(stream)
            if k is not None and k[1] > now:
                continue
            task = self.start(nc, stream)
            if task is not None and k is None:
                wait.add(task)
        if wait:
            await asyncio.wait(wait, timeout=max(0.0, deadline - asyncio.get_running_loop().time()))

    async def _look(self, stream: str) -> None:
        """Request the stream's info and note whether it may refuse one message (yes if it cannot be
        fetched: looked at again in `RETRY_S`)."""
        refuses, again = True, RETRY_S
        try:
            nc = self._nc_ref()
            if nc is not None:
                msg = await nc.request(_STREAM_INFO + stream, b"", timeout=_LOOKUP_TIMEOUT_S)
                info = _decode_info(msg.data)
                if info.error is None and info.config is not None:
                    refuses, again = may_refuse_one(info.config), RECHECK_S
        except Exception:  # no responders, a timeout, a bad name or answer, a closed connection
            pass
        self.known[stream] = (refuses, asyncio.get_running_loop().time() + again)

    def cancel(self) -> None:
        """A lost connection: its answers never come (confirms waiting for them go on as for a stream
        that may refuse a message)."""
        for task in list(self.lookups.values()):
            task.cancel()


def _forget(lookups: dict[str, asyncio.Task[None]], stream: str, task: asyncio.Task[None]) -> None:
    if lookups.get(stream) is task:
        del lookups[stream]
