"""The REST API served in-process from a test runtime's controller, and a client for it."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp

from noetl_stream.api import ApiServer
from noetl_stream.kv.keychain import Keychain, KeychainKey
from noetl_stream.runtime.local import Runtime

TOKEN = "test-token-1"
OTHER_TOKEN = "test-token-2"
READ_TOKEN = "test-read-token"
"""A token that may only read (``--api-read-token``)."""


@dataclass
class Api:
    server: ApiServer
    session: aiohttp.ClientSession

    @property
    def url(self) -> str:
        return self.server.url

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        headers = {"Authorization": f"Bearer {TOKEN}", **kwargs.pop("headers", {})}
        return self.session.request(method, self.url + path, headers=headers, **kwargs)

    async def json(self, method: str, path: str, expect: int = 200, **kwargs: Any) -> Any:
        async with self.request(method, path, **kwargs) as resp:
            body = await resp.read()
            assert resp.status == expect, (method, path, resp.status, body[:2000])
            return json.loads(body) if body else None


@contextlib.asynccontextmanager
async def serve(rt: Runtime, keychain_key: KeychainKey | None = None) -> AsyncIterator[Api]:
    server = ApiServer(rt.controller, "127.0.0.1", 0, (TOKEN, OTHER_TOKEN), (READ_TOKEN,))
    if keychain_key is not None:
        server.context.keychain = Keychain(rt.nc.jetstream(), rt.topology, keychain_key)
    await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            yield Api(server, session)
    finally:
        await server.stop()


async def sse(resp: aiohttp.ClientResponse) -> list[dict[str, str]]:
    """Read a server-sent event stream to its end: one dict (id, event, data) per event."""
    out: list[dict[str, str]] = []
    current: dict[str, str] = {}
    async for raw in resp.content:
        line = raw.decode().rstrip("\n")
        if not line:
            if current:
                out.append(current)
            current = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(": ")
            current[key] = value
    return out
