"""Explicit privacy choices: δ rules, table options in --help, multi-class targets refused."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from privmtl.cli import main


def test_delta_at_or_above_one_over_m_warns(capsys):
    # synthetic federation: m = 50 clients, so 1/m = 0.02
    code = main(["pmtl", "--data", "synthetic", "--model", "logreg", "--rounds", "1",
                 "--epsilon", "2", "--delta", "0.05", "--finetune", "none", "--json"])  # fmt: skip
    cap = capsys.readouterr()
    assert code == 0 and json.loads(cap.out)["delta"] == 0.05
    warn = [ln for ln in cap.err.splitlines() if ln.startswith("privmtl: warning:")]
    assert len(warn) == 1 and "1/m" in warn[0]


@pytest.mark.parametrize("delta", ["1", "1.5", "0"])
def test_impossible_delta_is_refused(capsys, delta):
    code = main(["pmtl", "--data", "synthetic", "--model", "logreg", "--rounds", "1",
                 "--epsilon", "2", "--delta", delta])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "delta" in err[0]


def test_mpmtl_help_shows_table_options(capsys):
    assert main(["mpmtl", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--task-column", "--target-column", "--train-fraction", "--normalize"):
        assert flag in out


def _tasks(path, labels):
    rng = np.random.default_rng(0)
    n = 60
    frame = pd.DataFrame(rng.normal(size=(n, 4)), columns=list("abcd"))
    frame.insert(0, "school", [f"s{i % 5}" for i in range(n)])
    frame["score"] = labels(rng, n)
    frame.to_csv(path, index=False)


def test_three_class_target_refused_for_regression(tmp_path, capsys):
    _tasks(tmp_path / "t.csv", lambda rng, n: rng.integers(0, 3, size=n))
    code = main(["mpmtl", "--data", "table", "--data-path", str(tmp_path / "t.csv"),
                 "--task-column", "school", "--target-column", "score", "--method", "stl-l2",
                 "--no-tune"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "'score'" in err[0] and "3-class" in err[0]


def test_table_options_and_user_delta(tmp_path, capsys):
    _tasks(tmp_path / "t.csv", lambda rng, n: rng.normal(size=n))
    code = main(["mpmtl", "--data", "table", "--data-path", str(tmp_path / "t.csv"),
                 "--task-column", "school", "--target-column", "score", "--method", "lowrank",
                 "--epsilon", "1", "--train-fraction", "0.5", "--normalize", "none", "--no-tune",
                 "--iterations", "3", "--reproducible-noise", "--json"])  # fmt: skip
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["delta"] == pytest.approx(1e-5)  # min(1e-5, 1/(100*5))


def test_csv_error_names_the_file_line(tmp_path, capsys):
    _tasks(tmp_path / "t.csv", lambda rng, n: rng.normal(size=n))
    frame = pd.read_csv(tmp_path / "t.csv")
    frame.loc[6, "b"] = np.nan  # data row 6 is line 8 (line 1: header)
    frame.to_csv(tmp_path / "t.csv", index=False)
    code = main(["mpmtl", "--data", "table", "--data-path", str(tmp_path / "t.csv"),
                 "--task-column", "school", "--target-column", "score", "--method", "stl-l2"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "'b'" in err[0] and "line 8" in err[0]
