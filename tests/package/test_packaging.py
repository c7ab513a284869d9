"""The package says it is typed (PEP 561): ``noetl_stream/py.typed`` is in the source and in the wheel the
project's own build backend (hatchling, as pyproject.toml's ``[build-system]``) makes, so a type checker
reads ``noetl_stream``'s annotations in an application that installed it."""

from __future__ import annotations

import importlib.resources
import zipfile
from pathlib import Path

from hatchling.builders.wheel import WheelBuilder

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_package_has_its_py_typed_marker() -> None:
    assert importlib.resources.files("noetl_stream").joinpath("py.typed").is_file()


def test_the_wheel_ships_py_typed(tmp_path: Path) -> None:
    (wheel,) = WheelBuilder(str(ROOT)).build(directory=str(tmp_path), versions=["standard"])

    with zipfile.ZipFile(wheel) as built:
        names = set(built.namelist())
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        recorded = {line.split(",")[0] for line in built.read(record).decode().splitlines()}
    assert "noetl_stream/py.typed" in names
    assert "noetl_stream/py.typed" in recorded  # installed, and uninstalled, with the rest
    assert "noetl_stream/__init__.py" in names and "noetl_stream/cli/main.py" in names
    # the viewer's pages and its vendored layout library (with its license), served from the package
    viewer = "noetl_stream/api/viewer/"
    for asset in ("index.html", "viewer.js", "viewer.css", "vendor/dagre.min.js", "vendor/LICENSE.dagre"):
        assert viewer + asset in names and viewer + asset in recorded, asset
    assert not any(n.startswith("tests/") for n in names)
