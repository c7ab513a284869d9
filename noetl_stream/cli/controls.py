"""CLI operator controls: cancel, pause and resume (through the controller's micro endpoints), and prune."""

from __future__ import annotations

import sys
from typing import Any

import click
import msgspec

from noetl_stream.cli.common import (
    EXIT_FAILED,
    EXIT_INVALID,
    REFUSED,
    nats_option,
    prefix_option,
    topology_for,
    with_nats,
)
from noetl_stream.cli.main import main


def _control(action: str, execution_id: str, reason: str | None, nats_url: str, prefix: str) -> None:
    from noetl_stream.jetstream.connection import refusal

    topology = topology_for(prefix)

    async def go(nc: Any) -> dict[str, Any]:
        body = {"execution_id": execution_id, **({"reason": reason} if reason else {})}
        try:
            msg = await nc.request(topology.api_subject(action), msgspec.json.encode(body), timeout=10)
        except Exception as exc:
            refused = refusal(nc)
            if refused is not None:
                return {"error": "forbidden", "detail": f"{refused}: {REFUSED}"}
            return {"error": f"no controller answered on {topology.api_subject(action)}: {exc}"}
        reply: dict[str, Any] = msgspec.json.decode(msg.data) if msg.data else {}
        if msg.headers and msg.headers.get("Nats-Service-Error"):
            reply.setdefault("error", msg.headers["Nats-Service-Error"])
            reply.setdefault("detail", msg.headers["Nats-Service-Error"])
        return reply

    reply = with_nats(nats_url, f"noetl-{action}", go)
    if "error" in reply:
        click.echo(f"error: {reply.get('detail') or reply['error']}", err=True)
        sys.exit(EXIT_INVALID if reply["error"] in ("not_found", "bad_request", "forbidden") else EXIT_FAILED)
    click.echo(f"{action}: {execution_id}")


@main.command()
@click.argument("execution_id")
@click.option("--reason", default=None, help="Recorded in the execution's error.")
@nats_option
@prefix_option
def cancel(execution_id: str, reason: str | None, nats_url: str, prefix: str) -> None:
    """Cancel an execution: nothing new is scheduled, running steps stop at their next task."""
    _control("cancel", execution_id, reason, nats_url, prefix)


@main.command()
@click.argument("execution_id")
@nats_option
@prefix_option
def pause(execution_id: str, nats_url: str, prefix: str) -> None:
    """Pause an execution: running steps finish, nothing new is scheduled until `resume`."""
    _control("pause", execution_id, None, nats_url, prefix)


@main.command()
@click.argument("execution_id")
@nats_option
@prefix_option
def resume(execution_id: str, nats_url: str, prefix: str) -> None:
    """Resume a paused execution where it was."""
    _control("resume", execution_id, None, nats_url, prefix)


@main.command()
@nats_option
@prefix_option
@click.option(
    "--older-than",
    type=click.FloatRange(min=0),
    default=3600.0,
    show_default=True,
    help="Seconds since an object was written before it may be pruned.",
)
@click.option("--dry-run", is_flag=True, help="Report what would be deleted, delete nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the report.")
def prune(nats_url: str, prefix: str, older_than: float, dry_run: bool, as_json: bool) -> None:
    """Delete result-store objects nothing can read any more: those of executions whose history has
    expired, finished executions' loop items, snapshot objects no snapshot points to (docs/operations.md,
    "Retention")."""
    from noetl_stream.control.prune import prune as do_prune

    topology = topology_for(prefix)

    async def go(nc: Any) -> Any:
        return await do_prune(nc.jetstream(), topology, older_than_s=older_than, dry_run=dry_run)

    report = with_nats(nats_url, "noetl-prune", go)
    if as_json:
        click.echo(msgspec.json.encode(report).decode())
    else:
        verb = "would prune" if dry_run else "pruned"
        click.echo(
            f"{verb} {len(report.pruned)} objects ({report.pruned_bytes:,} bytes) of {report.executions} "
            f"executions; kept {report.kept} of {report.scanned}"
        )
        for name in report.pruned:
            click.echo(f"  {name}")
    for error in report.errors:
        click.echo(f"error: {error}", err=True)
    if report.errors:
        sys.exit(EXIT_FAILED)
