"""``privmtl report RESULT_OR_FOLDER``: one self-contained HTML page of a run."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from privmtl.exceptions import InvalidParameterError

__all__ = [
    "check_output_files",
    "report",
    "report_option",
    "rows_for_report",
    "write_run_report",
]


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
    from privmtl.cli._common import echo_json
    from privmtl.report_html import check_report_path, load_report_input, write_report

    if output is None:
        output = source.parent / f"{source.stem if source.is_file() else source.name}.html"
    check_report_path(output, name="output")
    result, rows = load_report_input(source)
    written = write_report(output, result, rows, source=f"from {source.resolve()}")
    if as_json:
        echo_json({"report": str(written), "per_client_rows": None if rows is None else len(rows)})
    else:
        click.echo(f"report: {written}")


report_option = click.option(
    "--report",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the run's report here: one self-contained HTML file (see privmtl report).",
)
"""``--report FILE`` of the run commands (``privmtl pmtl``, ``privmtl mpmtl``)."""


def write_run_report(path: Path, out: dict[str, Any], rows_file: Path | None) -> Path:
    """``--report`` of a run command: the report of the run's result ``out`` with the per-client
    rows of ``rows_file`` (the run's --per-client file or its saved clients.csv), if any."""
    from privmtl.per_client import read_rows
    from privmtl.report_html import write_report

    rows = read_rows(rows_file) if rows_file is not None and rows_file.is_file() else None
    return write_report(path, out, rows, source="written by the run")


def check_output_files(kw: dict[str, Any]) -> Path | None:
    """A run command's ``--per-client`` (left in ``kw``) and ``--report`` (popped and returned),
    checked before the run starts: a usage error (exit 2, one line) for a bad name or folder."""
    from privmtl.per_client import check_rows_path
    from privmtl.report_html import check_report_path

    report = kw.pop("report", None)
    for flag, value, check in (
        ("--per-client", kw.get("per_client"), check_rows_path),
        ("--report", report, check_report_path),
    ):
        if value is not None:
            try:
                check(value, name=flag.lstrip("-").replace("-", "_"))
            except InvalidParameterError as exc:
                raise click.BadParameter(str(exc), param_hint=flag) from None
    return report


@contextmanager
def rows_for_report(kw: dict[str, Any], report: Path | None) -> Iterator[Path | None]:
    """The per-client rows file a run's ``--report`` reads: the ``--per-client`` file, the
    saved folder's ``clients.csv``, or (neither asked for) a temporary file the run writes into
    ``kw["per_client"]``, removed afterwards."""
    from privmtl.per_client import CLIENTS_FILE

    if report is None or kw.get("per_client") is not None:
        yield kw.get("per_client")
    elif kw.get("save_models") is not None:
        yield Path(kw["save_models"]) / CLIENTS_FILE
    else:
        with tempfile.TemporaryDirectory(prefix="privmtl-report-") as tmp:
            kw["per_client"] = Path(tmp) / CLIENTS_FILE
            yield kw["per_client"]
