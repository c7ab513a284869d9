"""The execution viewer in a real headless Chromium (Debian's ``chromium`` + ``chromium-driver``,
installed by ``make chromium``), against the REST server of a real controller and worker.

Selenium is synchronous: every browser call runs in a thread, so the event loop keeps serving the
API the page reads. Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

import json
from pathlib import Path

from apiserver import TOKEN, Api
from viewer_support import GATE_BOOK, Browser, call, graph_when, open_gate, pipeline_book, start


async def test_the_execution_page_shows_the_graph_timeline_and_list(api: Api, browser: Browser) -> None:
    execution_id = await start(api, pipeline_book())
    await call(browser.open, f"{api.url}/ui/executions/{execution_id}#token={TOKEN}")
    await call(browser.wait, "the end of the execution", lambda: browser.body("live") == "done")

    assert await call(browser.body, "executionStatus") == "success"
    assert await call(browser.nodes) == {
        "start": "ok",
        "each": "ok",
        "flaky": "ok",
        "boom": "failed",
        "handle": "ok",
        "never": "unreached",
    }
    assert await call(browser.text, '#graph g.node[data-step="each"] .loop-progress') == "loop 4/5 · 1 failed"
    assert "1 retry" in (await call(browser.text, '#graph g.node[data-step="flaky"] .extra'))
    taken = await call(
        browser.js,
        "return Array.from(document.querySelectorAll('#graph path.arc'),"
        " a => [a.dataset.source + '>' + a.dataset.target, a.dataset.taken])",
    )
    assert dict(taken) == {
        "start>each": "1",
        "each>flaky": "1",
        "flaky>boom": "1",
        "boom>handle": "1",
        "boom>never": "0",
    }
    # the token left the address bar at once
    assert "token" not in await call(browser.js, "return location.href")

    # the timeline is every event, in stream order
    page = await api.json("GET", f"/api/executions/{execution_id}/events?limit=1000")
    shown = await call(
        browser.js,
        "return Array.from(document.querySelectorAll('#timeline tr.ev'), r => [Number(r.dataset.seq), r.dataset.event])",
    )
    assert shown == [[r["seq"], r["event"]["name"]] for r in page["events"]]
    assert shown[-1][1] == "playbook.processed"

    # a step's details
    await call(
        browser.js,
        "document.querySelector('#graph g.node[data-step=\"boom\"]').dispatchEvent(new MouseEvent('click'))",
    )
    details = await call(
        browser.wait, "boom's details", lambda: browser.text('#step-details[data-step="boom"]')
    )
    assert "ValueError" in details and "no luck" in details
    shot = await call(browser.screenshot, "viewer.png")
    assert shot.stat().st_size > 10_000
    assert await call(browser.errors) == []

    # the list: the token stays in the tab's session storage
    await call(browser.open, f"{api.url}/ui")
    row = f'#executions tr[data-execution-id="{execution_id}"]'
    await call(
        browser.wait,
        "the execution in the list",
        lambda: browser.js(f"return !!document.querySelector('{row}')"),
    )
    assert await call(browser.js, f"return document.querySelector('{row}').dataset.status") == "success"
    assert await call(browser.text, f"{row} td:nth-child(2)") == "tests/viewer"
    await call(browser.screenshot, "viewer-list.png")
    await call(browser.js, f"document.querySelector('{row} a').click()")
    await call(browser.wait, "the execution page again", lambda: browser.body("live") == "done")
    assert (await call(browser.nodes))["boom"] == "failed"
    assert await call(browser.errors) == []


async def test_the_page_follows_a_running_execution(api: Api, browser: Browser, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    execution_id = await start(api, GATE_BOOK, {"gate": str(gate)})
    await graph_when(api, execution_id, lambda g: any(s["status"] == "running" for s in g["steps"]))
    await call(browser.open, f"{api.url}/ui/executions/{execution_id}#token={TOKEN}")
    await call(browser.wait, "the running step", lambda: browser.nodes().get("wait") == "running")
    assert await call(browser.nodes) == {"start": "ok", "wait": "running", "after": "pending"}
    assert await call(browser.body, "live") == "following"
    assert await call(browser.body, "executionStatus") == "running"
    await call(browser.screenshot, "viewer-running.png")
    await call(browser.js, "window.sameDocument = true")

    open_gate(gate)
    await call(browser.wait, "the end of the execution", lambda: browser.body("live") == "done")
    assert await call(browser.nodes) == {"start": "ok", "wait": "ok", "after": "ok"}
    assert await call(browser.body, "executionStatus") == "success"
    assert await call(browser.js, "return window.sameDocument === true")  # updated in place, not reloaded
    events = await call(
        browser.js, "return Array.from(document.querySelectorAll('#timeline tr.ev'), r => r.dataset.event)"
    )
    assert events.count("step.done") == 3 and events[-1] == "playbook.processed"
    assert await call(browser.errors) == []


async def test_the_page_asks_for_a_token_and_refuses_a_wrong_one(api: Api, browser: Browser) -> None:
    await call(browser.open, f"{api.url}/ui")
    await call(browser.wait, "the token form", lambda: browser.body("view") == "login")

    async def submit(token: str) -> None:
        await call(
            browser.js,
            "document.getElementById('token-input').value = arguments[0];"
            "document.getElementById('login-form').requestSubmit()",
            token,
        )

    await submit("wrong")
    await call(
        browser.wait, "the refusal", lambda: browser.text("#login-error") == "the server refused the token"
    )
    assert await call(browser.js, "return sessionStorage.length") == 0
    await submit(TOKEN)
    await call(browser.wait, "the list", lambda: browser.body("loaded") == "true")
    assert await call(browser.body, "view") == "list"
    stored = await call(browser.js, "return JSON.stringify(Object.values(sessionStorage))")
    assert json.loads(stored) == [TOKEN]

    # an unknown execution: the API's answer, on the page
    await call(browser.open, f"{api.url}/ui/executions/no-such-run")
    await call(browser.wait, "the refusal", lambda: browser.text("#page-error") == "no execution no-such-run")
