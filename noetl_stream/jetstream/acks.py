"""The acks of one connection's JetStream publishes: one wildcard inbox, reply tokens from a counter.

nats-py's ``publish_async`` makes a random token per call (``secrets.token_hex``: a ``getrandom``
syscall) and decodes each ack with ``json.loads`` into a dataclass. `Acks` gives each acked publish the
reply subject ``<prefix><n>`` (one inbox subscription per connection, handed each ack as nats-py parses
it: `fastpath.subscribe_inline`), decodes acks with msgspec, and keeps one timer per connection for the
deadlines instead of one per publish. An API error in an ack (``{"error": {...}}``) fails its future
at once (nats-py's ``publish_async`` left it to the timeout), and so does a lost connection
(`fail_all`): the acks of a lost connection never come.

What an ack settles is one caller's future, a `Group` of callers one ack confirms (their messages to one
stream went out in one write), or `AllOf` one caller's messages to a stream that may refuse one of them.
"""

from __future__ import annotations

import asyncio
import heapq
from typing import Protocol

import msgspec
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.errors import (
    APIError,
    BadRequestError,
    NoStreamResponseError,
    NotFoundError,
    ServerError,
    ServiceUnavailableError,
)

from noetl_stream.errors import NoetlError
from noetl_stream.jetstream.fastpath import subscribe_inline
from noetl_stream.protocol.decoding import explain

__all__ = [
    "DUPLICATE_IN_PROCESS",
    "WRONG_LAST_SEQUENCE",
    "WRONG_LAST_SEQUENCE_PENDING",
    "AckTimeoutError",
    "Acks",
    "AllOf",
    "ApiError",
    "Group",
    "PubAck",
    "Settles",
    "api_error",
]

WRONG_LAST_SEQUENCE = 10071
"""The ``err_code`` of a publish refused because its subject's last sequence is not the expected one."""
WRONG_LAST_SEQUENCE_PENDING = 10164
"""The ``err_code`` of a conditional publish a clustered stream refuses because another message on the
subject is being stored (it cannot tell the last sequence yet): the answer may differ a moment later."""
DUPLICATE_IN_PROCESS = 10158
"""The ``err_code`` (with a 409) of a publish a clustered stream refuses because a message with the same
``Nats-Msg-Id`` is being stored: a moment later it is acked as a duplicate (or stored, if that failed)."""

TICK_S = 0.25
"""How often the deadlines are looked at while any is pending: a deadline is kept to within this."""
_NO_RESPONDERS = "503"


class AckTimeoutError(NoetlError, nats.errors.TimeoutError):
    """No JetStream ack came within the publish's deadline (a ``nats.errors.TimeoutError``, as nats-py's
    ``js.publish`` raises, which is a ``TimeoutError`` too)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ApiError(msgspec.Struct):
    code: int = 0
    err_code: int | None = None
    description: str = ""


class PubAck(msgspec.Struct):
    """The server's answer to a JetStream publish (``duplicate`` when ``Nats-Msg-Id`` was seen before)."""

    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    domain: str | None = None
    error: ApiError | None = None


_decode_ack = msgspec.json.Decoder(PubAck).decode


def api_error(err: ApiError) -> APIError:
    """nats-py's error for an API error (503 is ``ServiceUnavailableError``, as ``js.publish`` raises)."""
    cls = {503: ServiceUnavailableError, 500: ServerError, 404: NotFoundError, 400: BadRequestError}
    return cls.get(err.code, APIError)(code=err.code, err_code=err.err_code, description=err.description)


class Settles(Protocol):
    """What an ack settles: one caller's future, a `Group`, an `AllOf`."""

    def done(self) -> bool: ...
    def set_result(self, result: PubAck, /) -> None: ...
    def set_exception(self, exception: type | BaseException, /) -> None: ...


class Group:
    """The callers whose messages to one stream went out in one write: the ack of the write's last message
    to that stream settles each caller's future (those not cancelled)."""

    __slots__ = ("futures",)

    def __init__(self) -> None:
        self.futures: list[asyncio.Future[PubAck]] = []

    def done(self) -> bool:
        return all(f.done() for f in self.futures)

    def set_result(self, result: PubAck, /) -> None:
        for f in self.futures:
            if not f.done():
                f.set_result(result)

    def set_exception(self, exception: type | BaseException, /) -> None:
        for f in self.futures:
            if not f.done():
                f.set_exception(exception)


class AllOf:
    """One caller's messages to a stream that may refuse one of them and store a later one: each asks for
    an ack, and the caller's future settles with the last stored message's `PubAck` once every ack came,
    or fails with the first refusal (a later message stored says nothing of an earlier one)."""

    __slots__ = ("future", "left", "result")

    def __init__(self, future: asyncio.Future[PubAck], messages: int) -> None:
        self.future, self.left = future, messages
        self.result: PubAck | None = None

    def done(self) -> bool:
        return self.future.done()

    def set_result(self, result: PubAck, /) -> None:
        self.left -= 1
        if self.result is None or result.seq > self.result.seq:
            self.result = result
        if self.left <= 0 and not self.future.done():
            self.future.set_result(self.result)

    def set_exception(self, exception: type | BaseException, /) -> None:
        if not self.future.done():
            self.future.set_exception(exception)


class Acks:
    """The acks awaited on one connection: what each reply token settles, and its deadline."""

    def __init__(self) -> None:
        self.prefix = ""  # reply subjects are <prefix><token>; set by `subscribe`
        self._prefix_b = b""
        self.issued = 0
        """Reply tokens handed out so far (acks asked for)."""
        self._waiting: dict[str, Settles] = {}
        # (deadline, token, settles), a heap: callers may use different timeouts (the outbox's, a KV write's)
        self._deadlines: list[tuple[float, str, Settles]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        """Kept: ``asyncio.get_running_loop()`` costs a ``getpid`` system call (a fork check)."""

    @property
    def subscribed(self) -> bool:
        return bool(self.prefix)

    @property
    def pending(self) -> int:
        """Callers awaiting an ack (futures not yet settled)."""
        return sum(
            sum(1 for f in s.futures if not f.done()) if isinstance(s, Group) else (0 if s.done() else 1)
            for s in self._waiting.values()
        )

    async def subscribe(self, nc: NATS) -> None:
        """One wildcard subscription for every ack of the connection (nats-py replays it after a reconnect)."""
        async with self._lock:
            if self.prefix:
                return
            if nc.is_closed:
                raise nats.errors.ConnectionClosedError
            prefix = nc.new_inbox() + "."
            await subscribe_inline(nc, prefix + "*", self._on_ack)
            self.prefix, self._prefix_b = prefix, prefix.encode()

    def reply(self, settles: Settles, deadline: float) -> bytes:
        """The reply subject of a publish whose ack settles `settles`, failed with `AckTimeoutError` when it
        has not come by `deadline` (the loop's clock). `subscribe` first."""
        self.issued += 1
        token = str(self.issued)
        self._waiting[token] = settles
        heapq.heappush(self._deadlines, (deadline, token, settles))
        if self._timer is None:
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            self._timer = loop.call_later(min(TICK_S, max(0.0, deadline - loop.time())), self._expire)
        return self._prefix_b + token.encode()

    def _on_ack(self, msg: Msg) -> None:
        settles = self._waiting.pop(msg.subject[len(self.prefix) :], None)
        if settles is None or settles.done():
            return
        headers = msg.headers
        if headers and headers.get("Status") == _NO_RESPONDERS:
            settles.set_exception(NoStreamResponseError())
            return
        try:
            ack = _decode_ack(msg.data)
        except Exception as exc:  # whatever the bytes cause: said in our words (`decoding.explain`)
            why = explain(msg.data, exc, PubAck)
            settles.set_exception(APIError(description=f"unreadable publish ack {msg.data[:200]!r}: {why}"))
            return
        if ack.error is not None:
            settles.set_exception(api_error(ack.error))
        else:
            settles.set_result(ack)

    def _expire(self) -> None:
        """Forget what was settled and fail what is past its deadline, earliest first; again in a moment
        while anything is left."""
        self._timer = None
        deadlines, waiting = self._deadlines, self._waiting
        loop = self._loop or asyncio.get_running_loop()
        now = loop.time()
        while deadlines:
            deadline, token, settles = deadlines[0]
            if not settles.done():
                if deadline > now:
                    break
                settles.set_exception(
                    AckTimeoutError(f"no JetStream ack within the deadline (token {token})")
                )
            heapq.heappop(deadlines)
            waiting.pop(token, None)
        if deadlines:
            self._timer = loop.call_later(TICK_S, self._expire)

    def fail_all(self, exc: BaseException, *, closed: bool = False) -> None:
        """The connection dropped: the acks awaited never come. `closed`: its subscriptions are gone too
        (`subscribe` again if it is reconnected)."""
        waiting, self._waiting = self._waiting, {}
        if closed:
            self.prefix, self._prefix_b = "", b""
        for settles in waiting.values():
            if not settles.done():
                settles.set_exception(exc)
