"""Tests of the readers: School, MALSAR .mat, CSV and Parquet tables, and bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.io import savemat

from privmtl.data import (
    dataset_from_frame,
    default_school_path,
    load_malsar_mat,
    load_school,
    read_table,
)
from privmtl.exceptions import DataFormatError


@pytest.mark.shared_data
def test_school(school_path: Path) -> None:
    ds = load_school(school_path)
    assert ds.n_tasks == 139
    assert int(ds.n_samples.sum()) == 15362
    assert ds.n_features == 28
    assert all(
        x.dtype == np.float64 and y.dtype == np.float64 for x, y in zip(ds.X, ds.y, strict=True)
    )
    assert ds.task_type == "regression"
    assert ds.task_names[0] == "school_001" and ds.task_names[-1] == "school_139"
    X = np.concatenate(ds.X)
    np.testing.assert_array_equal(X[:, -1], 1.0)  # MALSAR's constant column, kept as is
    y = np.concatenate(ds.y)
    assert y.min() >= 1 and y.max() <= 70
    # uint8 arithmetic would wrap around; float64 sums must exceed 255.
    assert float(np.sum(ds.y[0])) > 255


@pytest.mark.shared_data
def test_school_default_path_from_env(school_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PRIVMTL_SCHOOL_PATH", str(school_path))
    assert default_school_path() == school_path
    assert load_school().n_tasks == 139


def test_school_missing_file_names_path_and_env(tmp_path: Path, monkeypatch) -> None:
    missing = tmp_path / "nowhere" / "school.mat"
    monkeypatch.setenv("PRIVMTL_SCHOOL_PATH", str(missing))
    with pytest.raises(DataFormatError, match="PRIVMTL_SCHOOL_PATH") as err:
        load_school()
    assert str(missing) in str(err.value)
    monkeypatch.delenv("PRIVMTL_SCHOOL_PATH")
    monkeypatch.delenv("PRIVMTL_SHARED_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    assert default_school_path() == tmp_path.parent / "shared" / "data" / "school" / "school.mat"


def _cell(arrays: list[np.ndarray], column: bool = False) -> np.ndarray:
    cell = np.empty((len(arrays), 1) if column else (1, len(arrays)), dtype=object)
    for i, a in enumerate(arrays):
        cell.flat[i] = a
    return cell


@pytest.mark.parametrize("column", [False, True])
def test_malsar_mat_uint8_and_cell_layouts(tmp_path: Path, column: bool) -> None:
    X1 = np.array([[200, 100], [255, 1]], dtype=np.uint8)
    X2 = np.array([[3, 4]], dtype=np.uint8)
    Y = [np.array([[250], [10]], dtype=np.uint8), np.array([[7]], dtype=np.uint8)]
    path = tmp_path / "tiny.mat"
    savemat(path, {"X": _cell([X1, X2], column), "Y": _cell(Y, column)})
    ds = load_malsar_mat(path)
    assert ds.n_tasks == 2 and ds.n_features == 2
    np.testing.assert_array_equal(ds.X[0], [[200.0, 100.0], [255.0, 1.0]])
    np.testing.assert_array_equal(ds.y[0], [250.0, 10.0])
    assert ds.X[0].sum() == 556.0  # no uint8 overflow


def test_malsar_mat_classification_labels(tmp_path: Path) -> None:
    path = tmp_path / "cls.mat"
    X = [np.eye(2), np.ones((2, 2))]
    savemat(
        path, {"X": _cell(X), "Y": _cell([np.array([[1.0], [-1.0]]), np.array([[-1.0], [1.0]])])}
    )
    ds = load_malsar_mat(path, task_type=None)
    assert ds.task_type == "classification"
    np.testing.assert_array_equal(ds.y[0], [1.0, 0.0])
    assert load_malsar_mat(path).task_type == "regression"  # default keeps the values


def test_malsar_mat_bad_files(tmp_path: Path) -> None:
    with pytest.raises(DataFormatError, match="not found"):
        load_malsar_mat(tmp_path / "missing.mat")
    junk = tmp_path / "junk.mat"
    junk.write_bytes(b"definitely not matlab")
    with pytest.raises(DataFormatError, match=r"junk\.mat"):
        load_malsar_mat(junk)
    nox = tmp_path / "nox.mat"
    savemat(nox, {"Y": _cell([np.ones((2, 1))])})
    with pytest.raises(DataFormatError, match="'X' not found"):
        load_malsar_mat(nox)
    notcell = tmp_path / "notcell.mat"
    savemat(notcell, {"X": np.ones((2, 2)), "Y": np.ones((2, 1))})
    with pytest.raises(DataFormatError, match="cell array"):
        load_malsar_mat(notcell)
    short = tmp_path / "short.mat"
    savemat(short, {"X": _cell([np.ones((2, 2)), np.ones((1, 2))]), "Y": _cell([np.ones((2, 1))])})
    with pytest.raises(DataFormatError, match="X has 2 cells but Y has 1"):
        load_malsar_mat(short)


def _frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "task": ["b", "a", "b", "a", "c"],
            "f1": [1.0, 2.0, 3.0, 4.0, 5.0],
            "f2": [0, 1, 0, 1, 0],
            "y": [0.5, 1.5, 2.5, 3.5, 4.5],
        }
    )


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".csv.gz"])
def test_read_table_round_trip(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"table{suffix}"
    frame = _frame()
    if suffix == ".parquet":
        frame.to_parquet(path)
    else:
        frame.to_csv(path, index=False)
    ds = read_table(path)
    assert ds.task_names == ("b", "a", "c")  # order of first appearance
    assert ds.feature_names == ("f1", "f2")
    assert ds.task_type == "regression"
    np.testing.assert_array_equal(ds.X[0], [[1.0, 0.0], [3.0, 0.0]])
    np.testing.assert_array_equal(ds.y[1], [1.5, 3.5])
    sel = read_table(path, feature_columns=["f2"])
    assert sel.n_features == 1


def test_read_table_infers_classification(tmp_path: Path) -> None:
    frame = _frame().assign(y=[1, -1, -1, 1, 1])
    path = tmp_path / "cls.csv"
    frame.to_csv(path, index=False)
    ds = read_table(path)
    assert ds.task_type == "classification"
    np.testing.assert_array_equal(ds.y[0], [1.0, 0.0])
    assert read_table(path, task_type="regression").y[0].tolist() == [1.0, -1.0]
    frame.assign(y=[0, 1, 1, 0, 1]).to_csv(path, index=False)
    assert read_table(path).task_type == "classification"
    frame.assign(y=[0, 2, 1, 0, 1]).to_csv(path, index=False)
    with pytest.raises(DataFormatError, match="0/1 or -1/1"):
        read_table(path, task_type="classification")


def test_read_table_bad_input(tmp_path: Path) -> None:
    with pytest.raises(DataFormatError, match=r"unknown table format '\.xlsx'"):
        read_table(tmp_path / "data.xlsx")
    with pytest.raises(DataFormatError, match="not found"):
        read_table(tmp_path / "missing.csv")
    path = tmp_path / "t.csv"
    _frame().to_csv(path, index=False)
    with pytest.raises(DataFormatError, match=r"target column \(--target-column\) 'score'"):
        read_table(path, target_column="score")
    with pytest.raises(DataFormatError, match=r"task column \(--task-column\) 'school'"):
        read_table(path, task_column="school")
    with pytest.raises(DataFormatError, match="'f9'"):
        read_table(path, feature_columns=["f1", "f9"])
    _frame().assign(f1=[1.0, np.nan, 3.0, 4.0, 5.0]).to_csv(path, index=False)
    with pytest.raises(DataFormatError, match=r"NaN.*column 'f1', line 3 of the file"):
        read_table(path)
    _frame().assign(f2=["0", "1", "x", "1", "0"]).to_csv(path, index=False)
    with pytest.raises(DataFormatError, match=r"non-numeric.*column 'f2', line 4 of the file"):
        read_table(path)
    _frame().assign(y=[0.5, None, 1.0, 2.0, 3.0]).to_csv(path, index=False)
    with pytest.raises(DataFormatError, match="column 'y', line 3 of the file"):
        read_table(path)
    _frame().assign(task=["a", None, "b", "a", "b"]).to_parquet(tmp_path / "t.parquet")
    with pytest.raises(DataFormatError, match=r"missing task.*row 1"):
        read_table(tmp_path / "t.parquet")


def test_task_with_zero_rows(tmp_path: Path) -> None:
    frame = _frame()
    frame["task"] = pd.Categorical(frame["task"], categories=["a", "b", "c", "empty"])
    path = tmp_path / "cat.parquet"
    frame.to_parquet(path)
    with pytest.raises(DataFormatError, match=r"'empty'.*0 rows"):
        read_table(path)
    ds = dataset_from_frame(
        frame[frame["task"] != "c"].assign(task=lambda f: f["task"].astype(str))
    )
    assert ds.task_names == ("b", "a")
