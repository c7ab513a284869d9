"""The result of a SQL task (``postgres``, ``duckdb``), in the shape NoETL playbooks read.

A task's result is its last statement's: ``{rows, row_count, columns}`` when that statement returns
rows (a ``SELECT``, an ``INSERT ... RETURNING``; rows are mappings keyed by column name, ``columns``
the names in order), else ``{row_count, affected_rows, message}`` (``message`` is the command's tag,
``INSERT 0 3``). Beside it, ``command_<i>`` (i from 0) holds each statement's own result in that
shape, for playbooks that read ``{{ s.command_0.rows[0].x }}``. The last statement's result is thus
there twice, and counts twice toward the size above which a result travels by reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def rows_result(columns: list[str], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A statement that returns rows (none, too: a ``SELECT`` that matched nothing)."""
    return {"rows": rows, "row_count": len(rows), "columns": columns}


def command_result(affected: int | None, message: str) -> dict[str, Any]:
    """A statement that returns no rows: the rows it changed (0 for one that changes none, such as
    ``CREATE TABLE``; None when not known) and its tag."""
    return {"row_count": affected, "affected_rows": affected, "message": message}


def task_result(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The task's result from its statements' results, in the order they ran (at least one)."""
    out = dict(results[-1])
    for i, result in enumerate(results):
        out[f"command_{i}"] = result
    return out


__all__ = ["command_result", "rows_result", "task_result"]
