"""The API routes behind the viewer's step panel, its buttons and its list, on a real controller and worker:
a step in detail (the args each task ran with, attempts, a python traceback, a loop's iterations), a
result stored by reference, retry over HTTP (and the link between a retry and its original), and the
executions list's start/finish times, id search and cursor paging."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from apiserver import Api, serve
from helpers import playbook
from viewer_support import GATE_BOOK, graph_when, open_gate, pipeline_book, start

from noetl_stream.control.core.state import ExecutionState
from noetl_stream.kv.snapshots import SnapshotStore
from noetl_stream.runtime.local import Runtime

BIG_RESULT = playbook(
    """
    - step: start
      tool: {kind: python, code: "result = 'x' * 300000"}
    """,
    name="big",
)
FAILS = playbook(
    """
    - step: start
      next: {arcs: [{step: first}]}
    - step: first
      tool: {kind: noop, result: 1}
      next: {arcs: [{step: second}]}
    - step: second
      tool:
        - name: check
          kind: python
          args: {ok: "{{ workload.ok }}"}
          code: |
            if not ok:
                raise RuntimeError("not yet")
            result = "fine"
    """,
    workload={"ok": False},
    name="fails",
)


async def ended(api: Api, execution_id: str) -> dict[str, Any]:
    return await graph_when(api, execution_id, lambda g: g["finished_at"] is not None)


async def test_a_step_in_detail(runtime: Runtime) -> None:
    async with serve(runtime) as api:
        execution_id = await start(api, pipeline_book())
        await ended(api, execution_id)
        base = f"/api/executions/{execution_id}/steps"

        boom = await api.json("GET", f"{base}/boom")
        assert (boom["step"], boom["kind"]) == ("boom", "tasks")
        (run,) = boom["runs"]
        assert run["status"] == "failed" and run["worker"] and run["duration_s"] is not None
        assert run["error"]["kind"] == "python_error"
        assert "raise ValueError('no luck')" in run["error"]["traceback"]
        (task,) = run["tasks"]
        assert (task["task"], task["attempt"], task["status"], task["do"]) == (
            "boom_task",
            1,
            "error",
            "fail",
        )
        assert "ValueError: no luck" in task["error"]["traceback"]

        flaky = await api.json("GET", f"{base}/flaky")
        assert flaky["declared"] == [
            {"name": "call", "kind": "python", "args": {"attempt": "{{ _attempt }}"}}
        ]
        (run,) = flaky["runs"]
        assert run["status"] == "ok" and run["result"] == 2 and run["args"] == {}
        assert [(t["attempt"], t["args"], t["status"], t["do"]) for t in run["tasks"]] == [
            (1, {"attempt": 1}, "error", "retry"),
            (2, {"attempt": 2}, "ok", "continue"),
        ]
        assert run["tasks"][1]["result"] == 2

        each = await api.json("GET", f"{base}/each")
        (run,) = each["runs"]
        assert each["kind"] == "loop" and run["loop"] == {"total": 5, "done": 4, "failed": 1}
        assert run["iterations_total"] == 5
        its = {it["index"]: it for it in run["iterations"]}
        assert [its[i]["status"] for i in range(5)] == ["ok", "ok", "failed", "ok", "ok"]
        assert its[1]["result"] == 6 and its[1]["tasks"][0]["args"] == {"x": 2}
        assert "ZeroDivisionError" in its[2]["error"]["traceback"]
        assert its[2]["tasks"][0]["args"] == {"x": 0}
        page = await api.json("GET", f"{base}/each?offset=3&limit=1")
        assert [it["index"] for it in page["runs"][0]["iterations"]] == [3]
        assert page["runs"][0]["iterations_total"] == 5

        assert (await api.json("GET", f"{base}/never"))["runs"] == []
        missing = await api.json("GET", f"{base}/nope", 404)
        assert missing["error"] == "not_found"
        await api.json("GET", "/api/executions/no-such-run/steps/boom", 404)


async def test_a_result_stored_by_reference_is_served_by_its_key(runtime: Runtime) -> None:
    async with serve(runtime) as api:
        execution_id = await start(api, BIG_RESULT)
        assert (await ended(api, execution_id))["status"] == "success"
        (run,) = (await api.json("GET", f"/api/executions/{execution_id}/steps/start"))["runs"]
        ref = run["result"]["$ref"]
        assert ref["key"].startswith(f"{execution_id}/")
        url = f"/api/executions/{execution_id}/result"
        got = await api.json("GET", url, params={"key": ref["key"], "checksum": ref["checksum"]})
        assert got == {
            "execution_id": execution_id,
            "key": ref["key"],
            "size": ref["size"],
            "value": "x" * 300000,
        }
        wrong = "sha256:" + "0" * 64
        assert (await api.json("GET", url, 409, params={"key": ref["key"], "checksum": wrong}))["error"]
        await api.json("GET", url, 404, params={"key": f"{execution_id}/nothing/result"})
        other = await start(api, playbook("- step: start\n  tool: {kind: noop}"))
        await api.json("GET", f"/api/executions/{other}/result", 400, params={"key": ref["key"]})
        async with api.session.get(api.url + url, params={"key": ref["key"]}) as resp:
            assert resp.status == 401  # token-checked like the rest


async def test_retry_over_http_links_the_retry_and_its_original(runtime: Runtime, tmp_path: Path) -> None:
    async with serve(runtime) as api:
        failed = await start(api, FAILS)
        assert (await ended(api, failed))["status"] == "failed"

        unknown = await api.json(
            "POST", f"/api/executions/{failed}/retry", 400, json={"from_steps": ["nope"]}
        )
        assert unknown["error"] == "bad_request"
        await api.json("POST", "/api/executions/no-such-run/retry", 404)

        retry = (await api.json("POST", f"/api/executions/{failed}/retry", 201))["execution_id"]
        graph = await ended(api, retry)
        assert graph["retry_of"] == failed
        steps = {s["name"]: s["status"] for s in graph["steps"]}
        assert steps["first"] == "ok" and steps["second"] == "failed"  # first reused, second ran again
        detail = await api.json("GET", f"/api/executions/{retry}/steps/first")
        assert detail["runs"] == []  # not run again: its result was reused

        again = (
            await api.json("POST", f"/api/executions/{failed}/retry", 201, json={"from_steps": ["first"]})
        )["execution_id"]
        await ended(api, again)
        summary = await api.json("GET", f"/api/executions/{retry}")
        assert summary["retry_of"] == failed and summary["started_at"] and summary["finished_at"]
        retries = await api.json("GET", "/api/executions", params={"retry_of": failed})
        assert sorted(i["execution_id"] for i in retries["items"]) == sorted([retry, again])
        (original,) = (await api.json("GET", "/api/executions", params={"q": failed}))["items"]
        assert original["retried_by"] == [again, retry]  # newest start first
        assert "retry_of" not in await api.json("GET", f"/api/executions/{failed}")

        gate = tmp_path / "gate"
        running = await start(api, GATE_BOOK, {"gate": str(gate)})
        await graph_when(api, running, lambda g: any(s["status"] == "running" for s in g["steps"]))
        refused = await api.json("POST", f"/api/executions/{running}/retry", 409)
        assert refused["error"] == "conflict" and running in refused["detail"]
        open_gate(gate)
        await ended(api, running)


async def test_the_list_has_times_search_and_cursor_paging_through_thousands(runtime: Runtime) -> None:
    async with serve(runtime) as api:
        real = await start(api, playbook("- step: start\n  tool: {kind: noop}", name="real"))
        await ended(api, real)
        listed = await api.json("GET", "/api/executions", params={"q": real[4:12].upper()})
        (item,) = listed["items"]
        assert item["execution_id"] == real and item["status"] == "success"
        assert item["started_at"] <= item["finished_at"] and item["duration_s"] >= 0

        # Thousands of ended executions, as a controller's snapshots hold them.
        store = await SnapshotStore.open(runtime.nc.jetstream(), runtime.topology, ExecutionState)
        day = "2001-02-03"  # before the real one
        n = 2500
        seeded = []
        for i in range(n):
            eid = f"seed{i:05d}"
            at = f"{day}T00:{i // 60 % 60:02d}:{i % 60:02d}.{i % 1000:03d}Z"
            status = "failed" if i % 10 == 0 else "success"
            path = "tests/alpha" if i % 2 else "tests/beta"
            state = ExecutionState(
                execution_id=eid, status=status, name=path[6:], path=path, started_at=at, finished_at=at
            )
            await store.put(eid, state)
            seeded.append(eid)

        by_start: list[str] = []
        cursor = None
        pages = 0
        while True:
            params: dict[str, Any] = {"order": "started", "limit": 1000}
            if cursor:
                params["cursor"] = cursor
            page = await api.json("GET", "/api/executions", params=params)
            assert page["total"] == n + 1
            by_start += [i["execution_id"] for i in page["items"]]
            pages += 1
            cursor = page.get("next_cursor")
            if cursor is None:
                break
        assert pages == 3 and len(by_start) == len(set(by_start)) == n + 1
        starts = [(s.started_at or "", s.execution_id) for s in [await store.get(e) for e in seeded]]
        expected = [eid for _, eid in sorted(starts, reverse=True)]
        assert [e for e in by_start if e != real] == expected
        assert by_start[0] == real  # started after every seeded one

        offset = await api.json(
            "GET", "/api/executions", params={"order": "started", "offset": 1000, "limit": 5}
        )
        assert [i["execution_id"] for i in offset["items"]] == by_start[1000:1005]

        failed = await api.json(
            "GET", "/api/executions", params={"status": "failed", "playbook": "tests/beta"}
        )
        assert failed["total"] == n // 10 and all(i["path"] == "tests/beta" for i in failed["items"])
        found = await api.json("GET", "/api/executions", params={"q": "SEED0123"})
        assert sorted(i["execution_id"] for i in found["items"]) == [f"seed0123{d}" for d in range(10)]

        bad = await api.json("GET", "/api/executions", 400, params={"cursor": "not-a-cursor"})
        assert bad["error"] == "bad_request"
        await api.json("GET", "/api/executions", 400, params={"order": "sideways"})


async def test_a_distributed_loop_lists_its_iterations_from_every_worker(runtime: Runtime) -> None:
    async with serve(runtime) as api:
        execution_id = await start(api, pipeline_book("distributed"))
        await ended(api, execution_id)
        each = await api.json("GET", f"/api/executions/{execution_id}/steps/each")
        (run,) = each["runs"]
        assert run["iterations_total"] == 5 and run["loop"]["done"] == 4 and run["loop"]["failed"] == 1
        its = {it["index"]: it for it in run["iterations"]}
        assert [its[i]["status"] for i in range(5)] == ["ok", "ok", "failed", "ok", "ok"]
        assert all(its[i]["worker"] for i in range(5))
        assert [its[i]["tasks"][0]["args"] for i in range(5)] == [{"x": x} for x in (1, 2, 0, 3, 4)]
        assert its[4]["result"] == 3 and "ZeroDivisionError" in its[2]["error"]["traceback"]
