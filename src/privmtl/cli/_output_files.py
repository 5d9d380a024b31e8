"""The files a run command writes beside its result: ``--per-client`` and ``--report``.

``privmtl pmtl`` and ``privmtl mpmtl`` take ``--report FILE`` (:data:`report_option`), check both
files before the run starts (:func:`check_output_files`), have the run write the per-client rows
the report reads (:func:`rows_for_report`) and write the report after it
(:func:`write_run_report`); ``privmtl evaluate`` checks its ``--per-client`` file the same way.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from privmtl.exceptions import InvalidParameterError
from privmtl.per_client import CLIENTS_FILE, check_rows_path, read_rows
from privmtl.report_html import check_report_path, write_report

__all__ = ["check_output_files", "report_option", "rows_for_report", "write_run_report"]


report_option = click.option(
    "--report",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the run's report here: one self-contained HTML file (see privmtl report).",
)
"""``--report FILE`` of the run commands (``privmtl pmtl``, ``privmtl mpmtl``)."""


def write_run_report(path: Path, out: dict[str, Any], rows_file: Path | None) -> Path:
    """``--report`` of a run command: the report of the run's result ``out`` with the per-client
    rows of ``rows_file`` (the run's --per-client file or its saved clients.csv), if any."""
    rows = read_rows(rows_file) if rows_file is not None and rows_file.is_file() else None
    return write_report(path, out, rows, source="written by the run")


def check_output_files(kw: dict[str, Any]) -> Path | None:
    """A run command's ``--per-client`` (left in ``kw``) and ``--report`` (popped and returned),
    checked before the run starts: a usage error (exit 2, one line) for a bad name or folder."""
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
    if report is None or kw.get("per_client") is not None:
        yield kw.get("per_client")
    elif kw.get("save_models") is not None:
        yield Path(kw["save_models"]) / CLIENTS_FILE
    else:
        with tempfile.TemporaryDirectory(prefix="privmtl-report-") as tmp:
            kw["per_client"] = Path(tmp) / CLIENTS_FILE
            yield kw["per_client"]
