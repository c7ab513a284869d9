"""Credentials in the forms a request carries them: URL-encoded in a query, the token of a Basic header.

A server that echoes the request (an error page quoting the path, a debug endpoint returning the
headers) shows those forms, not the value; they are ``***`` in every event like the value itself.
Real parts: a NATS server, the controller and a worker (``local_runtime``), the keychain in KV and an
aiohttp server that echoes the raw path and headers it received.
"""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote, quote_plus

import msgspec
import pytest
from aiohttp import web
from helpers import run

from noetl_stream.dataplane.tools.urlmask import mask_urls, masked_url
from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.keychain import Keychain, KeychainKey, generate_key, redact, secret_strings
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import local_runtime

BASIC_USER, BASIC_PASSWORD = "alice", "PWbasic_1a2b3c4d"
API_KEY = "AK+/key=5e6f7a8b"  # '+', '/' and '=' are written differently by every URL encoder
STATIC = "ST/secret+val=77 x"
BASIC_TOKEN = base64.b64encode(f"{BASIC_USER}:{BASIC_PASSWORD}".encode()).decode()


def forms(value: str) -> set[str]:
    """The ways a URL or form encoder writes `value` (what must never reach an event)."""
    return {value, quote(value, safe=""), quote(value), quote_plus(value), quote_plus(value, safe="/")}


class EchoServer:
    """Answers any path with ``{path, headers}`` as received (the raw, still-encoded path); the status is
    the path's first segment when it is a number (``/401``), else 200."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> EchoServer:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._echo)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _echo(self, request: web.Request) -> web.Response:
        info = {"path": request.raw_path, "headers": dict(request.headers)}
        self.seen.append(info)
        first = request.path.strip("/").split("/")[0]
        return web.json_response(info, status=int(first) if first.isdigit() else 200)


@pytest.fixture
async def echo() -> AsyncIterator[EchoServer]:
    server = await EchoServer().start()
    yield server
    await server.stop()


CONTINUE_ON_ERROR = """
      spec:
        policy:
          rules:
            - when: "{{ outcome.status == 'error' }}"
              then: {do: continue}"""


def _playbook(api: str) -> str:
    return f"""apiVersion: noetl.io/v2
kind: Playbook
metadata: {{name: encoded, path: tests/encoded}}
keychain:
  - {{name: kstatic, kind: static}}
workflow:
  - step: start
    tool:
    - name: basic
      kind: http
      url: {api}/401
      auth: kbasic{CONTINUE_ON_ERROR}
    - name: apiparam
      kind: http
      url: {api}/500
      auth: kapiparam{CONTINUE_ON_ERROR}
    - name: templated
      kind: http
      url: {api}/401
      params: {{q: "{{{{ keychain.kstatic.value }}}}"}}{CONTINUE_ON_ERROR}
    - name: printed
      kind: python
      args: {{v: "{{{{ keychain.kstatic.value }}}}"}}
      code: |
        from urllib.parse import quote, quote_plus
        print("quoted", quote(v, safe=""))
        result = {{"plus": quote_plus(v), "path": quote(v)}}
    - name: whole
      kind: secrets
      auth: kbasic
    - name: header
      kind: python
      args: {{c: "{{{{ whole }}}}"}}
      code: |
        import base64
        result = "Basic " + base64.b64encode((c["username"] + ":" + c["password"]).encode()).decode()
"""


async def test_encoded_forms_of_credentials_are_masked_in_every_event(
    nats_server: EmbeddedNats, topology: Topology, echo: EchoServer
) -> None:
    key = KeychainKey([generate_key()])
    async with local_runtime(nats_server.url, topology=topology, keychain_key=key) as rt:
        keychain = Keychain(rt.nc.jetstream(), topology, key)
        await keychain.put("kbasic", "basic", {"username": BASIC_USER, "password": BASIC_PASSWORD})
        await keychain.put("kapiparam", "api_key", {"value": API_KEY, "param": "appid"})
        await keychain.put("kstatic", "static", {"value": STATIC})
        r = await run(rt, _playbook(echo.url))
    assert r.status == "success", r.summary
    # The server got the real credentials, in their encoded forms ...
    sent = [s["path"] for s in echo.seen]
    assert sent == [
        "/401",
        f"/500?appid={quote(API_KEY, safe='/')}",
        f"/401?q={quote_plus(STATIC, safe='/')}",
    ]
    assert echo.seen[0]["headers"]["Authorization"] == f"Basic {BASIC_TOKEN}"

    def result(task: str) -> Any:
        (done,) = r.tasks("start", task)
        return done.payload

    # ... and what the echoes show in task.done is masked.
    assert result("basic")["result"]["data"]["headers"]["Authorization"] == "Basic ***"
    assert result("apiparam")["result"]["data"]["path"] == "/500?appid=***"
    assert result("templated")["result"]["data"]["path"] == "/401?q=***"
    assert result("printed")["result"] == {"plus": "***", "path": "***"}
    assert result("printed")["output"]["stdout"] == "quoted ***\n"
    assert result("header")["result"] == "Basic ***"
    everything = msgspec.json.encode([r.events, r.summary]).decode()
    leaked = [
        f for f in (*forms(API_KEY), *forms(STATIC), *forms(BASIC_PASSWORD), BASIC_TOKEN) if f in everything
    ]
    assert leaked == []
    assert all(s["path"].partition("=")[2] not in everything for s in echo.seen[1:])  # the wire forms


def test_secret_strings_hold_the_encoded_forms_of_long_values_only() -> None:
    strings = secret_strings({"kind": "basic", "username": BASIC_USER, "password": BASIC_PASSWORD})
    assert BASIC_TOKEN in strings and BASIC_USER not in strings  # a user name is not a secret
    assert forms(API_KEY) <= secret_strings(API_KEY)
    # A value shorter than 4 characters is masked only where a whole value equals it (`redact`); its
    # encoded forms (longer) would be masked inside any text, so they are not added.
    assert secret_strings("a b") == {"a b"}
    assert redact({"q": "x=a+b&y=a%20b", "v": "a b"}, secret_strings("a b")) == {
        "q": "x=a+b&y=a%20b",
        "v": "***",
    }
    text = f"GET /500?appid={quote(API_KEY, safe='/')}&from={quote_plus(API_KEY)} failed"
    assert redact(text, secret_strings(API_KEY)) == "GET /500?appid=***&from=*** failed"
    quoted = 'pw"with\\escapes-é'  # a json body carries it escaped; a text echo of the body shows that
    body = json.dumps({"password": quoted})
    assert redact(body, secret_strings({"password": quoted})) == '{"password": "***"}'


def test_url_masking_takes_the_parameter_an_api_key_credential_names() -> None:
    url = "https://api.example/v1/items?appid=AK%2b%2fkey&page=2#appid=frag"
    assert masked_url(url) == url  # appid is not a name urlmask knows
    assert masked_url(url, {"appid"}) == "https://api.example/v1/items?appid=***&page=2#appid=***"
    text = "error at /v1/items?page=2&appid=AK%2b%2fkey (see <https://api.example/x?AppId=z>)"
    assert (
        mask_urls(text, {"appid"})
        == "error at /v1/items?page=2&appid=*** (see <https://api.example/x?AppId=***>)"
    )
