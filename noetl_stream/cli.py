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
