"""``kind: script``'s ``env``: a null value leaves the variable unset, never the text ``null``."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import playbook, run

from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.dataplane.tools.base import ToolContext
from noetl_stream.dataplane.tools.script import run_script
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import local_runtime

SHOW = 'echo "X=${X-unset} HOME=${HOME-unset} KEPT=${KEPT-unset} N=${N-unset}"'


async def script(config: dict[str, Any]) -> Outcome:
    return await run_script(config, ToolContext(execution_id="e1", step="s", task="t", spec={}))


async def test_a_null_env_value_leaves_the_variable_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/worker")  # inherited (KEPT_ENV) unless `env` unsets it
    out = await script({"code": SHOW, "env": {"X": None, "HOME": None, "KEPT": "yes", "N": 0}})
    assert out.status == "ok", out.error
    assert out.result["stdout"] == "X=unset HOME=unset KEPT=yes N=0\n"


async def test_a_null_env_value_in_python_is_not_in_os_environ() -> None:
    code = "import json, os\nprint(json.dumps({'has': 'X' in os.environ, 'path': 'PATH' in os.environ}))"
    out = await script({"language": "python", "code": code, "env": {"X": None, "PATH": None}})
    assert out.status == "ok", out.error
    assert out.result["json"] == {"has": False, "path": False}


async def test_a_template_rendering_to_null_unsets_the_variable(
    nats_server: EmbeddedNats, topology: Topology
) -> None:
    text = playbook(
        f"""
        - step: start
          tool:
            kind: script
            code: '{SHOW}'
            env: {{X: "{{{{ workload.nothing }}}}", KEPT: "{{{{ workload.region }}}}"}}
        """,
        workload={"nothing": None, "region": "eu"},
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "success", r.summary.error
    assert r.result["stdout"].startswith("X=unset ") and "KEPT=eu" in r.result["stdout"]
