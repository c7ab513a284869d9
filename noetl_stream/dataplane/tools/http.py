"""``http``: one request with aiohttp, on one pooled session per worker.

Config: ``method`` (default GET), ``url`` (or its alias ``endpoint``; not both), ``params`` (query;
lists repeat the key), ``headers``, and a body from the first given of ``json`` (any JSON value;
``json: null`` sends the body ``null``), ``form`` (a mapping, sent urlencoded), ``body`` (str/bytes, sent
as is), ``payload`` (like ``body`` for str/bytes, else like ``json``) and ``data`` (str/bytes like
``body``; otherwise JSON, or urlencoded when the Content-Type header says form). On a GET, ``data`` is
not a body but query parameters, merged with ``params`` (``params`` wins a name both give). ``auth``
names a keychain entry: ``bearer``/``http_bearer`` {token}, ``basic``/``http_basic`` {username,
password}, or ``api_key`` {value, header (default ``X-API-Key``)} / {value, param} (a query parameter).
``verify_ssl: false`` skips the check of the server's certificate (NoETL's key; a task's ``timeout`` or
``timeout_seconds`` is compiled into ``spec.timeout``). ``spec.timeout``: ``{connect, read, total}`` in seconds, each a number or text holding one (a number sets
connect and read; defaults in ``dsl/kinds.py``; no total by default: ``total`` bounds a server that sends
a byte now and then, which no read timeout catches). ``spec.max_body_bytes`` (default 64 MiB; a whole
number or text holding one): a longer 2xx body is not read but fails the task with
``response_too_large``, so that one answer cannot take the worker's memory; a longer body of an error
status is cut there (the task still fails with that status's kind, ``outcome.http.truncated`` true).

``auth``'s header replaces a header of the same name in ``headers``, whatever its case (header names
are case-insensitive: one header, never two).

The result is an envelope: ``{status_code, headers, url, elapsed, data}`` (`envelope`), ``data`` the
body, which templates also read as ``body`` (``{{ fetch.body }}``, ``outcome.result.body``: a view's
alias). The body is JSON-decoded when the content type is JSON (after a UTF-8 byte order mark, if any)
or, whatever the content type, when it is a JSON object or array; else it is text (bytes that are not
UTF-8 text are base64 and ``outcome.http.encoding`` says so). A body of a JSON content type that is not
JSON (``{not json``, a number out of range like ``1e400``) is the text too, with the task still ``ok``
(the status decides that), and ``outcome.http.json_error`` says why it did not decode (absent when it
did). ``outcome.http``: ``status``, ``headers`` (lower-case names), ``url``,
``method``, ``elapsed_s`` and ``retry_after`` (seconds, from a ``Retry-After`` header, else None).

Errors: a non-2xx response fails the task with the envelope still its result (`status_error`: 429
``rate_limit`` and 5xx ``server_error``, retryable; 401/403 ``auth``, 404 ``not_found``, other 4xx
``client_error``, any other status ``http_error``; ``error.status`` is the status code); a refused or
dropped connection is ``connection_error`` and a connect/read timeout ``timeout``, both retryable with
``outcome.http.status`` None; a certificate or TLS handshake failure is ``tls_error`` and a URL that is
not http(s) ``config_error`` (neither retryable). Redirects are followed, but a header that
carries a credential (``auth``'s, or one named in `SENSITIVE_HEADERS`) is never sent to another origin
than the task's URL. Credential values never appear in the outcome: headers
that carry credentials are masked and every value of the credential used is redacted, also in the forms
the request carried it (URL-encoded in the query, the Basic header's base64 token: `secret_strings`), so
a server echoing the request shows ``***``. In the URLs of error messages, ``outcome.http`` and the
envelope (the request's, a redirect's, those in response headers), the password of a URL's userinfo
(``https://user:pw@host``) and the values of query parameters named like credentials (``access_token``,
``api_key``, ``sig``, ... `urlmask.SENSITIVE_PARAMS`, and the ``param`` of the ``api_key`` entry used)
are masked by the URL's structure: the same text outside a URL (a status reason) stays as it is.
"""

from __future__ import annotations

import base64
import contextlib
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import aiohttp
import msgspec
import yarl

from noetl_stream import __version__
from noetl_stream.dataplane.outcome import Outcome, json_safe
from noetl_stream.dataplane.tools.base import ToolContext, seconds
from noetl_stream.dataplane.tools.httpresponse import (
    decode_body,
    decode_cut,
    envelope,
    response_headers,
    retry_after_seconds,
    status_error,
)
from noetl_stream.dataplane.tools.urlmask import mask_urls, masked_url
from noetl_stream.errors import ConfigurationError, NoetlError
from noetl_stream.kv.keychain import CredentialNotFoundError, redact, secret_strings

if TYPE_CHECKING:  # client middlewares: aiohttp >= 3.12
    from aiohttp.client_middlewares import ClientHandlerType, ClientMiddlewareType

_SESSION_KEY = "http.session"
_BODY_KEYS = ("json", "form", "body", "payload", "data")
"""The keys that give a request body, in precedence order: the first given is the body."""
SENSITIVE_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "api-key", "x-auth-token"}
)
BEARER_KINDS = ("bearer", "http_bearer")
BASIC_KINDS = ("basic", "http_basic")
API_KEY_KINDS = ("api_key",)


class _ConfigError(NoetlError):
    pass


async def _new_session() -> aiohttp.ClientSession:
    # No cookie jar: the session is shared by every execution on the worker, and one execution's
    # cookies must never travel with another's requests.
    return aiohttp.ClientSession(
        cookie_jar=aiohttp.DummyCookieJar(),
        headers={"User-Agent": f"noetl-stream/{__version__}"},
        connector=aiohttp.TCPConnector(limit=256, ttl_dns_cache=60),
    )


async def _close_session(session: aiohttp.ClientSession) -> None:
    await session.close()


DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
"""The longest response body read without ``spec.max_body_bytes``."""


def _seconds(name: str, value: Any) -> float | None:
    """One timeout of ``spec.timeout`` (`base.seconds`: as the other tools take it)."""
    try:
        return seconds(value, name, " (or {connect, read, total})" if name == "spec.timeout" else "")
    except ValueError as exc:
        raise _ConfigError(str(exc)) from None


def _timeout(spec: Mapping[str, Any]) -> aiohttp.ClientTimeout:
    raw = spec.get("timeout")
    if isinstance(raw, Mapping):
        connect = _seconds("spec.timeout.connect", raw.get("connect"))
        read = _seconds("spec.timeout.read", raw.get("read"))
        total = _seconds("spec.timeout.total", raw.get("total"))
    else:
        connect = read = _seconds("spec.timeout", raw)
        total = None
    return aiohttp.ClientTimeout(total=total, sock_connect=connect, sock_read=read)


def _verify_ssl(value: Any) -> bool:
    """``verify_ssl`` (NoETL's key): false sends the request without checking the server's certificate."""
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if not isinstance(value, bool):
        raise _ConfigError(f"'verify_ssl' must be true or false, got {value!r}")
    return value


def _max_body(spec: Mapping[str, Any]) -> int:
    """``spec.max_body_bytes``: a positive whole number, or text holding one (``"1048576"``)."""
    raw = spec.get("max_body_bytes", DEFAULT_MAX_BODY_BYTES)
    value = raw.strip() if isinstance(raw, str) else raw
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _ConfigError(f"spec.max_body_bytes must be a positive number of bytes, got {raw!r}")
    return value


class _TooLargeError(NoetlError):
    """The response body is longer than ``spec.max_body_bytes``."""


def _param_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return str(value)
    return msgspec.json.encode(json_safe(value)).decode()


def _params(raw: Any, name: str = "params") -> list[tuple[str, str]]:
    if raw is None:
        return []
    if not isinstance(raw, Mapping):
        raise _ConfigError(f"'{name}' must be a mapping, got {type(raw).__name__}")
    out: list[tuple[str, str]] = []
    for key, value in raw.items():
        if value is None:
            continue
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is not None:
                out.append((str(key), _param_value(v)))
    return out


def _headers(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise _ConfigError(f"'headers' must be a mapping, got {type(raw).__name__}")
    return {str(k): _param_value(v) for k, v in raw.items() if v is not None}


def _given(config: Mapping[str, Any], key: str) -> bool:
    # `json` is any JSON value, null too: an explicit `json: null` sends the body `null`; the other
    # keys given as null send nothing.
    return key in config if key == "json" else config.get(key) is not None


def _body(
    config: Mapping[str, Any], method: str, headers: dict[str, str], params: list[tuple[str, str]]
) -> Any:
    """The request body: the first given of `_BODY_KEYS` (the others are ignored). On a GET, ``data`` is
    query parameters instead, added to `params` unless ``params`` gives that name."""
    keys: tuple[str, ...] = _BODY_KEYS
    if method == "GET" and config.get("data") is not None:
        given = {name for name, _ in params}
        params.extend(p for p in _params(config["data"], "data") if p[0] not in given)
        keys = keys[:-1]
    key = next((k for k in keys if _given(config, k)), None)
    if key is None:
        return None
    value = config[key]
    sent_as = key
    if key in ("payload", "data") and isinstance(value, (str, bytes)):
        sent_as = "body"
    elif key == "payload" or (key == "data" and not _says_form(headers)):
        sent_as = "json"
    elif key == "data":
        sent_as = "form"
    if sent_as == "json":
        if not any(h.lower() == "content-type" for h in headers):
            headers["Content-Type"] = "application/json"
        return msgspec.json.encode(json_safe(value))
    if sent_as == "form":
        if not isinstance(value, Mapping):
            why = " (the Content-Type says form)" if key == "data" else ""
            raise _ConfigError(f"'{key}' must be a mapping{why}, got {type(value).__name__}")
        return [(str(k), _param_value(v)) for k, v in value.items() if v is not None]
    if isinstance(value, (str, bytes)):
        return value
    raise _ConfigError(f"'{key}' must be a string or bytes, got {type(value).__name__}")


def _says_form(headers: Mapping[str, str]) -> bool:
    """The request's Content-Type is ``application/x-www-form-urlencoded``."""
    return any(
        k.lower() == "content-type" and v.lower().startswith("application/x-www-form-urlencoded")
        for k, v in headers.items()
    )


def _set_header(headers: dict[str, str], name: str, value: str) -> None:
    """Set the header `name`, replacing one of that name in any case (header names are case-insensitive:
    ``authorization`` and ``Authorization`` are one header, never both)."""
    for key in [k for k in headers if k.lower() == name.lower()]:
        del headers[key]
    headers[name] = value


def _apply_auth(
    cred: Mapping[str, Any], name: str, headers: dict[str, str], params: list[tuple[str, str]]
) -> tuple[str, str]:
    """Add the credential to the request; returns the (lower-case) names of the header and of the query
    parameter it set (each "" if none)."""
    kind = str(cred.get("kind", ""))

    def field(key: str) -> str:
        value = cred.get(key)
        if not isinstance(value, str) or not value:
            raise _ConfigError(f"keychain entry '{name}' (kind {kind}) has no '{key}'")
        return value

    if kind in BEARER_KINDS:
        # `value`: a declaration's `env:` (or a text `file:`) gives the token as {value: ...}.
        token = field("token") if "token" in cred or "value" not in cred else field("value")
        _set_header(headers, "Authorization", f"Bearer {token}")
        return "authorization", ""
    if kind in BASIC_KINDS:
        raw = f"{field('username')}:{cred.get('password') or ''}".encode()
        _set_header(headers, "Authorization", "Basic " + base64.b64encode(raw).decode())
        return "authorization", ""
    if kind in API_KEY_KINDS:
        value = field("value")
        param = cred.get("param")
        if isinstance(param, str) and param:
            params.append((param, value))
            return "", param.strip().lower()
        header = cred.get("header") or "X-API-Key"
        _set_header(headers, str(header), value)
        return str(header).lower(), ""
    raise _ConfigError(
        f"keychain entry '{name}' has kind '{kind}', which http auth does not use "
        f"(use one of {', '.join(BEARER_KINDS + BASIC_KINDS + API_KEY_KINDS)})"
    )


def _same_origin_only(url: str, names: list[str]) -> tuple[ClientMiddlewareType, ...]:
    """A middleware that drops the credential headers `names` from a request that a redirect sent to
    another origin (aiohttp drops only ``Authorization``, ``Cookie`` and ``Proxy-Authorization``; an
    api-key header would reach whatever host a ``Location`` names)."""
    try:
        origin = yarl.URL(url).origin()
    except ValueError:  # no absolute URL: the request fails before anything is sent
        return ()

    async def middleware(req: aiohttp.ClientRequest, handler: ClientHandlerType) -> aiohttp.ClientResponse:
        if req.url.origin() != origin:
            for name in names:
                req.headers.popall(name, None)
        return await handler(req)

    return (middleware,)


async def run_http(config: dict[str, Any], ctx: ToolContext) -> Outcome:
    secrets: set[str] = set()
    sensitive = SENSITIVE_HEADERS
    names: frozenset[str] = frozenset()  # query parameters masked in URLs besides urlmask's
    method = str(config.get("method") or "GET").upper()
    url = config.get("url")
    if url is None:
        url = config.get("endpoint")
    http: dict[str, Any] = {"status": None, "headers": {}, "url": url, "method": method, "retry_after": None}
    try:
        if config.get("url") is not None and config.get("endpoint") is not None:
            raise _ConfigError("give 'url' or its alias 'endpoint', not both")
        if not isinstance(url, str) or not url:
            raise _ConfigError("http task needs 'url' (a string)")
        timeout = _timeout(ctx.spec)
        max_body = _max_body(ctx.spec)
        params = _params(config.get("params"))
        headers = _headers(config.get("headers"))
        data = _body(config, method, headers, params)
        auth = config.get("auth")
        if auth is not None:
            if not isinstance(auth, str):
                raise _ConfigError("'auth' must name a keychain entry")
            cred = await ctx.credential(auth)
            secrets = secret_strings(cred)
            header, param = _apply_auth(cred, auth, headers, params)
            if header:
                sensitive = sensitive | {header}
            if param:
                names = frozenset({param})
        verify = _verify_ssl(config.get("verify_ssl", True))
        guarded = [name for name in headers if name.lower() in sensitive]
        middlewares = _same_origin_only(url, guarded) if guarded else ()
    except _ConfigError as exc:
        return _redacted(Outcome.fail("config_error", str(exc), http=http), secrets, names)
    except KeyError as exc:
        msg = (
            str(exc)
            if isinstance(exc, CredentialNotFoundError)
            else f"no keychain entry {config.get('auth')!r}"
        )
        return _redacted(Outcome.fail("credential_error", msg, http=http), secrets, names)
    except ConfigurationError as exc:
        return _redacted(Outcome.fail("credential_error", str(exc), http=http), secrets, names)

    shown = masked_url(url, names)  # the task's URL in messages
    started = time.monotonic()
    answered = False  # a response was read: the result is its envelope
    try:
        if ctx.services is not None:  # the worker's pooled session, kept open
            shared = await ctx.services.get_or_create(_SESSION_KEY, _new_session, _close_session)
            owned: Any = contextlib.nullcontext(shared)
        else:  # a session of its own, closed after the request
            owned = await _new_session()
        async with owned as session:
            outcome = await _request(
                session,
                method,
                url,
                shown,
                params,
                headers,
                data,
                timeout,
                max_body,
                http,
                sensitive,
                middlewares,
                verify,
            )
        answered = True
    except _TooLargeError as exc:
        outcome = Outcome.fail(
            "response_too_large",
            f"{method} {shown}: the response body is longer than {max_body} bytes{exc} (spec.max_body_bytes)",
            http=http,
        )
    except (aiohttp.ConnectionTimeoutError, aiohttp.SocketTimeoutError, TimeoutError) as exc:
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            phase, limit = "connect", timeout.sock_connect
        elif isinstance(exc, aiohttp.SocketTimeoutError) or timeout.total is None:
            phase, limit = "read", timeout.sock_read
        else:
            phase, limit = "request", timeout.total
        outcome = Outcome.fail(
            "timeout", f"{method} {shown}: {phase} timed out after {limit}s", retryable=True, http=http
        )
    except (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError) as exc:
        target = exc.url if isinstance(exc, aiohttp.InvalidURL) else (exc.args or [url])[0]
        what = "a redirect to" if isinstance(exc, aiohttp.RedirectClientError) else "invalid url"
        outcome = Outcome.fail(
            "config_error",
            f"{what} {masked_url(str(target), names)!r} (an http or https URL is needed)",
            http=http,
        )
    except aiohttp.ClientSSLError as exc:  # a certificate or handshake failure: retrying does not fix it
        what = (
            "the server's TLS certificate was not accepted"
            if isinstance(exc, aiohttp.ClientConnectorCertificateError)
            else "the TLS handshake failed"
        )
        outcome = Outcome.fail("tls_error", f"{method} {shown}: {what} ({_described(exc, names)})", http=http)
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
        outcome = Outcome.fail(
            "connection_error", f"{method} {shown}: {_described(exc, names)}", retryable=True, http=http
        )
    except aiohttp.TooManyRedirects as exc:
        outcome = Outcome.fail(
            "http_client_error", f"{method} {shown}: too many redirects ({len(exc.history)})", http=http
        )
    except aiohttp.ClientError as exc:
        outcome = Outcome.fail("http_client_error", f"{method} {shown}: {_described(exc, names)}", http=http)
    except ValueError as exc:  # e.g. a header value with a newline
        outcome = Outcome.fail("config_error", f"{method} {shown}: {mask_urls(str(exc), names)}", http=http)
    http["elapsed_s"] = round(time.monotonic() - started, 6)
    outcome = _redacted(outcome, secrets, names)
    if answered:  # after the masking: the envelope shares outcome.http's masked headers and URL
        outcome.result = envelope(outcome.helpers["http"], outcome.result)
    return outcome


async def _request(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    shown: str,
    params: list[tuple[str, str]],
    headers: dict[str, str],
    data: Any,
    timeout: aiohttp.ClientTimeout,
    max_body: int,
    http: dict[str, Any],
    sensitive: frozenset[str],
    middlewares: tuple[ClientMiddlewareType, ...],
    verify: bool = True,
) -> Outcome:
    async with session.request(
        method,
        url,
        params=params or None,
        headers=headers,
        data=data,
        timeout=timeout,
        middlewares=middlewares or None,
        ssl=verify,  # False: no certificate check (verify_ssl)
    ) as resp:
        http["status"] = resp.status
        http["headers"] = response_headers(resp.headers, sensitive)
        http["url"] = str(resp.url)
        ok = 200 <= resp.status < 300
        bodiless = method == "HEAD" or resp.status < 200 or resp.status in (204, 304)
        # An error status is the task's answer whatever its body's size: its body is cut at the limit
        # rather than failing the task with `response_too_large`, which would hide the status.
        if ok and not bodiless and resp.content_length is not None and resp.content_length > max_body:
            raise _TooLargeError(f" ({resp.content_length} announced)")
        chunks: list[bytes] = []
        size = 0
        cut = False
        if (
            resp.content_length is not None
            and resp.content_length <= max_body
            and resp.headers.get("Content-Encoding", "identity").lower() == "identity"
        ):  # (the usual case; a compressed body's length is not what it inflates to)
            chunks.append(await resp.read())  # (what it announced: the parser reads no more)
            size = len(chunks[0])
        async for chunk in resp.content.iter_chunked(256 * 1024):  # (the rest: none, or all of it)
            if size + len(chunk) > max_body:  # no Content-Length (chunked), or more than it said
                if ok:
                    raise _TooLargeError("")
                chunks.append(chunk[: max_body - size])
                cut = True
                break
            size += len(chunk)
            chunks.append(chunk)
        body = b"".join(chunks)
        http["retry_after"] = retry_after_seconds(resp.headers.get("Retry-After"))
        if cut:
            result, encoding, json_error = *decode_cut(body, resp.charset), None
            http["truncated"] = True
        else:
            result, encoding, json_error = decode_body(body, resp.content_type, resp.charset)
        if encoding:
            http["encoding"] = encoding
        if json_error:
            http["json_error"] = json_error
        if ok:
            return Outcome.ok(result, http=http)
        kind, retryable = status_error(resp.status)
        reason = f" {resp.reason}" if resp.reason else ""
        note = f" (the body is cut to its first {max_body} bytes: spec.max_body_bytes)" if cut else ""
        outcome = Outcome.fail(
            kind, f"{method} {shown} -> {resp.status}{reason}{note}", retryable=retryable, http=http
        )
        outcome.error = {**(outcome.error or {}), "status": resp.status}
        outcome.result = result
        return outcome


def _described(exc: BaseException, names: frozenset[str]) -> str:
    """An aiohttp exception as ``Type: text``, the URLs in its text masked (it may quote the request's)."""
    return mask_urls(f"{type(exc).__name__}: {exc}", names)


def _redacted(outcome: Outcome, secrets: set[str], names: frozenset[str]) -> Outcome:
    """The URLs of ``outcome.http`` masked by their structure, with `names` as credential parameters
    (messages are written with masked URLs); `secrets` (the credential's values and their encoded
    forms) masked everywhere as text, body included."""
    http = outcome.helpers.get("http")
    if isinstance(http, dict):
        if isinstance(http.get("url"), str):
            http["url"] = masked_url(http["url"], names)
        if isinstance(http.get("headers"), dict):
            http["headers"] = {name: mask_urls(value, names) for name, value in http["headers"].items()}
    if not secrets:
        return outcome
    outcome.error = redact(outcome.error, secrets)
    outcome.helpers = redact(outcome.helpers, secrets)
    outcome.result = redact(outcome.result, secrets)
    return outcome
