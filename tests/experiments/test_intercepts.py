"""Linear models on a user's regression table fit an unpenalized per-task intercept."""

from __future__ import annotations

import numpy as np
import pytest

from privmtl.experiments.mpmtl import load_mpmtl_data, run_mpmtl
from privmtl.linear.metrics import nmse


def _diabetes_tasks(path, shift=0.0):
    """scikit-learn's diabetes in raw units, 6 tasks: sex x age tercile (sex not a feature)."""
    from sklearn.datasets import load_diabetes

    frame = load_diabetes(as_frame=True, scaled=False).frame
    tercile = np.searchsorted(np.quantile(frame["age"], [1 / 3, 2 / 3]), frame["age"])
    frame.insert(0, "task", [f"s{int(s)}-a{t}" for s, t in zip(frame["sex"], tercile, strict=True)])
    frame = frame.drop(columns="sex").rename(columns={"target": "y"})
    frame["y"] -= shift
    frame.to_csv(path, index=False)
    return path


def _stl(path, seed=0, method="stl-l2", **kw):
    return run_mpmtl(data="table", method=method, data_path=path, task_column="task",
                     target_column="y", seed=seed, **kw)  # fmt: skip


@pytest.mark.parametrize("method", ["stl-l2", "dp-mtrl"])
def test_shifting_every_target_shifts_the_intercepts_only(tmp_path, method):
    a = _diabetes_tasks(tmp_path / "a.csv")
    b = _diabetes_tasks(tmp_path / "b.csv", shift=152.0)
    kw = {"epsilon": 1.0, "noise_source": "seeded"} if method == "dp-mtrl" else {}
    ra, rb = _stl(a, method=method, **kw), _stl(b, method=method, **kw)
    assert abs(ra["nmse"] - rb["nmse"]) <= 1e-9
    assert np.allclose(np.subtract(ra["target_offsets"], rb["target_offsets"]), 152.0)
    assert any("own training rows" in n and "intercept" in n for n in ra["guarantee"]["notes"])


def test_stl_l2_is_within_0_02_of_per_task_ridgecv(tmp_path):
    from sklearn.linear_model import RidgeCV

    path = _diabetes_tasks(tmp_path / "d.csv")
    ours, theirs = [], []
    for seed in range(5):
        ours.append(_stl(path, seed)["nmse"])
        train, test = load_mpmtl_data("table", data_path=path, seed=seed, task_column="task",
                                      target_column="y")  # fmt: skip
        pred = [
            RidgeCV().fit(X, y).predict(Xt)
            for X, y, Xt in zip(train.X, train.y, test.X, strict=True)
        ]
        theirs.append(nmse(list(test.y), pred))
    assert abs(np.mean(ours) - np.mean(theirs)) <= 0.02


def test_saved_models_carry_their_intercepts(tmp_path):
    path = _diabetes_tasks(tmp_path / "d.csv")
    out = _stl(path, save_models=tmp_path / "m")
    from privmtl.experiments.mpmtl import evaluate_saved
    from privmtl.linear.saved import load_linear_models

    meta, _ = load_linear_models(tmp_path / "m")
    assert meta["data"]["target_offsets"] == out["target_offsets"]
    assert evaluate_saved(tmp_path / "m")["nmse"] == pytest.approx(out["nmse"], abs=1e-12)


def test_school_and_synthetic_keep_models_without_intercepts():
    out = run_mpmtl(data="synthetic-lowrank", method="stl-l2", seed=0)
    assert "target_offsets" not in out
    train, _ = load_mpmtl_data("synthetic-lowrank", seed=0)
    from privmtl.experiments.mpmtl import target_offsets

    assert not target_offsets(train, "none").any()
    assert not target_offsets(train, "unit-norm").any()  # School's protocol


def test_sweep_selection_scores_candidates_with_their_intercepts(tmp_path, capsys):
    import json

    from privmtl.cli import main

    def sweep(path, out):
        code = main(["mpmtl-sweep", "--data", "table", "--data-path", str(path),
                     "--task-column", "task", "--target-column", "y", "--methods", "stl-l2",
                     "--epsilons", "1", "--out", str(out), "--json"])  # fmt: skip
        cap = capsys.readouterr()
        assert code == 0, cap.err
        return {r["method"]: r for r in json.loads(cap.out)["summary"]}

    a = sweep(_diabetes_tasks(tmp_path / "a.csv"), tmp_path / "sa")
    b = sweep(_diabetes_tasks(tmp_path / "b.csv", shift=152.0), tmp_path / "sb")
    # per-task selection on validation rows: predictions without the intercepts would miss every
    # task's mean (nMSE above 5 here)
    assert a["stl-l2"]["selection_method"] == "client" and a["stl-l2"]["mean"] < 0.9
    assert abs(a["stl-l2"]["mean"] - b["stl-l2"]["mean"]) <= 1e-9
