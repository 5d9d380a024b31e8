"""Tests of the multi-task metrics against hand computations."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from privmtl.exceptions import DataFormatError, InvalidParameterError
from privmtl.linear.metrics import (
    aauc,
    mse,
    nmse,
    per_task_auc,
    per_task_mse,
    per_task_nmse,
    r2,
)

# Task 0: y = [1, 3], pred = [2, 3] -> SSE 1, MSE 0.5, Var 1.
# Task 1: y = [10, 10, 16], pred = [10, 13, 16] -> SSE 9, MSE 3, Var 8.
Y = [np.array([1.0, 3.0]), np.array([10.0, 10.0, 16.0])]
P = [np.array([2.0, 3.0]), np.array([10.0, 13.0, 16.0])]


def test_mse_by_hand() -> None:
    np.testing.assert_allclose(per_task_mse(Y, P), [0.5, 3.0])
    assert mse(Y, P) == pytest.approx(10 / 5)


def test_nmse_poolings_by_hand() -> None:
    # Global: all targets [1, 3, 10, 10, 16], mean 8, sum of squares 49+25+4+4+64 = 146,
    # Var = 146/5 = 29.2; pooled MSE = 10/5 = 2 -> nMSE = 2 / 29.2 = 10/146.
    assert nmse(Y, P) == pytest.approx(10 / 146, rel=1e-14)
    assert nmse(Y, P, pooling="global") == pytest.approx(10 / 146, rel=1e-14)
    np.testing.assert_allclose(per_task_nmse(Y, P), [0.5, 3 / 8])
    assert nmse(Y, P, pooling="task-mean") == pytest.approx((0.5 + 0.375) / 2)
    assert nmse(Y, P, pooling="task-weighted") == pytest.approx((2 * 0.5 + 3 * 0.375) / 5)


def test_nmse_reference_points() -> None:
    rng = np.random.default_rng(0)
    ys = [rng.normal(loc=i, size=20) for i in range(3)]
    grand = np.concatenate(ys).mean()
    assert nmse(ys, [np.full(20, grand)] * 3) == pytest.approx(1.0)
    assert nmse(ys, ys) == 0.0
    # Per-task means are a perfect "task-weighted" baseline of 1.
    assert nmse(ys, [np.full(20, y.mean()) for y in ys], pooling="task-weighted") == pytest.approx(
        1.0
    )


def test_nmse_errors() -> None:
    with pytest.raises(DataFormatError, match="task 1: targets are constant"):
        per_task_nmse([np.array([1.0, 2.0]), np.array([3.0, 3.0])], [np.zeros(2)] * 2)
    with pytest.raises(DataFormatError, match="all targets are equal"):
        nmse([np.ones(2)], [np.zeros(2)])
    with pytest.raises(DataFormatError, match="task 0: 2 targets but 3"):
        nmse([np.ones(2)], [np.zeros(3)])
    with pytest.raises(DataFormatError, match="1 target vectors but 2"):
        mse([np.ones(2)], [np.zeros(2)] * 2)
    with pytest.raises(DataFormatError, match="NaN"):
        mse([np.array([1.0, np.nan])], [np.zeros(2)])
    with pytest.raises(InvalidParameterError, match="pooling"):
        nmse(Y, P, pooling="median")  # type: ignore[arg-type]


def test_aauc_matches_sklearn_and_skips_single_class_tasks() -> None:
    rng = np.random.default_rng(1)
    ys = [rng.integers(0, 2, 30).astype(float) for _ in range(3)] + [np.ones(5)]
    ss = [rng.normal(size=30) + y for y in ys[:3]] + [rng.normal(size=5)]
    per = per_task_auc(ys, ss)
    expected = [roc_auc_score(y, s) for y, s in zip(ys[:3], ss[:3], strict=True)]
    np.testing.assert_allclose(per[:3], expected)
    assert np.isnan(per[3])
    assert aauc(ys, ss) == pytest.approx(np.mean(expected))
    # Hand example: one positive scores above the negative, the other below -> AUC 0.5.
    assert aauc([np.array([0.0, 1.0, 1.0])], [np.array([0.5, 0.2, 0.9])]) == pytest.approx(0.5)
    with pytest.raises(DataFormatError, match="no task has both classes"):
        aauc([np.zeros(3)], [np.zeros(3)])
    with pytest.raises(DataFormatError, match="0/1 labels"):
        aauc([np.array([-1.0, 1.0])], [np.zeros(2)])


def test_r2_is_sklearns_pooled_r2_score() -> None:
    from sklearn.metrics import r2_score

    assert r2(Y, P) == pytest.approx(1 - 10 / 146, rel=1e-14)
    assert r2(Y, P) == pytest.approx(r2_score(np.concatenate(Y), np.concatenate(P)), rel=1e-12)
    ys = [np.array([1.0, 2.0, 3.0]), np.array([5.0, 7.0])]
    assert r2(ys, ys) == 1.0
