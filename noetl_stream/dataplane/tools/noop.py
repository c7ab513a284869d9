"""``noop``: returns its ``result`` field, or passes ``_prev`` through when it has none."""

from __future__ import annotations

from typing import Any

from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.dataplane.tools.base import ToolContext


async def run_noop(config: dict[str, Any], ctx: ToolContext) -> Outcome:
    if "result" in config:
        return Outcome.ok(config["result"])
    return Outcome.ok(ctx.prev)
