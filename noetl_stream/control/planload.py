"""A plan compiled off the event loop when the playbook is long: intake, and the controller before a fold."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from noetl_stream.control.core.plan import Plan
from noetl_stream.control.core.plans import PlanCache, plan_key
from noetl_stream.dsl.diagnostics import Diagnostic

__all__ = ["COMPILE_INLINE_CHARS", "load_off_loop"]

COMPILE_INLINE_CHARS = 16 * 1024
"""Playbooks up to this long are compiled on the controller's event loop (milliseconds); longer ones in a
thread."""


async def load_off_loop(
    plans: PlanCache, text: str, file: str, extensions: Iterable[str] = ()
) -> tuple[Plan | None, tuple[Diagnostic, ...]]:
    """`plans.load`, compiling a playbook longer than `COMPILE_INLINE_CHARS` in a thread: seconds of
    parsing would hold up the caller's event loop (every other execution, the partition leases)."""
    extensions = tuple(extensions)
    if len(text) <= COMPILE_INLINE_CHARS:
        return plans.load(text, file, extensions)
    digest = plan_key(text, extensions)
    cached = plans.cached(digest)
    if cached is not None:
        return cached
    plan, diagnostics = await asyncio.to_thread(plans.compile, text, file, extensions, digest)
    if plan is not None:
        plans.store(plan, diagnostics)
    return plan, diagnostics
