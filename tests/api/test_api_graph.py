"""``GET /api/executions/{id}/graph`` (the viewer's data) and the viewer's static pages, over real HTTP."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import helpers
import msgspec
import pytest
from apiserver import Api
from helpers import playbook
from viewer_support import GATE_BOOK, graph_when, open_gate, pipeline_book, start, steps

from noetl_stream.api.graph import fold_graph
from noetl_stream.client.submit import retry_request
from noetl_stream.protocol import events as E
from noetl_stream.runtime.local import Runtime


def _at(iso: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(iso.replace("Z", "+00:00"))


def finished(graph: dict[str, Any]) -> bool:
    return graph["finished_at"] is not None


@pytest.mark.parametrize("exec_", ["local", "distributed"])
async def test_the_graph_of_a_finished_execution(api: Api, exec_: str) -> None:
    execution_id = await start(api, pipeline_book(exec_))
    graph = await graph_when(api, execution_id, finished)

    assert (graph["status"], graph["name"], graph["path"]) == ("success", "viewer", "tests/viewer")
    by = steps(graph)
    assert [s["name"] for s in graph["steps"]] == ["start", "each", "flaky", "boom", "handle", "never"]
    assert {n: s["status"] for n, s in by.items()} == {
        "start": "ok",
        "each": "ok",
        "flaky": "ok",
        "boom": "failed",
        "handle": "ok",
        "never": "unreached",
    }
    assert {n: (s["layer"], s["order"]) for n, s in by.items()} == {
        "start": (0, 0),
        "each": (1, 0),
        "flaky": (2, 0),
        "boom": (3, 0),
        "handle": (4, 0),
        "never": (4, 1),
    }
    assert {n: s["kind"] for n, s in by.items()} == {
        "start": "router",
        "each": "loop",
        "flaky": "tasks",
        "boom": "tasks",
        "handle": "tasks",
        "never": "tasks",
    }
    loop = by["each"]["loop"]
    assert loop == {"mode": "parallel", "exec": exec_, "total": 5, "started": 5, "done": 4, "failed": 1}
    assert (by["flaky"]["retries"], by["flaky"]["task_runs"]) == (1, 2)
    assert by["boom"]["error"]["kind"] == "python_error" and "no luck" in by["boom"]["error"]["message"]
    assert by["never"]["runs"] == 0 and by["never"]["started_at"] is None
    for name in ("each", "flaky", "boom", "handle"):
        s = by[name]
        assert s["runs"] == 1
        assert _at(s["scheduled_at"]) <= _at(s["started_at"]) <= _at(s["finished_at"]), s
        assert s["duration_s"] == pytest.approx(
            (_at(s["finished_at"]) - _at(s["started_at"])).total_seconds(), abs=0.002
        )
    assert _at(by["flaky"]["finished_at"]) <= _at(by["boom"]["started_at"])  # in order

    arcs = {(a["source"], a["target"]): a for a in graph["arcs"]}
    assert set(arcs) == {
        ("start", "each"),
        ("each", "flaky"),
        ("flaky", "boom"),
        ("boom", "handle"),
        ("boom", "never"),
    }
    assert {k: a["taken"] for k, a in arcs.items()} == {
        ("start", "each"): 1,
        ("each", "flaky"): 1,
        ("flaky", "boom"): 1,
        ("boom", "handle"): 1,
        ("boom", "never"): 0,
    }
    assert arcs[("boom", "handle")]["when"] == "{{ event.name == 'step.failed' }}"
    assert arcs[("boom", "never")]["when"] is None
    assert not any(a["back"] for a in graph["arcs"])

    page = await api.json("GET", f"/api/executions/{execution_id}/events?limit=1000")
    assert graph["events"] == len(page["events"]) and graph["last_seq"] == page["events"][-1]["seq"]
    assert graph["duration_s"] > 0 and graph["error"] is None


async def test_a_running_step_then_its_end(api: Api, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    execution_id = await start(api, GATE_BOOK, {"gate": str(gate)})
    running = await graph_when(api, execution_id, lambda g: steps(g)["wait"]["status"] == "running")
    assert running["status"] == "running" and running["finished_at"] is None
    wait = steps(running)["wait"]
    assert wait["started_at"] is not None and wait["finished_at"] is None and wait["duration_s"] is None
    assert steps(running)["after"]["status"] == "pending"

    open_gate(gate)
    done = await graph_when(api, execution_id, finished)
    assert done["status"] == "success"
    assert {s["name"]: s["status"] for s in done["steps"]} == {"start": "ok", "wait": "ok", "after": "ok"}


async def test_a_back_edge_is_marked_and_counts_runs(api: Api) -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: noop
            spec: {policy: {rules: [{else: {then: {do: continue, set_ctx: {n: 0}}}}]}}
          next: {arcs: [{step: count}]}
        - step: count
          tool:
            kind: noop
            result: "{{ ctx.n + 1 }}"
            spec: {policy: {rules: [{else: {then: {do: continue, set_ctx: {n: "{{ outcome.result }}"}}}}]}}
          next:
            arcs:
              - step: count
                when: "{{ ctx.n < 3 }}"
              - step: done
        - step: done
          tool: {kind: noop, result: "{{ count }}"}
        """,
        name="again",
    )
    execution_id = await start(api, text)
    graph = await graph_when(api, execution_id, finished)
    by = steps(graph)
    assert by["count"]["runs"] == 3 and by["count"]["status"] == "ok"
    assert [(s["name"], s["layer"]) for s in graph["steps"]] == [("start", 0), ("count", 1), ("done", 2)]
    arcs = {(a["source"], a["target"]): a for a in graph["arcs"]}
    assert arcs[("count", "count")]["back"] and arcs[("count", "count")]["taken"] == 2
    assert not arcs[("count", "done")]["back"] and arcs[("count", "done")]["taken"] == 1


async def test_a_retry_shows_the_reused_steps_as_ok(api: Api, runtime: Runtime, tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    text = playbook(
        """
        - step: start
          tool: {kind: noop, result: 1}
          next: {arcs: [{step: compute}]}
        - step: compute
          tool:
            kind: python
            args: {flag: "{{ workload.flag }}"}
            code: |
              import os
              if not os.path.exists(flag):
                  raise RuntimeError("flag missing")
              result = 2
        """,
        workload={"flag": str(flag)},
        name="retried",
    )
    first = await start(api, text)
    failed = await graph_when(api, first, finished)
    assert failed["status"] == "failed"
    assert {s["name"]: s["status"] for s in failed["steps"]} == {"start": "ok", "compute": "failed"}

    open_gate(flag)
    request = await retry_request(runtime.nc, runtime.topology, first)
    body = msgspec.to_builtins(request)
    second = (await api.json("POST", "/api/executions", 201, json=body))["execution_id"]
    graph = await graph_when(api, second, finished)
    assert graph["status"] == "success"
    by = steps(graph)
    assert (by["start"]["status"], by["start"]["runs"]) == ("ok", 0)  # reused, not run again
    assert (by["compute"]["status"], by["compute"]["runs"]) == ("ok", 1)


async def test_a_rejected_request_has_no_steps(api: Api) -> None:
    bad = playbook("- step: start\n  tool: {kind: noop}\n  retries: 3\n", name="bad")
    reply = await api.json("POST", "/api/executions", 422, json={"playbook": bad})
    graph = await graph_when(api, reply["execution_id"], finished)
    assert graph["status"] == "rejected" and graph["steps"] == [] and graph["arcs"] == []
    assert graph["error"]["kind"] == "invalid_playbook"


async def test_graph_refusals(api: Api) -> None:
    assert (await api.json("GET", "/api/executions/no-such-run/graph", 404))["error"] == "not_found"
    assert (await api.json("GET", "/api/executions/a.b/graph", 400))["error"] == "bad_request"
    async with api.session.get(api.url + "/api/executions/x/graph") as resp:
        assert resp.status == 401


async def test_the_pages_are_served_without_a_token_and_hold_no_data(api: Api) -> None:
    for path in ("/ui", "/ui/executions/some-id"):
        async with api.session.get(api.url + path) as resp:
            assert resp.status == 200 and resp.content_type == "text/html"
            html = await resp.text()
            assert '<script src="/ui/static/viewer.js"' in html and "some-id" not in html
            assert "script-src 'self'" in resp.headers["Content-Security-Policy"]
    for path, kind in (
        ("/ui/static/viewer.js", "text/javascript"),
        ("/ui/static/viewer.css", "text/css"),
        ("/ui/static/vendor/dagre.min.js", "text/javascript"),
    ):
        async with api.session.get(api.url + path) as resp:
            assert (resp.status, resp.content_type) == (200, kind)
            assert len(await resp.read()) > 1000
    async with api.session.get(api.url + "/ui/executions/a.b") as resp:
        assert resp.status == 400 and (await resp.json())["error"] == "bad_request"
    async with api.session.get(api.url + "/ui/static/other.js") as resp:
        assert resp.status == 401  # not a page: like any unknown path, it needs the token first


def test_the_assets_ship_in_the_package() -> None:
    from importlib import resources

    from noetl_stream.api.pages import ASSETS

    root = resources.files("noetl_stream.api").joinpath("viewer")
    shipped = [p.name for p in root.iterdir() if p.is_file()]
    shipped += [f"vendor/{p.name}" for p in root.joinpath("vendor").iterdir()]
    # every file is served, but the vendored code's license and its note of version and checksum
    assert sorted(shipped) == sorted((*ASSETS, "vendor/LICENSE.dagre", "vendor/README.md"))


def test_a_redelivered_run_after_the_boundary_leaves_the_step_as_it_ended() -> None:
    """Events of a redelivered command's second run, stored after the first run's boundary (ids of their
    own), are ignored by the graph as by the controller; the arc the boundary took still counts."""
    text = playbook(
        """
        - step: start
          tool: {kind: noop}
          next:
            arcs:
              - step: end
        - step: end
          tool: {kind: noop}
        """
    )
    evs = [
        helpers.event(E.EXECUTION_REQUESTED, request={"playbook": text, "file": "p.yaml"}),
        helpers.event(E.STEP_STARTED, "start", "in_progress"),
        helpers.event(E.STEP_DONE, "start"),
        helpers.event(E.NEXT_EVALUATED, "start", matched=["end"]),
        helpers.event(E.STEP_STARTED, "start", "in_progress", delivery=2),
        helpers.event(E.TASK_STARTED, "start", "in_progress"),
        helpers.event(E.STEP_FAILED, "start", "error", error={"kind": "boom"}),
    ]
    g = fold_graph("e", enumerate(evs, 1))
    node = next(s for s in g.steps if s.name == "start")
    assert (node.status, node.runs, node.task_runs, node.error) == ("ok", 1, 0, None)
    assert [a.taken for a in g.arcs if a.source == "start"] == [1]
