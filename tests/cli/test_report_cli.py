"""`privmtl report`, and --per-client/--report on the run commands and evaluate."""

from __future__ import annotations

import json

from privmtl.cli import main
from privmtl.per_client import read_rows

PMTL = [
    "pmtl", "--data", "synthetic", "--num-clients", "12", "--rounds", "3", "--epsilon", "2",
    "--reproducible-noise", "--seed", "0", "--threads", "1", "--quiet",
]  # fmt: skip
MPMTL = [
    "mpmtl", "--data", "synthetic-lowrank", "--method", "lowrank", "--epsilon", "1", "--no-tune",
    "--reproducible-noise",
]  # fmt: skip


def _json(capsys, argv):
    code = main([*argv, "--json"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    return json.loads(cap.out)


def test_pmtl_report_without_per_client_rows_still_shows_the_gains(tmp_path, capsys):
    out = _json(capsys, [*PMTL, "--report", str(tmp_path / "r.html"), "--eval-every", "1"])
    page = (tmp_path / "r.html").read_text()
    assert out["report"] == str(tmp_path / "r.html")
    assert "per_client_file" not in out  # the report's rows went to a temporary file, removed
    assert page.count("class='bar-gain'") >= 5 and "class='series-accuracy'" in page
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]


def test_evaluate_gives_the_runs_rows_and_report_reads_the_folder(tmp_path, capsys):
    models, rows = tmp_path / "models", tmp_path / "rows.csv"
    out = _json(capsys, [*PMTL, "--save-models", str(models), "--per-client", str(rows)])
    assert out["per_client_file"] == str(rows)
    again = _json(capsys, ["evaluate", str(models), "--per-client", str(tmp_path / "e.csv")])
    assert read_rows(again["per_client_file"]).equals(read_rows(rows))
    assert main(["report", str(models)]) == 0
    assert capsys.readouterr().out.strip() == f"report: {tmp_path / 'models.html'}"
    assert "class='bar-gain'" in (tmp_path / "models.html").read_text()


def test_mpmtl_per_client_and_report(tmp_path, capsys):
    out = _json(
        capsys,
        [*MPMTL, "--per-client", str(tmp_path / "t.parquet"), "--report", str(tmp_path / "r.html")],
    )
    assert len(read_rows(out["per_client_file"])) == out["n_tasks"]
    assert "single-task learning nMSE" in (tmp_path / "r.html").read_text()
    (tmp_path / "result.json").write_text(json.dumps(out))
    report = _json(
        capsys, ["report", str(tmp_path / "result.json"), "-o", str(tmp_path / "x.html")]
    )
    assert report == {"report": str(tmp_path / "x.html"), "per_client_rows": None}
