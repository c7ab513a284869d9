"""``noop``: returns its ``result`` field; without one, the previous task's result (``_prev``), or, as the
first task of its pipeline run, NoETL's ``{status: ok, message: noop}``."""

from __future__ import annotations

from typing import Any

from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.dataplane.tools.base import ToolContext


async def run_noop(config: dict[str, Any], ctx: ToolContext) -> Outcome:
    if "result" in config:
        return Outcome.ok(config["result"])
    if ctx.first:
        return Outcome.ok({"status": "ok", "message": "noop"})
    return Outcome.ok(ctx.prev)
