"""``noetl-stream migrate``: rewrite a legacy playbook, or one in NoETL's dialect, in the canonical form
(no NATS needed)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import click

from noetl_stream.cli.common import EXIT_FAILED, EXIT_INVALID
from noetl_stream.cli.main import main
from noetl_stream.dsl.diagnostics import Diagnostic


@main.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "-o", "--output", "out", type=click.Path(dir_okay=False, path_type=Path), help="Write the result here."
)
@click.option("--in-place", is_flag=True, help="Rewrite FILE itself.")
@click.option("-q", "--quiet", is_flag=True, help="Do not list the rewritten forms.")
def migrate(file: Path, out: Path | None, in_place: bool, quiet: bool) -> None:
    """Rewrite a legacy playbook, or one in NoETL's dialect, in the canonical v10 form (keeps comments
    and key order where it can).

    Lists each form it rewrote (unless -q) and prints the result unless -o or --in-place is given;
    writes nothing when the playbook has a form without a faithful canonical spelling (exit 2, with
    the reason) or when the result would not validate without dialect warnings.
    """
    from noetl_stream.dsl.migrate import migrate_text

    if out is not None and in_place:
        raise click.BadParameter("give -o or --in-place, not both", param_hint="--in-place")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        click.echo(f"{file}: cannot read: {exc.strerror if isinstance(exc, OSError) else exc}", err=True)
        sys.exit(EXIT_INVALID)
    migration = migrate_text(text, str(file))
    for d in sorted(migration.diagnostics, key=lambda d: (d.line, d.col)):  # (in the order of the file)
        if d.severity == "error" or not quiet:
            click.echo(d.format(), err=True)
    if migration.text is None:
        sys.exit(EXIT_INVALID)
    target = file if in_place else out
    if target is None:
        click.echo(migration.text, nl=False)
        return
    try:
        target.write_text(migration.text, encoding="utf-8")
    except OSError as exc:
        click.echo(f"{target}: cannot write: {exc.strerror}", err=True)
        sys.exit(EXIT_FAILED)
    click.echo(f"{target}: {_rewritten(migration.diagnostics, migration.changed)}", err=True)


def _rewritten(diagnostics: Sequence[Diagnostic], changed: bool) -> str:
    """What ``migrate`` says it did: how many legacy constructs and NoETL forms it rewrote."""
    if not changed:
        return "nothing to rewrite (already canonical)"
    legacy = sum(1 for d in diagnostics if d.severity == "warning" and d.code == "legacy")
    noetl = sum(1 for d in diagnostics if d.severity == "warning" and d.code != "legacy")
    said = [
        *([f"{legacy} legacy constructs translated"] if legacy or not noetl else []),
        *([f"{noetl} NoETL dialect forms rewritten"] if noetl else []),
    ]
    return f"migrated ({', '.join(said)})"
