"""Catalog and keychain routes. The keychain routes never return a credential's values."""

from __future__ import annotations

from aiohttp import web
from nats.js.errors import BucketNotFoundError

from noetl_stream.api.http import YAML_TYPES, ApiError, context, read_json, reply
from noetl_stream.control.endpoints import catalog_error
from noetl_stream.errors import ConfigurationError
from noetl_stream.kv.catalog import CatalogConflictError, CatalogError, CatalogNotFoundError
from noetl_stream.kv.keychain import CredentialNotFoundError, Keychain, check_name
from noetl_stream.protocol.operations import (
    CatalogDeleted,
    CatalogList,
    CatalogPlaybook,
    CatalogRegister,
    KeychainItem,
    KeychainList,
    KeychainPut,
)
from noetl_stream.protocol.subjects import MAX_NEW_ID_LENGTH

# -- catalog --------------------------------------------------------------------------------------


def _ref(request: web.Request) -> tuple[str, str | None]:
    path = request.query.get("path")
    if not path:
        raise ApiError(400, "bad_request", "query parameter 'path' is required")
    return path, request.query.get("version") or None


async def catalog_list(request: web.Request) -> web.StreamResponse:
    try:
        items = await context(request).catalog.list(request.query.get("path") or None)
    except CatalogError as exc:
        raise catalog_error(exc, "bad_request") from None
    return reply(CatalogList(items=items))


async def catalog_register(request: web.Request) -> web.StreamResponse:
    if request.content_type in YAML_TYPES:  # else JSON (the app refused other types)
        try:
            text = (await request.read()).decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError(400, "bad_request", "the playbook is not UTF-8 text") from None
    else:
        text = (await read_json(request, CatalogRegister)).playbook
    try:
        entry, created = await context(request).catalog.register(text, "<request>")
    except (CatalogError, CatalogConflictError) as exc:
        raise catalog_error(exc) from None
    return reply(entry, 201 if created else 200)


async def catalog_show(request: web.Request) -> web.StreamResponse:
    path, version = _ref(request)
    try:
        entry, text = await context(request).catalog.resolve(path, version)
    except (CatalogError, CatalogNotFoundError) as exc:
        raise catalog_error(exc, "bad_request") from None
    return reply(CatalogPlaybook(entry=entry, playbook=text))


async def catalog_delete(request: web.Request) -> web.StreamResponse:
    path, version = _ref(request)
    try:
        versions = await context(request).catalog.delete(path, version)
    except (CatalogError, CatalogNotFoundError) as exc:
        raise catalog_error(exc, "bad_request") from None
    return reply(CatalogDeleted(path=path, versions=versions))


# -- keychain -------------------------------------------------------------------------------------


def _keychain(request: web.Request) -> Keychain:
    ctx = context(request)
    if ctx.keychain is None:
        ctx.keychain = Keychain(ctx.nc.jetstream(), ctx.topology)
    return ctx.keychain


def _name(request: web.Request) -> str:
    name = request.match_info["name"]
    if len(name) > MAX_NEW_ID_LENGTH:  # its KV subject would be longer than the server takes
        raise ApiError(
            400,
            "bad_request",
            f"invalid keychain name of {len(name)} characters: at most {MAX_NEW_ID_LENGTH}",
        )
    try:
        return check_name(name)
    except ConfigurationError as exc:
        raise ApiError(400, "bad_request", str(exc)) from None


async def keychain_list(request: web.Request) -> web.StreamResponse:
    try:
        entries = await _keychain(request).list()
    except ConfigurationError as exc:
        raise ApiError(503, "unavailable", str(exc)) from None
    return reply(KeychainList(items=[KeychainItem(name=n, kind=k) for n, k in entries]))


async def keychain_show(request: web.Request) -> web.StreamResponse:
    name = _name(request)
    try:
        kind = await _keychain(request).kind(name)
    except CredentialNotFoundError as exc:
        raise ApiError(404, "not_found", str(exc)) from None
    except (ConfigurationError, BucketNotFoundError) as exc:
        raise ApiError(503, "unavailable", str(exc)) from None
    return reply(KeychainItem(name=name, kind=kind))


async def keychain_put(request: web.Request) -> web.StreamResponse:
    """Create or replace a credential (write-only: the answer is its name and kind)."""
    name = _name(request)
    body = await read_json(request, KeychainPut)
    if not body.kind or not body.fields:
        raise ApiError(400, "bad_request", "give a 'kind' and at least one field")
    if "kind" in body.fields:
        raise ApiError(400, "bad_request", "'kind' is not a field name (use the entry's kind)")
    from noetl_stream.dataplane.credentials import BadCredentialError, check_credential

    try:
        check_credential(name, body.kind, body.fields)
    except BadCredentialError as exc:  # stored, it would fail the first task that reads it
        raise ApiError(400, "bad_request", str(exc)) from None
    try:
        await _keychain(request).put(name, body.kind, body.fields)
    except ConfigurationError as exc:
        # no key in this process: refusing is not the client's fault
        raise ApiError(503, "unavailable", str(exc)) from None
    return reply(KeychainItem(name=name, kind=body.kind))


async def keychain_delete(request: web.Request) -> web.StreamResponse:
    name = _name(request)
    try:
        deleted = await _keychain(request).delete(name)
    except ConfigurationError as exc:
        raise ApiError(503, "unavailable", str(exc)) from None
    if not deleted:
        raise ApiError(404, "not_found", f"no keychain entry {name!r}")
    return reply(None, 204)
