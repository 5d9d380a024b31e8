"""Tests of the linear baselines: optimality of the solvers, API, and statistical sanity."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.linear_model import Lasso, LogisticRegression

from privmtl.data import make_groupsparse_tasks, make_lowrank_tasks
from privmtl.exceptions import DataFormatError, InvalidParameterError
from privmtl.linear import L21MTL, MTRL, ModelAveraging, STLLasso, STLRidge, TraceNormMTL
from privmtl.linear.losses import task_gradients, task_losses
from privmtl.linear.metrics import aauc, nmse

TOL = 1e-6  # relative tolerance of the optimality conditions (acceptance criterion)


def _problem(kind: str, *, m: int = 8, d: int = 5, n: int = 20, seed: int = 0):
    """Small tasks with a shared low-rank signal (n > d so the loss is strongly convex)."""
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(d, 2)) @ rng.normal(size=(2, m))
    Xs = [rng.normal(size=(n + i, d)) for i in range(m)]
    if kind == "squared":
        ys = [X @ W[:, i] + 0.5 * rng.normal(size=X.shape[0]) for i, X in enumerate(Xs)]
    else:
        ys = [
            (X @ W[:, i] + rng.logistic(size=X.shape[0]) > 0).astype(float)
            for i, X in enumerate(Xs)
        ]
    return Xs, ys


def _grad(kind: str, Xs, ys, W: np.ndarray, mu: float) -> np.ndarray:
    return task_gradients(kind, Xs, ys, W) + mu * W


def _check_trace_norm_kkt(G: np.ndarray, W: np.ndarray) -> int:
    """Check G in the subdifferential of ||.||_* at W; returns the rank of W."""
    U, s, Vt = np.linalg.svd(W)
    r = int(np.sum(s > 1e-8 * s[0]))
    Ur, Vr = U[:, :r], Vt[:r].T
    Up, Vp = U[:, r:], Vt[r:].T
    np.testing.assert_allclose(Ur.T @ G @ Vr, np.eye(r), atol=TOL)
    np.testing.assert_allclose(Ur.T @ G @ Vp, 0.0, atol=TOL)
    np.testing.assert_allclose(Up.T @ G @ Vr, 0.0, atol=TOL)
    assert np.linalg.norm(Up.T @ G @ Vp, 2) <= 1 + TOL
    return r


@pytest.mark.parametrize(("kind", "lam", "mu"), [("squared", 0.6, 0.0), ("logistic", 0.3, 0.01)])
def test_trace_norm_reaches_optimum(kind: str, lam: float, mu: float) -> None:
    Xs, ys = _problem(kind)
    est = TraceNormMTL(lam=lam, loss=kind, mu=mu, tol=1e-13, max_iter=100_000).fit(Xs, ys)
    W = est.coef_
    G = -_grad(kind, Xs, ys, W, mu) / lam
    r = _check_trace_norm_kkt(G, W)
    assert 1 <= r < 5  # the test is meaningful: W is neither 0 nor full rank
    # The reported objective is the documented one.
    obj = task_losses(kind, Xs, ys, W).sum() + 0.5 * mu * np.sum(W**2)
    obj += lam * np.linalg.svd(W, compute_uv=False).sum()
    assert est.objective_[-1] == pytest.approx(obj, rel=1e-12)


@pytest.mark.parametrize(("kind", "lam", "mu"), [("squared", 1.3, 0.0), ("logistic", 0.3, 0.01)])
def test_l21_reaches_optimum(kind: str, lam: float, mu: float) -> None:
    Xs, ys = _problem(kind, seed=1)
    est = L21MTL(lam=lam, loss=kind, mu=mu, tol=1e-13, max_iter=100_000).fit(Xs, ys)
    W = est.coef_
    G = -_grad(kind, Xs, ys, W, mu) / lam
    norms = np.linalg.norm(W, axis=1)
    active = norms > 1e-10
    assert 1 <= active.sum() < W.shape[0]
    np.testing.assert_allclose(G[active], W[active] / norms[active, None], atol=TOL)
    assert np.all(np.linalg.norm(G[~active], axis=1) <= 1 + TOL)


@pytest.mark.parametrize("kind", ["squared", "logistic"])
def test_stl_lasso_optimality_and_sklearn(kind: str) -> None:
    Xs, ys = _problem(kind, seed=2)
    lam = 0.05 if kind == "squared" else 0.02
    est = STLLasso(lam=lam, loss=kind, tol=1e-13, max_iter=100_000).fit(Xs, ys)
    W = est.coef_
    G = -_grad(kind, Xs, ys, W, 0.0) / lam
    nz = W != 0
    assert nz.any() and (~nz).any()
    np.testing.assert_allclose(G[nz], np.sign(W[nz]), atol=TOL)
    assert np.all(np.abs(G[~nz]) <= 1 + TOL)
    if kind == "squared":
        for i in range(3):
            sk = Lasso(alpha=lam, fit_intercept=False, tol=1e-12, max_iter=100_000)
            sk.fit(Xs[i], ys[i])
            np.testing.assert_allclose(W[:, i], sk.coef_, atol=1e-7)


def test_stl_ridge_matches_normal_equations_and_sklearn() -> None:
    Xs, ys = _problem("squared", d=6, n=4, seed=3)  # n_i < d for the first tasks: dual form
    lam = 0.3
    W = STLRidge(lam=lam).fit(Xs, ys).coef_
    for i, (X, y) in enumerate(zip(Xs, ys, strict=True)):
        n = X.shape[0]
        expected = np.linalg.solve(X.T @ X / n + lam * np.eye(6), X.T @ y / n)
        np.testing.assert_allclose(W[:, i], expected, rtol=1e-10)
    Xc, yc = _problem("logistic", seed=4)
    Wc = STLRidge(lam=lam, loss="logistic", tol=1e-10).fit(Xc, yc).coef_
    for i in range(3):
        C = 1.0 / (lam * Xc[i].shape[0])  # sklearn: 0.5||w||^2 + C sum log-loss
        sk = LogisticRegression(C=C, fit_intercept=False, tol=1e-12, max_iter=10_000)
        sk.fit(Xc[i], yc[i])
        np.testing.assert_allclose(Wc[:, i], sk.coef_.ravel(), atol=1e-5)


def test_stl_ridge_zero_penalty_is_least_squares() -> None:
    Xs, ys = _problem("squared", seed=5)
    W = STLRidge(lam=0.0).fit(Xs, ys).coef_
    np.testing.assert_allclose(W[:, 0], np.linalg.lstsq(Xs[0], ys[0], rcond=None)[0], rtol=1e-10)


def test_model_averaging() -> None:
    Xs, ys = _problem("squared", seed=6)
    est = ModelAveraging(lam=0.1).fit(Xs, ys)
    local = STLRidge(lam=0.1).fit(Xs, ys).coef_
    np.testing.assert_allclose(est.local_coef_, local)
    np.testing.assert_allclose(est.coef_, np.repeat(local.mean(axis=1, keepdims=True), 8, axis=1))


def _mtrl_objective(Xs, ys, W, lam1: float, lam2: float) -> float:
    tn = np.linalg.svd(W, compute_uv=False).sum()
    return float(
        task_losses("squared", Xs, ys, W).sum() + 0.5 * lam1 * np.sum(W**2) + 0.5 * lam2 * tn**2
    )


def test_mtrl_exact_reaches_optimum() -> None:
    Xs, ys = _problem("squared", seed=7)
    lam1, lam2 = 0.05, 0.1
    est = MTRL(lam1=lam1, lam2=lam2, tol=1e-14, inner_tol=1e-14, inner_max_iter=100_000)
    W = est.fit(Xs, ys).coef_
    tn = np.linalg.svd(W, compute_uv=False).sum()
    assert est.tau_ == pytest.approx(lam2 * tn, rel=1e-8)
    # Optimality of F(W) = sum L_i + lam1/2 ||W||^2 + lam2/2 ||W||_*^2:
    # -(grad f + lam1 W) / (lam2 ||W||_*) must be a subgradient of ||.||_* at W.
    G = -_grad("squared", Xs, ys, W, lam1) / (lam2 * tn)
    r = _check_trace_norm_kkt(G, W)
    assert 1 <= r < 5
    # Omega is the closed-form minimizer: trace 1, PSD, and tr(W Omega^+ W^T) = ||W||_*^2.
    om = est.omega_
    assert np.trace(om) == pytest.approx(1.0)
    assert np.linalg.eigvalsh(om).min() > -1e-12
    assert np.trace(W @ np.linalg.pinv(om, rcond=1e-10) @ W.T) == pytest.approx(tn**2, rel=1e-6)
    F = _mtrl_objective(Xs, ys, W, lam1, lam2)
    assert est.objective_[-1] == pytest.approx(F, rel=1e-12)
    # The alternating solver decreases its objective monotonically and does not beat the optimum.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        alt = MTRL(lam1=lam1, lam2=lam2, solver="alternating", eps=1e-6, max_iter=30).fit(Xs, ys)
    assert np.all(np.diff(alt.objective_) <= 1e-9 * abs(alt.objective_[0]))
    assert _mtrl_objective(Xs, ys, alt.coef_, lam1, lam2) >= F - 1e-9
    assert np.trace(alt.omega_) == pytest.approx(1.0)


def test_mtrl_logistic_runs_and_improves_on_chance() -> None:
    Xs, ys = _problem("logistic", seed=8)
    est = MTRL(lam1=0.01, lam2=0.01, loss="logistic").fit(Xs, ys)
    assert est.score(Xs, ys) > 0.8


@pytest.mark.parametrize("cls", [TraceNormMTL, L21MTL, STLLasso])
def test_unaccelerated_solver_agrees(cls) -> None:
    Xs, ys = _problem("squared", seed=9)
    a = cls(lam=0.3, tol=1e-12, max_iter=100_000, solver="proximal-gradient").fit(Xs, ys)
    b = cls(lam=0.3, tol=1e-12, max_iter=100_000, accelerate=False, solver="proximal-gradient").fit(
        Xs, ys
    )
    np.testing.assert_allclose(a.coef_, b.coef_, atol=1e-8)
    assert b.n_iter_ >= a.n_iter_
    # Without momentum, proximal gradient decreases the objective at every step.
    assert np.all(np.diff(b.objective_) <= 1e-12 * abs(b.objective_[0]))


def test_large_penalty_gives_zero_model() -> None:
    Xs, ys = _problem("squared", seed=10)
    G0 = task_gradients("squared", Xs, ys, np.zeros((5, 8)))
    lam = 1.01 * np.linalg.norm(G0, 2)
    assert np.all(TraceNormMTL(lam=lam).fit(Xs, ys).coef_ == 0)
    lam = 1.01 * np.linalg.norm(G0, axis=1).max()
    assert np.all(L21MTL(lam=lam).fit(Xs, ys).coef_ == 0)


def test_mtl_beats_stl_on_structured_synthetic_data() -> None:
    # Low-rank tasks with n_i = d: trace-norm MTL shares the subspace, ridge STL cannot.
    train, test = make_lowrank_tasks(
        n_tasks=60, n_samples=20, n_features=20, rank=3, random_state=0
    )
    stl = STLRidge(lam=1e-3).fit(train).paper_score(test)  # nMSE
    tn = TraceNormMTL(lam=0.1).fit(train).paper_score(test)
    mtrl = MTRL(lam1=0.0, lam2=1e-4).fit(train).paper_score(test)
    assert tn < 0.5 * stl and mtrl < 0.5 * stl
    assert tn < 0.1
    # Group-sparse tasks: the l2,1 model selects the 4 shared features.
    train, test, _ = make_groupsparse_tasks(
        n_tasks=40, n_samples=20, n_features=20, random_state=1, return_coef=True
    )
    l21 = L21MTL(lam=1.0).fit(train)
    assert l21.paper_score(test) < 0.5 * STLRidge(lam=1e-3).fit(train).paper_score(test)
    assert set(np.flatnonzero(np.linalg.norm(l21.coef_, axis=1) > 0)) >= {0, 1, 2, 3}


def test_prediction_api_and_scores() -> None:
    Xs, ys = _problem("squared", seed=11)
    est = TraceNormMTL(lam=0.5).fit(Xs, ys)
    assert est.coef_.shape == (5, 8) and est.n_tasks_ == 8 and est.n_features_in_ == 5
    assert est.objective_.shape == (est.n_iter_,)
    pred = est.predict(Xs)
    assert [p.shape for p in pred] == [(X.shape[0],) for X in Xs]
    np.testing.assert_allclose(pred[3], Xs[3] @ est.coef_[:, 3])
    assert est.paper_score(Xs, ys) == pytest.approx(nmse(ys, pred))
    assert est.score(Xs, ys) == pytest.approx(1.0 - nmse(ys, pred))  # R²: higher is better
    with pytest.raises(AttributeError, match="logistic"):
        est.predict_proba(Xs)
    Xc, yc = _problem("logistic", seed=12)
    clf = L21MTL(lam=0.01, loss="logistic").fit(Xc, yc)
    labels, proba, scores = clf.predict(Xc), clf.predict_proba(Xc), clf.decision_function(Xc)
    assert set(np.concatenate(labels).tolist()) <= {0.0, 1.0}
    np.testing.assert_array_equal(labels[0], (proba[0] > 0.5).astype(float))
    assert clf.score(Xc, yc) == pytest.approx(aauc(yc, scores))


def test_dataset_input_clone_and_params() -> None:
    train, _ = make_lowrank_tasks(n_tasks=6, n_samples=10, n_features=4, rank=2, random_state=0)
    est = TraceNormMTL(lam=0.2, mu=0.01)
    a = est.fit(train).coef_
    b = clone(est).fit(list(train.X), list(train.y)).coef_
    np.testing.assert_array_equal(a, b)
    assert est.get_params()["lam"] == 0.2
    assert "TraceNormMTL(lam=0.2, mu=0.01)" in repr(est)
    assert est.set_params(lam=0.3).lam == 0.3


def test_errors() -> None:
    Xs, ys = _problem("squared", seed=13)
    with pytest.raises(NotFittedError):
        STLRidge().predict(Xs)
    est = STLRidge().fit(Xs, ys)
    with pytest.raises(DataFormatError, match="fitted on 8 tasks"):
        est.predict(Xs[:3])
    with pytest.raises(DataFormatError, match="5 features"):
        est.predict([X[:, :4] for X in Xs])
    with pytest.raises(DataFormatError, match="0/1 labels"):
        STLRidge(loss="logistic").fit(Xs, ys)
    with pytest.raises(DataFormatError, match="task 2: 22 feature rows but 3"):
        STLRidge().fit(Xs, [*ys[:2], np.ones(3), *ys[3:]])
    with pytest.raises(DataFormatError, match="NaN"):
        STLRidge().fit([np.full((2, 5), np.nan)], [np.ones(2)])
    with pytest.raises(DataFormatError, match="single 2-D array"):
        STLRidge().fit(Xs[0], ys[0])
    with pytest.raises(InvalidParameterError, match="'lam'"):
        TraceNormMTL(lam=-1).fit(Xs, ys)
    with pytest.raises(InvalidParameterError, match="'loss'"):
        L21MTL(loss="hinge").fit(Xs, ys)
    with pytest.raises(InvalidParameterError, match="'solver'"):
        MTRL(solver="sgd").fit(Xs, ys)
    with pytest.raises(InvalidParameterError, match="'lam2'"):
        MTRL(lam2=0.0).fit(Xs, ys)
    with pytest.warns(ConvergenceWarning, match="TraceNormMTL"):
        TraceNormMTL(lam=0.01, max_iter=2, tol=1e-12).fit(Xs, ys)
