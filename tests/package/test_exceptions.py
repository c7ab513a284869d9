"""Every exception the package defines is one it raises on purpose: named ``...Error`` and under
`NoetlError` (so the command line and the API can tell ours from a bug), except the two that must not be
caught by an ``except Exception`` of the code they interrupt (a template's budget, a python task's
interruption), which derive from BaseException on purpose."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import noetl_stream
from noetl_stream.errors import NoetlError

# Raised through code that may catch Exception (a user's python, a template's filters): BaseException.
NOT_CATCHABLE = {
    "noetl_stream.dsl.budget.BudgetExceededError",
    "noetl_stream.dataplane.tools.python._TaskInterruptedError",
}


def _defined_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(noetl_stream.__path__, "noetl_stream."):
        if info.name.endswith(".__main__"):  # (runs the command line)
            continue
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == info.name:
                found[f"{info.name}.{obj.__qualname__}"] = obj
    return found


def test_every_exception_is_named_an_error_and_is_a_noetl_error() -> None:
    found = _defined_exceptions()
    assert len(found) > 30  # (the walk found the package's modules)
    assert set(NOT_CATCHABLE) <= set(found)
    misnamed = sorted(name for name in found if not name.rsplit(".", 1)[1].endswith("Error"))
    assert misnamed == []
    outside = sorted(
        name for name, cls in found.items() if not issubclass(cls, NoetlError) and name not in NOT_CATCHABLE
    )
    assert outside == []
    for name in NOT_CATCHABLE:
        assert not issubclass(found[name], Exception), name
