"""A third-party tool kind installed as a distribution with a `noetl_stream.tools` entry point."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator

import pytest
from helpers import playbook

from noetl_stream.dsl import compile_playbook
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import local_runtime
from noetl_stream.runtime.plugins import load_plugins

PLUGIN = """
from noetl_stream.dataplane.outcome import Outcome
from noetl_stream.runtime.plugins import ToolPlugin


async def run_shout(config, ctx):
    text = config.get("text")
    if not isinstance(text, str):
        return Outcome.fail("config_error", "shout needs text")
    return Outcome.ok(text.upper() + "!")


def plugin():
    return ToolPlugin(kind="shout", run=run_shout, keys={"text"}, required_any=[("text",)],
                      description="upper-cases text")
"""


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Install a real (tiny) distribution on sys.path: a module plus its .dist-info with entry points."""
    site = tmp_path_factory.mktemp("site")
    (site / "shout_plugin.py").write_text(PLUGIN)
    info = site / "shout_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: shout-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        textwrap.dedent(
            """\
            [noetl_stream.tools]
            shout = shout_plugin:plugin
            """
        )
    )
    sys.path.insert(0, str(site))
    try:
        yield
    finally:
        sys.path.remove(str(site))


SHOUT = playbook(
    """
    - step: start
      tool:
        kind: shout
        text: "{{ workload.who }}"
    """,
    workload={"who": "hello"},
)


def test_an_unknown_kind_is_rejected_before_the_plugin_is_loaded() -> None:
    if "shout" in load_plugins():  # another test of this module loaded it already
        pytest.skip("plugin already loaded in this process")
    result = compile_playbook(SHOUT, "shout.yaml")
    assert any("unknown tool kind 'shout'" in d.message for d in result.errors)


def test_the_plugin_kind_validates_and_its_keys_are_checked(installed_plugin: None) -> None:
    assert load_plugins()["shout"] == "shout=shout_plugin:plugin"
    assert compile_playbook(SHOUT, "shout.yaml").errors == ()
    bad = compile_playbook(SHOUT.replace("text:", "txt:"), "bad.yaml")
    messages = [d.message for d in bad.errors]
    assert any("unknown key 'txt' for kind 'shout'" in m for m in messages), messages


async def test_the_plugin_kind_runs(
    installed_plugin: None, nats_server: EmbeddedNats, topology: Topology
) -> None:
    load_plugins()
    async with local_runtime(nats_server.url, topology=topology) as rt:
        summary = await rt.run_playbook(SHOUT, "shout.yaml", timeout=20)
    assert summary.status == "success"
    assert summary.result == "HELLO!"
