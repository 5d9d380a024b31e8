"""An MP-MTL run's per-task rows: one per task, adding up to the run's nMSE and its baseline."""

from __future__ import annotations

import json

import numpy as np
import pytest

from privmtl.data.synthetic import make_lowrank_tasks
from privmtl.experiments.mpmtl import evaluate_saved, run_mpmtl
from privmtl.per_client import read_rows


def test_one_row_per_task_that_adds_up_to_the_runs_nmse(tmp_path):
    out = run_mpmtl(
        data="synthetic-lowrank", method="lowrank", epsilon=1.0, tune=False,
        noise_source="seeded", seed=0, per_client=tmp_path / "rows.csv",
        save_models=tmp_path / "models",
    )  # fmt: skip
    rows = read_rows(tmp_path / "rows.csv")
    train, test = make_lowrank_tasks(random_state=0)  # the data set's own generator, seed 0
    assert len(rows) == test.n_tasks and set(rows["kept"]) == {"lowrank"}
    assert rows["n_train"].tolist() == [len(y) for y in train.y]
    var = float(np.var(np.concatenate([np.ravel(y) for y in test.y])))
    n = rows["n_test"]
    assert (rows["test_mse"] * n).sum() / n.sum() / var == pytest.approx(out["nmse"], rel=1e-9)
    assert (rows["stl_mse"] * n).sum() / n.sum() / var == pytest.approx(out["stl_nmse"], rel=1e-9)
    meta = json.loads((tmp_path / "models" / "model.json").read_text())
    assert meta["clients"] == {"file": "clients.csv"}
    assert (tmp_path / "models" / "clients.csv").read_bytes() == (
        tmp_path / "rows.csv"
    ).read_bytes()
    again = evaluate_saved(tmp_path / "models", per_client=tmp_path / "again.csv")
    assert read_rows(again["per_client_file"]).equals(rows)
