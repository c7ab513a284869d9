"""Probe 67: the ``script`` tool's ``json`` is the whole stdout decoded, also past the 64 KiB kept as
``stdout`` text."""

from __future__ import annotations

from noetl_stream.dataplane.tools.base import ToolContext
from noetl_stream.dataplane.tools.script import OUTPUT_LIMIT, run_script


async def test_json_is_the_whole_stdout_decoded_past_the_kept_tail() -> None:
    code = "import json\nprint(json.dumps({'rows': ['x' * 100 for _ in range(2000)], 'end': True}))\n"
    ctx = ToolContext(execution_id="e1", step="s", task="t", spec={})
    out = await run_script({"language": "python", "code": code}, ctx)
    assert out.status == "ok", out.error
    assert len(out.result["stdout"].encode()) == OUTPUT_LIMIT  # the text is cut to its tail
    assert out.result["json"] == {"rows": ["x" * 100] * 2000, "end": True}
