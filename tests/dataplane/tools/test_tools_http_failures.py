"""The ``http`` tool's failure edges, end to end: credentials on redirects and in headers of any case,
TLS, URLs that are not http."""

from __future__ import annotations

import datetime
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from helpers import playbook, run
from httpserver import HttpServer

from noetl_stream.jetstream.embedded import EmbeddedNats
from noetl_stream.kv.keychain import Keychain, KeychainKey, generate_key
from noetl_stream.protocol.subjects import Topology
from noetl_stream.runtime.local import local_runtime

API_KEY = "key-SECRET-probe-4c1d9e"
TOKEN = "tok-SECRET-probe-0a7b3f"


@pytest.fixture
async def server() -> AsyncIterator[HttpServer]:
    srv = await HttpServer().start()
    yield srv
    await srv.stop()


async def _site(app: web.Application, ssl_context: ssl.SSLContext | None = None) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    assert site._server is not None
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]


class Redirector:
    """``/to?url=U`` answers 302 to U, ``/loop`` redirects to itself, ``/seen`` records the
    ``X-Token`` header it got (None when absent) in `seen`, ``/linked`` answers 500 with the URL it was
    asked for in a ``Link`` header (absolute) and a ``Content-Location`` header (path and query)."""

    def __init__(self) -> None:
        self.seen: list[str | None] = []
        self.url = ""

    async def to(self, request: web.Request) -> web.Response:
        raise web.HTTPFound(request.query["url"])

    async def loop(self, request: web.Request) -> web.Response:
        raise web.HTTPFound("/loop")

    async def record(self, request: web.Request) -> web.Response:
        self.seen.append(request.headers.get("X-Token"))
        return web.json_response({})

    async def linked(self, request: web.Request) -> web.Response:
        headers = {"Link": f'<{request.url}>; rel="self"', "Content-Location": request.path_qs}
        return web.json_response({}, status=500, headers=headers)


@pytest.fixture
async def redirector() -> AsyncIterator[Redirector]:
    r = Redirector()
    app = web.Application()
    app.router.add_get("/to", r.to)
    app.router.add_get("/loop", r.loop)
    app.router.add_get("/seen", r.record)
    app.router.add_get("/linked", r.linked)
    runner, port = await _site(app)
    r.url = f"http://127.0.0.1:{port}"
    yield r
    await runner.cleanup()


@pytest.fixture
async def self_signed(tmp_path: Path) -> AsyncIterator[str]:
    """An https server whose certificate no client trusts."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(private, hashes.SHA256())
    )
    key.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(cert), str(key))

    async def hello(_: web.Request) -> web.Response:
        return web.Response(text="hi")

    app = web.Application()
    app.router.add_get("/", hello)
    runner, port = await _site(app, context)
    yield f"https://127.0.0.1:{port}"
    await runner.cleanup()


async def test_api_key_header_is_not_sent_to_another_origin_on_redirect(
    nats_server: EmbeddedNats, topology: Topology, server: HttpServer, redirector: Redirector
) -> None:
    # The same server under another host name is another origin: a Location pointing there must not
    # receive the credential (aiohttp itself drops only Authorization); a same-origin redirect keeps it.
    other = server.url.replace("127.0.0.1", "localhost")
    key = KeychainKey([generate_key()])
    text = playbook(
        """
        - step: start
          tool:
            - name: away
              kind: http
              url: "{{ redirector }}/to"
              params: {url: "{{ other }}/echo"}
              auth: api
            - name: home
              kind: http
              url: "{{ redirector }}/to"
              params: {url: /seen}
              auth: api
            - name: same
              kind: http
              url: "{{ api }}/echo"
              auth: api
            - name: out
              kind: noop
              result: {away: "{{ away.data.headers }}", same: "{{ same.data.headers }}"}
        """,
        workload={"api": server.url, "other": other, "redirector": redirector.url},
    )
    async with local_runtime(nats_server.url, topology=topology, keychain_key=key) as rt:
        await Keychain(rt.nc.jetstream(), topology, key).put(
            "api", "api_key", {"header": "X-Token", "value": API_KEY}
        )
        r = await run(rt, text)
    assert r.status == "success", r.summary
    assert [s["headers"].get("X-Token") for s in server.seen] == [None, API_KEY]
    assert redirector.seen == [API_KEY]
    result = r.step_result("start")
    assert "X-Token" not in result["away"] and result["same"]["X-Token"] == "***"
    assert API_KEY not in msgspec.json.encode(r.events).decode()


async def test_untrusted_certificate_is_a_tls_error_not_retryable(
    nats_server: EmbeddedNats, topology: Topology, self_signed: str
) -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: http
            url: "{{ api }}/"
            spec:
              policy:
                rules:
                  - when: "{{ outcome.status == 'error' and outcome.error.retryable }}"
                    then: {do: retry, attempts: 3, delay: 0}
                  - when: "{{ outcome.status == 'error' }}"
                    then: {do: fail}
        """,
        workload={"api": self_signed},
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "failed"
    err = r.step_error("start")
    assert err["kind"] == "tls_error" and err["retryable"] is False
    assert "the server's TLS certificate was not accepted" in err["message"]
    assert len(r.tasks("start")) == 1  # not retried


async def test_verify_ssl_false_accepts_a_certificate_no_client_trusts(
    nats_server: EmbeddedNats, topology: Topology, self_signed: str
) -> None:
    """NoETL's ``verify_ssl: false`` (and a timeout in NoETL's spelling): the request is sent without
    checking the certificate; ``verify_ssl: true`` (the default) still refuses it."""
    text = playbook(
        """
        - step: start
          tool:
            - {name: unchecked, kind: http, url: "{{ api }}/", verify_ssl: false, timeout_seconds: 5}
            - {name: checked, kind: http, url: "{{ api }}/", verify_ssl: "true"}
        """,
        workload={"api": self_signed},
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "failed"
    unchecked, checked = r.tasks("start")
    assert unchecked.payload["status"] == "ok" and unchecked.payload["result"]["status_code"] == 200
    assert checked.payload["error"]["kind"] == "tls_error"


@pytest.mark.parametrize("url", ["127.0.0.1:9/items", "ftp://127.0.0.1/items"])
async def test_url_that_is_not_http_is_a_config_error(
    nats_server: EmbeddedNats, topology: Topology, url: str
) -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: http, url: "{{ target }}"}
        """,
        workload={"target": url},
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "failed"
    err = r.step_error("start")
    assert err["kind"] == "config_error", err
    assert repr(url) in err["message"] and "http or https" in err["message"]


async def test_redirect_loop_says_so(
    nats_server: EmbeddedNats, topology: Topology, redirector: Redirector
) -> None:
    text = playbook(
        """
        - step: start
          tool: {kind: http, url: "{{ loop }}"}
        """,
        workload={"loop": f"{redirector.url}/loop"},
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    err = r.step_error("start")
    assert err["kind"] == "http_client_error" and "too many redirects" in err["message"], err


class HeaderCounter:
    """``/`` records every value of the headers in `NAMES` it got (a repeated header is two values)."""

    NAMES = ("Authorization", "X-Token", "Content-Type")

    def __init__(self) -> None:
        self.seen: list[dict[str, list[str]]] = []
        self.url = ""

    async def record(self, request: web.Request) -> web.Response:
        self.seen.append({name: request.headers.getall(name, []) for name in self.NAMES})
        return web.json_response({})


@pytest.fixture
async def header_counter() -> AsyncIterator[HeaderCounter]:
    c = HeaderCounter()
    app = web.Application()
    app.router.add_route("*", "/", c.record)
    runner, port = await _site(app)
    c.url = f"http://127.0.0.1:{port}/"
    yield c
    await runner.cleanup()


async def test_auth_header_replaces_the_same_header_in_any_case(
    nats_server: EmbeddedNats, topology: Topology, header_counter: HeaderCounter
) -> None:
    # Header names are case-insensitive: `authorization` given in `headers` and `auth`'s Authorization
    # are one header, and `auth` sets it (as for `Authorization` spelled alike), never both; so for an
    # api_key entry's header. The json body's Content-Type yields to one given in any case.
    key = KeychainKey([generate_key()])
    text = playbook(
        """
        - step: start
          tool:
            - name: same_case
              kind: http
              url: "{{ url }}"
              headers: {Authorization: Bearer mine}
              auth: tok
            - name: lower_case
              kind: http
              url: "{{ url }}"
              headers: {authorization: Bearer mine}
              auth: tok
            - name: api_key
              kind: http
              url: "{{ url }}"
              headers: {x-TOKEN: mine}
              auth: api
            - name: json_type
              kind: http
              method: POST
              url: "{{ url }}"
              headers: {content-type: application/vnd.x+json}
              json: {a: 1}
        """,
        workload={"url": header_counter.url},
    )
    async with local_runtime(nats_server.url, topology=topology, keychain_key=key) as rt:
        keychain = Keychain(rt.nc.jetstream(), topology, key)
        await keychain.put("tok", "bearer", {"token": TOKEN})
        await keychain.put("api", "api_key", {"header": "X-Token", "value": API_KEY})
        r = await run(rt, text)
    assert r.status == "success", r.summary
    bearer = [f"Bearer {TOKEN}"]
    assert header_counter.seen == [
        {"Authorization": bearer, "X-Token": [], "Content-Type": []},
        {"Authorization": bearer, "X-Token": [], "Content-Type": []},
        {"Authorization": [], "X-Token": [API_KEY], "Content-Type": []},
        {"Authorization": [], "X-Token": [], "Content-Type": ["application/vnd.x+json"]},
    ]
    everything = msgspec.json.encode(r.events).decode()
    assert TOKEN not in everything and API_KEY not in everything


async def test_credential_params_are_masked_in_urls_not_in_the_rest_of_the_text(
    nats_server: EmbeddedNats, topology: Topology, server: HttpServer, redirector: Redirector
) -> None:
    # Before: a credential param's value was replaced wherever it occurred as a substring, so `key: auth`
    # gave "GET .../status/401 -> 401 Un***orized" and `token: Error` "-> 500 Internal Server ***".
    # Now the values are masked inside URLs only: the request's, a redirect's, those in response headers.
    link_token = "tok-LINK-77aa+/="
    redirect_token = "tok-REDIR-5b5b"
    capture = '{do: continue, set_iter: {msg: "{{ outcome.error.message }}", http: "{{ outcome.http }}"}}'
    text = playbook(
        f"""
        - step: start
          tool:
            - name: unauthorized
              kind: http
              url: "{{{{ api }}}}/status/401"
              params: {{key: auth, page: 2}}
              spec: {{policy: {{rules: [{{else: {{then: {capture}}}}}]}}}}
            - name: keep_401
              kind: noop
              spec: {{policy: {{rules: [{{else: {{then: {{do: continue, set_iter: {{a: "{{{{ iter.msg }}}}", a_url: "{{{{ iter.http.url }}}}"}}}}}}}}]}}}}
            - name: server_error
              kind: http
              url: "{{{{ api }}}}/status/500"
              params: {{token: Error}}
              spec: {{policy: {{rules: [{{else: {{then: {capture}}}}}]}}}}
            - name: keep_500
              kind: noop
              spec: {{policy: {{rules: [{{else: {{then: {{do: continue, set_iter: {{b: "{{{{ iter.msg }}}}", b_url: "{{{{ iter.http.url }}}}"}}}}}}}}]}}}}
            - name: linked
              kind: http
              url: "{{{{ redirector }}}}/linked?page=3"
              params: {{access_token: "{{{{ link_token }}}}"}}
              spec: {{policy: {{rules: [{{else: {{then: {capture}}}}}]}}}}
            - name: keep_linked
              kind: noop
              spec: {{policy: {{rules: [{{else: {{then: {{do: continue, set_iter: {{c: "{{{{ iter.msg }}}}", c_http: "{{{{ iter.http }}}}"}}}}}}}}]}}}}
            - name: redirected
              kind: http
              url: "{{{{ redirector }}}}/to"
              params: {{url: "{{{{ api }}}}/status/503?x=1&token={{{{ redirect_token }}}}"}}
              spec: {{policy: {{rules: [{{else: {{then: {capture}}}}}]}}}}
            - name: out
              kind: noop
              result:
                a: "{{{{ iter.a }}}}"
                a_url: "{{{{ iter.a_url }}}}"
                b: "{{{{ iter.b }}}}"
                b_url: "{{{{ iter.b_url }}}}"
                c: "{{{{ iter.c }}}}"
                c_http: "{{{{ iter.c_http }}}}"
                d: "{{{{ iter.msg }}}}"
                d_url: "{{{{ iter.http.url }}}}"
        """,
        workload={
            "api": server.url,
            "redirector": redirector.url,
            "link_token": link_token,
            "redirect_token": redirect_token,
        },
    )
    async with local_runtime(nats_server.url, topology=topology) as rt:
        r = await run(rt, text)
    assert r.status == "success", r.summary
    out = r.step_result("start")
    assert out["a"] == f"GET {server.url}/status/401 -> 401 Unauthorized"
    assert out["a_url"] == f"{server.url}/status/401?key=***&page=2"
    assert out["b"] == f"GET {server.url}/status/500 -> 500 Internal Server Error"
    assert out["b_url"] == f"{server.url}/status/500?token=***"
    assert out["c"] == f"GET {redirector.url}/linked?page=3 -> 500 Internal Server Error"
    assert out["c_http"]["url"] == f"{redirector.url}/linked?page=3&access_token=***"
    assert (
        out["c_http"]["headers"]["link"] == f'<{redirector.url}/linked?page=3&access_token=***>; rel="self"'
    )
    assert out["c_http"]["headers"]["content-location"] == "/linked?page=3&access_token=***"
    assert out["d"] == f"GET {redirector.url}/to -> 503 Service Unavailable"
    assert out["d_url"] == f"{server.url}/status/503?x=1&token=***"
    reported = msgspec.json.encode([out, [e.payload for e in r.tasks("start")]]).decode()
    for secret in ("tok-LINK-77aa", "tok-LINK-77aa%2B", redirect_token):
        assert secret not in reported
