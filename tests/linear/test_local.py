"""Local solvers: the variational refit against a released covariance (oracle and limit tests)."""

from __future__ import annotations

import numpy as np
import pytest

from privmtl.exceptions import InvalidParameterError
from privmtl.linear.local import local_ridge, refit_with_metric, variational_factor
from privmtl.linear.losses import TaskBatch
from privmtl.linear.mpmtl import MPMTLGroupSparse, MPMTLLowRank, MPMTLLowRankSparse
from privmtl.linear.options import MPMTLRefit


def _tasks(m=8, d=5, n=12, seed=0, logistic=False):
    rng = np.random.default_rng(seed)
    W = 3.0 * rng.standard_normal((d, 2)) @ rng.standard_normal((2, m))
    Xs = [rng.standard_normal((n + i % 3, d)) / np.sqrt(d) for i in range(m)]
    if logistic:
        ys = [
            (rng.random(len(x)) < 1 / (1 + np.exp(-x @ W[:, i]))).astype(float)
            for i, x in enumerate(Xs)
        ]
    else:
        ys = [x @ W[:, i] + 0.3 * rng.standard_normal(len(x)) for i, x in enumerate(Xs)]
    return Xs, ys, W


def _spd(d, seed):
    rng = np.random.default_rng(seed)
    B = rng.standard_normal((d, d))
    return B @ B.T + 0.1 * np.eye(d)


def test_variational_factor_is_the_normalised_square_root():
    S = _spd(5, 1)
    A = variational_factor(S, penalty="lowrank", shift=None, floor=0.0)
    vals, U = np.linalg.eigh(S)
    D = (U * np.sqrt(vals)) @ U.T
    D = D / np.trace(D) * 5  # mean eigenvalue 1
    np.testing.assert_allclose(A @ A, D, atol=1e-10)
    np.testing.assert_allclose(A, A.T, atol=1e-12)
    G = variational_factor(S, penalty="groupsparse", shift=None, floor=0.0)
    dg = np.sqrt(np.diag(S))
    np.testing.assert_allclose(np.diag(G) ** 2, dg / dg.mean(), rtol=1e-10)
    assert np.count_nonzero(G - np.diag(np.diag(G))) == 0
    # pure noise below the shift: D = I exactly
    np.testing.assert_allclose(
        variational_factor(S, penalty="lowrank", shift=-1e6, floor=0.5), np.eye(5), atol=1e-12
    )
    with pytest.raises(InvalidParameterError, match="penalty"):
        variational_factor(S, penalty="trace", shift=None, floor=0.0)


def test_refit_squared_loss_matches_the_normal_equations():
    Xs, ys, _ = _tasks()
    batch = TaskBatch.from_tasks(Xs, ys)
    A = variational_factor(_spd(5, 2), penalty="lowrank", shift=None, floor=0.1)
    rho = 0.07
    W = refit_with_metric(batch, "squared", rho, A)
    Dinv = np.linalg.inv(A @ A)
    for i, (X, y) in enumerate(zip(Xs, ys, strict=True)):
        n = len(y)
        w = np.linalg.solve(X.T @ X / n + rho * Dinv, X.T @ y / n)  # independent oracle
        np.testing.assert_allclose(W[:, i], w, rtol=1e-8, atol=1e-10)


def test_refit_logistic_loss_is_stationary():
    Xs, ys, _ = _tasks(logistic=True, n=30)
    batch = TaskBatch.from_tasks(Xs, ys)
    A = variational_factor(_spd(5, 3), penalty="lowrank", shift=None, floor=0.1)
    rho = 0.05
    W = refit_with_metric(batch, "logistic", rho, A)
    G = batch.gradients("logistic", W) + rho * np.linalg.inv(A @ A) @ W
    assert np.max(np.abs(G)) < 1e-8


def test_refit_pure_noise_is_single_task_ridge_and_guarantee_unchanged():
    Xs, ys, _ = _tasks()
    kw = dict(
        epsilon=1e-3,
        clip=2.0,
        iterations=1,
        init="stl",
        eigen_fix="denoise",
        random_state=0,
        noise_source="seeded",
    )
    est = MPMTLLowRank(refit_lam=0.2, **kw).fit(Xs, ys)
    ridge = local_ridge(TaskBatch.from_tasks(Xs, ys), "squared", 0.2)
    np.testing.assert_allclose(est.coef_, ridge, atol=1e-6)
    plain = MPMTLLowRank(**kw).fit(Xs, ys)
    assert est.privacy_ == plain.privacy_ and est.privacy_.valid


def test_refit_recovers_the_subspace_without_noise():
    """Non-private, exact W W^T of a rank-2 W: the refit beats STL ridge on held-out data."""
    Xs, ys, W = _tasks(m=30, d=8, n=10, seed=4)
    rng = np.random.default_rng(9)
    Xt = [rng.standard_normal((200, 8)) / np.sqrt(8) for _ in range(30)]
    err = lambda C: np.mean([np.mean((x @ (C[:, i] - W[:, i])) ** 2) for i, x in enumerate(Xt)])  # noqa: E731
    stl = local_ridge(TaskBatch.from_tasks(Xs, ys), "squared", 1e-2)
    est = MPMTLLowRank(
        clip=1e3, iterations=1, init=W, refit_lam=1e-2, refit=MPMTLRefit(refit_floor=0.0)
    ).fit(Xs, ys)
    assert err(est.coef_) < 0.5 * err(stl)


def test_refit_validation():
    Xs, ys, _ = _tasks()
    with pytest.raises(InvalidParameterError, match="refit_lam"):
        MPMTLLowRank(refit_lam=-1.0).fit(Xs, ys)
    with pytest.raises(InvalidParameterError, match="refit_floor"):
        MPMTLGroupSparse(refit_lam=1.0, refit=MPMTLRefit(refit_floor=-1.0)).fit(Xs, ys)
    assert "refit_lam" not in MPMTLLowRankSparse().get_params()  # no refit for Alg. 4
    with pytest.raises(InvalidParameterError, match="refit_lam"):
        MPMTLLowRank(refit_lam=1.0, covariance="WtW").fit(Xs, ys)
