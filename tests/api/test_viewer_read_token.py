"""The viewer with a read-only token (``--api-read-token``), in a real headless Chromium against a real
controller and worker: it asks ``GET /api/session`` once per page load and disables the action buttons,
saying why; an action the server refuses with 403 is shown in the outcome line."""

from __future__ import annotations

from pathlib import Path

from apiserver import READ_TOKEN, TOKEN, Api
from viewer_support import GATE_BOOK, Browser, call, graph_when, open_gate, start

READ_ONLY = "this token may only read"
ACTIONS = ("cancel", "pause", "resume", "retry")
BUTTONS_JS = """
return Array.from(document.querySelectorAll('#controls button.action'),
                  b => [b.dataset.action, b.disabled, b.title]);
"""


async def buttons(b: Browser) -> dict[str, tuple[bool, str]]:
    return {action: (disabled, title) for action, disabled, title in await call(b.js, BUTTONS_JS)}


async def test_a_read_only_token_sees_the_actions_disabled_and_a_403_is_shown(
    api: Api, browser: Browser, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    execution_id = await start(api, GATE_BOOK, {"gate": str(gate)})
    await graph_when(api, execution_id, lambda g: any(s["status"] == "running" for s in g["steps"]))
    page = f"{api.url}/ui/executions/{execution_id}"
    outcome = "#action-outcome"

    # An operator's page whose token is then swapped for a read-only one: the server's 403 is shown.
    await call(browser.open, f"{page}#token={TOKEN}")
    await call(browser.wait, "the running step", lambda: browser.nodes().get("wait") == "running")
    assert await call(browser.body, "may") == "read operate"
    shown = await buttons(browser)
    assert not shown["pause"][0] and not shown["cancel"][0], shown
    await call(browser.js, "sessionStorage.setItem('noetl-viewer-token', arguments[0])", READ_TOKEN)
    await call(browser.click, "#action-pause")
    await call(browser.wait, "the refusal", lambda: "HTTP 403" in (browser.text(outcome) or ""))
    refused = await call(browser.text, outcome)
    assert refused.startswith("pause refused (HTTP 403): " + READ_ONLY), refused
    assert await call(browser.js, "return document.getElementById('action-outcome').dataset.state") == (
        "refused"
    )
    assert (await api.json("GET", f"/api/executions/{execution_id}"))["status"] == "running"  # not paused

    # A page opened with the read-only token: every action button is disabled and says why.
    await call(browser.open, "about:blank")  # (only the fragment differing, the page would not load again)
    await call(browser.open, f"{page}#token={READ_TOKEN}")
    await call(browser.wait, "the running step", lambda: browser.nodes().get("wait") == "running")
    assert await call(browser.body, "may") == "read"
    shown = await buttons(browser)
    assert set(shown) == set(ACTIONS), shown
    for action, (disabled, title) in shown.items():
        assert disabled and title.startswith(READ_ONLY), (action, disabled, title)

    # still so once it has ended (an operator's retry buttons are enabled then), the step's one included
    open_gate(gate)
    await call(browser.wait, "the end", lambda: browser.body("executionStatus") == "success")
    shown = await buttons(browser)
    assert all(disabled and title.startswith(READ_ONLY) for disabled, title in shown.values()), shown
    await call(browser.click, '#graph g.node[data-step="wait"]')
    await call(
        browser.wait,
        "the step's retry button",
        lambda: browser.js("return !!document.getElementById('retry-from-step')"),
    )
    retry_here = await call(
        browser.js, "const b = document.getElementById('retry-from-step'); return [b.disabled, b.title]"
    )
    assert retry_here[0] and retry_here[1].startswith(READ_ONLY), retry_here
    errors = await call(browser.errors)  # no script error (the refused request is logged by the browser)
    assert all("403" in e for e in errors), errors
