"""A pmtl run's per-client rows: one per client, adding up to the run's own numbers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from privmtl.experiments.pmtl import evaluate_saved, run_pmtl
from privmtl.federated import baseline
from privmtl.per_client import read_rows

RUN = {
    "data": "synthetic", "num_clients": 12, "rounds": 3, "epsilon": 2.0, "seed": 0,
    "noise_source": "seeded", "show_progress": False, "threads": 1,
}  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    out = run_pmtl(**RUN, per_client=d / "rows.csv", save_models=d / "models", eval_every=1)
    return out, read_rows(d / "rows.csv"), d


def _weighted(rows, column):
    has = rows["n_test"] > 0
    return float((rows[column] * rows["n_test"])[has].sum() / rows["n_test"][has].sum())


def test_one_row_per_client_that_adds_up_to_the_runs_accuracy(run):
    out, rows, d = run
    meta = json.loads((d / "models" / "model.json").read_text())
    assert rows["client"].tolist() == meta["client_ids"] and len(rows) == 12
    # independent oracle: the pooled accuracy is the test-size weighted mean of the clients'
    assert _weighted(rows, "test_accuracy") == pytest.approx(out["test_accuracy"], abs=1e-12)
    assert _weighted(rows, "local_test_accuracy") == pytest.approx(out["local_test_accuracy"])
    assert _weighted(rows, "gain") == pytest.approx(out["gain_over_local"], abs=1e-12)
    counts = rows["kept"].value_counts().to_dict()
    assert counts == {k: v for k, v in out["finetune_auto"]["clients_per_candidate"].items() if v}
    assert rows["n_test"].tolist() == [int(v) for v in rows["n_test"]]


def test_the_saved_folder_holds_the_same_rows_and_evaluate_gives_them_again(run, tmp_path):
    _, rows, d = run
    meta = json.loads((d / "models" / "model.json").read_text())
    assert meta["files"]["clients"] == "clients.csv"
    assert (d / "models" / "clients.csv").read_bytes() == (d / "rows.csv").read_bytes()
    again = evaluate_saved(d / "models", per_client=tmp_path / "again.parquet")
    assert again["per_client_file"] == str(tmp_path / "again.parquet")
    assert read_rows(tmp_path / "again.parquet").equals(rows)


def test_accuracy_per_round_on_evaluation_rounds(run):
    out, _, _ = run
    assert len(out["val_accuracy_per_round"]) == out["rounds_run"] == 3
    assert all(0.0 <= a <= 1.0 for a in out["val_accuracy_per_round"])
    assert "val_accuracy_per_round" not in run_pmtl(**{**RUN, "rounds": 1})


def test_without_the_end_of_runs_scores_one_scoring_pass_and_a_sampled_baseline(
    tmp_path, monkeypatch
):
    sample = baseline.baseline_sample
    monkeypatch.setattr(baseline, "baseline_sample", lambda m, seed: sample(m, seed, size=5))
    out = run_pmtl(**RUN, finetune="none", per_client=tmp_path / "rows.csv")
    rows = read_rows(tmp_path / "rows.csv")
    assert _weighted(rows, "test_accuracy") == pytest.approx(out["test_accuracy"], abs=1e-12)
    assert set(rows["kept"]) == {"trained"} and out["baseline_clients"] == 5
    local = rows["local_test_accuracy"].to_numpy()
    assert np.isfinite(local).sum() == 5  # outside the sample: blank
    assert np.isnan(rows["gain"].to_numpy()[np.isnan(local)]).all()


def test_an_edited_clients_file_is_refused(run, tmp_path):
    """clients.csv is covered by the signed model.json through its SHA-256, like the models."""
    import shutil

    from privmtl.exceptions import DataFormatError

    _, _, d = run
    folder = tmp_path / "models"
    shutil.copytree(d / "models", folder, ignore=shutil.ignore_patterns(".privmtl*"))
    rows = (folder / "clients.csv").read_text().replace(",trained,", ",local,", 1)
    (folder / "clients.csv").write_text(rows.replace(",0.", ",1.", 1))
    with pytest.raises(DataFormatError, match=r"clients\.csv"):
        evaluate_saved(folder, per_client=tmp_path / "again.csv")


def test_evaluate_reports_the_runs_baseline_beside_the_models_it_scores(run):
    out, _, d = run
    again = evaluate_saved(d / "models")
    for key in ("local_test_accuracy", "gain_over_local", "gain_interval"):
        assert again[key] == pytest.approx(out[key], abs=1e-12), key
