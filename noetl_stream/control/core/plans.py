"""Compiled plans by content hash and extensions: what the reducer folds an execution's events with."""

from __future__ import annotations

from collections.abc import Iterable

from noetl_stream.control.core.plan import Plan
from noetl_stream.dsl.compiler import compile_playbook
from noetl_stream.dsl.diagnostics import Diagnostic
from noetl_stream.protocol.wire import content_hash

__all__ = ["PlanCache", "plan_key"]


def plan_key(text: str, extensions: Iterable[str] = ()) -> str:
    """What identifies a compiled plan: the text's sha256, followed by ``+<extension>`` for each DSL
    extension it was compiled with (``<sha256>+legacy``). The execution's ``content_hash``."""
    return "+".join([content_hash(text), *sorted(set(extensions))])


class PlanCache:
    """Compiled plans by content hash and extensions (compiling is pure, so caching is safe)."""

    def __init__(self, default_pool: str = "default", max_size: int = 256) -> None:
        self.default_pool = default_pool
        self.max_size = max_size
        self._plans: dict[str, Plan] = {}
        self._warnings: dict[str, tuple[Diagnostic, ...]] = {}
        """The warnings each cached plan compiled with: a cache hit reports them too (the intake compiles a
        request's playbook first; the fold that records `playbook.request.evaluated` finds it cached)."""

    def get(self, digest: str) -> Plan | None:
        return self._plans.get(digest)

    def load(
        self, text: str, file: str, extensions: Iterable[str] = ()
    ) -> tuple[Plan | None, tuple[Diagnostic, ...]]:
        """The plan of ``text`` compiled with ``extensions`` (those recorded with the request)."""
        extensions = tuple(extensions)
        digest = plan_key(text, extensions)
        plan = self._plans.get(digest)
        if plan is not None:
            return plan, self._warnings.get(digest, ())
        plan, diagnostics = self.compile(text, file, extensions, digest)
        if plan is not None:
            self.store(plan, diagnostics)
        return plan, diagnostics

    def cached(self, digest: str) -> tuple[Plan, tuple[Diagnostic, ...]] | None:
        """The plan cached under `digest` (``plan_key``) and the warnings it compiled with, if any."""
        plan = self._plans.get(digest)
        return None if plan is None else (plan, self._warnings.get(digest, ()))

    def compile(
        self, text: str, file: str, extensions: Iterable[str], digest: str
    ) -> tuple[Plan | None, tuple[Diagnostic, ...]]:
        """Compile without touching the cache (pure: `control.planload.load_off_loop` runs it in a thread). `digest` is
        ``plan_key(text, extensions)``."""
        result = compile_playbook(text, file, extensions=tuple(extensions))
        if result.playbook is None:
            return None, result.diagnostics
        return Plan.build(result.playbook, text, digest, self.default_pool), result.diagnostics

    def store(self, plan: Plan, diagnostics: Iterable[Diagnostic] = ()) -> None:  # on the event loop only
        if len(self._plans) >= self.max_size:
            evicted = next(iter(self._plans))
            self._plans.pop(evicted)
            self._warnings.pop(evicted, None)
        self._plans[plan.content_hash] = plan
        warnings = tuple(d for d in diagnostics if d.severity == "warning")
        if warnings:
            self._warnings[plan.content_hash] = warnings
        else:
            self._warnings.pop(plan.content_hash, None)
