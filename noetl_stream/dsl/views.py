"""What templates read a step result, ``ctx`` and a loop iteration as: views over the plain values.

NoETL's playbooks read a result through names the value does not hold. A view answers them and is
otherwise the plain value: each is a ``dict`` or ``list`` subclass holding the value's own items, so
JSON encoders, ``tojson``, ``dict(...)`` and the events, args and ctx it travels into see the plain
value. An alias answers only a read of a key the value lacks (``__missing__``) or a view's attribute.

* `ResultView`: a mapping result. ``.data`` is the result itself when it has no ``data`` key
  (``{{ calc.data.n }}`` = ``{{ calc.n }}``); an http envelope's ``.body`` is its ``data``. A pipeline's
  result (``tasks`` in its meta) also reads every task's fields (the last task's winning), each task's
  result by label (``{{ s.extract.status_code }}``) and ``.results.<label>``.
* `LoopView`: a loop step's result, the list of iteration results in index order, with ``.results``
  (the list), ``.stats`` (``total``, ``success``, ``failed``) and ``.data`` (itself).
* `CtxView`: ``ctx`` reads its own keys, then any other name of its scope (NoETL's one flat namespace:
  ``{{ ctx.<step> }}``, ``{{ ctx.<workload key> }}``).
* `IterView`: a loop iteration's ``iter`` with its positions ``_index``, ``_total``, ``_first``, ``_last``.

Building one costs a shallow copy of the value's top level (a few keys; a loop's list of results),
made when a scope is built, never per render.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["CtxView", "IterView", "LoopView", "ResultView", "plain", "result_meta", "result_view"]


class ResultView(dict[str, Any]):
    """A mapping step (or task) result with NoETL's aliases (see the module)."""

    __slots__ = ("_plain", "_result_task", "_tasks")

    def __init__(
        self,
        value: dict[str, Any],
        tasks: Mapping[str, Any] | None = None,
        result_task: str | None = None,
    ) -> None:
        super().__init__(value)
        self._plain = value
        self._tasks = tasks
        self._result_task = result_task

    def __missing__(self, key: Any) -> Any:
        tasks = self._tasks
        if tasks is not None:
            for label in reversed(list(tasks)):  # every task's fields, the later ones first
                value = tasks[label]
                if type(value) is dict and key in value:
                    return value[key]
            if key == self._result_task:
                return ResultView(self._plain)
            if key in tasks:
                return result_view(tasks[key])
            if key == "results":
                return self.labels()
        if key == "data":
            return self
        if key == "body" and "status_code" in self and "data" in self:
            return self["data"]  # an http envelope: its body
        raise KeyError(key)

    def labels(self) -> dict[str, Any]:
        """A pipeline's results by task label (empty for any other result)."""
        out = {k: result_view(v) for k, v in (self._tasks or {}).items()}
        if self._result_task is not None:
            out[self._result_task] = ResultView(self._plain)
        return out

    @property
    def plain(self) -> dict[str, Any]:
        return self._plain


class LoopView(list[Any]):
    """A loop step's result: its iteration results in index order (failed ones null), read as a list
    (``| length``, ``[0]``, ``for``) and as NoETL's ``{results, stats}`` object."""

    __slots__ = ("_plain", "_stats")

    def __init__(self, value: list[Any], stats: Mapping[str, Any] | None = None) -> None:
        super().__init__(value)
        self._plain = value
        self._stats = stats

    @property
    def results(self) -> LoopView:
        return self

    @property
    def data(self) -> LoopView:
        return self

    @property
    def stats(self) -> dict[str, Any]:
        """``{total, success, failed}`` as the loop counted them (from its boundary); without those, the
        null results are counted as failed."""
        s = self._stats
        if s is not None:
            return {"total": s.get("total"), "success": s.get("done"), "failed": s.get("failed")}
        failed = sum(1 for v in self if v is None)
        return {"total": len(self), "success": len(self) - failed, "failed": failed}

    @property
    def plain(self) -> list[Any]:
        return self._plain


class CtxView(dict[str, Any]):
    """``ctx``: its own keys, then the other names of `scope` (read only through a missing key)."""

    __slots__ = ("_scope",)

    def __init__(self, ctx: Mapping[str, Any], scope: Mapping[str, Any]) -> None:
        super().__init__(ctx)
        self._scope = scope

    def __missing__(self, key: Any) -> Any:
        return self._scope[key]

    @property
    def plain(self) -> dict[str, Any]:
        return dict(self)


class IterView(dict[str, Any]):
    """A loop iteration's ``iter`` (its own keys, written by ``set_iter``) with the iteration's position
    as NoETL's engines bind it: ``_index`` (0-based), ``_total``, ``_first``, ``_last``."""

    __slots__ = ("_index", "_total")

    def __init__(self, values: Mapping[str, Any], index: int, total: int | None) -> None:
        super().__init__(values)
        self._index = index
        self._total = total

    def __missing__(self, key: Any) -> Any:
        if key == "_index":
            return self._index
        if key == "_first":
            return self._index == 0
        if self._total is not None:
            if key == "_total":
                return self._total
            if key == "_last":
                return self._index == self._total - 1
        raise KeyError(key)

    @property
    def plain(self) -> dict[str, Any]:
        return dict(self)


VIEWS = (ResultView, LoopView, CtxView, IterView)


def plain(value: Any) -> Any:
    """The plain value of a view (the value itself for anything else)."""
    return value.plain if isinstance(value, VIEWS) else value


def result_view(value: Any, meta: Mapping[str, Any] | None = None) -> Any:
    """How templates read a step's result: a mapping as a `ResultView`, a loop's list (``stats`` in its
    `meta`) as a `LoopView`; anything else (a scalar, another list, a result stored by reference) as it
    is."""
    t = type(value)
    if t is dict:
        tasks = meta.get("tasks") if meta is not None else None
        if isinstance(tasks, dict) and "$ref" not in tasks:  # (by reference: the controller reads no label)
            assert meta is not None
            task = meta.get("result_task")
            return ResultView(value, tasks, task if isinstance(task, str) else None)
        return ResultView(value)
    if t is list and meta is not None and isinstance(stats := meta.get("stats"), dict):
        return LoopView(value, stats)
    return value


def result_meta(event: str, payload: Mapping[str, Any]) -> dict[str, Any] | None:
    """What a step's boundary says about its result beyond the value, for its view: a loop's counts
    (``loop.done``), a pipeline's task results (``step.done`` of a step with several tasks)."""
    if event == "loop.done":
        return {"stats": {k: payload.get(k) for k in ("total", "done", "failed")}}
    tasks = payload.get("tasks")
    if isinstance(tasks, dict):
        return {"tasks": tasks, "result_task": payload.get("result_task")}
    return None
