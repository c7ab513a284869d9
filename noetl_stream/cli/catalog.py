"""CLI commands for the playbook catalog: ``catalog register|list|show|delete``."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import msgspec

from noetl_stream.cli.common import (
    EXIT_FAILED,
    EXIT_INVALID,
    echo_json,
    nats_option,
    prefix_option,
    read_playbook,
    topology_for,
    with_nats,
)
from noetl_stream.cli.main import main

T = TypeVar("T")


def _catalog_call(
    nats_url: str, prefix: str, action: Callable[[Any], Awaitable[T]], extensions: tuple[str, ...] = ()
) -> T:
    from noetl_stream.kv.catalog import Catalog, CatalogConflictError, CatalogError, CatalogNotFoundError

    topology = topology_for(prefix)

    async def run(nc: Any) -> T:
        return await action(Catalog(nc.jetstream(), topology, extensions=extensions))

    try:
        return with_nats(nats_url, "noetl-catalog", run)
    except CatalogError as exc:
        click.echo(f"error: {exc}", err=True)
        for line in exc.diagnostics[1:]:
            click.echo(line, err=True)
        sys.exit(EXIT_INVALID)
    except (CatalogNotFoundError, CatalogConflictError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_FAILED)


@main.group()
def catalog() -> None:
    """Register playbooks by path and version; run them with {"path": ..., "version": ...}."""


@catalog.command("register")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the entry as JSON.")
@click.option(
    "--legacy", is_flag=True, help="Compile it with the legacy extension (its executions use it too)."
)
@nats_option
@prefix_option
def catalog_register(file: Path, as_json: bool, nats_url: str, prefix: str, legacy: bool = False) -> None:
    """Store FILE under its metadata.path and metadata.version (or the next number)."""
    text = read_playbook(file)

    async def action(cat: Any) -> Any:
        return await cat.register(text, str(file))

    entry, created = _catalog_call(nats_url, prefix, action, ("legacy",) if legacy else ())
    if as_json:
        echo_json({**msgspec.to_builtins(entry), "created": created})
        return
    verb = "registered" if created else "already registered"
    click.echo(f"{verb} {entry.path}@{entry.version} (sha256 {entry.content_hash[:12]}, {entry.size} bytes)")


@catalog.command("list")
@click.argument("path", required=False)
@click.option("--json", "as_json", is_flag=True, help="A JSON list of entries.")
@nats_option
@prefix_option
def catalog_list(path: str | None, as_json: bool, nats_url: str, prefix: str) -> None:
    """List registered playbooks (every version; '*' marks the latest)."""

    async def action(cat: Any) -> Any:
        return await cat.list(path)

    entries = _catalog_call(nats_url, prefix, action)
    if as_json:
        echo_json(entries)
        return
    if not entries:  # on stderr, as `kubectl get` does: stdout stays a (empty) listing
        click.echo(f"no playbooks registered under '{path}'" if path else "no playbooks registered", err=True)
    for e in entries:
        mark = "*" if e.latest else " "
        click.echo(
            f"{mark} {e.path}@{e.version}\t{e.content_hash[:12]}\t{e.size}\t{e.registered_at}\t{e.name}"
        )


@catalog.command("show")
@click.argument("ref", metavar="PATH[@VERSION]")
@click.option("--json", "as_json", is_flag=True, help="The entry and the text as JSON.")
@nats_option
@prefix_option
def catalog_show(ref: str, as_json: bool, nats_url: str, prefix: str) -> None:
    """Print a registered playbook's text (latest version unless @VERSION is given)."""
    from noetl_stream.kv.catalog import parse_ref

    path, version = parse_ref(ref)

    async def action(cat: Any) -> Any:
        return await cat.resolve(path, version)

    entry, text = _catalog_call(nats_url, prefix, action)
    if as_json:
        echo_json({"entry": entry, "playbook": text})
        return
    click.echo(text, nl=not text.endswith("\n"))


@catalog.command("delete")
@click.argument("ref", metavar="PATH[@VERSION]")
@nats_option
@prefix_option
def catalog_delete(ref: str, nats_url: str, prefix: str) -> None:
    """Delete one version, or every version of PATH (executions keep the text they ran)."""
    from noetl_stream.kv.catalog import parse_ref

    path, version = parse_ref(ref)

    async def action(cat: Any) -> Any:
        return await cat.delete(path, version)

    versions = _catalog_call(nats_url, prefix, action)
    click.echo(f"deleted {path}@{', '.join(versions)}")
