"""``privmtl pmtl --data table``: a user's federated CSV, private and not; malformed tables exit 2."""

from __future__ import annotations

import json
import sys

import numpy as np
import pandas as pd
import pytest

from privmtl.cli import main
from privmtl.data.federated_table import load_federated_table


def _table(path, *, n_clients=20, rows=40, d=5, k=3, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(k, d)) * 2
    frames = []
    for c in range(n_clients):
        y = rng.integers(0, k, size=rows)
        x = centers[y] + rng.normal(size=(rows, d))
        f = pd.DataFrame(x, columns=[f"f{j}" for j in range(d)])
        f.insert(0, "user", f"u{c:02d}")
        f["label"] = y
        frames.append(f)
    frame = pd.concat(frames, ignore_index=True)
    frame.to_csv(path, index=False)
    return frame


ARGS = ["pmtl", "--data", "table", "--client-column", "user", "--label-column", "label",
        "--model", "logreg", "--rounds", "20", "--clients-per-round", "5", "--json",
        "--reproducible-noise"]  # fmt: skip


@pytest.mark.parametrize("private", [False, True])
def test_table_runs_private_and_nonprivate(tmp_path, capsys, private):
    _table(tmp_path / "t.csv")
    extra = ["--epsilon", "4"] if private else []
    assert main([*ARGS, "--data-path", str(tmp_path / "t.csv"), *extra]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["num_clients"] == 20 and out["guarantee"]["private"] is private
    if private:
        # a user's table gets delta well below 1/m, not the papers' 1/m
        assert out["delta"] == pytest.approx(min(1e-5, 1 / 2000))
    # well-separated classes: far above chance (1/3) without noise
    if not private:
        assert out["test_accuracy"] > 0.6


def test_split_covers_every_row_once(tmp_path):
    frame = _table(tmp_path / "t.csv")
    ds = load_federated_table(
        tmp_path / "t.csv", client_column="user", label_column="label", scaling="none"
    )
    assert ds.n_clients == 20 and ds.n_classes == 3 and ds.n_features == 5
    for k in range(ds.n_clients):
        n = sum(len(getattr(ds, f"{s}_y")[k]) for s in ("train", "val", "test"))
        assert n == 40 and len(ds.test_y[k]) == 8 and len(ds.train_y[k]) >= 1
    got = np.sort(np.concatenate([t.numpy() for s in ("train", "val", "test")
                                  for t in getattr(ds, f"{s}_x")])[:, 0])  # fmt: skip
    assert np.allclose(got, np.sort(frame["f0"].to_numpy(dtype=np.float32)))


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda f: f.assign(f2=f["f2"].where(f.index != 7)), "'f2'"),  # NaN
        (lambda f: f.assign(f1=f["f1"].astype(object).where(f.index != 3, "abc")), "'f1'"),
        (lambda f: f.assign(label=f["label"].where(f.index != 5, -1)), "'label'"),  # out of range
        (lambda f: f.assign(label=f["label"].astype(float).where(f.index != 5, 1.5)), "'label'"),
        (lambda f: pd.concat([f, f.iloc[:1].assign(user="lonely")]), "'lonely'"),  # 1 row
        (lambda f: f.drop(columns="user"), "'user'"),  # missing client column
    ],
)
def test_malformed_tables_exit_2_with_one_line(tmp_path, capsys, mutate, needle):
    frame = _table(tmp_path / "t.csv")
    mutate(frame).to_csv(tmp_path / "bad.csv", index=False)
    assert main([*ARGS, "--data-path", str(tmp_path / "bad.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("privmtl: error:") and needle in err[0]


def test_cnn_refuses_non_image_table_cleanly(tmp_path, capsys):
    _table(tmp_path / "t.csv")
    argv = [a if a != "logreg" else "cnn" for a in ARGS]
    assert main([*argv, "--data-path", str(tmp_path / "t.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cnn" in err[0] and "logreg" in err[0]


def test_user_model_factory(tmp_path, capsys, monkeypatch):
    _table(tmp_path / "t.csv")
    (tmp_path / "my_models.py").write_text(
        "import torch\n"
        "def mlp(n_features, n_classes):\n"
        "    return torch.nn.Sequential(torch.nn.Linear(n_features, 8), torch.nn.ReLU(),\n"
        "                               torch.nn.Linear(8, n_classes))\n"
        "def not_a_model(n_features, n_classes):\n"
        "    return 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = [a if a != "logreg" else "my_models:mlp" for a in ARGS]
    assert main([*argv, "--data-path", str(tmp_path / "t.csv")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "my_models:mlp" and out["test_accuracy"] > 0.4
    for bad in ("my_models:not_a_model", "my_models:nope", "nomodule_xyz:f", "mlp"):
        argv = [a if a != "logreg" else bad for a in ARGS]
        assert main([*argv, "--data-path", str(tmp_path / "t.csv")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "model" in err[0]
    sys.modules.pop("my_models", None)
