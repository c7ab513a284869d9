"""The vendored layout library is the file its note names: the version's sha256 in vendor/README.md."""

from __future__ import annotations

import hashlib
import re
from importlib import resources


def test_the_vendored_dagre_is_the_one_its_readme_names() -> None:
    vendor = resources.files("noetl_stream.api").joinpath("viewer", "vendor")
    readme = vendor.joinpath("README.md").read_text(encoding="utf-8")
    row = next(line for line in readme.splitlines() if line.startswith("| `dagre.min.js`"))
    version, digest = re.findall(r"\| (\d+\.\d+\.\d+) \| `([0-9a-f]{64})`", row)[0]
    data = vendor.joinpath("dagre.min.js").read_bytes()
    assert hashlib.sha256(data).hexdigest() == digest
    assert f"@dagrejs/dagre@{version}" in readme
    license_text = vendor.joinpath("LICENSE.dagre").read_text(encoding="utf-8")
    assert "Permission is hereby granted, free of charge" in license_text  # the MIT license, as shipped
