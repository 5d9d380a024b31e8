"""Per-client rows: their columns, their files and the checks of their path."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from privmtl.exceptions import InvalidParameterError
from privmtl.linear.metrics import nmse
from privmtl.per_client import (
    MPMTL_COLUMNS,
    PMTL_COLUMNS,
    check_rows_path,
    mpmtl_rows,
    pmtl_rows,
    read_rows,
    write_rows,
)


def _rows():
    sizes = {"train": np.array([5, 6, 7]), "val": np.array([1, 1, 2]), "test": np.array([4, 0, 8])}
    return pmtl_rows(
        ["a", "b", "007"], sizes, ["local", "trained", "local"], np.array([3.0, 0.0, 2.0]),
        np.array([0.5, np.nan, 0.125]),
    )  # fmt: skip


def test_pmtl_rows_hold_accuracy_local_accuracy_and_gain():
    rows = _rows()
    assert list(rows.columns) == list(PMTL_COLUMNS)
    assert rows["test_accuracy"].tolist()[0] == 0.75 and np.isnan(rows["test_accuracy"][1])
    assert rows["gain"].tolist()[0] == 0.25 and rows["gain"].tolist()[2] == 0.125
    assert np.isnan(rows["local_test_accuracy"][1])  # no local score: blank, not zero


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_rows_round_trip_exactly(tmp_path, suffix):
    rows = _rows()
    path = write_rows(tmp_path / f"rows{suffix}", rows)
    back = read_rows(path)
    assert back["client"].tolist() == ["a", "b", "007"]  # ids stay text
    pd.testing.assert_frame_equal(back, rows, check_dtype=False)
    assert not list(tmp_path.glob(".privmtl-*"))  # written through a renamed temporary


def test_the_path_is_checked_before_any_work(tmp_path):
    assert check_rows_path(tmp_path / "new" / "rows.csv").name == "rows.csv"
    with pytest.raises(InvalidParameterError, match=r"'per_client'.*\.csv or \.parquet"):
        check_rows_path(tmp_path / "rows.txt")
    (tmp_path / "d.csv").mkdir()
    with pytest.raises(InvalidParameterError, match="which is a folder"):
        check_rows_path(tmp_path / "d.csv")
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidParameterError, match="writable folder"):
        check_rows_path(tmp_path / "file" / "rows.csv", name="per_client")


def test_mpmtl_rows_read_each_task_alone_and_add_up_to_the_pooled_nmse():
    rng = np.random.default_rng(0)
    ys = [rng.normal(size=n) for n in (5, 9, 4)]
    pred = [y + rng.normal(scale=0.3, size=y.size) for y in ys]
    alone = [y + rng.normal(scale=0.5, size=y.size) for y in ys]
    rows = mpmtl_rows(["t0", "t1", "t2"], [10, 20, 30], ys, pred, "lowrank", alone)
    assert list(rows.columns) == list(MPMTL_COLUMNS)
    for k, y in enumerate(ys):  # each task's own targets only
        mse = float(np.mean((pred[k] - y) ** 2))
        assert rows["test_mse"][k] == pytest.approx(mse)
        assert rows["test_nmse"][k] == pytest.approx(mse / np.var(y))
    pooled = (
        (rows["test_mse"] * rows["n_test"]).sum()
        / rows["n_test"].sum()
        / np.var(np.concatenate(ys))
    )
    assert pooled == pytest.approx(nmse(ys, pred))
    assert np.allclose(rows["gain"], rows["stl_nmse"] - rows["test_nmse"])
