"""The API tests' fixtures: an API server on the test's runtime (`apiserver.serve`: an operator token and
a read-only one) and a headless browser for the viewer's tests (`viewer_support.open_browser`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from apiserver import Api, serve
from viewer_support import Browser, open_browser

from noetl_stream.runtime.local import Runtime


@pytest.fixture
async def api(runtime: Runtime) -> AsyncIterator[Api]:
    async with serve(runtime) as client:
        yield client


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with open_browser() as b:
        yield b
