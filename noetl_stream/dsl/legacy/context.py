"""One legacy translation: the origins of the rewritten data, the authored source map, the messages."""

from __future__ import annotations

from typing import Any, TypeVar

from noetl_stream.dsl.diagnostics import Diagnostic, Path
from noetl_stream.dsl.origins import Origins
from noetl_stream.dsl.source import SourceMap
from noetl_stream.errors import NoetlError

CODE = "legacy"
T = TypeVar("T")


class UntranslatableError(NoetlError):
    """A construct without a faithful canonical translation (already reported)."""


class Translation:
    """Reports at authored positions: a warning per translated construct, an error (saying why)
    for what cannot be translated faithfully."""

    def __init__(self, origins: Origins, smap: SourceMap) -> None:
        self.origins = origins
        self.smap = smap
        self.diagnostics: list[Diagnostic] = []
        self.keychain: dict[str, str] = {}
        """Credentials the translation introduced: name -> kind (declared in the root keychain)."""
        self.ctx_vars: set[str] = set()
        """Names written by 000 ``vars:`` blocks (execution scope, read as ``vars.x`` -> ``ctx.x``)."""
        self.step_vars: set[str] = set()
        """Names the current step writes with 002 ``set_vars`` (step scope, mapped to iteration scope
        as 002 §6.5 allows)."""
        self.structural_next = False
        """A ``next`` list of ``{step}`` objects without ``when`` is 000's structural next (the playbook
        is in 000 form), not a 002 list of arcs."""
        self.bare: set[int] = set()
        """Ids of the arcs made of a target written as a step name (``next: b``)."""
        self.loop_mode: str | None = None
        """The current step's loop mode (``parallel``, ``sequential``); None: the step has no loop."""
        self.vars_by_step: dict[str, set[str]] = {}
        self.after_steps: set[str] = set()
        """Names of the steps the translation adds after a step (they run once it has ended)."""
        self.new_steps: list[dict[str, Any]] = []
        """Steps the translation adds (after a step's loop: its ``step.exit`` work)."""

    def warn(self, path: Path, message: str, *, at_key: bool = True) -> None:
        self.diagnostics.append(
            self.smap.diagnostic(path, message, severity="warning", at_key=at_key, code=CODE)
        )

    def error(self, path: Path, message: str, *, at_key: bool = True) -> UntranslatableError:
        self.diagnostics.append(self.smap.diagnostic(path, message, at_key=at_key, code=CODE))
        return UntranslatableError(message)

    def mark(self, node: T, path: Path) -> T:
        return self.origins.mark(node, path)
