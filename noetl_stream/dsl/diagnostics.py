"""Diagnostics: compiler-style messages with ``file:line:col`` and the YAML path."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import msgspec

from noetl_stream.errors import NoetlError

Severity = Literal["error", "warning"]
Path = tuple[str | int, ...]


def format_path(path: Path) -> str:
    """``("workflow", 1, "tool", 0)`` -> ``workflow[1].tool[0]``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or "<root>"


class Diagnostic(msgspec.Struct, frozen=True):
    """One problem found in a playbook. ``line`` and ``col`` are 1-based (0 when unknown)."""

    severity: Severity
    message: str
    file: str
    line: int
    col: int
    path: str
    code: str = "invalid"

    def format(self) -> str:
        where = f"{self.file}:{self.line}:{self.col}"
        label = "warning: " if self.severity == "warning" else ""
        return f"{where}: {label}{self.message} (at {self.path})"

    def __str__(self) -> str:
        return self.format()


class PlaybookError(NoetlError):
    """A playbook failed to compile. Carries every problem found, not just the first."""

    def __init__(self, diagnostics: Iterable[Diagnostic]) -> None:
        self.diagnostics: tuple[Diagnostic, ...] = tuple(diagnostics)
        self.errors = tuple(d for d in self.diagnostics if d.severity == "error")
        first = self.errors[0].format() if self.errors else "invalid playbook"
        more = len(self.errors) - 1
        super().__init__(first + (f" (and {more} more)" if more > 0 else ""))

    def format(self) -> str:
        return "\n".join(d.format() for d in self.diagnostics)
