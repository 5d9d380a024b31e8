"""Per-client rows: their columns, their files and the checks of their path."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from privmtl.exceptions import InvalidParameterError
from privmtl.per_client import (
    PMTL_COLUMNS,
    check_rows_path,
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


def test_importing_the_rows_module_loads_no_pandas():
    """A run imports the module at its top to check its path; pandas loads when rows are built."""
    code = "import sys, privmtl.per_client; print('pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
