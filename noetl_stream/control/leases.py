"""Partition leases: which controller folds which executions, decided in a NATS KV bucket.

Executions are split into a fixed number of partitions (the events stream stores each event under
its execution's partition). A controller may pull a partition's events only while it holds the
partition's lease, a key ``partition.<n>`` in the leases bucket, whose TTL is the bucket's max age:

- acquire: ``create`` the key (it is absent or expired), or ``update`` it when it names this very
  controller (a restart of the same controller id takes its partitions back at once);
- renew: ``update`` with the revision last written (compare-and-set) every ``ttl / 4``;
- lose: a renewal that is refused (someone else holds the key) or that has not succeeded for
  ``ttl * 0.6`` — the controller stops pulling the partition before the key can expire on the
  server, so two controllers never pull one partition at once;
- release: on shutdown or rebalancing, stop pulling first, then delete the key (compare-and-set).

The revision of the write that acquired a lease is its fencing token: every snapshot and every
server event records it (revisions only grow, so a later owner's token is larger), and a controller
whose snapshot compare-and-set fails against a snapshot written under a newer token has lost the
partition (``Controller`` releases it at once). Membership is a ``member.<id>`` key per controller,
refreshed with the leases; each controller aims at ``ceil(partitions / members)`` partitions.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import nats.errors
import structlog
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.errors import KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from noetl_stream.errors import ConfigurationError
from noetl_stream.kv import scan
from noetl_stream.protocol.subjects import Topology, check_token

log = structlog.get_logger(__name__)

LOSE_AFTER = 0.6
"""Fraction of the TTL after the last successful renewal at which a controller gives a lease up."""


def default_controller_id(configured: str | None = None) -> str:
    """`configured` (``NOETL_CONTROLLER_ID``, `Settings.controller_id`) or the host name (a pod name on
    Kubernetes), made a valid KV key token."""
    name = configured or socket.gethostname() or "controller"
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:64]


class LeaseValue(msgspec.Struct, frozen=True):
    owner: str
    acquired_at: float
    incarnation: str = ""
    """Random per process: tells a restart of this controller id from a live duplicate of it."""


class Lease(msgspec.Struct):
    partition: int
    fence: int
    """The fencing token: the revision of the write that acquired the lease (constant while held)."""
    revision: int
    """The revision of the last write of the lease (renewals compare-and-set against it)."""
    renewed_at: float
    """Monotonic time at which the last successful renewal was sent."""
    releasing: bool = False
    """Being handed over: still renewed while its folds finish, no longer counted in the share."""


OnAcquire = Callable[[int, int], Awaitable[None]]
"""``(partition, fence)``."""
OnRelease = Callable[[int, bool], Awaitable[None]]
"""``(partition, graceful)``: graceful when the lease is still ours (shutdown, rebalancing)."""


class DuplicateControllerError(ConfigurationError, RuntimeError):
    """Another live controller already uses this controller id."""


class Leases:
    def __init__(
        self,
        nc: NATS,
        topology: Topology,
        partitions: int,
        controller_id: str,
        on_acquire: OnAcquire,
        on_release: OnRelease,
    ) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.topology = topology
        self.partitions = partitions
        self.controller_id = check_token(controller_id, "controller id")
        self.ttl = topology.lease_ttl_s
        self.on_acquire = on_acquire
        self.on_release = on_release
        self.owned: dict[int, Lease] = {}
        self._kv: KeyValue | None = None
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._started_at = time.time()
        self._alive: Any = None
        self._guard: asyncio.Task[None] | None = None
        self.incarnation = uuid.uuid4().hex
        self._first_tick = True
        self._member_rev: int | None = None
        """The revision of this process's last write of its member key (None: not claimed)."""
        self.halted = False
        """Another live process uses this controller id (it keeps the partitions): take none."""

    @property
    def interval(self) -> float:
        return self.ttl / 4

    def fence(self, partition: int) -> int | None:
        lease = self.owned.get(partition)
        return None if lease is None else lease.fence

    def valid(self, partition: int) -> bool:
        """Held, and renewed recently enough that nobody else can hold it yet (by our clock)."""
        lease = self.owned.get(partition)
        return lease is not None and time.monotonic() - lease.renewed_at < self.ttl * LOSE_AFTER

    async def start(self) -> None:
        """Claim the controller id (refusing a duplicate of a live one), then take partitions."""
        self._kv = await self.js.key_value(self.topology.leases_bucket)
        # Single-key reads from the stream's leader: a revision read before a compare-and-set must
        # be current (a follower a moment behind would only fail the write, but an id claim retried
        # against a lagging follower could give up). The lease round reads through `direct_entries`.
        self._kv._direct = False
        await self._claim_id()
        await self.tick()
        self._guard = asyncio.create_task(self._renew_loop(), name="controller-lease-renewal")
        self._task = asyncio.create_task(self._run(), name="controller-leases")

    async def _claim_id(self) -> None:
        """Claim the controller id: exactly one of two processes with one id started together runs.

        Read the id's member key, ask whether a live process answers for the id, subscribe to answer
        for it, then write the member key compare-and-set against the revision read (0 for none).
        Of two processes started together, either both write against the same revision (one write
        is refused) or one reads the other's write, which that one made after subscribing: its
        question is answered. A refused write is retried from the start, so an expiring key is not
        taken for a rival. (On a cluster this holds when the subscription reaches the asker's server
        before the write is read there, as it does over working routes; partition fencing and the
        halt on a lease rewritten under this id by another process remain the backstop.)"""
        assert self._kv is not None
        key = self._member_key(self.controller_id)
        alive = self.topology.controller_alive_subject(self.controller_id)
        for _attempt in range(3):
            last, _value = await self._read_member()
            await self._refuse_if_alive(alive)
            self._alive = await self.nc.subscribe(alive, cb=self._answer_alive)
            await self.nc.flush()
            try:
                # Exactly against what was read (not `create`, which would write over a delete
                # marker made since: the delete of a rival's key would let this one through).
                self._member_rev = await self._kv.update(key, self._value(), last=last)
                return
            except BaseException as exc:
                with contextlib.suppress(Exception):
                    await self._alive.unsubscribe()
                self._alive = None
                if not isinstance(exc, KeyWrongLastSequenceError):
                    raise  # no claim (the server did not answer, ...): not left answering for the id
        raise DuplicateControllerError(
            f"controllers with id {self.controller_id!r} keep starting at the same moment: give each "
            "controller its own id (--controller-id or NOETL_CONTROLLER_ID; the default is the host name)"
        )

    async def _refuse_if_alive(self, alive: str) -> None:
        try:
            await self.nc.request(alive, b"", timeout=1.0)
        except nats.errors.NoRespondersError:
            return  # nobody is subscribed for this id: a previous run of it is dead, its leases are ours
        except (nats.errors.TimeoutError, TimeoutError):
            if await self._member_gone():
                # Subscribed but silent, and not a member for a TTL: a dead process whose connection
                # the server has not dropped yet (a crashed host: until the server's ping timeout,
                # minutes). Its leases expired with its membership: the id is free.
                log.warning("controller.stale_alive_subscription", controller=self.controller_id)
                return
            raise DuplicateControllerError(  # subscribed but silent: alive and busy, or stalled
                f"a controller with id {self.controller_id!r} is connected but did not answer within 1 s"
            ) from None
        raise DuplicateControllerError(
            f"another controller with id {self.controller_id!r} is running: give each controller its "
            "own id (--controller-id or NOETL_CONTROLLER_ID; the default is the host name)"
        )

    async def _member_gone(self) -> bool:
        """The id's member key has no value: expired (not renewed for a TTL) or deleted."""
        try:
            return (await self._read_member())[1] is None
        except Exception:  # unreadable: not known to be gone
            return False

    async def stop(self) -> None:
        """Release every partition (stop pulling, then delete the key), and leave the membership."""
        if self._task is not None:
            await _cancel(self._task)
        async with self._lock:
            # All at once; the renewal task runs on, so their folds can finish under a valid lease.
            await asyncio.gather(*(self._release(p, graceful=True) for p in sorted(self.owned)))
        for task in (self._task, self._guard):
            if task is not None:
                await _cancel(task)
        self._task = self._guard = None
        async with self._lock:
            if self._kv is not None and self._member_rev is not None:  # only a key this one wrote
                with contextlib.suppress(Exception):
                    await self._kv.delete(self._member_key(self.controller_id), last=self._member_rev)
                self._member_rev = None
        if self._alive is not None:
            with contextlib.suppress(Exception):
                await self._alive.unsubscribe()
            self._alive = None

    @staticmethod
    async def _answer_alive(msg: Msg) -> None:
        if msg.reply:
            with contextlib.suppress(Exception):
                await msg.respond(b"alive")

    async def lost(self, partition: int) -> None:
        """Someone else holds ``partition`` (a fenced write): stop pulling it now."""
        if partition in self.owned:  # not behind the lock: a slow balance must not delay it
            await self._release(partition, graceful=False)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval * random.uniform(0.9, 1.1))
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("controller.lease_tick_failed", controller=self.controller_id)

    async def tick(self) -> None:
        """Balance: give up partitions above the fair share, take free ones below it. (Renewal runs
        on its own task: a slow release or acquire here must not hold the other leases' renewals.)"""
        async with self._lock:
            if self._first_tick:
                await self._renew()
            try:
                owners, members = await self._read()
            except (nats.errors.Error, TimeoutError, OSError, scan.ScanError) as exc:
                log.warning("controller.lease_read_failed", error=str(exc) or type(exc).__name__)
                return
            first, self._first_tick = self._first_tick, False
            if self.halted:
                return
            members.add(self.controller_id)
            share = math.ceil(self.partitions / len(members))
            mine = sorted(p for p, lease in self.owned.items() if not lease.releasing)
            await asyncio.gather(*(self._release(p, graceful=True) for p in mine[share:]))

            def ours(v: LeaseValue) -> bool:
                # This process's lease, or (first tick only) a previous run's: taken back at once.
                return v.owner == self.controller_id and (first or v.incarnation == self.incarnation)

            free = [p for p in range(self.partitions) if p not in owners or ours(owners[p])]
            free = [p for p in free if p not in self.owned]
            random.shuffle(free)
            for p in free:
                if self.halted or len(self.owned) >= share or not await self._acquire(p, p in owners):
                    break

    async def _renew(self) -> None:
        assert self._kv is not None
        now = time.monotonic()
        if self.halted:  # a halted duplicate leaves the id, and every partition, to the others
            return
        # All at once, each with a short timeout: a slow server must not push the later ones past
        # their expiry (nor a slow member renewal the partitions').
        taken, *_ = await asyncio.gather(
            self._member_taken(), *(self._renew_one(p, lease, now) for p, lease in list(self.owned.items()))
        )
        if taken and not self.halted:
            log.error("controller.duplicate_id", controller=self.controller_id, member=True)
            self.halted = True
            self._member_rev = None  # the key is the other process's now
            await self._abdicate()

    async def _member_taken(self) -> bool:
        """Renew the member key; True if another process with this id holds it now."""
        try:
            return await asyncio.wait_for(self._renew_member(), self.ttl * 0.2)
        except Exception as exc:  # the next round tries again
            log.warning("controller.member_renew_failed", error=str(exc) or type(exc).__name__)
            return False

    async def _renew_member(self) -> bool:
        """Rewrite the member key compare-and-set against this process's last write of it. Refused:
        read it. This process's own value (a write whose answer was lost) is adopted; another process
        with this id (one started while this one was cut off for longer than the TTL) keeps the id, and
        this one halts; an expired or deleted key is written again."""
        assert self._kv is not None
        key = self._member_key(self.controller_id)
        try:
            self._member_rev = await self._kv.update(key, self._value(), last=self._member_rev or 0)
            return False
        except KeyWrongLastSequenceError:
            pass
        last, value = await self._read_member()
        if value is None:  # expired or deleted
            self._member_rev = await self._kv.update(key, self._value(), last=last)
            return False
        if value.incarnation == self.incarnation:
            self._member_rev = last
            return False
        return True

    async def _read_member(self) -> tuple[int, LeaseValue | None]:
        """The id's member key (`_read_key`)."""
        return await self._read_key(self._member_key(self.controller_id))

    async def _read_key(self, key: str) -> tuple[int, LeaseValue | None]:
        """A lease or member key, from the leader: the revision to write it against and its value. A
        delete marker (nats-py's `get` raises KeyNotFoundError carrying it): its revision and None; no
        message at all (never written, or expired): 0 and None."""
        assert self._kv is not None
        try:
            entry = await self._kv.get(key)
        except (KeyNotFoundError, KeyDeletedError, NotFoundError) as exc:
            marker = getattr(exc, "entry", None)
            return (marker.revision if marker is not None else 0), None
        try:
            value = msgspec.json.decode(entry.value or b"", type=LeaseValue)
        except msgspec.DecodeError:  # not one of ours: someone else's value all the same
            value = LeaseValue(owner="", acquired_at=0.0)
        return entry.revision or 0, value

    async def _renew_one(self, p: int, lease: Lease, now: float) -> None:
        assert self._kv is not None
        try:
            rev = await asyncio.wait_for(
                self._kv.update(self._key(p), self._value(), last=lease.revision), self.ttl * 0.2
            )
        except KeyWrongLastSequenceError:
            await self._refused(p, lease, now)
        except Exception as exc:
            if time.monotonic() - lease.renewed_at > self.ttl * LOSE_AFTER:
                log.warning("controller.lease_expired", partition=p, error=str(exc) or type(exc).__name__)
                await self._release(p, graceful=False)
        else:
            if self.owned.get(p) is lease:
                lease.revision, lease.renewed_at = rev, now

    async def _refused(self, p: int, lease: Lease, now: float) -> None:
        """A renewal refused for its revision: the key, read once, tells why. This process's own lease at
        a later revision: an earlier renewal was stored and its answer came too late (a slow server, past
        the renewal's timeout): adopted, and renewed on. This id written by another process: a live
        duplicate, which keeps the id (this one halts). Anyone else's, or nothing: taken."""
        try:
            last, value = await asyncio.wait_for(self._read_key(self._key(p)), self.ttl * 0.2)
        except Exception:  # unknown: read as taken (the safe side)
            last, value = 0, None
        ours = value is not None and value.owner == self.controller_id
        same = ours and value is not None and value.incarnation == self.incarnation
        if (
            same
            and last > lease.revision
            and self.owned.get(p) is lease
            and await self._renew_on(p, lease, last, now)
        ):
            return
        log.warning("controller.lease_taken", partition=p, controller=self.controller_id)
        if ours and not same:
            log.error("controller.duplicate_id", controller=self.controller_id, partition=p)
            if not self.halted:
                self.halted = True
                await self._abdicate()
        await self._release(p, graceful=False)

    async def _renew_on(self, p: int, lease: Lease, last: int, now: float) -> bool:
        """Adopt revision `last` of this process's own lease and renew on it; False if someone else wrote
        the key since."""
        assert self._kv is not None
        lease.revision = last  # (its renewal time unknown: `renewed_at` stays, the overdue check holds)
        log.info("controller.lease_renewal_adopted", partition=p, revision=last)
        try:
            rev = await asyncio.wait_for(
                self._kv.update(self._key(p), self._value(), last=last), self.ttl * 0.2
            )
        except KeyWrongLastSequenceError:
            return False
        except Exception:  # the next renewal tries again, from the adopted revision
            return True
        if self.owned.get(p) is lease:
            lease.revision, lease.renewed_at = rev, now
        return True

    async def _renew_loop(self) -> None:
        """Renew every interval; between renewals give overdue leases up on time (all at once)."""
        next_renewal = time.monotonic() + self.interval
        while True:
            await asyncio.sleep(self.ttl * 0.05)
            now = time.monotonic()
            overdue = [p for p, lease in self.owned.items() if now - lease.renewed_at > self.ttl * LOSE_AFTER]
            for p in overdue:
                log.warning("controller.lease_expired", partition=p, error="not renewed in time")
            await asyncio.gather(*(self._release(p, graceful=False) for p in overdue))
            if now >= next_renewal:
                next_renewal = now + self.interval * random.uniform(0.9, 1.1)
                try:
                    await self._renew()
                except Exception:
                    log.exception("controller.lease_renew_failed", controller=self.controller_id)

    async def _abdicate(self) -> None:
        """Halted: leave the id to the other process. Stop answering for it, give back the partitions
        still held, and stop counting as a member (no more renewals; the member key goes now if this one wrote it last, else at its
        expiry). A halted controller that stayed a member would hold a share of the partitions it
        never takes; one still answering would refuse the id's restart once the other is gone."""
        assert self._kv is not None
        if self._alive is not None:
            with contextlib.suppress(Exception):
                await self._alive.unsubscribe()
            self._alive = None
        # Partitions still held: stop pulling now (the other process may hold them already: no
        # graceful finish), and delete the keys still ours, free for the others to take at once.
        await asyncio.gather(*(self._give_up(p) for p in sorted(self.owned)))
        if self._member_rev is not None:
            with contextlib.suppress(Exception):
                await self._kv.delete(self._member_key(self.controller_id), last=self._member_rev)
            self._member_rev = None

    async def _give_up(self, p: int) -> None:
        """Stop pulling `p` now (its folds aborted), then delete its key if it is still ours."""
        lease = self.owned.get(p)
        if lease is None:
            return
        await self._release(p, graceful=False)
        if self._kv is not None:
            with contextlib.suppress(Exception):
                await self._kv.delete(self._key(p), last=lease.revision)

    async def _read(self) -> tuple[dict[int, LeaseValue], set[str]]:
        """Current partition owners and live members (keys not yet expired)."""
        assert self._kv is not None
        owners: dict[int, LeaseValue] = {}
        members: set[str] = set()
        # One batched direct get: every key and value, no consumer (a lease round runs every ttl / 4).
        entries = await scan.direct_entries(self._kv, timeout=max(1.0, self.ttl * 0.2))
        if entries is None:  # a bucket without direct gets (provisioned before): a consumer, to the end
            entries = [e async for e in scan.entries(self._kv)]
        for entry in entries:
            kind, _, name = entry.key.partition(".")
            if kind == "member":
                members.add(name)
            elif kind == "partition" and name.isdigit() and int(name) < self.partitions and entry.value:
                owners[int(name)] = msgspec.json.decode(entry.value, type=LeaseValue)
        return owners, members

    async def _acquire(self, p: int, mine: bool) -> bool:
        """Try to take partition `p`; False if the server did not answer (try again next tick)."""
        assert self._kv is not None
        now = time.monotonic()
        try:
            if mine:  # a previous run of this controller id held it: take it back now
                entry = await self._kv.get(self._key(p))
                rev = await self._kv.update(self._key(p), self._value(), last=entry.revision)
            else:
                rev = await self._kv.create(self._key(p), self._value())
        except (KeyWrongLastSequenceError, KeyNotFoundError, NotFoundError):
            return True  # someone else was faster
        except (nats.errors.Error, TimeoutError, OSError) as exc:
            # A server that stalls or restarts now must not fail the controller's start. If the write
            # did land, the next tick finds this incarnation's lease and takes it back.
            log.warning("controller.lease_acquire_failed", partition=p, error=str(exc) or type(exc).__name__)
            return False
        self.owned[p] = Lease(partition=p, fence=rev, revision=rev, renewed_at=now)
        log.info("controller.partition_acquired", partition=p, fence=rev, controller=self.controller_id)
        try:
            await self.on_acquire(p, rev)
        except Exception:
            log.exception("controller.partition_start_failed", partition=p)
            await self._release(p, graceful=True)
        if self.halted:  # halted meanwhile (the renewal task): not this process's to keep
            await self._give_up(p)
        return True

    async def _release(self, p: int, *, graceful: bool) -> None:
        """Graceful: the lease stays in `owned`, renewed, until on_release returns. Lost: gone now."""
        lease = self.owned.get(p)
        if lease is None or (graceful and lease.releasing):
            return
        lease.releasing = True
        if not graceful:
            del self.owned[p]
        try:
            await self.on_release(p, graceful)
        except Exception:
            log.exception("controller.partition_stop_failed", partition=p)
        finally:
            if self.owned.get(p) is lease:
                del self.owned[p]
        if graceful and self._kv is not None:
            with contextlib.suppress(Exception):
                await self._kv.delete(self._key(p), last=lease.revision)
        log.info(
            "controller.partition_released", partition=p, graceful=graceful, controller=self.controller_id
        )

    def _value(self) -> bytes:
        return msgspec.json.encode(
            LeaseValue(owner=self.controller_id, acquired_at=self._started_at, incarnation=self.incarnation)
        )

    @staticmethod
    def _key(p: int) -> str:
        return f"partition.{p}"

    @staticmethod
    def _member_key(controller_id: str) -> str:
        return f"member.{controller_id}"


async def _cancel(task: asyncio.Task[None]) -> None:
    """Cancel ``task`` and wait for its end, cancelling again while it runs on: Python 3.11's
    ``asyncio.wait_for`` (under nats-py's requests) returns the result instead of raising when the
    cancellation arrives as its future completes, and the loop would go on with the cancel spent."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.5)
    with contextlib.suppress(asyncio.CancelledError):
        await task
