"""The package's public API: the names `noetl_stream` re-exports, and a pure DSL import that stays pure."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import noetl_stream

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", [n for n in noetl_stream.__all__ if n != "__version__"])
def test_each_public_name_is_its_modules_object(name: str) -> None:
    home = importlib.import_module(noetl_stream._HOMES[name])
    assert getattr(noetl_stream, name) is getattr(home, name)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'run_everything'"):
        noetl_stream.run_everything  # noqa: B018


def test_the_public_compiler_compiles_a_playbook() -> None:
    text = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: p, path: p}\nworkflow:\n  - step: start\n    tool: {kind: noop}\n"
    result = noetl_stream.compile_playbook(text, "p.yaml")
    assert not result.errors, result.errors


def test_importing_the_dsl_loads_neither_nats_nor_the_runtime() -> None:
    code = (
        "import sys, noetl_stream.dsl.compiler\n"
        "loaded = sorted(m for m in ('nats', 'asyncpg', 'aiohttp', 'noetl_stream.runtime.local', 'noetl_stream.control')"
        " if m in sys.modules)\n"
        "print(','.join(loaded))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def _block(text: str, lang: str) -> str:
    start = text.index(f"```{lang}\n") + len(f"```{lang}\n")
    return text[start : text.index("```", start)]


def test_the_readmes_python_example_runs_as_written(tmp_path: Path) -> None:
    """README's "From Python" block, on README's playbook, in a fresh interpreter (its own nats-server)."""
    readme = (ROOT / "README.md").read_text()
    (tmp_path / "greet.yaml").write_text(_block(readme, "yaml"))
    (tmp_path / "example.py").write_text(_block(readme, "python"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("NOETL_NATS_URL", None)
    out = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    # local_runtime configured the logs (warnings, on stderr): stdout is the example's own
    assert out.stdout == "success {'count': 1, 'first': 'hello, x!'}\n", out.stdout
