"""Every MP-MTL result carries its baseline: each task alone (per-task ridge)."""

from __future__ import annotations

import pytest

from privmtl.cli import main
from privmtl.data.synthetic import make_lowrank_tasks
from privmtl.experiments.mpmtl import run_mpmtl
from privmtl.linear.stl import STLRidge


def test_the_baseline_is_per_task_ridge_and_the_gain_is_its_nmse_minus_the_runs():
    out = run_mpmtl(
        data="synthetic-lowrank", method="lowrank", epsilon=1.0, tune=False,
        noise_source="seeded", seed=0,
    )  # fmt: skip
    train, test = make_lowrank_tasks(random_state=0)  # the data set's own generator, seed 0
    oracle = STLRidge(lam="cv").fit(train.X, train.y).paper_score(test.X, test.y)
    assert out["stl_nmse"] == pytest.approx(oracle, rel=1e-9)
    assert out["gain_over_stl"] == pytest.approx(out["stl_nmse"] - out["nmse"], abs=1e-12)
    low, high = out["gain_interval"]
    assert low < out["gain_over_stl"] < high
    assert "every task alone" in out["stl_baseline"]


def test_the_human_output_says_whether_sharing_helped(capsys):
    argv = ["mpmtl", "--data", "synthetic-lowrank", "--method", "stl-l2", "--no-tune"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    line = next(ln for ln in lines if ln.startswith("every task alone"))
    assert "gain" in line and ("helped" in line or "hurt" in line or "no clear gain" in line)
