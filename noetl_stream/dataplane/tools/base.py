"""What a tool is: an async callable from a rendered task config to an ``Outcome``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from noetl_stream.dataplane.outcome import Outcome


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
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)


class Tool(Protocol):
    async def __call__(self, config: dict[str, Any], ctx: ToolContext) -> Outcome: ...


ToolFn = Callable[[dict[str, Any], ToolContext], Awaitable[Outcome]]
