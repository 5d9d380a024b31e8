"""What a user's table may hold: labels 0..K-1, unique column names, helpful column errors."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from privmtl.data.federated_table import load_federated_table
from privmtl.data.readers import dataset_from_frame, read_frame, read_table
from privmtl.exceptions import DataFormatError, PrivmtlWarning


def _table(labels, n_clients=6, rows=10, seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    n = n_clients * rows
    frame = pd.DataFrame(rng.normal(size=(n, 3)), columns=["f0", "f1", "f2"])
    frame.insert(0, "user", np.repeat([f"u{c}" for c in range(n_clients)], rows))
    frame["label"] = np.resize(np.asarray(labels), n)
    return frame


def _load(tmp_path, frame, **kw):
    path = tmp_path / "t.csv"
    frame.to_csv(path, index=False)
    return load_federated_table(path, client_column="user", label_column="label", **kw)


def test_a_label_space_larger_than_the_table_is_refused(tmp_path):
    frame = _table([0, 1, 2])
    frame.loc[4, "label"] = 999999
    with pytest.raises(DataFormatError) as exc:
        _load(tmp_path, frame)
    msg = str(exc.value)
    assert "holds label 999999" in msg and "1000000 classes" in msg and "60 rows" in msg
    assert "4 distinct labels (0, 1, 2, 999999)" in msg and "Relabel it to 0..3" in msg
    # the rule is the table's size: the same label space over as many rows is a label space
    frame = _table([0, 1, 2], n_clients=4, rows=250)
    frame.loc[4, "label"] = 999
    with pytest.warns(PrivmtlWarning):
        assert _load(tmp_path, frame).n_classes == 1000


def test_labels_that_leave_classes_empty_warn_and_keep_their_values(tmp_path):
    with pytest.warns(PrivmtlWarning) as record:
        ds = _load(tmp_path, _table([3, 7]))
    assert ds.n_classes == 8  # never remapped: label 7 is output 7
    assert sorted(int(v) for v in np.unique(np.concatenate([y.numpy() for y in ds.train_y]))) == [
        3,
        7,
    ]
    (message,) = [str(w.message) for w in record]
    assert "no row with label(s) 0, 1, 2, 4, 5, 6 of 0..7" in message
    assert "6 of them never seen" in message and "relabel the column to 0..1" in message


def test_labels_0_to_k_minus_1_and_an_explicit_n_classes_do_not_warn(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivmtlWarning)
        assert _load(tmp_path, _table([0, 1, 2])).n_classes == 3
        assert _load(tmp_path, _table([3, 7]), n_classes=8).n_classes == 8


def test_one_class_is_refused(tmp_path):
    with pytest.raises(DataFormatError, match=r"one class only \(every label is 4\)"):
        _load(tmp_path, _table([4]))


def test_a_float_label_is_printed_as_a_number(tmp_path):
    frame = _table([0, 1, 2]).astype({"label": float})
    frame.loc[4, "label"] = 3.5
    with pytest.raises(DataFormatError) as exc:
        _load(tmp_path, frame)
    assert str(exc.value).endswith("got 3.5.") and "np." not in str(exc.value)


def test_a_repeated_column_name_is_refused_not_renamed(tmp_path):
    path = tmp_path / "dup.csv"
    lines = _table([0, 1, 2]).to_csv(index=False).splitlines()
    lines[0] = "user,f0,f1,f0,label"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(
        DataFormatError, match=r"column 'f0' appears more than once \(columns 2 and 4\)"
    ):
        load_federated_table(path, client_column="user", label_column="label")
    path.write_text("task,a,a,y\nt0,1,2,3\nt1,1,2,4\n")
    with pytest.raises(DataFormatError, match="column 'a' appears more than once"):
        read_table(path)


def test_a_written_index_column_is_not_a_repeated_name(tmp_path):
    path = tmp_path / "indexed.csv"
    _table([0, 1, 2]).to_csv(path)  # header starts with an unnamed column
    ds = load_federated_table(path, client_column="user", label_column="label",
                              feature_columns=["f0", "f1", "f2"])  # fmt: skip
    assert ds.n_clients == 6


def test_a_missing_column_lists_ten_columns_and_the_close_matches(tmp_path):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(size=(60, 66)), columns=[f"feat_{j:02d}" for j in range(66)])
    frame.insert(0, "user", np.repeat([f"u{c}" for c in range(6)], 10))
    frame["label"] = np.resize(np.arange(3), 60)
    path = tmp_path / "wide.csv"
    frame.to_csv(path, index=False)
    with pytest.raises(DataFormatError) as exc:
        load_federated_table(path, client_column="user", label_column="lable")
    msg = str(exc.value)
    assert "'lable' not found; columns (68): ['user', 'feat_00'" in msg
    assert "'feat_08', … and 58 more]" in msg and "'feat_09'" not in msg
    assert msg.endswith("; did you mean 'label'?")
    with pytest.raises(DataFormatError) as exc:
        load_federated_table(
            path, client_column="user", label_column="label", feature_columns=["feat_1", "x"]
        )
    assert "['feat_1', 'x'] not found" in str(exc.value) and "did you mean" in str(exc.value)


class _CountedHeader(list):
    """A header that counts how often pandas deep-copies it along with a frame's ``attrs``."""

    copies = 0

    def __deepcopy__(self, memo):
        type(self).copies += 1
        return _CountedHeader(self)


def _wide_csv(path, n_cols, rows=6, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(rows, n_cols)).round(3)
    tasks = [f"t{r % 2}" for r in range(rows)]
    y = [r % 2 for r in range(rows)]
    with open(path, "w") as fh:
        fh.write("task,y," + ",".join(f"f{j}" for j in range(n_cols)) + "\n")
        for r in range(rows):
            fh.write(f"{tasks[r]},{y[r]}," + ",".join(map(str, X[r])) + "\n")
    return X


def test_a_wide_table_is_read_whole_without_copying_its_header_per_column(tmp_path):
    path = tmp_path / "wide.csv"
    X = _wide_csv(path, 3000)
    frame = read_frame(path)
    _CountedHeader.copies = 0
    frame.attrs["privmtl_header"] = _CountedHeader(str(c) for c in frame.columns)
    data = dataset_from_frame(frame, source=str(path))
    # the header travels with the frame: one copy at most, not one per column read
    assert _CountedHeader.copies <= 1
    assert data.n_tasks == 2 and data.feature_names == tuple(f"f{j}" for j in range(3000))
    np.testing.assert_array_equal(np.vstack([data.X[0], data.X[1]]), np.vstack([X[0::2], X[1::2]]))
    np.testing.assert_array_equal(data.y[1], [1.0, 1.0, 1.0])


def test_a_bad_cell_of_a_wide_table_is_named_by_column_and_line(tmp_path):
    path = tmp_path / "wide.csv"
    _wide_csv(path, 2000)
    lines = path.read_text().splitlines()
    cells = lines[3].split(",")
    cells[2 + 1500] = "x"
    lines[3] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataFormatError, match=r"non-numeric value in column 'f1500', line 4"):
        read_table(path)
    cells[2 + 1500] = "0.5"
    cells[2 + 1999] = "inf"
    lines[3] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataFormatError, match=r"NaN or infinite value in column 'f1999', line 4"):
        read_table(path)


def test_a_column_named_like_a_renamed_one_is_kept(tmp_path):
    path = tmp_path / "dotted.csv"
    path.write_text("task,a,a.1,y\nt0,1,2,3\nt1,1,2,4\n")
    assert read_table(path).feature_names == ("a", "a.1")
