"""The limits a process takes from its environment, read once at the edge.

The command line and the runtime build a `Settings` with `Settings.from_env` and pass its values down:
the playbook language, the controller and the worker take values, not the environment. Each field names
its variable and its default; docs/operations.md lists them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from noetl_stream.errors import ConfigurationError

__all__ = [
    "CONTROLLER_ID_ENV",
    "DEFAULT_MAX_CHILD_DEPTH",
    "DEFAULT_TEMPLATE_CPU_S",
    "MAX_CHILD_DEPTH_ENV",
    "TEMPLATE_CPU_S_ENV",
    "Settings",
    "template_cpu_s_from_env",
]

TEMPLATE_CPU_S_ENV = "NOETL_TEMPLATE_CPU_S"
DEFAULT_TEMPLATE_CPU_S = 2.0
MAX_CHILD_DEPTH_ENV = "NOETL_MAX_CHILD_DEPTH"
DEFAULT_MAX_CHILD_DEPTH = 32
CONTROLLER_ID_ENV = "NOETL_CONTROLLER_ID"


@dataclass(frozen=True)
class Settings:
    """Environment-derived limits of one process."""

    template_cpu_s: float = DEFAULT_TEMPLATE_CPU_S
    """CPU seconds one template render may take (``NOETL_TEMPLATE_CPU_S``, default 2). A value that is
    not a number above 0 leaves the default."""
    max_child_depth: int = DEFAULT_MAX_CHILD_DEPTH
    """How deep child playbooks may nest, a root being depth 0 (``NOETL_MAX_CHILD_DEPTH``, default 32):
    a playbook that runs itself without a bound is refused there instead of spawning children for ever."""
    controller_id: str | None = None
    """The controller's id (``NOETL_CONTROLLER_ID``); None: the host name (a pod name on Kubernetes)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        """The settings `environ` gives (``os.environ`` at the edge); `ConfigurationError`, naming the
        variable, for a value that cannot be used."""
        return cls(
            template_cpu_s=template_cpu_s_from_env(environ),
            max_child_depth=_max_child_depth(environ.get(MAX_CHILD_DEPTH_ENV)),
            controller_id=environ.get(CONTROLLER_ID_ENV) or None,
        )


def template_cpu_s_from_env(environ: Mapping[str, str]) -> float:
    """`Settings.template_cpu_s` alone: what every process of the command line sets its template budget
    to, the ones that run no controller included (they do not read the controller's variables)."""
    raw = environ.get(TEMPLATE_CPU_S_ENV, "")
    try:
        value = float(raw) if raw else DEFAULT_TEMPLATE_CPU_S
    except ValueError:
        return DEFAULT_TEMPLATE_CPU_S
    return value if value > 0 else DEFAULT_TEMPLATE_CPU_S


def _max_child_depth(raw: str | None) -> int:
    if not raw:
        return DEFAULT_MAX_CHILD_DEPTH
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(f"{MAX_CHILD_DEPTH_ENV}={raw!r}: not a whole number") from None
    if value < 0:
        raise ConfigurationError(f"{MAX_CHILD_DEPTH_ENV}={raw!r}: must be 0 or more")
    return value
