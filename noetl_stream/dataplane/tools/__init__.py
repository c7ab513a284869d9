"""Tool kinds the worker can run, by name."""

from __future__ import annotations

from typing import Any

from noetl_stream.dataplane.tools.base import ToolContext, ToolFn
from noetl_stream.dataplane.tools.duckdb import close_resources as _close_duckdb
from noetl_stream.dataplane.tools.duckdb import run_duckdb
from noetl_stream.dataplane.tools.http import run_http
from noetl_stream.dataplane.tools.noop import run_noop
from noetl_stream.dataplane.tools.playbook import run_playbook
from noetl_stream.dataplane.tools.postgres import run_postgres
from noetl_stream.dataplane.tools.python import run_python
from noetl_stream.dataplane.tools.script import run_script
from noetl_stream.dataplane.tools.secrets import run_secrets

TOOLS: dict[str, ToolFn] = {
    "noop": run_noop,
    "python": run_python,
    "duckdb": run_duckdb,
    "playbook": run_playbook,
    "http": run_http,
    "postgres": run_postgres,
    "secrets": run_secrets,
    "script": run_script,
}


def close_resources(resources: dict[str, Any]) -> None:
    _close_duckdb(resources)


__all__ = ["TOOLS", "ToolContext", "ToolFn", "close_resources"]
