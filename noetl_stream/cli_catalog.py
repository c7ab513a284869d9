"""CLI commands for the catalog and for inspecting executions (registered on ``noetl-stream``)."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import msgspec

from noetl_stream.cli import (
    EXIT_FAILED,
    EXIT_INVALID,
    _run_async,
    _topology,
    main,
    nats_option,
    prefix_option,
)

T = TypeVar("T")


def _with_js(nats_url: str, prefix: str, name: str, action: Callable[[Any, Any], Awaitable[T]]) -> T:
    from noetl_stream.natsconn import connect

    topology = _topology(prefix)

    async def go() -> T:
        nc = await connect(nats_url, name=name, connect_wait_s=10.0, max_reconnect_attempts=0)
        try:
            return await action(nc, topology)
        finally:
            await nc.close()

    return _run_async(go())


def _catalog_call(
    nats_url: str, prefix: str, action: Callable[[Any], Awaitable[T]], extensions: tuple[str, ...] = ()
) -> T:
    from noetl_stream.kv.catalog import Catalog, CatalogConflictError, CatalogError, CatalogNotFoundError

    async def run(nc: Any, topology: Any) -> T:
        return await action(Catalog(nc.jetstream(), topology, extensions=extensions))

    try:
        return _with_js(nats_url, prefix, "noetl-catalog", run)
    except CatalogError as exc:
        click.echo(f"error: {exc}", err=True)
        for line in exc.diagnostics[1:]:
            click.echo(line, err=True)
        sys.exit(EXIT_INVALID)
    except (CatalogNotFoundError, CatalogConflictError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_FAILED)


def _echo_json(value: object) -> None:
    click.echo(msgspec.json.encode(value).decode())


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
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        click.echo(f"{file}: cannot read: {exc}", err=True)
        sys.exit(EXIT_INVALID)

    async def action(cat: Any) -> Any:
        return await cat.register(text, str(file))

    entry, created = _catalog_call(nats_url, prefix, action, ("legacy",) if legacy else ())
    if as_json:
        _echo_json({**msgspec.to_builtins(entry), "created": created})
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
        _echo_json(entries)
        return
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
        _echo_json({"entry": entry, "playbook": text})
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


@main.command()
@click.option("--status", default=None, help="Only executions with this status (running, failed, ...).")
@click.option("--playbook", default=None, help="Only executions of this playbook path or name.")
@click.option("--since", default=None, help="Only executions updated at or after this ISO time.")
@click.option("--limit", default=50, show_default=True)
@click.option("--offset", default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the page as JSON.")
@nats_option
@prefix_option
def executions(
    status: str | None,
    playbook: str | None,
    since: str | None,
    limit: int,
    offset: int,
    as_json: bool,
    nats_url: str,
    prefix: str,
) -> None:
    """List executions from the controller's snapshots, newest update first."""
    from noetl_stream.control.inspect import Inspector, QueryError
    from noetl_stream.operations import ListExecutions

    query = ListExecutions(status=status, playbook=playbook, since=since, limit=limit, offset=offset)

    async def action(nc: Any, topology: Any) -> Any:
        return await Inspector(nc.jetstream(), topology).executions(query)

    try:
        page = _with_js(nats_url, prefix, "noetl-executions", action)
    except QueryError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_INVALID)
    if as_json:
        _echo_json(page)
        return
    for s in page.items:
        click.echo(f"{s.execution_id}\t{s.status:<9}\t{s.path or s.file}\t{s.updated_at or ''}")
    if page.total > page.offset + len(page.items):
        click.echo(f"... {page.total - page.offset - len(page.items)} more (--offset)", err=True)


@main.command()
@click.argument("execution_id")
@nats_option
@prefix_option
def ctx(execution_id: str, nats_url: str, prefix: str) -> None:
    """Print an execution's ctx as JSON (the controller's live view, else its snapshot)."""
    from noetl_stream.control.inspect import Inspector, QueryError

    async def action(nc: Any, topology: Any) -> Any:
        try:
            msg = await nc.request(
                topology.api_subject("ctx"), msgspec.json.encode({"execution_id": execution_id}), timeout=5
            )
            if not (msg.headers or {}).get("Nats-Service-Error-Code"):
                return msgspec.json.decode(msg.data)
        except Exception:
            pass  # no controller answering: read the snapshot
        reply = await Inspector(nc.jetstream(), topology).ctx(execution_id)
        return None if reply is None else msgspec.to_builtins(reply)

    try:
        reply = _with_js(nats_url, prefix, "noetl-ctx", action)
    except QueryError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_INVALID)
    if reply is None:
        click.echo(f"error: no execution {execution_id}", err=True)
        sys.exit(EXIT_INVALID)
    _echo_json(reply["ctx"])
