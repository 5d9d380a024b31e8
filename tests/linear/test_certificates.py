"""Duality-gap certificates against an independent solve on small random problems.

The reference optimum comes from a long plain proximal-gradient run written here with NumPy only
(its own losses, gradients and proximal steps; no privmtl solver code), so the certificate is
checked against a computation that shares nothing with it.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy.special import expit

from privmtl.linear import L21MTL, STLLasso, STLRidge, TraceNormMTL


def _problem(kind: str, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    # Some tasks have fewer samples than features: the ill-conditioned case of the School data.
    rng = np.random.default_rng(seed)
    d, m = 6, 7
    B = rng.normal(size=(d, 2)) @ rng.normal(size=(2, m))
    Xs = [rng.normal(size=(n, d)) for n in (3, 4, 5, 8, 12, 20, 30)]
    if kind == "squared":
        ys = [X @ B[:, i] + 0.3 * rng.normal(size=len(X)) for i, X in enumerate(Xs)]
    else:
        ys = [(rng.random(len(X)) < expit(X @ B[:, i])).astype(float) for i, X in enumerate(Xs)]
    return Xs, ys


def _objective(kind: str, Xs, ys, W: np.ndarray, lam: float, mu: float, h) -> float:
    total = 0.0
    for i, (X, y) in enumerate(zip(Xs, ys, strict=True)):
        s = X @ W[:, i]
        if kind == "squared":
            total += 0.5 * np.mean((s - y) ** 2)
        else:
            total += np.mean(np.logaddexp(0.0, s) - y * s)
    return total + 0.5 * mu * np.sum(W * W) + lam * h(W)


def _reference_optimum(kind, Xs, ys, lam, mu, prox, h, iters=15_000) -> float:
    """Plain proximal gradient, step 1/L: monotone, converges; its best value bounds P* above."""
    c = 1.0 if kind == "squared" else 0.25
    L = max(c * np.linalg.norm(X, 2) ** 2 / len(X) for X in Xs) + mu
    W = np.zeros((Xs[0].shape[1], len(Xs)))
    for _ in range(iters):
        G = np.empty_like(W)
        for i, (X, y) in enumerate(zip(Xs, ys, strict=True)):
            s = X @ W[:, i]
            r = s - y if kind == "squared" else expit(s) - y
            G[:, i] = X.T @ r / len(X)
        W = prox(W - (G + mu * W) / L, lam / L)
    return _objective(kind, Xs, ys, W, lam, mu, h)


def _svt(V, t):
    U, s, Vt = np.linalg.svd(V, full_matrices=False)
    return (U * np.maximum(s - t, 0.0)) @ Vt


def _rows(V, t):
    n = np.linalg.norm(V, axis=1, keepdims=True)
    return V * np.maximum(1.0 - t / np.maximum(n, 1e-300), 0.0)


def _soft(V, t):
    return np.sign(V) * np.maximum(np.abs(V) - t, 0.0)


CASES = [
    (TraceNormMTL, _svt, lambda W: np.linalg.svd(W, compute_uv=False).sum()),
    (L21MTL, _rows, lambda W: np.linalg.norm(W, axis=1).sum()),
    (STLLasso, _soft, lambda W: np.abs(W).sum()),
]


@pytest.mark.parametrize(("cls", "prox", "h"), CASES, ids=["trace", "l21", "l1"])
@pytest.mark.parametrize(("kind", "mu"), [("squared", 0.0), ("logistic", 0.0), ("squared", 0.05)])
def test_gap_bounds_true_suboptimality(cls, prox, h, kind: str, mu: float) -> None:
    Xs, ys = _problem(kind, seed=3)
    lam = 0.05
    p_star = _reference_optimum(kind, Xs, ys, lam, mu, prox, h)
    # A loose run stops early: its gap must still bound its true suboptimality.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loose = cls(lam=lam, loss=kind, mu=mu, tol=1e-2, max_iter=20).fit(Xs, ys)
    sub = _objective(kind, Xs, ys, loose.coef_, lam, mu, h) - p_star
    assert sub <= loose.dual_gap_ + 1e-10 * abs(p_star)
    assert loose.dual_gap_ > 0
    # A tight run is certified, and the certificate agrees with the independent optimum.
    tight = cls(lam=lam, loss=kind, mu=mu, tol=1e-9, max_iter=100_000).fit(Xs, ys)
    p_tight = _objective(kind, Xs, ys, tight.coef_, lam, mu, h)
    assert 0 <= tight.dual_gap_ <= 1e-9 * p_tight
    assert p_tight == pytest.approx(tight.objective_[-1], rel=1e-12)
    assert abs(p_tight - p_star) <= 1e-8 * p_star


def test_ridge_gap_is_zero_at_the_closed_form() -> None:
    Xs, ys = _problem("squared", seed=4)
    est = STLRidge(lam=0.1).fit(Xs, ys)
    assert abs(est.dual_gap_) <= 1e-12 * est.objective_[-1]


@pytest.mark.shared_data
@pytest.mark.parametrize("cls", [TraceNormMTL, L21MTL])
def test_school_certified_at_every_rho_with_defaults(cls, school_path) -> None:
    """School as in MALSAR: 30% per-task split, unit-norm rows, task rows scaled by sqrt(n_i).

    The speed of these fits is measured in ``benchmarks/linear_solvers.py``, not here.
    """
    from privmtl.data.readers import load_school

    full = load_school(school_path).normalize_rows()
    train, _ = full.train_test_split(0.3, random_state=0)
    Xs = [np.sqrt(len(y)) * np.asarray(x) for x, y in zip(train.X, train.y, strict=True)]
    ys = [np.sqrt(len(y)) * np.asarray(y) for y in train.y]
    for rho in (0.1, 1.0, 10.0, 100.0):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no ConvergenceWarning with the defaults
            est = cls(lam=rho).fit(Xs, ys)
        assert 0 <= est.dual_gap_ <= 1e-8 * est.objective_[-1]
