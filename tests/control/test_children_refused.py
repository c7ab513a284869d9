"""Child playbooks on the controller and client side: a child of an ended parent is refused, nesting is
bounded, and each child file reference resolves relative to the file that wrote it."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import playbook

from noetl_stream.client.submit import AttachmentError, collect_attachments, request_for, submit
from noetl_stream.client.tracking import follow
from noetl_stream.control.intake import rebase_attachments
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.protocol.subjects import Topology
from noetl_stream.protocol.wire import ExecutionRequest, new_execution_id
from noetl_stream.runtime.local import Runtime, local_runtime


async def test_a_child_request_of_an_ended_parent_is_rejected_with_a_terminal_event(runtime: Runtime) -> None:
    parent = await submit(
        runtime.nc, runtime.topology, request_for(playbook("- step: start\n  tool: {kind: noop}\n"), "p.yaml")
    )
    assert (await follow(runtime.nc, runtime.topology, parent, timeout=20)).status == "success"
    child = ExecutionRequest(
        playbook=playbook("- step: start\n  tool: {kind: noop, result: 1}\n", name="kid"),
        file="kid.yaml",
        execution_id=new_execution_id(),
        parent_execution_id=parent,
        parent_step_run_id="start-1",
    )
    summary = await follow(
        runtime.nc, runtime.topology, await submit(runtime.nc, runtime.topology, child), timeout=20
    )
    assert summary.status == "rejected", summary
    assert summary.error is not None and summary.error["kind"] == "parent_ended"
    assert parent in summary.error["message"] and "ended (success)" in summary.error["message"]


SELF = playbook(
    """
    - step: start
      tool: {kind: python, code: "result = 1"}
      next: {arcs: [{step: recurse}]}
    - step: recurse
      tool: {kind: playbook, path: self.yaml, return_step: recurse, args: {n: "{{ workload.n + 1 }}"}}
    """,
    workload={"n": 0},
    name="self",
)


async def test_a_playbook_that_runs_itself_without_a_bound_stops_at_the_depth_limit(
    nats_server: EmbeddedNats, topology: Topology, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOETL_MAX_CHILD_DEPTH", "3")
    (tmp_path / "self.yaml").write_text(SELF)
    async with local_runtime(nats_server.url, topology=topology) as rt:
        summary = await rt.run_playbook(SELF, str(tmp_path / "self.yaml"), timeout=30)
    assert summary.status == "failed"
    assert summary.error is not None and "nested 4 deep" in summary.error["message"]
    assert "at most 3" in summary.error["message"]


def _tree(tmp_path: Path) -> Path:
    def child(result: str) -> str:
        return playbook(f"- step: start\n  tool: {{kind: noop, result: {result}}}\n", name=result)

    (tmp_path / "sub").mkdir()
    (tmp_path / "grand.yaml").write_text(child("grand-from-top"))
    (tmp_path / "sub" / "grand.yaml").write_text(child("grand-from-sub"))
    (tmp_path / "sub" / "other.yaml").write_text(child("other-from-sub"))
    (tmp_path / "sub" / "mid.yaml").write_text(
        playbook(
            """
            - step: start
              tool:
                - {name: g, kind: playbook, path: grand.yaml, return_step: start}
                - {name: o, kind: playbook, path: ./other, return_step: start}
                - {name: both, kind: noop, result: ["{{ g.data }}", "{{ o.data }}"]}
            """,
            name="mid",
        )
    )
    top = tmp_path / "top.yaml"
    top.write_text(
        playbook(
            """
            - step: start
              tool:
                - {name: a, kind: playbook, path: grand.yaml, return_step: start}
                - {name: b, kind: playbook, path: sub/mid.yaml, return_step: start}
                - {name: c, kind: noop, result: ["{{ a.data }}", "{{ b.data }}"]}
            """,
            name="top",
        )
    )
    return top


def test_attachments_are_keyed_relative_to_the_file_that_references_them(tmp_path: Path) -> None:
    top = _tree(tmp_path)
    found = collect_attachments(top.read_text(), str(top))
    assert "grand-from-top" in found["grand.yaml"]
    assert "grand-from-sub" in found["sub/grand.yaml"]
    assert "other-from-sub" in found["sub/other"]
    # as the child sub/mid.yaml's worker looks its references up
    seen_by_mid = rebase_attachments(found, "sub/mid.yaml")
    assert "grand-from-sub" in seen_by_mid["grand.yaml"]
    assert "other-from-sub" in seen_by_mid["./other"]
    assert "grand-from-top" in seen_by_mid["../grand.yaml"]


async def test_the_same_relative_name_in_two_directories_runs_the_right_child(
    runtime: Runtime, tmp_path: Path
) -> None:
    top = _tree(tmp_path)
    summary = await runtime.run_playbook(top.read_text(), str(top), timeout=30)
    assert summary.status == "success", summary.error
    assert summary.result == ["grand-from-top", ["grand-from-sub", "other-from-sub"]]


def test_more_child_files_than_the_cap_is_an_error_naming_it(tmp_path: Path) -> None:
    refs = "\n".join(f"    - {{name: k{i}, kind: playbook, path: k{i}.yaml}}" for i in range(3))
    for i in range(3):
        (tmp_path / f"k{i}.yaml").write_text(playbook("- step: start\n  tool: {kind: noop}\n"))
    text = playbook(f"- step: start\n  tool:\n{refs}\n")
    assert len(collect_attachments(text, str(tmp_path / "p.yaml"), limit=3)) == 3
    with pytest.raises(AttachmentError, match="more than 2 files"):
        collect_attachments(text, str(tmp_path / "p.yaml"), limit=2)
