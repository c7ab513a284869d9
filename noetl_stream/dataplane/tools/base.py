"""What a tool is: an async callable from a rendered task config to an ``Outcome``."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import math
import posixpath
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.errors import NoetlError

CredentialResolver = Callable[[str], Awaitable[dict[str, Any]]]
"""Resolve a keychain entry by name to its (decrypted) fields; raises ``KeyError`` if unknown."""


class WorkerServices:
    """Worker-wide resources shared by every task of one worker process (HTTP session, DB pools).

    Tools create what they need lazily with ``get_or_create`` and register a closer; the worker
    calls ``close()`` at shutdown.
    """

    def __init__(self, credentials: CredentialResolver | None = None) -> None:
        self.credentials = credentials
        self.children: Any = None
        """A ``ChildRunner`` for ``kind: playbook`` tasks (set by the worker)."""
        self._items: dict[str, Any] = {}
        self._closers: list[Callable[[], Awaitable[None]]] = []
        self._lock = asyncio.Lock()

    async def get_or_create(
        self,
        key: str,
        factory: Callable[[], Awaitable[Any]],
        closer: Callable[[Any], Awaitable[None]] | None = None,
    ) -> Any:
        item = self._items.get(key)
        if item is not None:
            return item
        async with self._lock:
            item = self._items.get(key)
            if item is None:
                item = await factory()
                self._items[key] = item
                if closer is not None:
                    self._closers.append(lambda: closer(item))
        return item

    def declaring(self, entries: Mapping[str, Mapping[str, Any]]) -> WorkerServices:
        """These services for one step run whose credential resolver gives `entries` (the step's own
        resolved ``keychain`` declarations: ``env:``/``file:`` entries of the worker, or entries read
        from the store) before the store: ``auth: <name>`` uses what ``{{ keychain.<name> }}`` shows.
        The view shares this object's pools and session and is never closed itself."""
        if not entries:
            return self
        view = copy.copy(self)
        store = self.credentials

        async def resolve(name: str) -> dict[str, Any]:
            if name in entries:
                return dict(entries[name])
            if store is None:
                raise KeyError(name)
            return await store(name)

        view.credentials = resolve
        return view

    async def close(self) -> None:
        closers, self._closers = self._closers, []
        self._items.clear()
        for close in reversed(closers):
            try:
                await close()
            except Exception:
                pass


@dataclass
class ToolContext:
    """What a running task may know about where it runs."""

    execution_id: str
    step: str
    task: str
    spec: dict[str, Any]
    attempt: int = 1
    prev: Any = None
    resources: dict[str, Any] = field(default_factory=dict)
    """Per-pipeline resources (e.g. the pipeline's in-memory DuckDB), closed when the pipeline ends."""
    services: WorkerServices | None = None
    """Worker-wide resources and the credential resolver."""
    scope_id: str = ""
    """``<step_run_id>[.<iteration>]`` of the pipeline run."""
    attachments: dict[str, str] = field(default_factory=dict)
    """Child playbook texts by path, shipped with the command."""
    stop_check: Callable[[], str | None] | None = None
    """A reason when the execution has ended (tools that wait long should give up then)."""
    scope: Mapping[str, Any] | None = None
    """The template scope the task's config rendered in (python's ``context``); tools never change it."""
    first: bool = False
    """No task ran before this one in its pipeline run (a ``noop`` without ``result`` then has no
    previous result to hand on)."""

    async def credential(self, name: str) -> dict[str, Any]:
        """The keychain entry ``name`` (raises ``KeyError`` when there is none)."""
        if self.services is None or self.services.credentials is None:
            raise KeyError(name)
        return await self.services.credentials(name)


def script_file(config: Mapping[str, Any], ctx: ToolContext) -> str:
    """The text of a task's ``script: {path}`` (NoETL's file script): a file shipped with the playbook,
    by its path relative to the playbook. Raises ``ValueError`` saying what is missing."""
    script = config.get("script")
    path = script.get("path") if isinstance(script, Mapping) else None
    if not isinstance(path, str) or not path:
        raise ValueError(f"'script' must be {{path: <file>}}, got {script!r}")
    text = ctx.attachments.get(path)
    if text is None:
        text = ctx.attachments.get(posixpath.normpath(path))
    if text is None:
        raise ValueError(
            f"script file {path!r} was not shipped with the playbook (a path relative to the playbook's "
            "file, read when it is run or submitted from that file)"
        )
    return text


def seconds(value: Any, name: str = "spec.timeout", shape: str = "") -> float | None:
    """A time limit of a tool: a finite number of seconds >= 0, or text holding one (``"1.5"``); None or
    0 sets no limit (None). Raises ``ValueError`` naming `name` (and the other `shape` it may take) for
    anything else, which must not pass for "no limit"."""
    if value is None:
        return None
    number = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        with contextlib.suppress(ValueError):
            number = float(value)
    if number is None or not math.isfinite(number) or number < 0:
        raise ValueError(f"{name} must be a non-negative number of seconds{shape}, got {value!r}")
    return number or None


def timeout_seconds(value: Any) -> float | None:
    """``spec.timeout`` of a tool bounded by one number of seconds (``python``, ``script``): `seconds`;
    a mapping (a step-wide http ``{connect, read}`` or postgres ``{connect, statement}``) sets no limit
    for these."""
    return None if isinstance(value, Mapping) else seconds(value)


class DuplicateColumnsError(NoetlError, ValueError):
    """A SQL result with two columns of one name: a row (a mapping) would keep one value and lose the other."""


def check_columns(columns: list[str]) -> None:
    """Raise `DuplicateColumnsError` naming every column name that occurs more than once (once per
    result: its rows share their columns)."""
    if len(set(columns)) == len(columns):
        return
    names = ", ".join(repr(c) for c, n in Counter(columns).items() if n > 1)
    raise DuplicateColumnsError(
        f"the result has duplicate column names {names}: alias them (SELECT t.id AS t_id, u.id AS u_id ...) "
        "so that each column has its own name"
    )


class Tool(Protocol):
    async def __call__(self, config: dict[str, Any], ctx: ToolContext) -> Outcome: ...


ToolFn = Callable[[dict[str, Any], ToolContext], Awaitable[Outcome]]
