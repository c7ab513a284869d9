"""The import contract that keeps `control/core` at the bottom of `control` names every other module of
`control`: import-linter checks only the modules a layers contract lists, so one added later and not
listed could be imported by the pure core unnoticed."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_control_layers_contract_lists_every_module_of_control() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    (layers,) = [
        c for c in contracts if c["type"] == "layers" and c.get("containers") == ["noetl_stream.control"]
    ]
    above, bottom = layers["layers"]
    assert bottom == "core"
    listed = {name.strip() for name in above.split(":")}
    control = ROOT / "noetl_stream" / "control"
    modules = {p.stem for p in control.glob("*.py") if p.stem != "__init__"}
    modules |= {
        p.name for p in control.iterdir() if p.is_dir() and (p / "__init__.py").exists() and p.name != "core"
    }
    assert listed == modules


def test_no_module_imports_itself_through_others() -> None:
    """No import circles: no module reaches itself through the modules it imports (lazy imports inside
    functions count; the type checker's imports do not)."""
    import grimp

    graph = grimp.build_graph("noetl_stream", exclude_type_checking_imports=True)
    circles = [
        (module, other)
        for module in sorted(graph.modules)
        for other in graph.find_modules_directly_imported_by(module)
        if graph.chain_exists(importer=other, imported=module)
    ]
    assert circles == []
