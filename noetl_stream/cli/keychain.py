"""CLI commands for the keychain: the encrypted credential store (kv/keychain.py). Never prints a secret."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from noetl_stream.cli.common import (
    EXIT_FAILED,
    EXIT_INVALID,
    echo_json,
    fail,
    nats_option,
    prefix_option,
    topology_for,
    with_nats,
)
from noetl_stream.cli.main import main

T = TypeVar("T")


@main.group()
def keychain() -> None:
    """Manage credentials in the encrypted keychain bucket (key: NOETL_KEYCHAIN_KEY[_FILE])."""


def _keychain_call(nats_url: str, prefix: str, action: Callable[[Any], Awaitable[T]]) -> T:
    from noetl_stream.kv.keychain import Keychain

    topology = topology_for(prefix)

    async def go(nc: Any) -> T:
        return await action(Keychain(nc.jetstream(), topology))

    return with_nats(nats_url, "noetl-keychain", go)


def _keychain_fields(fields: tuple[str, ...], from_json: str | None) -> tuple[dict[str, Any], str | None]:
    import json

    data: dict[str, Any] = {}
    kind: str | None = None
    if from_json:
        try:
            text = sys.stdin.read() if from_json == "-" else Path(from_json).read_text(encoding="utf-8")
            loaded = json.loads(text)
        except OSError as exc:
            raise click.BadParameter(f"cannot read: {exc.strerror}", param_hint="--from-json") from None
        except json.JSONDecodeError as exc:
            raise click.BadParameter(
                f"not JSON: {exc.msg} (line {exc.lineno})", param_hint="--from-json"
            ) from None
        if not isinstance(loaded, dict):
            raise click.BadParameter("must be a JSON object of fields", param_hint="--from-json")
        if isinstance(loaded.get("fields"), dict):  # {"kind": ..., "fields": {...}}
            kind = loaded.get("kind") if isinstance(loaded.get("kind"), str) else None
            loaded = loaded["fields"]
        else:
            kind = loaded.pop("kind", None) if isinstance(loaded.get("kind"), str) else None
        data.update(loaded)
    for item in fields:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter("expected KEY=VALUE (the value is not shown)", param_hint="--field")
        data[key] = value
    return data, kind


def _check_entry(name: str, kind: str, fields: dict[str, Any]) -> None:
    """Exit 2 with one line if no tool could use the entry (`check_credential`)."""
    from noetl_stream.dataplane.credentials import BadCredentialError, check_credential

    try:
        check_credential(name, kind, fields)
    except BadCredentialError as exc:
        fail(str(exc), EXIT_INVALID)


@keychain.command("set")
@click.argument("name")
@click.option(
    "--kind", default=None, help="Entry kind: postgres_credential, bearer, basic, api_key, static, ..."
)
@click.option("--field", "fields", multiple=True, metavar="KEY=VALUE", help="A field (repeat).")
@click.option(
    "--from-json", "from_json", default=None, metavar="FILE", help="Fields from a JSON object ('-': stdin)."
)
@nats_option
@prefix_option
def keychain_set(
    name: str, kind: str | None, fields: tuple[str, ...], from_json: str | None, nats_url: str, prefix: str
) -> None:
    """Create or replace entry NAME (encrypted at rest)."""
    data, json_kind = _keychain_fields(fields, from_json)
    kind = kind or json_kind
    if not kind:
        raise click.BadParameter("give the entry's kind", param_hint="--kind")
    if not data:
        raise click.BadParameter("give at least one --field or --from-json", param_hint="--field")
    _check_entry(name, kind, data)
    entry_kind: str = kind

    async def action(kc: Any) -> None:
        await kc.put(name, entry_kind, data)

    _keychain_call(nats_url, prefix, action)
    click.echo(f"set {name} ({kind}, fields: {', '.join(sorted(data))})")


@keychain.command("get")
@click.argument("name")
@nats_option
@prefix_option
def keychain_get(name: str, nats_url: str, prefix: str) -> None:
    """Show entry NAME's kind and field names (never the values)."""
    from noetl_stream.kv.keychain import CredentialNotFoundError

    async def action(kc: Any) -> Any:
        return await kc.get(name)

    try:
        entry = _keychain_call(nats_url, prefix, action)
    except CredentialNotFoundError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    echo_json({"name": name, "kind": entry.kind, "fields": sorted(entry.fields)})


@keychain.command("list")
@click.option("--json", "as_json", is_flag=True, help="A JSON list of {name, kind}.")
@nats_option
@prefix_option
def keychain_list(as_json: bool, nats_url: str, prefix: str) -> None:
    """List entry names and kinds (needs no key)."""

    async def action(kc: Any) -> Any:
        return await kc.list()

    entries = _keychain_call(nats_url, prefix, action)
    if as_json:
        echo_json([{"name": n, "kind": k} for n, k in entries])
        return
    for entry_name, entry_kind in entries:
        click.echo(f"{entry_name}\t{entry_kind}")


@keychain.command("delete")
@click.argument("name")
@nats_option
@prefix_option
def keychain_delete(name: str, nats_url: str, prefix: str) -> None:
    """Delete entry NAME (exit 1 if there is none)."""

    async def action(kc: Any) -> bool:
        return bool(await kc.delete(name))

    if not _keychain_call(nats_url, prefix, action):
        click.echo(f"error: no keychain entry {name!r}", err=True)
        sys.exit(EXIT_FAILED)
    click.echo(f"deleted {name}")


@keychain.command("keygen")
def keychain_keygen() -> None:
    """Print a new random key for NOETL_KEYCHAIN_KEY."""
    from noetl_stream.kv.keychain import generate_key

    click.echo(generate_key())
