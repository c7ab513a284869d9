"""What the viewer tests share: a headless Chromium driven by chromedriver (`Browser`), and the playbooks
they run: a loop, a retried task and a failure routed to a handler; a gate."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from apiserver import Api
from helpers import playbook

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WAIT_S = 30.0

# Without the background-networking switches Chromium stalls on a network that reaches nothing.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--no-proxy-server",
    "--window-size=1500,1100",
)

NODES_JS = (
    "return Array.from(document.querySelectorAll('#graph g.node'), n => [n.dataset.step, n.dataset.status])"
)


class Browser:
    """One Chromium with a fresh profile, driven by chromedriver."""

    def __init__(self, profile: Path) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for flag in (*FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
        self.driver.set_page_load_timeout(WAIT_S)

    def open(self, url: str) -> None:
        self.driver.get(url)

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def wait(self, what: str, check: Callable[[], Any]) -> Any:
        from selenium.common.exceptions import TimeoutException
        from selenium.webdriver.support.ui import WebDriverWait

        try:
            return WebDriverWait(self.driver, WAIT_S, poll_frequency=0.05).until(lambda _: check())
        except TimeoutException:
            raise AssertionError(f"the page never showed {what}; graph nodes: {self.nodes()}") from None

    def nodes(self) -> dict[str, str]:
        return dict(self.js(NODES_JS) or [])

    def body(self, key: str) -> str | None:
        return self.js("return document.body.dataset[arguments[0]] ?? null", key)  # type: ignore[no-any-return]

    def text(self, selector: str) -> str | None:
        return self.js("const e = document.querySelector(arguments[0]); return e && e.textContent", selector)  # type: ignore[no-any-return]

    def errors(self) -> list[str]:
        """Severe console entries (script errors, refused loads, CSP violations) since the last call."""
        return [e["message"] for e in self.driver.get_log("browser") if e["level"] == "SEVERE"]

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / name
        height = self.js("return Math.max(document.body.scrollHeight, 800)")
        self.driver.set_window_size(1500, min(int(height) + 40, 4000))
        assert self.driver.save_screenshot(str(path)), path
        return path

    def window_shot(self, path: Path) -> Path:
        """A screenshot of the window as it is (its size unchanged), to `path`."""
        path.parent.mkdir(parents=True, exist_ok=True)
        assert self.driver.save_screenshot(str(path)), path
        return path

    def click(self, selector: str) -> None:
        """A real click (the driver's: pointer events, a focus) on the element `selector` names; when the
        page re-renders the element between finding and clicking it (a live panel refreshing), the new
        one is found and clicked, as a person would click again."""
        from selenium.common.exceptions import StaleElementReferenceException
        from selenium.webdriver.common.by import By

        for attempt in range(5):
            try:
                self.driver.find_element(By.CSS_SELECTOR, selector).click()
                return
            except StaleElementReferenceException:
                if attempt == 4:
                    raise
                time.sleep(0.1)

    def click_at(self, selector: str, at: tuple[int, int]) -> None:
        """A real click on `selector`, `at` pixels from its middle."""
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.by import By

        element = self.driver.find_element(By.CSS_SELECTOR, selector)
        ActionChains(self.driver).move_to_element_with_offset(element, *at).click().perform()

    def drag(self, selector: str, dx: int, dy: int, at: tuple[int, int] = (0, 0)) -> None:
        """Press on `selector` (`at`: pixels from its middle), move by (dx, dy), release: the pointer
        events of a drag."""
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.by import By

        element = self.driver.find_element(By.CSS_SELECTOR, selector)
        chain = ActionChains(self.driver).move_to_element_with_offset(element, *at)
        chain.click_and_hold().move_by_offset(dx, dy).release().perform()

    def quit(self) -> None:
        self.driver.quit()


@contextlib.asynccontextmanager
async def open_browser() -> AsyncIterator[Browser]:
    """A Chromium with a fresh profile (the test fails, naming the packages, when it is not installed)."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.fail(
            f"the viewer tests need Debian's chromium and chromium-driver ({', '.join(missing)} missing): "
            "run `make chromium` (apt-get install chromium chromium-driver)"
        )
    with tempfile.TemporaryDirectory(prefix="noetl-chromium-") as profile:
        b = await asyncio.to_thread(Browser, Path(profile))
        try:
            yield b
        finally:
            await asyncio.to_thread(b.quit)


def call(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a (synchronous) browser call in a thread, so the event loop keeps serving the API."""
    return asyncio.to_thread(fn, *args)


def pipeline_book(exec_: str = "local") -> str:
    """start -> each (a best-effort loop over workload.items, one of which fails) -> flaky (a task
    retried once) -> boom (fails) -> handle (its failure arc); ``never`` is the arc not taken."""
    return playbook(
        f"""
        - step: start
          next: {{arcs: [{{step: each}}]}}
        - step: each
          spec: {{policy: {{failure: {{mode: best_effort}}}}}}
          loop:
            in: "{{{{ workload['items'] }}}}"
            iterator: x
            spec: {{mode: parallel, max_in_flight: 2, policy: {{exec: {exec_}}}}}
          tool:
            - name: divide
              kind: python
              args: {{x: "{{{{ iter.x }}}}"}}
              code: |
                result = 12 // x
          next:
            arcs: [{{step: flaky, when: "{{{{ event.name == 'loop.done' }}}}"}}]
        - step: flaky
          tool:
            - name: call
              kind: python
              args: {{attempt: "{{{{ _attempt }}}}"}}
              code: |
                if attempt < 2:
                    raise ConnectionError(f"attempt {{attempt}}")
                result = attempt
              spec:
                policy:
                  rules:
                    - when: "{{{{ outcome.status == 'error' }}}}"
                      then: {{do: retry, attempts: 3, delay: 0}}
          next: {{arcs: [{{step: boom}}]}}
        - step: boom
          tool: {{kind: python, code: "raise ValueError('no luck')"}}
          next:
            arcs:
              - step: handle
                when: "{{{{ event.name == 'step.failed' }}}}"
              - step: never
        - step: handle
          tool: {{kind: noop, result: handled}}
        - step: never
          tool: {{kind: noop, result: unexpected}}
        """,
        workload={"items": [1, 2, 0, 3, 4]},
        name="viewer",
    )


GATE_BOOK = playbook(
    """
    - step: start
      next: {arcs: [{step: wait}]}
    - step: wait
      tool:
        - name: gate
          kind: python
          args: {gate: "{{ workload.gate }}"}
          code: |
            import os, time
            deadline = time.monotonic() + 60
            while not os.path.exists(gate) and time.monotonic() < deadline:
                time.sleep(0.02)
            result = os.path.exists(gate)
      next: {arcs: [{step: after}]}
    - step: after
      tool: {kind: noop, result: done}
    """,
    name="gated",
)


async def start(api: Api, text: str, payload: dict[str, Any] | None = None) -> str:
    reply = await api.json("POST", "/api/executions", 201, json={"playbook": text, "payload": payload or {}})
    return str(reply["execution_id"])


async def graph_when(api: Api, execution_id: str, check: Any, timeout: float = 30.0) -> dict[str, Any]:
    """Poll the graph route until ``check(graph)`` holds; the last graph otherwise (in the error)."""
    graph: dict[str, Any] = {}
    try:
        async with asyncio.timeout(timeout):
            while True:
                graph = await api.json("GET", f"/api/executions/{execution_id}/graph")
                if check(graph):
                    return graph
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"the graph of {execution_id} never matched: {graph}") from None


def steps(graph: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in graph["steps"]}


def open_gate(path: Path) -> None:
    path.write_text("open")
