"""``noetl-stream validate``: check playbook files (no NATS needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import msgspec

from noetl_stream.cli.common import EXIT_INVALID, EXIT_OK
from noetl_stream.cli.main import main
from noetl_stream.dsl import compile_playbook


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
