"""Tests of MultiTaskDataset: validation, splits, k-fold, normalization, subsets, frames."""

from __future__ import annotations

import numpy as np
import pytest

from privmtl.data import MultiTaskDataset
from privmtl.exceptions import DataFormatError, InvalidParameterError


def _ds(sizes=(10, 7, 3), d: int = 4, seed: int = 0, **kw) -> MultiTaskDataset:
    rng = np.random.default_rng(seed)
    return MultiTaskDataset(
        X=tuple(rng.normal(size=(n, d)) for n in sizes),
        y=tuple(rng.normal(size=n) for n in sizes),
        **kw,
    )


def test_basic_properties_and_conversion() -> None:
    X = [np.arange(6, dtype=np.uint8).reshape(3, 2), np.ones((2, 2), dtype=np.int64)]
    y = [np.array([[1], [2], [3]], dtype=np.uint8), [0, 1]]
    ds = MultiTaskDataset(X=X, y=y)  # type: ignore[arg-type]
    assert ds.n_tasks == 2 and len(ds) == 2
    assert ds.n_features == 2
    assert ds.n_samples.tolist() == [3, 2]
    assert ds.task_names == ("task_0", "task_1")
    assert ds.feature_names == ("x0", "x1")
    assert all(x.dtype == np.float64 for x in ds.X) and ds.y[0].shape == (3,)
    # Copies, read-only: the caller's arrays are not shared or mutated.
    X[0][0, 0] = 99
    assert ds.X[0][0, 0] == 0
    with pytest.raises(ValueError, match="read-only"):
        ds.X[0][0, 0] = 1.0
    assert "n_tasks=2" in repr(ds)


@pytest.mark.parametrize(
    ("X", "y", "kw", "match"),
    [
        ([], [], {}, "at least one task"),
        ([np.ones((2, 3))], [np.ones(2), np.ones(1)], {}, "1 feature matrices but 2"),
        ([np.ones((2, 3)), np.ones((2, 4))], [np.ones(2)] * 2, {}, "'b'.*4 features"),
        ([np.ones((2, 3)), np.ones((3, 3))], [np.ones(2)] * 2, {}, "'b'.*3 feature rows but 2"),
        ([np.ones((2, 3)), np.ones((0, 3))], [np.ones(2), np.ones(0)], {}, "'b'.*no samples"),
        ([np.ones(3), np.ones((3, 3))], [np.ones(3)] * 2, {}, "'a'.*2-D"),
        (
            [np.ones((2, 3)), np.array([[1, np.nan, 0.0]])],
            [np.ones(2), np.ones(1)],
            {},
            "'b'.*NaN",
        ),
        ([np.ones((2, 3))] * 2, [np.ones(2), np.array([1, np.inf])], {}, "'b'.*targets.*row 1"),
        (
            [np.ones((2, 3))] * 2,
            [np.ones(2), np.array([0.0, 2.0])],
            {"task_type": "classification"},
            "'b'.*0 or 1",
        ),
        ([np.ones((2, 3))] * 2, [np.ones(2)] * 2, {"task_names": ("a", "a")}, "unique"),
        ([np.ones((2, 3))] * 2, [np.ones(2)] * 2, {"task_names": ("a",)}, "1 task names"),
    ],
)
def test_validation_errors_name_the_task(X, y, kw, match) -> None:
    names = kw.pop("task_names", ("a", "b")[: len(X)])
    with pytest.raises(DataFormatError, match=match):
        MultiTaskDataset(X=tuple(X), y=tuple(y), task_names=names, **kw)


def test_bad_task_type() -> None:
    with pytest.raises(InvalidParameterError, match="task_type"):
        MultiTaskDataset(X=(np.ones((1, 1)),), y=(np.ones(1),), task_type="ranking")  # type: ignore[arg-type]


def test_train_test_split_sizes_seed_and_disjointness() -> None:
    # Tag every row with its original index in column 0 to check the partition.
    sizes = (10, 7, 2, 31)
    X = tuple(np.column_stack([np.arange(n), np.zeros(n)]) for n in sizes)
    y = tuple(np.arange(n, dtype=float) for n in sizes)
    ds = MultiTaskDataset(X=X, y=y, task_names=("a", "b", "c", "d"))
    tr, te = ds.train_test_split(0.3, random_state=1)
    assert tr.n_samples.tolist() == [3, 2, 1, 9]  # floor(0.3 n + 0.5), clipped to [1, n-1]
    assert te.n_samples.tolist() == [7, 5, 1, 22]
    assert tr.task_names == ds.task_names and te.task_type == ds.task_type
    for i, n in enumerate(sizes):
        idx_tr, idx_te = tr.X[i][:, 0], te.X[i][:, 0]
        assert sorted(np.concatenate([idx_tr, idx_te]).tolist()) == list(range(n))
        np.testing.assert_array_equal(tr.y[i], idx_tr)  # rows and targets stay paired
        assert np.all(np.diff(idx_tr) > 0)  # original order kept
    tr2, _ = ds.train_test_split(0.3, random_state=1)
    tr3, _ = ds.train_test_split(0.3, random_state=2)
    assert all(np.array_equal(a, b) for a, b in zip(tr.X, tr2.X, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(tr.X, tr3.X, strict=True))
    # Extreme fractions still leave one sample on each side.
    tr, te = ds.train_test_split(0.001, random_state=0)
    assert tr.n_samples.min() == 1 and te.n_samples.min() >= 1


def test_train_test_split_errors() -> None:
    ds = _ds(sizes=(5, 1), task_names=("big", "tiny"))
    with pytest.raises(DataFormatError, match="'tiny' \\(1\\)"):
        ds.train_test_split(0.5, random_state=0)
    with pytest.raises(InvalidParameterError, match="train_fraction"):
        _ds().train_test_split(1.0, random_state=0)


def test_kfold_partitions_every_task() -> None:
    sizes = (10, 7, 5)
    X = tuple(np.arange(n, dtype=float)[:, None] for n in sizes)
    ds = MultiTaskDataset(X=X, y=tuple(np.zeros(n) for n in sizes))
    splits = list(ds.kfold(5, random_state=0))
    assert len(splits) == 5
    for i, n in enumerate(sizes):
        seen = np.concatenate([va.X[i][:, 0] for _, va in splits])
        assert sorted(seen.tolist()) == list(range(n))  # each sample validated exactly once
        for tr, va in splits:
            assert tr.n_samples[i] + va.n_samples[i] == n
            assert set(tr.X[i][:, 0]).isdisjoint(va.X[i][:, 0])
            assert va.n_samples[i] in (n // 5, -(-n // 5))
    again = list(ds.kfold(5, random_state=0))
    assert all(np.array_equal(a[1].X[0], b[1].X[0]) for a, b in zip(splits, again, strict=True))


def test_kfold_too_few_samples_is_an_error() -> None:
    ds = _ds(sizes=(10, 3), task_names=("ok", "small"))
    with pytest.raises(DataFormatError, match="'small' \\(3\\)"):
        ds.kfold(5, random_state=0)
    with pytest.raises(InvalidParameterError, match="n_splits"):
        ds.kfold(1, random_state=0)


def test_normalize_rows() -> None:
    X = (np.array([[3.0, 4.0], [0.0, 0.0], [-1.0, 0.0]]),)
    ds = MultiTaskDataset(X=X, y=(np.zeros(3),)).normalize_rows()
    np.testing.assert_allclose(ds.X[0], [[0.6, 0.8], [0.0, 0.0], [-1.0, 0.0]])
    big = _ds(sizes=(50, 20)).normalize_rows()
    for x in big.X:
        np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, rtol=1e-12)


def test_subset() -> None:
    ds = _ds(task_names=("a", "b", "c"))
    sub = ds.subset([2, 0])
    assert sub.task_names == ("c", "a")
    np.testing.assert_array_equal(sub.X[0], ds.X[2])
    assert ds.subset([-1]).task_names == ("c",)
    for bad, match in (([], "at least 1"), ([3], "in \\[-3, 2\\]"), ([0, -3], "repeat")):
        with pytest.raises(InvalidParameterError, match=match):
            ds.subset(bad)


def test_to_frame_round_trip_shape() -> None:
    ds = _ds(sizes=(3, 2), d=2, task_names=("a", "b"))
    frame = ds.to_frame()
    assert list(frame.columns) == ["task", "x0", "x1", "y"]
    assert frame["task"].tolist() == ["a"] * 3 + ["b"] * 2
    np.testing.assert_array_equal(frame[["x0", "x1"]].to_numpy()[3:], ds.X[1])
    np.testing.assert_array_equal(frame["y"].to_numpy()[:3], ds.y[0])
