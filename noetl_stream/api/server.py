"""Serving the REST API from the controller process (``noetl-stream controller --http HOST:PORT``)."""

from __future__ import annotations

import asyncio
import os

import structlog
from aiohttp import web

from noetl_stream.api.app import build_app
from noetl_stream.api.http import END_OF_STREAM, ApiContext
from noetl_stream.control.controller import Controller
from noetl_stream.control.metrics import Metrics
from noetl_stream.errors import ConfigurationError

__all__ = [
    "READ_TOKENS_ENV",
    "TOKENS_ENV",
    "ApiServer",
    "http_url",
    "listen_text",
    "parse_listen",
    "tokens_from",
]

log = structlog.get_logger(__name__)

TOKENS_ENV = "NOETL_API_TOKENS"
READ_TOKENS_ENV = "NOETL_API_READ_TOKENS"


def listen_text(host: str, port: int) -> str:
    """``HOST:PORT`` as `parse_listen` reads it (an IPv6 host in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def http_url(host: str, port: int) -> str:
    """The URL of a server listening on `host` and `port`."""
    return f"http://{listen_text(host, port)}"


def parse_listen(value: str, option: str = "--http") -> tuple[str, int]:
    """``HOST:PORT`` (``:8080`` listens on every interface; ``[::1]:8080`` for IPv6)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigurationError(f"{option} {value!r}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    return host.strip("[]") or "0.0.0.0", int(port)


def tokens_from(
    given: tuple[str, ...], environ: dict[str, str] | None = None, name: str = TOKENS_ENV
) -> tuple[str, ...]:
    """The tokens given as options, then those of the environment variable `name` (comma-separated)."""
    env = os.environ if environ is None else environ
    from_env = [t for t in env.get(name, "").split(",") if t.strip()]
    return tuple(dict.fromkeys([*given, *from_env]))


class ApiServer:
    """The REST API plus the metrics it serves, attached to a running controller."""

    def __init__(
        self,
        controller: Controller,
        host: str,
        port: int,
        tokens: tuple[str, ...],
        read_tokens: tuple[str, ...] = (),
    ) -> None:
        self.controller = controller
        self.host = host
        self.port = port
        self.metrics = Metrics(controller.topology, controller.reducer.plans)
        self.metrics.holds = controller.holds_execution
        self.context = ApiContext(
            nc=controller.nc,
            topology=controller.topology,
            intake=controller.intake,
            tokens=tokens,
            metrics=self.metrics,
            read_tokens=read_tokens,
        )
        self.app = build_app(self.context)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return http_url(self.host, self.port)

    async def start(self) -> None:
        if self._runner is not None:
            return
        self.controller.observer = self.metrics.observe
        await self.metrics.start(self.controller.nc)
        runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=5.0)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        self._runner = runner
        if self.port == 0:  # an ephemeral port: report the real one
            server = getattr(site, "_server", None)
            sockets = getattr(server, "sockets", None) or []
            if sockets:
                self.port = int(sockets[0].getsockname()[1])
        log.info("api.listening", url=self.url)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        for queue in list(self.context.streams):  # they would hold the shutdown until their clients leave
            queue.put_nowait(END_OF_STREAM)
        for _ in range(100):  # each ends its stream (unsubscribes, writes its end) in a moment
            if not self.context.streams:
                break
            await asyncio.sleep(0.02)
        if runner is not None:
            await runner.cleanup()
        await self.metrics.stop()
        if self.controller.observer == self.metrics.observe:
            self.controller.observer = None

    async def __aenter__(self) -> ApiServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
