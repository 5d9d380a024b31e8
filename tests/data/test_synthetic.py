"""Tests of the MP-MTL synthetic generators."""

from __future__ import annotations

import numpy as np
import pytest

from privmtl.data import (
    lowrank_task_covariance,
    make_anomaly_tasks,
    make_groupsparse_tasks,
    make_lowrank_tasks,
    make_tasks_from_coef,
)
from privmtl.exceptions import InvalidParameterError


def test_lowrank_covariance_structure() -> None:
    S = lowrank_task_covariance(40, 4)
    assert S.shape == (40, 40)
    np.testing.assert_allclose(S, S.T)
    np.testing.assert_allclose(np.diag(S), 1.0, rtol=1e-12)
    eig = np.linalg.eigvalsh(S)
    assert eig.min() > -1e-10
    assert np.linalg.matrix_rank(S, tol=1e-8) == 4
    # Block structure: the first task of a cluster is perfectly aligned with the others' factor 0
    # and tasks of distant clusters are uncorrelated.
    assert S[0, 1] > 0.9 and S[0, 25] == pytest.approx(0.0, abs=1e-12)
    assert np.linalg.matrix_rank(lowrank_task_covariance(7, 1)) == 1


def test_lowrank_tasks_defaults_match_paper() -> None:
    train, test, W = make_lowrank_tasks(random_state=0, return_coef=True)
    assert W.shape == (30, 320)
    assert np.linalg.matrix_rank(W) == 5
    assert train.n_tasks == 320 and train.n_features == 30
    assert set(train.n_samples.tolist()) == {30} and set(test.n_samples.tolist()) == {270}
    for ds in (train, test):
        for X in ds.X[:20]:
            np.testing.assert_allclose(np.linalg.norm(X, axis=1), 1.0, rtol=1e-12)
    # Entries of W have standard deviation coef_scale = 10 (a loose 3-sigma check on 9600 draws).
    assert abs(W.std() - 10.0) < 0.5
    # Targets follow y = X w + N(0, 1): residual variance near 1 (chi-square with 86400 dof).
    res = np.concatenate(
        [y - X @ W[:, i] for i, (X, y) in enumerate(zip(test.X, test.y, strict=True))]
    )
    assert abs(res.var() - 1.0) < 0.03


def test_lowrank_reproducible_and_seed_dependent() -> None:
    a = make_lowrank_tasks(n_tasks=12, n_samples=5, n_features=6, rank=2, random_state=3)
    b = make_lowrank_tasks(n_tasks=12, n_samples=5, n_features=6, rank=2, random_state=3)
    c = make_lowrank_tasks(n_tasks=12, n_samples=5, n_features=6, rank=2, random_state=4)
    assert all(np.array_equal(x, y) for x, y in zip(a[0].X + a[1].y, b[0].X + b[1].y, strict=True))
    assert not np.array_equal(a[0].y[0], c[0].y[0])
    g = make_lowrank_tasks(
        n_tasks=12, n_samples=5, n_features=6, rank=2, random_state=np.random.default_rng(3)
    )
    assert np.array_equal(g[0].y[0], a[0].y[0])


def test_groupsparse_pattern() -> None:
    train, test, W = make_groupsparse_tasks(
        n_tasks=50, n_samples=8, random_state=1, return_coef=True
    )
    assert W.shape == (30, 50)
    assert np.all(W[4:] == 0)
    nz = np.abs(W[:4])
    assert nz.min() >= 1.0 and nz.max() <= 50.0
    assert (W[:4] > 0).mean() == pytest.approx(0.5, abs=0.1)  # both signs (200 draws)
    assert train.n_samples.tolist() == [8] * 50 and test.n_samples.tolist() == [72] * 50
    np.testing.assert_allclose(np.linalg.norm(train.X[7], axis=1), 1.0)


def test_tasks_from_coef_noiseless_and_sizes() -> None:
    W = np.arange(6.0).reshape(3, 2)
    train, test = make_tasks_from_coef(
        W, n_samples=[2, 5], test_factor=3, noise_std=0.0, random_state=0
    )
    assert train.n_samples.tolist() == [2, 5] and test.n_samples.tolist() == [6, 15]
    np.testing.assert_allclose(test.y[1], test.X[1] @ W[:, 1])
    with pytest.raises(InvalidParameterError, match="n_samples"):
        make_tasks_from_coef(W, n_samples=[2], random_state=0)
    with pytest.raises(InvalidParameterError, match="test_factor"):
        make_tasks_from_coef(W, test_factor=0, random_state=0)


def test_anomaly_tasks() -> None:
    W0 = make_anomaly_tasks(0)
    assert W0.shape == (5, 10)
    assert np.all((W0[:, :9] >= 0) & (W0[:, :9] < 1))
    assert np.all(W0[:, 9] >= 0) and W0[:, 9].max() > 1  # scaled by 100
    np.testing.assert_array_equal(make_anomaly_tasks(0), W0)


def test_parameter_errors() -> None:
    with pytest.raises(InvalidParameterError, match="rank"):
        make_lowrank_tasks(n_tasks=3, rank=4, random_state=0)
    with pytest.raises(InvalidParameterError, match="n_nonzero_rows"):
        make_groupsparse_tasks(n_features=3, n_nonzero_rows=4, random_state=0)
    with pytest.raises(InvalidParameterError, match="random_state"):
        make_anomaly_tasks("seed")  # type: ignore[arg-type]
