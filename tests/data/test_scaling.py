"""Feature scaling of users' tables: per client / per task, from its own training rows only."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from privmtl.data.federated_table import (
    DEFAULT_CLIENT_SCALING,
    SCALING_CLIP,
    SCALING_DESCRIPTIONS,
    client_scaling,
    load_federated_table,
)
from privmtl.data.multitask import INTERCEPT, MultiTaskDataset, standardization
from privmtl.exceptions import DataFormatError
from privmtl.experiments.mpmtl import data_protocol, load_mpmtl_data


def test_standardization_matches_numpy_and_keeps_constant_columns():
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.normal(3, 5, 40), np.ones(40), rng.normal(-1e3, 1e-2, 40)])
    mean, scale = standardization(X)
    assert np.allclose(mean, [X[:, 0].mean(), 0.0, X[:, 2].mean()])
    assert np.allclose(scale, [X[:, 0].std(), 1.0, X[:, 2].std()])
    Z = (X - mean) / scale
    assert np.allclose(Z[:, [0, 2]].mean(0), 0) and np.allclose(Z[:, [0, 2]].std(0), 1)
    assert np.all(Z[:, 1] == 1.0)  # a bias column stays a bias column


def _fed_table(path, n_clients=6, rows=30, seed=0):
    rng = np.random.default_rng(seed)
    frames = []
    for c in range(n_clients):
        x = rng.normal(loc=c, scale=1 + c, size=(rows, 3)) * [1e-3, 1.0, 1e3]
        f = pd.DataFrame(x, columns=["a", "b", "c"])
        f.insert(0, "user", f"u{c}")
        f["label"] = rng.integers(0, 2, size=rows)
        frames.append(f)
    frame = pd.concat(frames, ignore_index=True)
    frame.to_csv(path, index=False)
    return frame


def _load(path, scaling):
    return load_federated_table(path, client_column="user", label_column="label", scaling=scaling)


def test_each_client_is_standardized_with_its_own_training_split(tmp_path):
    _fed_table(tmp_path / "t.csv")
    raw, ds = _load(tmp_path / "t.csv", "none"), _load(tmp_path / "t.csv", "per-client")
    assert ds.scaling == SCALING_DESCRIPTIONS["per-client"] and raw.scaling == "none"
    for k in range(ds.n_clients):
        tr = raw.train_x[k].double().numpy()
        mean, std = tr.mean(0), tr.std(0)
        for split in ("train", "val", "test"):
            got = getattr(ds, f"{split}_x")[k].double().numpy()
            want = (getattr(raw, f"{split}_x")[k].double().numpy() - mean) / std
            assert np.allclose(got, want, atol=1e-4)
        z = ds.train_x[k].double().numpy()
        assert np.allclose(z.mean(0), 0, atol=1e-5) and np.allclose(z.std(0), 1, atol=1e-4)


def test_a_client_scaling_does_not_read_other_clients(tmp_path):
    frame = _fed_table(tmp_path / "t.csv")
    other = frame.copy()
    rows = other["user"] != "u0"
    noise = np.random.default_rng(5).standard_exponential(size=(int(rows.sum()), 3))
    other.loc[rows, ["a", "b", "c"]] = noise * 1e4  # other clients' data: nothing alike
    other.to_csv(tmp_path / "other.csv", index=False)
    ds, ds2 = _load(tmp_path / "t.csv", "per-client"), _load(tmp_path / "other.csv", "per-client")
    for split in ("train", "val", "test"):
        assert np.array_equal(getattr(ds, f"{split}_x")[0], getattr(ds2, f"{split}_x")[0])
    assert not np.allclose(ds.train_x[1], ds2.train_x[1])  # the others did change


def test_bad_scaling_and_pmtl_errors_name_the_cli_flags(tmp_path):
    frame = _fed_table(tmp_path / "t.csv")
    with pytest.raises(Exception, match="scaling"):
        _load(tmp_path / "t.csv", "pooled")
    with pytest.raises(DataFormatError, match="--client-column"):
        load_federated_table(tmp_path / "t.csv", client_column="client", label_column="label")
    with pytest.raises(DataFormatError, match="--label-column"):
        load_federated_table(tmp_path / "t.csv", client_column="user", label_column="y")
    frame.assign(label=frame["label"] + 0.5).to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(DataFormatError, match="--label-column") as err:
        load_federated_table(tmp_path / "bad.csv", client_column="user", label_column="label")
    assert "task" not in str(err.value) and "target" not in str(err.value)


def test_default_clips_standardized_values_of_each_client(tmp_path):
    frame = _fed_table(tmp_path / "t.csv")
    # client u0: column a is almost constant on its training rows and ordinary on its test rows
    # (a pixel that is rarely lit in one client's training images); the split ignores values
    rows = np.flatnonzero(frame["user"] == "u0")
    test_b = _load(tmp_path / "t.csv", "none").test_x[0][:, 1].double().numpy()
    in_test = np.isclose(frame.loc[rows, "b"].to_numpy()[:, None], test_b[None, :], atol=1e-5)
    frame.loc[rows, "a"] = 0.0
    frame.loc[rows[~in_test.any(1)][:2], "a"] = 1e-3
    frame.loc[rows[in_test.any(1)], "a"] = 1.0
    frame.to_csv(tmp_path / "t.csv", index=False)
    assert DEFAULT_CLIENT_SCALING == "per-client-clipped"
    plain = _load(tmp_path / "t.csv", "per-client")
    ds = load_federated_table(tmp_path / "t.csv", client_column="user", label_column="label")
    assert ds.scaling == SCALING_DESCRIPTIONS["per-client-clipped"]
    worst = max(float(x.abs().max()) for x in (*plain.train_x, *plain.val_x, *plain.test_x))
    assert worst > 10 * SCALING_CLIP  # without the clip this column blows up
    for split in ("train", "val", "test"):
        for got, want in zip(getattr(ds, f"{split}_x"), getattr(plain, f"{split}_x"), strict=True):
            assert float(got.abs().max()) <= SCALING_CLIP
            assert np.allclose(got, np.clip(want, -SCALING_CLIP, SCALING_CLIP))


def test_client_scaling_fits_on_the_rows_it_is_given():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(30, 2)) * [1e-3, 1e3]
    z = client_scaling(x, "per-client")(x)
    assert np.allclose(z.mean(0), 0) and np.allclose(z.std(0), 1)
    far = client_scaling(x, "per-client-clipped")(100 * x)  # rows far outside the fitted ones
    assert np.abs(far).max() == SCALING_CLIP
    assert np.array_equal(client_scaling(x, "none")(x), x)
    with pytest.raises(Exception, match="scaling"):
        client_scaling(x, "pooled")


def test_multitask_standardize_uses_each_tasks_training_rows():
    rng = np.random.default_rng(1)
    Xtr = [rng.normal(i, 1 + i, size=(20, 3)) for i in range(3)]
    Xte = [rng.normal(i, 1 + i, size=(10, 3)) for i in range(3)]
    ys = [rng.normal(size=20) for _ in range(3)]
    train = MultiTaskDataset(X=Xtr, y=ys)
    test = MultiTaskDataset(X=Xte, y=[y[:10] for y in ys])
    got = test.standardize(train)
    for i in range(3):
        want = (Xte[i] - Xtr[i].mean(0)) / Xtr[i].std(0)
        assert np.allclose(got.X[i], want)
    with pytest.raises(DataFormatError, match="same tasks"):
        test.subset([0, 1]).standardize(train)


def _task_table(path, *, constant=False):
    rng = np.random.default_rng(2)
    frames = []
    for t in range(4):
        f = pd.DataFrame(rng.normal(size=(50, 2)) * [1e-3, 1e3], columns=["u", "v"])
        if constant:
            f["one"] = 1.0
        f.insert(0, "site", f"s{t}")
        f["outcome"] = rng.normal(size=50) + 5
        frames.append(f)
    pd.concat(frames, ignore_index=True).to_csv(path, index=False)


@pytest.mark.parametrize("constant", [False, True])
def test_table_defaults_are_70_30_per_task_standardization(tmp_path, constant):
    _task_table(tmp_path / "t.csv", constant=constant)
    train, test = load_mpmtl_data(
        "table", data_path=tmp_path / "t.csv", task_column="site", target_column="outcome"
    )
    assert train.n_samples.tolist() == [35] * 4 and test.n_samples.tolist() == [15] * 4
    feats = train.X[0][:, :2]
    assert np.allclose(feats.mean(0), 0) and np.allclose(feats.std(0), 1)
    # an intercept column is appended only when the table has no constant feature
    assert (train.feature_names[-1] == INTERCEPT) is (not constant)
    assert np.all(train.X[0][:, -1] == 1.0)


def test_school_keeps_the_papers_protocol_and_tables_get_user_defaults():
    assert data_protocol("school") == ("unit-norm", 0.3)
    assert data_protocol("table") == ("per-task", 0.7)
    assert data_protocol("table", "unit-norm", 0.3) == ("unit-norm", 0.3)
    assert data_protocol("synthetic-lowrank") == ("none", None)
