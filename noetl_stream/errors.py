"""The error tree. One root, ``NoetlError``; errors are translated only at the edge."""

from __future__ import annotations


class NoetlError(Exception):
    """Root of every error this package raises on purpose."""


class ConfigurationError(NoetlError):
    """Bad runtime configuration (flags, environment, topology)."""


class StoreMissingError(NoetlError):
    """A bucket or stream of the installation is not on the server (deleted, or never provisioned)."""


class StateConflictError(NoetlError):
    """A compare-and-set on persisted state lost (someone else wrote first)."""


class ToolError(NoetlError):
    """A tool failed. ``retryable`` tells task policies whether a retry may help."""

    def __init__(self, message: str, *, kind: str = "tool_error", retryable: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.retryable = retryable
