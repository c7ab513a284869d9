"""The execution viewer: static pages (``noetl_stream/api/viewer/``) served without a token.

The pages hold no data. Their script reads everything from the authenticated ``/api`` routes with the
bearer token the operator gives (``#token=...`` in the URL, or the page's form), kept in the tab's
``sessionStorage``. A strict Content-Security-Policy allows only this origin's script, style and
connections.
"""

from __future__ import annotations

import functools
from importlib import resources

from aiohttp import web

from noetl_stream.control.inspect import Inspector

__all__ = ["ASSETS", "dagre", "execution_page", "list_page", "script", "stylesheet"]

ASSETS = ("index.html", "viewer.js", "viewer.css", "vendor/dagre.min.js")
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@functools.cache
def _asset(name: str) -> bytes:
    return resources.files("noetl_stream.api").joinpath("viewer", *name.split("/")).read_bytes()


def _serve(name: str, content_type: str) -> web.Response:
    return web.Response(body=_asset(name), content_type=content_type, charset="utf-8", headers=_HEADERS)


async def list_page(request: web.Request) -> web.StreamResponse:
    return _serve("index.html", "text/html")


async def execution_page(request: web.Request) -> web.StreamResponse:
    Inspector.check_id(request.match_info["execution_id"])  # a malformed id is a 400, like the API's
    return _serve("index.html", "text/html")


async def script(request: web.Request) -> web.StreamResponse:
    return _serve("viewer.js", "text/javascript")


async def stylesheet(request: web.Request) -> web.StreamResponse:
    return _serve("viewer.css", "text/css")


async def dagre(request: web.Request) -> web.StreamResponse:
    return _serve("vendor/dagre.min.js", "text/javascript")
