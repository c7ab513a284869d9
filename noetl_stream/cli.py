"""The ``noetl-stream`` command line. The edge: maps errors to exit codes, never tracebacks."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import msgspec

from noetl_stream import __version__
from noetl_stream.dsl import compile_playbook

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="noetl-stream")
def main() -> None:
    """Run NoETL playbooks (noetl.io/v2) on NATS JetStream."""


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print diagnostics as a JSON list.")
def validate(files: tuple[Path, ...], as_json: bool) -> None:
    """Compile playbooks and report every problem as FILE:LINE:COL: message."""
    extensions: tuple[str, ...] = ()
    all_diags: list[dict[str, object]] = []
    invalid = False
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            invalid = True
            msg = f"{path}: cannot read: {exc.strerror if isinstance(exc, OSError) else exc}"
            all_diags.append(
                {
                    "severity": "error",
                    "message": msg,
                    "file": str(path),
                    "line": 0,
                    "col": 0,
                    "path": "<root>",
                    "code": "io",
                }
            )
            if not as_json:
                click.echo(msg, err=True)
            continue
        result = compile_playbook(text, str(path), extensions=extensions)
        if result.errors:
            invalid = True
        for d in result.diagnostics:
            all_diags.append(msgspec.to_builtins(d))
            if not as_json:
                click.echo(d.format(), err=d.severity == "error")
        if not as_json and not result.errors:
            name = result.playbook.metadata.name if result.playbook else "?"
            click.echo(
                f"{path}: ok ({name}, {len(result.playbook.workflow) if result.playbook else 0} steps)"
            )
    if as_json:
        click.echo(msgspec.json.encode(all_diags).decode())
    sys.exit(EXIT_INVALID if invalid else EXIT_OK)


def _load_payload(payload: str | None, sets: tuple[str, ...]) -> dict[str, object]:
    import json

    data: dict[str, object] = {}
    if payload:
        text = Path(payload[1:]).read_text(encoding="utf-8") if payload.startswith("@") else payload
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--payload") from None
        if not isinstance(loaded, dict):
            raise click.BadParameter("must be a JSON object", param_hint="--payload")
        data.update(loaded)
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--set")
        try:
            data[key] = json.loads(value)
        except json.JSONDecodeError:
            data[key] = value
    return data


@main.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--payload", help="Workload overrides: a JSON object, or @file.json.")
@click.option("--set", "sets", multiple=True, help="Workload override KEY=VALUE (VALUE parsed as JSON if it can be).")
@click.option("--nats", "nats_url", envvar="NOETL_NATS_URL", default=None,
              help="NATS URL (default: start an embedded nats-server).")
@click.option("--workers", default=1, show_default=True, help="In-process workers.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with the outcome.")
def run(file: Path, payload: str | None, sets: tuple[str, ...], nats_url: str | None, workers: int,
        as_json: bool) -> None:
    """Run a playbook end to end and print its outcome (exit 0 success, 1 failed, 2 invalid)."""
    import asyncio

    from noetl_stream.logs import configure
    from noetl_stream.progress import Progress

    configure("warning")

    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        click.echo(f"{file}: cannot read: {exc}", err=True)
        sys.exit(EXIT_INVALID)
    result = compile_playbook(text, str(file))
    for d in result.diagnostics:
        click.echo(d.format(), err=True)
    if result.playbook is None:
        sys.exit(EXIT_INVALID)
    data = _load_payload(payload, sets)
    progress = None if as_json else Progress()

    async def go() -> object:
        from noetl_stream.local import local_runtime

        async with local_runtime(nats_url, workers=workers) as rt:
            return await rt.run_playbook(text, str(file), data, progress.on_event if progress else None)

    try:
        summary = asyncio.run(go())
    except KeyboardInterrupt:
        sys.exit(130)
    except (OSError, ConnectionError, RuntimeError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    out = msgspec.to_builtins(summary)
    if as_json:
        click.echo(msgspec.json.encode(out).decode())
    else:
        assert progress is not None
        progress.finish(out)
    status = out.get("status") if isinstance(out, dict) else None
    sys.exit(EXIT_OK if status == "success" else EXIT_INVALID if status == "rejected" else EXIT_FAILED)
