"""Third-party tool kinds, registered through the ``noetl_stream.tools`` entry point group.

A plugin package declares, in its ``pyproject.toml``::

    [project.entry-points."noetl_stream.tools"]
    echo = "my_package.tools:ECHO"

where ``ECHO`` is a ``ToolPlugin`` (or a callable returning one)::

    from noetl_stream.runtime.plugins import ToolPlugin
    from noetl_stream.dataplane.outcome import Outcome

    async def run_echo(config, ctx):
        return Outcome.ok({"echo": config.get("message")})

    ECHO = ToolPlugin(kind="echo", run=run_echo, keys={"message"}, required_any=[("message",)])

``load_plugins()`` (called by every process at start: CLI, controller, worker) registers each kind with
the compiler (so playbooks using it validate) and with the worker (so it runs).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

import structlog

from noetl_stream.dataplane.tools import TOOLS, ToolFn
from noetl_stream.dsl.kinds import register_kind

GROUP = "noetl_stream.tools"
log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ToolPlugin:
    kind: str
    run: ToolFn
    keys: Iterable[str] | None = None
    """The task keys the kind accepts besides name/kind/spec/desc/args (None: any key)."""
    required_any: Iterable[Iterable[str]] = ()
    defaults: dict[str, Any] = field(default_factory=dict)
    description: str = ""


def register_plugin(plugin: ToolPlugin) -> None:
    register_kind(
        plugin.kind,
        plugin.keys,
        required_any=plugin.required_any,
        defaults=plugin.defaults,
        description=plugin.description,
    )
    TOOLS[plugin.kind] = plugin.run


_loaded: dict[str, str] = {}


def load_plugins() -> dict[str, str]:
    """Register every installed plugin once; returns ``{kind: entry point}``. A broken plugin is logged
    and skipped, never fatal."""
    for ep in entry_points(group=GROUP):
        ident = f"{ep.name}={ep.value}"
        if ident in _loaded.values():
            continue
        try:
            obj = ep.load()
            plugin = obj if isinstance(obj, ToolPlugin) else obj()
            if not isinstance(plugin, ToolPlugin):
                raise TypeError(f"expected a ToolPlugin, got {type(plugin).__name__}")
            register_plugin(plugin)
        except Exception as exc:
            log.error("plugin.load_failed", entry_point=ident, error=f"{type(exc).__name__}: {exc}")
            continue
        _loaded[plugin.kind] = ident
    return dict(_loaded)
