"""``privmtl report RESULT_OR_FOLDER``: one self-contained HTML page of a run."""

from __future__ import annotations

from pathlib import Path

import click

from privmtl.cli._common import echo_json
from privmtl.report_html import check_report_path, load_report_input, write_report

__all__ = ["report"]


@click.command()
@click.argument("source", type=click.Path(exists=True, path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The HTML file to write (default: SOURCE's name with .html, beside it).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def report(source: Path, output: Path | None, as_json: bool) -> None:
    """Write one HTML file (no network at view time) of a run: its guarantee, ε and accuracy per
    round, the gain over training alone per client, the models kept, and the references.

    SOURCE is a result JSON (privmtl pmtl/mpmtl/evaluate --json, redirected to a file) or a
    folder written by --save-models (model.json and its clients.csv).
    """
    if output is None:
        output = source.parent / f"{source.stem if source.is_file() else source.name}.html"
    check_report_path(output, name="output")
    result, rows = load_report_input(source)
    written = write_report(output, result, rows, source=f"from {source.resolve()}")
    if as_json:
        echo_json({"report": str(written), "per_client_rows": None if rows is None else len(rows)})
    else:
        click.echo(f"report: {written}")
