"""The registry of tool kinds the compiler accepts, with each kind's own keys.

The registry is open: plugins (and the runtime's tool modules) call
``register_kind`` to add a kind. A kind with ``keys=None`` accepts any key.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

# Keys every task may carry, whatever its kind.
COMMON_TASK_KEYS = frozenset({"name", "kind", "spec", "desc", "args"})


class KindInfo(msgspec.Struct, frozen=True):
    name: str
    keys: frozenset[str] | None
    required_any: tuple[tuple[str, ...], ...] = ()
    exclusive: tuple[tuple[str, ...], ...] = ()
    """Groups of keys of which a task gives at most one (``query`` or ``command``, never both)."""
    first_wins: tuple[tuple[str, ...], ...] = ()
    """Groups of keys of which the tool uses the first given, in the group's order, and ignores the rest
    (http's body keys): giving more than one is a warning, not an error, as NoETL takes them."""
    ignored: frozenset[str] = frozenset()
    """Keys accepted for NoETL's playbooks and ignored by the tool (postgres ``pool``): a warning."""
    defaults: dict[str, Any] = {}
    description: str = ""


_REGISTRY: dict[str, KindInfo] = {}


def register_kind(
    name: str,
    keys: Iterable[str] | None,
    *,
    required_any: Iterable[Iterable[str]] = (),
    exclusive: Iterable[Iterable[str]] = (),
    first_wins: Iterable[Iterable[str]] = (),
    ignored: Iterable[str] = (),
    defaults: dict[str, Any] | None = None,
    description: str = "",
) -> KindInfo:
    """Register (or replace) a tool kind. ``required_any``: groups of which one key must be present;
    ``exclusive``: groups of which at most one may be; ``first_wins``: groups of which the first given is
    used (a warning names the others); ``ignored``: keys accepted with a warning (they belong to ``keys``
    too)."""
    info = KindInfo(
        name=name,
        keys=None if keys is None else frozenset(keys) | frozenset(ignored),
        required_any=tuple(tuple(g) for g in required_any),
        exclusive=tuple(tuple(g) for g in exclusive),
        first_wins=tuple(tuple(g) for g in first_wins),
        ignored=frozenset(ignored),
        defaults=dict(defaults or {}),
        description=description,
    )
    _REGISTRY[name] = info
    return info


def kind_info(name: str) -> KindInfo | None:
    return _REGISTRY.get(name)


def known_kinds() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


register_kind(
    "noop",
    {"result"},
    description="does nothing; returns its rendered `result`, else {status: ok, message: noop}",
)
register_kind(
    "http",
    {
        *("method", "url", "endpoint", "params", "headers"),
        *("json", "form", "body", "payload", "data", "auth", "verify_ssl"),
    },
    required_any=[("url", "endpoint")],
    exclusive=[("url", "endpoint")],
    # The body: the first of these given (`data` of a GET is its query, not a body: dsl/tasks.py).
    first_wins=[("json", "form", "body", "payload", "data")],
    defaults={"timeout": {"connect": 10, "read": 60}},
    description="HTTP request (aiohttp)",
)
register_kind(
    "postgres",
    {"query", "command", "script", "params", "many", "auth", "dsn", "transaction"},
    required_any=[("query", "command", "script")],
    exclusive=[("query", "command", "script")],
    # `pool` (a NoETL connection pool's name) is accepted and ignored: a worker keeps its own pools.
    ignored={"pool"},
    defaults={"timeout": {"connect": 10}},
    description="PostgreSQL statements or a script, with bound parameters (asyncpg)",
)
register_kind(
    "duckdb",
    {"query", "command", "commands", "cmds", "params", "database", "db_path", "attach", "auth"},
    required_any=[("query", "command", "commands", "cmds")],
    exclusive=[("query", "command", "commands", "cmds"), ("database", "db_path")],
    description="DuckDB statements or a script, with bound parameters; a database file per execution",
)
register_kind(
    "python",
    {"code", "module", "script", "libs"},
    required_any=[("code", "module", "script")],
    exclusive=[("code", "module", "script")],
    description="inline Python `code` (with `libs` imports), a `script: {path}` file or a `module: pkg.mod:function`",
)
register_kind("secrets", {"auth", "key", "secret", "field"}, description="read a keychain entry")
register_kind(
    "playbook",
    {"path", "version", "return_step", "payload", "timeout"},
    required_any=[("path",)],
    description="start another playbook as a child execution; with `return_step`, wait for that step's result",
)
register_kind("workbook", {"task"}, description="run a task template from the root workbook")
register_kind(
    "script",
    {"code", "path", "language", "env"},
    exclusive=[("code", "path")],
    description="run a script",
)
