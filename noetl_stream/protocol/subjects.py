"""Every JetStream name in one place: streams, subjects, consumers, buckets, API subjects.

Nothing else in the package builds a subject or stream name with an f-string; it asks a `Topology`.
Names follow DESIGN.md §3 for the default prefix ``noetl``::

    NOETL_EVENTS    noetl.events.<execution_id>.<event name with dots as tokens>   (published)
                    noetl.events.<execution_id>.<partition>.<event name>           (stored)
    NOETL_COMMANDS  noetl.cmd.<pool>.<execution_id>
    NOETL_REQUESTS  noetl.exec.request
"""

from __future__ import annotations

import functools
import re
from typing import Literal

import msgspec

from noetl_stream.errors import ConfigurationError
from noetl_stream.protocol import events

__all__ = [
    "MAX_NEW_ID_LENGTH",
    "MAX_TOKEN_LENGTH",
    "SubjectError",
    "Topology",
    "TopologyError",
    "check_new_id",
    "check_pool",
    "check_token",
]

# Identifiers that become subject tokens, and also KV keys, consumer names and file names on the
# server: stricter than the NATS subject rules (no dots, whitespace, `*`, `>`) on purpose.
_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]+")
# The prefix also becomes part of stream names (upper-cased) and bucket names: lower-case only,
# so that two prefixes can never map to the same stream name.
_PREFIX_RE = re.compile(r"[a-z][a-z0-9_-]*")
_EVENT_PART_RE = re.compile(r"[a-z][a-z0-9_]*")

MIN_DUPLICATE_WINDOW_S = 120.0
MAX_PARTITIONS = 1024


@functools.lru_cache(maxsize=65536)  # the controller asks several times per event, for a few ids at a time
def partition_of(execution_id: str, partitions: int) -> int:
    """The partition the events stream stores an execution's events under.

    The same function as the server's ``{{partition(n,1)}}`` subject transform (FNV-1a, 32 bit, of
    the execution id token, modulo n); a test checks the two agree against a real server.
    """
    h = 0x811C9DC5
    for c in execution_id.encode():
        h = ((h ^ c) * 0x01000193) & 0xFFFFFFFF
    return h % partitions


_EVENT_BASES: dict[str, dict[str, str]] = {}
"""Per prefix, ``<prefix>.events.<execution id>.`` of the executions seen (checked once each), at most
`_BASES_KEPT` of them (then started again): every event an execution writes starts with it."""
_BASES_KEPT = 65536


def _event_subject(prefix: str, execution_id: str, event_name: str) -> str:
    bases = _EVENT_BASES.get(prefix)
    if bases is None:
        bases = _EVENT_BASES[prefix] = {}
    base = bases.get(execution_id)
    if base is None:
        check_token(execution_id, "execution id")
        if len(bases) >= _BASES_KEPT:
            bases.clear()
        base = bases[execution_id] = f"{prefix}.events.{execution_id}."
    if event_name not in _VALID_EVENT_NAMES:
        _check_event_name(event_name)
    return base + event_name


@functools.lru_cache(maxsize=65536)
def _command_subject(prefix: str, pool: str, execution_id: str) -> str:
    check_token(execution_id, "execution id")
    return f"{prefix}.cmd.{check_pool(pool)}.{execution_id}"


@functools.lru_cache(maxsize=1024)
def _stream_prefix(prefix: str) -> str:
    return prefix.upper()


class TopologyError(ConfigurationError, ValueError):
    """An invalid topology setting."""


class SubjectError(TopologyError):
    """A value that cannot be used as a subject token (prefix, pool, execution id, ...)."""


@functools.lru_cache(maxsize=65536)
def _is_token(value: str) -> bool:
    return _TOKEN_RE.fullmatch(value) is not None


MAX_TOKEN_LENGTH = 1024
"""The longest identifier that becomes a subject token (an execution id, a pool, a controller id...). A
longer one would make subjects longer than the server's control line (4 KiB), and the server closes a
connection that sends one. New ids are held to less (`MAX_NEW_ID_LENGTH`); this bound is for every id,
those of executions started before that limit included."""


MAX_NEW_ID_LENGTH = 128
"""The longest id a caller may give something new (an execution, a pool). Ids of existing executions are
read up to `MAX_TOKEN_LENGTH`, so that none started before this limit is lost to it."""


def check_new_id(value: str, what: str = "execution id") -> str:
    """An id a caller gives something new: `check_token`, and at most `MAX_NEW_ID_LENGTH` characters."""
    if isinstance(value, str) and len(value) > MAX_NEW_ID_LENGTH:
        raise SubjectError(f"invalid {what} of {len(value)} characters: at most {MAX_NEW_ID_LENGTH}")
    return check_token(value, what)


def check_token(value: str, what: str = "token") -> str:
    """Return `value` if it is a safe single subject token, else raise `SubjectError`."""
    if isinstance(value, str) and len(value) > MAX_TOKEN_LENGTH:
        raise SubjectError(f"invalid {what} of {len(value)} characters: at most {MAX_TOKEN_LENGTH}")
    if not isinstance(value, str) or not _is_token(value):
        raise SubjectError(
            f"invalid {what} {value!r}: use letters, digits, '_' or '-' "
            "(no dots, spaces, '*' or '>'; it becomes one NATS subject token)"
        )
    return value


def check_pool(pool: str) -> str:
    """Return `pool` if it is a valid worker pool name, else raise `SubjectError`."""
    return check_token(pool, "pool name")


_VALID_EVENT_NAMES: set[str] = set()


def _check_event_name(name: str) -> str:
    if name in _VALID_EVENT_NAMES:  # hot path: a handful of names, checked once each
        return name
    parts = name.split(".") if isinstance(name, str) else []
    if not parts or not all(_EVENT_PART_RE.fullmatch(p) for p in parts):
        raise SubjectError(f"invalid event name {name!r}: expected dotted lower-case words like 'step.done'")
    if len(_VALID_EVENT_NAMES) < 1024:
        _VALID_EVENT_NAMES.add(name)
    return name


class Topology(msgspec.Struct, frozen=True, kw_only=True):
    """Names and JetStream settings of one noetl-stream installation (one prefix)."""

    prefix: str = "noetl"
    replicas: int = 1
    storage: Literal["file", "memory"] = "file"
    events_max_age_s: float = 30 * 24 * 3600.0  # 0 keeps events forever
    duplicate_window_s: float = MIN_DUPLICATE_WINDOW_S
    command_ack_wait_s: float = 30.0
    command_max_deliver: int = 5
    partitions: int = 8
    """Executions are split into this many partitions, each owned by one controller at a time: the most
    controllers that can share the work (the chart's default too)."""
    lease_ttl_s: float = 10.0
    """A partition lease not renewed for this long expires, and another controller takes it over."""

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str) or not _PREFIX_RE.fullmatch(self.prefix):
            raise SubjectError(
                f"invalid prefix {self.prefix!r}: use lower-case letters, digits, '_' or '-', "
                "starting with a letter (it becomes a subject token, stream and bucket names)"
            )
        if self.storage not in ("file", "memory"):
            raise TopologyError(f"storage must be 'file' or 'memory', not {self.storage!r}")
        if not 1 <= self.replicas <= 5:
            raise TopologyError(f"replicas must be between 1 and 5, not {self.replicas}")
        if self.duplicate_window_s < MIN_DUPLICATE_WINDOW_S:
            raise TopologyError(f"duplicate_window_s must be >= {MIN_DUPLICATE_WINDOW_S:g}")
        if self.events_max_age_s < 0 or 0 < self.events_max_age_s < self.duplicate_window_s:
            raise TopologyError("events_max_age_s must be 0 (forever) or >= duplicate_window_s")
        if self.command_ack_wait_s <= 0:
            raise TopologyError("command_ack_wait_s must be positive")
        if self.command_max_deliver < 1:
            raise TopologyError("command_max_deliver must be >= 1 (redelivery is bounded)")
        if not 1 <= self.partitions <= MAX_PARTITIONS:
            raise TopologyError(f"partitions must be between 1 and {MAX_PARTITIONS}, not {self.partitions}")
        if self.lease_ttl_s < 1.0:
            raise TopologyError("lease_ttl_s must be >= 1 second")

    # --- streams --------------------------------------------------------------------------------
    @property
    def events_stream(self) -> str:
        return f"{self._stream_prefix}_EVENTS"

    @property
    def commands_stream(self) -> str:
        return f"{self._stream_prefix}_COMMANDS"

    @property
    def requests_stream(self) -> str:
        return f"{self._stream_prefix}_REQUESTS"

    @property
    def _stream_prefix(self) -> str:
        return _stream_prefix(self.prefix)

    # --- subjects -------------------------------------------------------------------------------
    @property
    def events_subjects(self) -> str:
        """Subjects of the events stream."""
        return f"{self.prefix}.events.>"

    def event_subject(self, execution_id: str, event_name: str) -> str:
        """``noetl.events.<id>.step.done`` for event ``step.done``."""
        if type(execution_id) is not str:  # (cached by value: what is no string is refused uncached)
            check_token(execution_id, "execution id")
        return _event_subject(self.prefix, execution_id, event_name)

    def events_filter(self, execution_id: str) -> str:
        """All events of one execution: ``noetl.events.<id>.>`` (as published and as stored)."""
        return f"{self.prefix}.events.{check_token(execution_id, 'execution id')}.>"

    def any_execution_filter(self, event_name: str) -> str:
        """One event name of every execution, as published (core subscriptions):
        ``noetl.events.*.task.done``."""
        return f"{self.prefix}.events.*.{_check_event_name(event_name)}"

    # The events stream stores each event under its execution's partition: the server's subject
    # transform inserts it after the execution id. Reads from the stream use these filters.
    @property
    def events_subject_transform(self) -> tuple[str, str]:
        """(src, dest) of the events stream's subject transform."""
        return (
            f"{self.prefix}.events.*.>",
            f"{self.prefix}.events.{{{{wildcard(1)}}}}.{{{{partition({self.partitions},1)}}}}.>",
        )

    def stored_event_names(self, subject: str) -> tuple[str, str] | None:
        """(execution id, event name) of an events-stream subject as stored
        (``noetl.events.<id>.<partition>.<name>``), or None if it is not one."""
        tokens = subject.split(".")
        if len(tokens) < 5 or tokens[0] != self.prefix or tokens[1] != "events":
            return None
        return tokens[2], ".".join(tokens[4:])

    def stored_event_filter(self, execution_id: str, event_name: str) -> str:
        """One execution's events of one name, as stored: ``noetl.events.<id>.*.step.done``."""
        check_token(execution_id, "execution id")
        return f"{self.prefix}.events.{execution_id}.*.{_check_event_name(event_name)}"

    def execution_claim_filter(self, execution_id: str) -> str:
        """Every ``playbook.*`` record of one execution, as stored: ``noetl.events.<id>.*.playbook.>``. The
        intake writes an execution's first record (its request, or its rejection) only while this holds
        nothing: whichever of two racing submissions is stored first decides the execution."""
        return f"{self.prefix}.events.{check_token(execution_id, 'execution id')}.*.playbook.>"

    def stored_any_execution_filter(self, event_name: str) -> str:
        """One event name of every execution, as stored: ``noetl.events.*.*.step.done``."""
        return f"{self.prefix}.events.*.*.{_check_event_name(event_name)}"

    def partition_of(self, execution_id: str) -> int:
        return partition_of(execution_id, self.partitions)

    def controller_event_filters(self, partition: int) -> tuple[str, ...]:
        """The controller inputs of one partition's executions (sorted, so configs are stable)."""
        self._check_partition(partition)
        return tuple(
            sorted(
                f"{self.prefix}.events.*.{partition}.{_check_event_name(n)}"
                for n in events.CONTROLLER_INPUT_EVENTS
            )
        )

    def _check_partition(self, partition: int) -> None:
        if not 0 <= partition < self.partitions:
            raise TopologyError(f"partition {partition} out of range 0..{self.partitions - 1}")

    @property
    def commands_subjects(self) -> str:
        """Subjects of the commands stream."""
        return f"{self.prefix}.cmd.>"

    def command_subject(self, pool: str, execution_id: str) -> str:
        """``noetl.cmd.<pool>.<id>``."""
        if type(execution_id) is not str or type(pool) is not str:  # (cached by value, as event_subject)
            check_token(execution_id, "execution id")
            check_pool(pool)
        return _command_subject(self.prefix, pool, execution_id)

    def execution_commands_filter(self, execution_id: str) -> str:
        """Every command of one execution, any pool: ``noetl.cmd.*.<id>``."""
        return f"{self.prefix}.cmd.*.{check_token(execution_id, 'execution id')}"

    def pool_filter(self, pool: str) -> str:
        """Every command of one pool: ``noetl.cmd.<pool>.>``."""
        return f"{self.prefix}.cmd.{check_pool(pool)}.>"

    @property
    def advisories_stream(self) -> str:
        """Captures JetStream's max-deliveries advisories for the commands stream (poison commands)."""
        return f"{self._stream_prefix}_ADVISORIES"

    @property
    def max_deliveries_subject(self) -> str:
        """``$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.NOETL_COMMANDS.>``: a command given up on."""
        return f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{self.commands_stream}.>"

    @property
    def controller_advisories_consumer(self) -> str:
        return "controller-advisories"

    def controller_alive_subject(self, controller_id: str) -> str:
        """Answered by the live controller with this id (a duplicate id is refused at start)."""
        return f"{self.prefix}.controllers.{check_token(controller_id, 'controller id')}.alive"

    @property
    def request_subject(self) -> str:
        """Durable fire-and-forget execution requests: ``noetl.exec.request``."""
        return f"{self.prefix}.exec.request"

    # --- consumers ------------------------------------------------------------------------------
    def pool_consumer(self, pool: str) -> str:
        return f"pool-{check_pool(pool)}"

    def controller_events_consumer(self, partition: int = 0) -> str:
        """The durable consumer of one partition's controller inputs: ``controller-<partition>``."""
        self._check_partition(partition)
        return f"controller-{partition}"

    @property
    def controller_requests_consumer(self) -> str:
        return "controller-requests"

    # --- KV buckets and object store ------------------------------------------------------------
    @property
    def executions_bucket(self) -> str:
        return f"{self.prefix}_executions"

    @property
    def ctx_bucket(self) -> str:
        return f"{self.prefix}_ctx"

    @property
    def loops_bucket(self) -> str:
        return f"{self.prefix}_loops"

    @property
    def catalog_bucket(self) -> str:
        return f"{self.prefix}_catalog"

    @property
    def keychain_bucket(self) -> str:
        return f"{self.prefix}_keychain"

    @property
    def leases_bucket(self) -> str:
        """Partition leases (``partition.<n>``) and controller membership (``member.<id>``)."""
        return f"{self.prefix}_leases"

    @property
    def kv_buckets(self) -> tuple[str, ...]:
        return (
            self.executions_bucket,
            self.ctx_bucket,
            self.loops_bucket,
            self.catalog_bucket,
            self.keychain_bucket,
            self.leases_bucket,
        )

    @property
    def results_store(self) -> str:
        return f"{self.prefix}_results"

    # --- NATS micro API -------------------------------------------------------------------------
    @property
    def service_name(self) -> str:
        """Name of the `nats.micro` service (``nats micro ls``)."""
        return self.prefix

    @property
    def api_prefix(self) -> str:
        return f"{self.prefix}.api"

    def api_subject(self, endpoint: str) -> str:
        """``noetl.api.<endpoint>``; a dotted endpoint is several tokens (``catalog.register``)."""
        tokens = endpoint.split(".") if isinstance(endpoint, str) else [endpoint]
        return f"{self.api_prefix}." + ".".join(check_token(t, "API endpoint") for t in tokens)
