"""CLI commands on playbook files that need no NATS: ``validate`` and ``migrate`` (legacy DSL, NoETL's
dialect)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import click
import msgspec

from noetl_stream.cli import EXIT_FAILED, EXIT_INVALID, EXIT_OK, main
from noetl_stream.dsl import compile_playbook
from noetl_stream.dsl.diagnostics import Diagnostic


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print diagnostics as a JSON list.")
@click.option("--legacy", is_flag=True, help="Translate legacy DSL forms (000/004, 002) before validating.")
@click.option(
    "--show-canonical",
    is_flag=True,
    help="Print the canonical expansion (after legacy translation and sugar).",
)
def validate(
    files: tuple[Path, ...], as_json: bool, legacy: bool = False, show_canonical: bool = False
) -> None:
    """Compile playbooks and report their problems as FILE:LINE:COL: message.

    Problems are reported together, in stages: a step's templates (the names they read, 'success'
    and legacy event aliases in them) are checked once the step itself is well formed, and the
    checks across steps once 'metadata' is valid; fixing the errors shown can reveal more. With
    --show-canonical, diagnostics go to stderr and stdout holds the canonical YAML and the 'ok' line.
    """
    extensions: tuple[str, ...] = ("legacy",) if legacy else ()
    all_diags: list[dict[str, object]] = []
    invalid = False
    for path in files:
        try:
            data = path.read_bytes()
            text = data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")  # as read_text does
        except OSError as exc:
            invalid = True
            msg = f"{path}: cannot read: {exc.strerror}"
            all_diags.append(_io_diagnostic(path, msg, 0, 0))
            if not as_json:
                click.echo(msg, err=True)
            continue
        except UnicodeDecodeError as exc:
            invalid = True
            line = data.count(b"\n", 0, exc.start) + 1
            col = len(data[data.rfind(b"\n", 0, exc.start) + 1 : exc.start].decode("utf-8", "replace")) + 1
            msg = f"the file is not UTF-8: byte 0x{data[exc.start]:02x} cannot be decoded"
            all_diags.append(_io_diagnostic(path, msg, line, col))
            if not as_json:
                click.echo(f"{path}:{line}:{col}: {msg}", err=True)
            continue
        result = compile_playbook(text, str(path), extensions=extensions)
        if result.errors:
            invalid = True
        for d in result.diagnostics:
            all_diags.append(msgspec.to_builtins(d))
            if not as_json:  # with --show-canonical, stdout is the YAML alone (to redirect to a file)
                click.echo(d.format(), err=d.severity == "error" or show_canonical)
        if show_canonical and not as_json:
            _show_canonical(text, str(path), extensions)
        if not as_json and not result.errors:
            name = result.playbook.metadata.name if result.playbook else "?"
            click.echo(
                f"{path}: ok ({name}, {len(result.playbook.workflow) if result.playbook else 0} steps)"
            )
    if as_json:
        click.echo(msgspec.json.encode(all_diags).decode())
    sys.exit(EXIT_INVALID if invalid else EXIT_OK)


def _io_diagnostic(path: Path, message: str, line: int, col: int) -> dict[str, object]:
    return {
        "severity": "error",
        "message": message,
        "file": str(path),
        "line": line,
        "col": col,
        "path": "<root>",
        "code": "io",
    }


def _show_canonical(text: str, file: str, extensions: tuple[str, ...]) -> None:
    from noetl_stream.dsl.canonical import dump_yaml, expand
    from noetl_stream.dsl.diagnostics import PlaybookError
    from noetl_stream.dsl.source import load_yaml

    try:
        data, smap = load_yaml(text, file)
    except PlaybookError:
        return
    click.echo(f"# {file}: canonical form")
    click.echo(dump_yaml(expand(data, smap, extensions).data), nl=False)


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
    from noetl_stream.migrate import migrate_text

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
