"""The HTML report: self-contained, with the series the result holds."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from privmtl.exceptions import InvalidParameterError
from privmtl.experiments.mpmtl import run_mpmtl
from privmtl.experiments.pmtl import run_pmtl
from privmtl.report_html import (
    SERIES,
    check_report_path,
    load_report_input,
    render_report,
    write_report,
)


@pytest.fixture(scope="module")
def pmtl_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("pmtl")
    out = run_pmtl(
        data="synthetic", num_clients=12, rounds=4, epsilon=2.0, seed=0, noise_source="seeded",
        show_progress=False, threads=1, eval_every=2, save_models=d / "models",
    )  # fmt: skip
    return out, d / "models"


def polyline_points(page: str, cls: str) -> int:
    (points,) = re.findall(rf"<polyline class='{cls}'[^>]*points='([^']*)'", page)
    return len(points.split())


def bar_counts(page: str, cls: str) -> list[int]:
    return [int(c) for c in re.findall(rf"<rect class='{cls}' data-count='(\d+)'", page)]


def test_nothing_is_loaded_at_view_time(pmtl_run):
    _, folder = pmtl_run
    page = render_report(*load_report_input(folder))
    assert "http://" not in page and "https://" not in page
    assert not re.search(r"<(script|link|img|iframe)\b|@import|url\(", page)


def test_a_saved_folder_with_rows_is_read_and_rendered_without_torch(pmtl_run):
    """``privmtl report`` checks the folder's per-client rows against its model.json without
    the saved-model modules."""
    _, folder = pmtl_run
    code = (
        "import sys\n"
        "from privmtl.report_html import load_report_input, render_report\n"
        "result, rows = load_report_input(sys.argv[1])\n"
        "assert rows is not None and 'holds no per-client rows' not in render_report(result, rows)\n"
        "print([m for m in ('torch', 'scipy', 'sklearn') if m in sys.modules])\n"
    )
    run = [sys.executable, "-c", code, str(folder)]
    out = subprocess.run(run, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_saved_folder_shows_every_series(pmtl_run):
    out, folder = pmtl_run
    result, rows = load_report_input(folder)
    page = render_report(result, rows)
    assert polyline_points(page, SERIES["epsilon"]) == out["rounds_run"] == 4
    assert polyline_points(page, SERIES["accuracy"]) == 2  # --eval-every 2 of 4 rounds
    assert sum(bar_counts(page, SERIES["gain"])) == rows["gain"].notna().sum() == 12
    kept = {k: v for k, v in out["clients_per_final_model"].items()}
    assert bar_counts(page, SERIES["kept"]) == list(kept.values())
    for text in ("ε", "δ", "relation", "sampling", "accountant", "noise source", "covered"):
        assert f"<th>{text}</th>" in page
    assert "local training alone" in page and "released global model alone" in page


def test_a_result_without_rows_says_so(pmtl_run, tmp_path):
    out, _ = pmtl_run
    path = tmp_path / "result.json"
    path.write_text(json.dumps(out))
    result, rows = load_report_input(path)
    assert rows is None
    page = render_report(result, rows)
    assert "holds no per-client rows" in page and SERIES["gain"] not in page
    assert polyline_points(page, SERIES["epsilon"]) == 4


def test_an_mpmtl_result_shows_its_single_task_reference(tmp_path):
    out = run_mpmtl(
        data="synthetic-lowrank", method="lowrank", epsilon=1.0, tune=False,
        noise_source="seeded", seed=0, save_models=tmp_path / "models",
    )  # fmt: skip
    page = render_report(*load_report_input(tmp_path / "models"))
    assert "single-task learning nMSE" in page and "No ε per round" in page
    assert sum(bar_counts(page, SERIES["gain"])) == out["n_tasks"]
    written = write_report(tmp_path / "r.html", out)
    assert "single-task" in written.read_text()


def test_the_output_path_is_checked(tmp_path):
    with pytest.raises(InvalidParameterError, match=r"'report'.*\.html"):
        check_report_path(tmp_path / "r.txt")
    (tmp_path / "f").write_text("")
    with pytest.raises(InvalidParameterError, match="writable folder"):
        check_report_path(tmp_path / "f" / "r.html")
