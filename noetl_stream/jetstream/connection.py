"""NATS connections with production options: reconnect with jittered backoff, a bounded wait for the
first connection, per-identity settings from the environment (creds, a private CA, an inbox prefix), and
error messages without credentials."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import random
import re
import ssl
from collections.abc import Sequence
from typing import Any

import structlog
from nats.aio.client import Client as NATS

from noetl_stream.errors import ConfigurationError
from noetl_stream.jetstream.fastpath import UnsupportedClientError, require_client_internals

__all__ = ["connect", "nats_tls_context", "redact_urls", "refusal"]

log = structlog.get_logger(__name__)


def _backoff(attempt: int, base: float = 0.1, cap: float = 5.0) -> float:
    """Exponential backoff with full jitter in [d/2, d]."""
    d = min(cap, base * 2.0 ** min(attempt, 16))
    return d / 2 + random.random() * d / 2


def _pick_server(servers: list[Any], _info: dict[str, Any]) -> tuple[Any, float]:
    s = min(servers, key=lambda srv: srv.reconnects)
    return s, _backoff(s.reconnects)


_USERINFO = re.compile(r"(?<=://)[^/@\s,]*@")


def refusal(nc: NATS) -> str | None:
    """The server's last refusal of a publish or subscription of this connection (a permissions
    violation), or None. A refused request is otherwise only a timeout: nothing ever answers it."""
    err = nc.last_error
    text = str(err) if err is not None else ""
    return text.removeprefix("nats: ") if "permissions violation" in text.lower() else None


# Per-identity connection settings from the environment (deploy/: each role has its own NATS user).
CREDS_ENV = "NOETL_NATS_CREDS"
"""A ``.creds`` file (user JWT and NKey seed) to authenticate with."""
CA_ENV = "NOETL_NATS_CA"
"""A PEM file of the CA certificate(s) that signed the NATS servers' certificates (a private CA)."""
INBOX_PREFIX_ENV = "NOETL_NATS_INBOX_PREFIX"


def _readable(variable: str, path: str) -> str:
    try:
        with open(path, "rb"):
            return path
    except OSError as exc:
        raise ConfigurationError(f"{variable}={path}: cannot read it ({exc.strerror or exc})") from None


def nats_tls_context(ca_file: str) -> ssl.SSLContext:
    """The TLS context of the NATS connection for servers signed by a private CA: it trusts the CA
    certificates in `ca_file` (PEM) and nothing else, as ``nats --tlsca`` does, and verifies the server's
    host name. Only the NATS connection uses it: every other TLS connection of the process (a worker's
    ``http`` tasks, databases) keeps the system's CAs. (Setting ``SSL_CERT_FILE`` to the private CA
    instead made Python's default context trust that CA alone, for every connection of the process.)"""
    try:
        return ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=_readable(CA_ENV, ca_file))
    except ssl.SSLError as exc:
        raise ConfigurationError(
            f"{CA_ENV}={ca_file}: no PEM CA certificate in it ({exc.reason or exc})"
        ) from None


def _environment_options() -> dict[str, Any]:
    """`connect` options from ``NOETL_NATS_CREDS``, ``NOETL_NATS_CA`` and ``NOETL_NATS_INBOX_PREFIX``."""
    opts: dict[str, Any] = {}
    if creds := os.environ.get(CREDS_ENV):
        opts["user_credentials"] = _readable(CREDS_ENV, creds)
    if ca_file := os.environ.get(CA_ENV):
        opts["tls"] = nats_tls_context(ca_file)
    if inbox_prefix := os.environ.get(INBOX_PREFIX_ENV):
        opts["inbox_prefix"] = inbox_prefix.encode()
    return opts


def redact_urls(text: str) -> str:
    """`text` with the user, password or token of every ``scheme://user:pass@host`` URL replaced (an error
    message must not carry them)."""
    return _USERINFO.sub("***@", text)


async def connect(
    url: str | Sequence[str],
    *,
    name: str = "noetl-stream",
    max_reconnect_attempts: int = -1,
    connect_wait_s: float | None = 30.0,
    pending_size: int = 64 * 1024 * 1024,
    **options: Any,
) -> NATS:
    """Connect to one server or a cluster with reconnect-forever (jittered exponential backoff)
    and logging callbacks.

    From the environment: ``NOETL_NATS_CREDS`` (a ``.creds`` file), ``NOETL_NATS_CA`` (the CA of
    servers with certificates of a private CA, for this connection only: `nats_tls_context`) and
    ``NOETL_NATS_INBOX_PREFIX``; a file that cannot be read raises `ConfigurationError`.
    `connect_wait_s` bounds the first connection (None waits forever, for components started
    before their server). Extra `options` go to ``nats.connect``.
    """
    nc = NATS()
    bound = log.bind(nats_client=name)
    # Until the first connection: each distinct error logged once (a server not up yet fails the same
    # way every second), the last one named in the error raised if no connection is made in time.
    connecting = True
    seen: set[str] = set()
    last_error = ""

    async def on_error(e: Exception) -> None:
        nonlocal last_error
        error = str(e) or type(e).__name__
        if connecting:
            last_error = error
            # A bounded first connection names its last error when it gives up: no line before that.
            if error in seen or connect_wait_s is not None:
                bound.debug("nats.error", error=error, kind=type(e).__name__)
                return
            seen.add(error)
            bound.warning(
                "nats.cannot_connect",
                error=error,
                kind=type(e).__name__,
                servers=shown,
                hint="retrying until a server answers (logged again only when the error changes)",
            )
            return
        bound.warning("nats.error", error=error, kind=type(e).__name__)

    async def on_disconnected() -> None:
        if nc.is_closed:  # our own close()
            bound.debug("nats.disconnected")
        else:
            bound.warning("nats.disconnected")

    async def on_reconnected() -> None:
        bound.info("nats.reconnected", server=nc.connected_url.netloc if nc.connected_url else None)

    async def on_closed() -> None:
        bound.info("nats.closed")

    opts: dict[str, Any] = {
        "name": name,
        "error_cb": on_error,
        "disconnected_cb": on_disconnected,
        "reconnected_cb": on_reconnected,
        "closed_cb": on_closed,
        "allow_reconnect": True,
        "max_reconnect_attempts": max_reconnect_attempts,
        "reconnect_time_wait": 1,
        "ping_interval": 20,
        "max_outstanding_pings": 3,
        "pending_size": pending_size,
    }
    if "reconnect_to_server_handler" in inspect.signature(NATS.connect).parameters:
        opts["reconnect_to_server_handler"] = _pick_server
    # Per-identity settings from the environment (deploy/: each role has its own NATS user); explicit
    # `options` win.
    opts.update(_environment_options())
    opts.update(options)
    # One URL, a comma-separated list (``nats://a:4222,nats://b:4222``, as NOETL_NATS_URL takes
    # them), or a sequence: the client connects to any of them and fails over to the others.
    servers = [u.strip() for u in url.split(",") if u.strip()] if isinstance(url, str) else list(url)
    shown = redact_urls(", ".join(servers))
    try:
        async with asyncio.timeout(connect_wait_s):
            await nc.connect(servers, **opts)
    except asyncio.CancelledError:  # the process is stopping before it ever connected
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                await nc.close()
        raise
    except TimeoutError:
        await nc.close()
        reason = f" (last error: {last_error})" if last_error else ""
        raise ConnectionError(f"cannot connect to NATS at {shown} within {connect_wait_s}s{reason}") from None
    connecting = False
    try:
        require_client_internals(nc)
    except UnsupportedClientError:
        await nc.close()
        raise
    return nc
