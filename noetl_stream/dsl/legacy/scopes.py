"""Where a legacy template is evaluated after translation, and what its names become there.

Legacy templates read ``response``/``result`` (the call's result), ``error``, ``this`` (the whole
envelope), ``status_code``, ``_retry.index``, the loop item by its bare name and the step's own
context (``set``/``collect`` targets) by bare name. Canonical scopes differ by place:

* ``call``: the call task's policy rules (``outcome`` is the call's outcome);
* ``after``: a task after the call in the same pipeline (the call's result is ``<call task>``);
* ``enter``: before the call (no call result yet); ``admission`` likewise, on the server;
* ``route``: arcs and the ``<step>_exit`` step, after the step ended: only its result (by step
  name), ``ctx``, ``workload``, ``args`` and, on failure, ``event.error``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from noetl_stream.dsl.rewrite import Rewrite, reads, reads_attr, rewrite_value
from noetl_stream.errors import NoetlError

OK = "outcome.status == 'ok'"
ERR = "outcome.status == 'error'"
RETRY_INDEX = "(iter.retry_index | default(1))"
RETRY_ATTRS = {("_retry", "index"): RETRY_INDEX, ("_retry", "count"): RETRY_INDEX}
CALL = Rewrite(
    names={
        "response": "outcome.result",
        "result": "outcome.result",
        "this": "outcome",
        "status_code": "outcome.http.status",
        "error": "outcome.error",
    },
    attrs={
        ("error", "status"): "outcome.http.status",
        ("error", "status_code"): "outcome.http.status",
        **RETRY_ATTRS,
    },
    defined={"error": ERR, "response": OK, "result": OK},
)
CALL_SCOPE = frozenset({"response", "result", "error", "this", "status_code", "_retry"})


class ScopeError(NoetlError):
    """A legacy template reads something its new place does not have."""


@dataclass
class Scopes:
    step: str
    call: str
    loop: bool
    iterator: str | None
    context: set[str] = field(default_factory=set)
    """Names of the step's own context (``set`` targets, ``collect`` targets)."""
    ctx_keys: set[str] = field(default_factory=set)
    """Context names written through ``set: {ctx: ...}`` (read as ``ctx.<name>``)."""
    collected: list[str] = field(default_factory=list)
    sets_result: bool = False
    result_name: str | None = None
    """The collected name that ``result`` actions set as the step's result (``result: {from: pages}``)."""

    @property
    def base(self) -> Rewrite:
        names = {n: f"iter.{n}" for n in sorted(self.context)}
        if self.iterator:
            names[self.iterator] = f"iter.{self.iterator}"
        return Rewrite(names=names, attrs={("ctx", k): f"iter.{k}" for k in sorted(self.ctx_keys)})

    def rewrite(self, value: Any, where: str, *, failed: bool = False, result: str | None = None) -> Any:
        """``value`` for ``where`` (see the module doc). Raises ``ScopeError`` saying what is missing."""
        self.check(value, where, failed=failed)
        value = copy.deepcopy(value)
        if where == "call":
            rw = self.base.merged(CALL)
        elif where == "after":
            ref = result or self.call
            rw = self.base.merged(Rewrite({"response": ref, "result": ref}, RETRY_ATTRS))
        elif where == "tool":
            rw = self.base.merged(Rewrite(attrs=RETRY_ATTRS))
        elif where in ("enter", "admission"):
            rw = self.base
        else:
            rw = self._route(failed)
        return rewrite_value(value, rw)

    def _route(self, failed: bool) -> Rewrite:
        names = {"result": self.step, "response": self.step}
        if failed:
            names["error"] = "event.error"
        if self.result_name:  # in a loop, each iteration's result is what it collected: flatten them
            names[self.result_name] = (
                f"({self.step} | reject('none') | sum(start=[]))" if self.loop else self.step
            )
        if not self.sets_result:
            for n in self.collected:
                if not self.loop:
                    names[n] = self.step if len(self.collected) == 1 else f"{self.step}.{n}"
                elif len(self.collected) == 1:
                    names[n] = f"({self.step} | reject('none') | sum(start=[]))"
                else:
                    names[n] = f"({self.step} | reject('none') | map(attribute='{n}') | sum(start=[]))"
        return Rewrite(names)

    def check(self, value: Any, where: str, *, failed: bool = False) -> None:
        read = reads(value)
        if where in ("enter", "admission", "tool"):
            bad = read & (CALL_SCOPE - {"_retry"} if where == "tool" else CALL_SCOPE)
            if bad:
                raise ScopeError(f"it reads '{sorted(bad)[0]}' before the step's call: there is none yet")
            own = self.context | ({self.iterator} if self.iterator else set())
            if where == "admission" and read & own:
                raise ScopeError(
                    f"it reads '{sorted(read & own)[0]}' in the step's admission, which the server decides "
                    "before the step (and its loop) runs"
                )
            return
        if where == "after":
            bad = read & {"error", "this", "status_code"}
            if bad:
                raise ScopeError(
                    f"it reads '{sorted(bad)[0]}' in a task after the call, which only sees its result"
                )
            return
        if where != "route":
            return
        if (
            reads_attr(value, "error", "status")
            or reads_attr(value, "error", "status_code")
            or "status_code" in read
        ):
            raise ScopeError(
                "it reads the call's HTTP status after the step ended: routing sees the step's error "
                "{kind, message}, not the response (route on event.error.kind, or decide in the task policy)"
            )
        bad = read & {"this", "_retry"}
        if "error" in read and not failed:
            bad |= {"error"}
        known = set(self.collected) if not self.sets_result else {self.result_name} - {None}
        own = (self.context - known) | ({self.iterator} if self.iterator else set())
        bad |= read & own
        bad |= {f"ctx.{k}" for k in self.ctx_keys if reads_attr(value, "ctx", k)}
        if bad:
            raise ScopeError(
                f"it reads '{sorted(bad)[0]}' after the step ended, when only its result, ctx, workload "
                "and args are known"
            )
