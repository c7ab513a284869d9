"""The viewer as an operator uses it, in a real headless Chromium against a real controller and worker:
zoom, pan and fit on a 100-step graph; the step panel (inputs, result, a stored result fetched, a python
traceback, a loop's iterations); the controls (pause, resume, cancel a running execution, retry it, a
refusal shown); the list's paging, filters and id search, and the links between a retry and its original.

Screenshots go to ``test-artifacts/``; with NOETL_DOCS_IMAGES=1 the list and the 100-step graph are also
written to ``docs/images/`` (the pictures docs/operations.md shows).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from apiserver import TOKEN, Api
from helpers import playbook
from viewer_support import (
    ARTIFACTS,
    GATE_BOOK,
    ROOT,
    Browser,
    call,
    graph_when,
    open_gate,
    pipeline_book,
    start,
)

LANES = ("extract", "transform", "load")
LANE_STEPS = 32


def hundred_steps() -> str:
    """start fans out to three lanes of 32 steps each, which join in `merge`, then `report` and
    `publish`: 100 steps."""
    lines = [
        "- step: start",
        "  next:",
        "    spec: {mode: inclusive}",
        "    arcs: [" + ", ".join(f"{{step: {lane}_01}}" for lane in LANES) + "]",
    ]
    for lane in LANES:
        for i in range(1, LANE_STEPS + 1):
            following = f"{lane}_{i + 1:02d}" if i < LANE_STEPS else "merge"
            lines += [
                f"- step: {lane}_{i:02d}",
                f"  tool: {{kind: noop, result: {i}}}",
                f"  next: {{arcs: [{{step: {following}}}]}}",
            ]
    lines += [
        "- step: merge",
        "  tool: {kind: noop, result: merged}",
        "  next: {arcs: [{step: report}]}",
        "- step: report",
        "  tool: {kind: python, code: \"result = {'rows': 3 * 32}\"}",
        "  next: {arcs: [{step: publish}]}",
        "- step: publish",
        "  tool: {kind: noop, result: published}",
    ]
    return playbook("\n".join(lines), name="hundred")


BIG_RESULT = playbook(
    """
    - step: start
      tool: {kind: python, code: "result = 'x' * 300000"}
    """,
    name="big",
)
ALPHA = playbook("- step: start\n  tool: {kind: noop, result: 1}", name="alpha")
BETA = playbook(
    """
    - step: start
      tool: {kind: python, code: "raise RuntimeError('beta always fails')"}
    """,
    name="beta",
)


def picture(b: Browser, name: str) -> Path:
    """A screenshot of the window to test-artifacts/, and to docs/images/ with NOETL_DOCS_IMAGES=1."""
    path = b.window_shot(ARTIFACTS / f"operator-{name}")
    if os.environ.get("NOETL_DOCS_IMAGES") == "1":
        target = ROOT / "docs" / "images" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return path


async def ended(api: Api, execution_id: str) -> dict[str, Any]:
    return await graph_when(api, execution_id, lambda g: g["finished_at"] is not None, timeout=60)


SCALE_JS = "return Number(document.getElementById('graph').dataset.scale)"
# Each node's box against the graph's, in the page's pixels.
OUTSIDE_JS = """
const view = document.getElementById('graph').getBoundingClientRect();
return Array.from(document.querySelectorAll('#graph g.node'), n => [n.dataset.step, n.getBoundingClientRect()])
  .filter(([_, r]) => r.left < view.left - 0.5 || r.top < view.top - 0.5
                      || r.right > view.right + 0.5 || r.bottom > view.bottom + 0.5)
  .map(([name]) => name);
"""
VIEWPORT_JS = "return document.getElementById('viewport').getAttribute('transform')"
MINIMAP_SHOWN_JS = "return getComputedStyle(document.getElementById('minimap')).display !== 'none'"


async def click_step(b: Browser, step: str) -> None:
    await call(b.click, f'#graph g.node[data-step="{step}"]')
    await call(
        b.wait,
        f"{step}'s panel",
        lambda: b.js(
            "const d = document.getElementById('details');"
            "return d.dataset.loaded === 'true' && !!d.querySelector(`#step-details[data-step='${arguments[0]}']`)",
            step,
        ),
    )


async def test_zoom_pan_and_fit_on_a_100_step_graph(api: Api, browser: Browser) -> None:
    execution_id = await start(api, hundred_steps())
    graph = await ended(api, execution_id)
    assert len(graph["steps"]) == 100 and graph["status"] == "success"
    await call(browser.driver.set_window_size, 1500, 1000)
    await call(browser.open, f"{api.url}/ui/executions/{execution_id}#token={TOKEN}")
    await call(browser.wait, "the end of the execution", lambda: browser.body("live") == "done")
    nodes = await call(browser.nodes)
    assert len(nodes) == 100 and set(nodes.values()) == {"ok"}
    assert await call(browser.js, "return document.getElementById('graph').dataset.layout") == "dagre"

    # Too wide to fit readably: it opens at the start, at a readable scale, the rest a drag away.
    opened = await call(browser.js, SCALE_JS)
    assert opened >= 0.6
    outside = await call(browser.js, OUTSIDE_JS)
    assert "start" not in outside and len(outside) > 50
    await click_step(browser, "transform_02")
    await call(browser.js, "window.scrollTo(0, 0)")
    picture(browser, "viewer-graph-100.png")

    await call(browser.click, "#zoom-in")
    zoomed = await call(browser.js, SCALE_JS)
    assert zoomed == pytest.approx(opened * 1.25, rel=1e-3)
    await call(browser.click, "#zoom-out")
    assert await call(browser.js, SCALE_JS) == pytest.approx(opened, rel=1e-3)
    # the wheel zooms around the pointer: up (negative deltaY) in, down out
    wheel = (
        "const svg = document.getElementById('graph'); const r = svg.getBoundingClientRect();"
        "svg.dispatchEvent(new WheelEvent('wheel', {deltaY: arguments[0], clientX: r.left + 200,"
        " clientY: r.top + 200, bubbles: true, cancelable: true}))"
    )
    await call(browser.js, wheel, -300)
    wheeled_in = await call(browser.js, SCALE_JS)
    assert wheeled_in > opened
    await call(browser.js, wheel, 600)
    assert await call(browser.js, SCALE_JS) < wheeled_in

    # a drag on the background pans
    before = await call(browser.js, VIEWPORT_JS)
    await call(browser.drag, "#zoom-level", -300, 200)  # (pressed on the zoom bar: no pan)
    assert await call(browser.js, VIEWPORT_JS) == before
    width, height = await call(
        browser.js,
        "const r = document.getElementById('graph').getBoundingClientRect(); return [r.width, r.height]",
    )
    corner = (int(-width / 2 + 12), int(-height / 2 + 12))  # the top left corner: background
    await call(browser.drag, "#graph", 400, 60, corner)
    panned = await call(browser.js, VIEWPORT_JS)
    assert panned != before
    assert await call(browser.js, SCALE_JS) == pytest.approx(
        float(before.split("scale(")[1].rstrip(")")), rel=1e-3
    )  # a pan leaves the scale

    # the overview: a press on its right end brings the graph's end into view
    assert await call(browser.js, MINIMAP_SHOWN_JS) is True
    assert "publish" in await call(browser.js, OUTSIDE_JS)
    mini_width = await call(
        browser.js, "return document.getElementById('minimap').getBoundingClientRect().width"
    )
    await call(browser.click_at, "#minimap", (int(mini_width / 2) - 6, 0))
    assert "publish" not in await call(browser.js, OUTSIDE_JS)

    await call(browser.click, "#zoom-fit")
    fitted = await call(browser.js, SCALE_JS)
    assert fitted < opened
    assert await call(browser.js, OUTSIDE_JS) == []  # every one of the 100 nodes in view
    assert await call(browser.js, MINIMAP_SHOWN_JS) is False

    # a step of the middle, zoomed in on, with its panel
    await call(browser.click, "#zoom-reset")
    assert await call(browser.js, SCALE_JS) == pytest.approx(1.0, rel=1e-3)
    await call(browser.click, "#zoom-fit")
    await call(
        browser.js,
        "document.querySelector('#graph g.node[data-step=\"report\"]')"
        ".dispatchEvent(new MouseEvent('click'))",
    )
    await call(browser.wait, "report's panel", lambda: browser.text("#details .json.result pre"))
    assert '"rows": 96' in await call(browser.text, "#details .json.result pre")
    await call(browser.js, "window.scrollTo(0, 0)")
    await call(browser.window_shot, ARTIFACTS / "operator-viewer-graph-100-fit.png")
    assert await call(browser.errors) == []


async def test_the_step_panel_shows_inputs_results_a_traceback_and_iterations(
    api: Api, browser: Browser
) -> None:
    execution_id = await start(api, pipeline_book())
    await ended(api, execution_id)
    await call(browser.open, f"{api.url}/ui/executions/{execution_id}#token={TOKEN}")
    await call(browser.wait, "the end of the execution", lambda: browser.body("live") == "done")

    await click_step(browser, "boom")
    traceback = await call(browser.text, "#details .run pre.traceback")
    assert "raise ValueError('no luck')" in traceback and "ValueError: no luck" in traceback
    assert await call(browser.text, "#run-details") and "local-0" in await call(browser.text, "#run-details")

    await click_step(browser, "flaky")
    attempts = await call(
        browser.js,
        "return Array.from(document.querySelectorAll('#details .run > section table.task-runs tr.task-run'),"
        " r => [r.dataset.attempt, r.dataset.task])",
    )
    assert attempts == [["1", "call"], ["2", "call"]]
    assert await call(browser.text, "#details .run > section .json.result pre") == "2"
    inputs = await call(browser.text, '#details .run > section[data-section="inputs"]')
    assert '"attempt": 2' in inputs
    await call(browser.click, '#details tr.task-run[data-attempt="1"]')
    first = await call(browser.text, "#details tr.task-more:not([hidden])")
    assert '"attempt": 1' in first and "ConnectionError: attempt 1" in first

    await click_step(browser, "each")
    rows = await call(
        browser.js,
        "return Array.from(document.querySelectorAll('#iterations tr.iteration'), r => [r.dataset.index, r.dataset.status])",
    )
    assert rows == [["0", "ok"], ["1", "ok"], ["2", "failed"], ["3", "ok"], ["4", "ok"]]
    await call(browser.click, '#iterations tr.iteration[data-index="2"]')
    await call(browser.wait, "iteration 2", lambda: browser.text('#iteration-detail[data-index="2"]'))
    opened = await call(browser.text, "#iteration-detail")
    assert '"x": 0' in opened and "ZeroDivisionError" in await call(
        browser.text, "#iteration-detail pre.traceback"
    )
    await call(browser.click, '#iterations tr.iteration[data-index="1"]')
    await call(browser.wait, "iteration 1", lambda: browser.text('#iteration-detail[data-index="1"]'))
    assert await call(browser.text, "#iteration-detail .json.result pre") == "6"
    await call(browser.screenshot, "viewer-step-panel.png")

    # a result stored by reference: its key, and a button that fetches it
    big = await start(api, BIG_RESULT)
    await ended(api, big)
    await call(browser.open, f"{api.url}/ui/executions/{big}")
    await call(browser.wait, "the end of the execution", lambda: browser.body("live") == "done")
    await click_step(browser, "start")
    assert f"{big}/" in await call(browser.text, "#details .stored-value")
    await call(browser.click, "#details button.fetch-stored")
    await call(browser.wait, "the stored value", lambda: browser.text("#details .json.fetched pre"))
    assert (await call(browser.text, "#details .json.fetched pre")) == '"' + "x" * 300000 + '"'
    assert await call(browser.errors) == []


async def test_controls_pause_resume_cancel_and_retry_a_running_execution(
    api: Api, browser: Browser, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    execution_id = await start(api, GATE_BOOK, {"gate": str(gate)})
    await graph_when(api, execution_id, lambda g: any(s["status"] == "running" for s in g["steps"]))
    await call(browser.open, f"{api.url}/ui/executions/{execution_id}#token={TOKEN}")
    await call(browser.wait, "the running step", lambda: browser.nodes().get("wait") == "running")
    outcome = "#action-outcome"

    assert await call(browser.js, "return document.getElementById('action-retry').disabled")
    await call(browser.click, "#action-pause")
    await call(browser.wait, "the pause", lambda: browser.text(".summary .badge.paused") == "paused")
    assert "pause: accepted" in await call(browser.text, outcome)
    await call(browser.click, "#action-resume")
    await call(browser.wait, "the resume", lambda: not browser.text(".summary .badge.paused"))
    assert "resume: accepted" in await call(browser.text, outcome)

    await call(browser.click, "#action-cancel")  # asks first
    assert await call(browser.text, "#action-cancel") == "Confirm cancel"
    assert await call(browser.body, "executionStatus") == "running"
    await call(browser.click, "#action-cancel")
    await call(browser.wait, "the cancellation", lambda: browser.body("executionStatus") == "cancelled")
    await call(browser.wait, "the end of the stream", lambda: browser.body("live") == "done")
    assert "cancel: accepted" in await call(browser.text, outcome)
    assert (await call(browser.nodes))["wait"] == "cancelled"
    summary = await api.json("GET", f"/api/executions/{execution_id}")
    assert summary["status"] == "cancelled"
    open_gate(gate)  # the python step's loop ends; the execution stays cancelled

    # Retry: a new execution from the interrupted step, linked both ways.
    await call(browser.click, "#action-retry")
    await call(
        browser.wait,
        "the retry",
        lambda: browser.js(
            "return document.querySelector('#action-outcome a[data-execution-link]')?.dataset.executionLink"
        ),
    )
    retry = await call(browser.js, "return document.querySelector('#action-outcome a').dataset.executionLink")
    assert (await ended(api, retry))["status"] == "success"
    await call(
        browser.wait,
        "the link to the retry",
        lambda: (
            browser.js("return document.querySelector('.summary .retried-by a')?.dataset.executionLink")
            == retry
        ),
    )
    await call(browser.click, "#action-outcome a")
    await call(browser.wait, "the retry's page", lambda: browser.body("live") == "done")
    assert (
        await call(browser.js, "return document.querySelector('.summary .retry-of a').dataset.executionLink")
        == execution_id
    )
    assert await call(browser.nodes) == {"start": "ok", "wait": "ok", "after": "ok"}
    assert await call(browser.errors) == []  # (the refusals below are logged by the browser)

    # The API's refusal, shown: a successful execution has nothing to retry.
    await call(browser.click, "#action-retry")
    await call(
        browser.wait,
        "the refusal",
        lambda: browser.js("return document.getElementById('action-outcome').dataset.state") == "refused",
    )
    refused = await call(browser.text, outcome)
    assert "HTTP 409" in refused and "no failed step" in refused
    # and a token the API refuses
    await click_step(browser, "wait")
    await call(browser.js, "sessionStorage.setItem('noetl-viewer-token', 'not-a-token')")
    # (clicked when it is there: the panel is drawn again while its step's details are fetched again)
    await call(
        browser.wait,
        "the retry-from-step button",
        lambda: browser.js("const b = document.getElementById('retry-from-step'); b?.click(); return !!b"),
    )
    await call(browser.wait, "the refusal", lambda: "HTTP 401" in (browser.text(outcome) or ""))
    assert "the server refused the token" in await call(browser.text, outcome)
    assert await call(browser.body, "view") == "execution"  # the page stays: the refusal is shown


async def test_the_list_pages_filters_searches_and_links_retries(api: Api, browser: Browser) -> None:
    alphas = [await start(api, ALPHA) for _ in range(20)]
    betas = [await start(api, BETA) for _ in range(3)]
    for eid in (*alphas, *betas):
        await ended(api, eid)
    retry = (await api.json("POST", f"/api/executions/{betas[0]}/retry", 201))["execution_id"]
    await ended(api, retry)
    everyone = {*alphas, *betas, retry}
    await call(browser.driver.set_window_size, 1500, 1000)

    def rows() -> list[str]:
        return browser.js(  # type: ignore[no-any-return]
            "return Array.from(document.querySelectorAll('#executions tbody tr[data-execution-id]'),"
            " r => r.dataset.executionId)"
        )

    async def loaded(what: str) -> None:
        await call(browser.wait, what, lambda: browser.body("loaded") == "true")

    await call(browser.open, f"{api.url}/ui?limit=10#token={TOKEN}")
    await loaded("the first page")
    seen: list[str] = []
    for page, size in ((1, 10), (2, 10), (3, 4)):
        shown = await call(rows)
        assert len(shown) == size and await call(browser.body, "page") == str(page)
        seen += shown
        assert (
            await call(browser.text, "#count") == f"{(page - 1) * 10 + 1}\u2013{(page - 1) * 10 + size} of 24"
        )
        if page < 3:
            await call(browser.click, "#next-page")
            await call(
                browser.wait,
                f"page {page + 1}",
                lambda p=page: browser.body("page") == str(p + 1) and browser.body("loaded") == "true",
            )
    assert set(seen) == everyone and len(seen) == 24
    assert await call(browser.js, "return document.getElementById('next-page').disabled")
    await call(browser.click, "#prev-page")
    await call(
        browser.wait, "page 2", lambda: browser.body("page") == "2" and browser.body("loaded") == "true"
    )
    assert await call(rows) == seen[10:20]

    # started and duration columns
    first = f'#executions tr[data-execution-id="{seen[10]}"]'
    assert await call(browser.text, f"{first} td.started")
    assert (await call(browser.text, f"{first} td.duration")).endswith(("ms", "s"))

    async def set_input(selector: str, value: str, search: str) -> None:
        """Set a filter as typing does; the list reloads with it (its filters go to the address)."""
        event = "change" if selector.startswith("#status") else "input"
        await call(
            browser.js,
            "const e = document.querySelector(arguments[0]); e.value = arguments[1];"
            "e.dispatchEvent(new Event(arguments[2]))",
            selector,
            value,
            event,
        )
        await call(
            browser.wait,
            f"the list filtered by {search!r}",
            lambda: browser.js("return location.search") == search and browser.body("loaded") == "true",
        )

    await set_input("#status-filter", "failed", "?status=failed&limit=10")
    assert set(await call(rows)) == {*betas, retry}
    await set_input("#playbook-filter", "tests/alpha", "?status=failed&playbook=tests%2Falpha&limit=10")
    assert await call(rows) == []
    await set_input("#status-filter", "", "?playbook=tests%2Falpha&limit=10")
    shown = await call(rows)
    assert len(shown) == 10 and set(shown) <= set(alphas)
    assert await call(browser.body, "total") == "20"
    await set_input("#playbook-filter", "", "?limit=10")
    await set_input("#search", betas[1][:10].upper(), f"?q={betas[1][:10].upper()}&limit=10")
    assert await call(rows) == [betas[1]]
    await set_input("#search", "", "?limit=10")

    # the retry and its original link to each other
    await call(browser.open, f"{api.url}/ui?limit=25")
    await loaded("the whole list")
    row = f'#executions tr[data-execution-id="{retry}"]'
    assert (
        await call(browser.js, f"return document.querySelector('{row} .retry-of a').dataset.executionLink")
        == betas[0]
    )
    original = f'#executions tr[data-execution-id="{betas[0]}"]'
    assert (
        await call(
            browser.js, f"return document.querySelector('{original} .retried-by a').dataset.executionLink"
        )
        == retry
    )
    picture(browser, "viewer-list.png")
    assert await call(browser.errors) == []
