"""Tests of the MP-MTL estimators (Algorithms 2-5 of Liang et al.)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from privmtl.exceptions import DataFormatError, InvalidParameterError
from privmtl.linear import mpmtl as _mpmtl
from privmtl.linear.losses import task_gradients
from privmtl.linear.metrics import nmse
from privmtl.linear.mpmtl import (
    MPMTLLowRankSparse,
    MPMTLPrivacy,
    local_ridge,
    sample_l2_laplace,
)
from privmtl.linear.prox import prox_l1, prox_l21, prox_trace_norm
from privmtl.privacy.delta import user_data_delta

# The paper's Algorithms 2/3 (zero start, T = 50 releases, projected output, shift fix): what the
# tests of this module check. The estimators' own defaults (STL start, one release, local refit
# with per-task weights) are tested in tests/linear/test_mpmtl_defaults.py.
PAPER_ALG = {
    "iterations": 50,
    "eigen_fix": "shift",
    "init": "zeros",
    "init_alpha": 1e-3,
    "refit_lam": None,
}


def MPMTLLowRank(**kw):
    return _mpmtl.MPMTLLowRank(**{**PAPER_ALG, **kw})


def MPMTLGroupSparse(**kw):
    return _mpmtl.MPMTLGroupSparse(**{**PAPER_ALG, **kw})


# ------------------------------------------------------------------------------------ fixtures
def _unit_rows(X: np.ndarray) -> np.ndarray:
    return X / np.linalg.norm(X, axis=1, keepdims=True)


def make_lowrank(m: int = 12, d: int = 6, n: int = 15, rank: int = 2, seed: int = 0, scale=3.0):
    rng = np.random.default_rng(seed)
    W = scale * rng.standard_normal((d, rank)) @ rng.standard_normal((rank, m))
    Xs = [_unit_rows(rng.standard_normal((n + (i % 3), d))) for i in range(m)]
    ys = [x @ W[:, i] + 0.1 * rng.standard_normal(x.shape[0]) for i, x in enumerate(Xs)]
    return Xs, ys, W


def make_logistic(m: int = 10, d: int = 5, n: int = 40, seed: int = 1):
    rng = np.random.default_rng(seed)
    w = 6.0 * rng.standard_normal(d)
    Xs = [_unit_rows(rng.standard_normal((n, d))) for _ in range(m)]
    W = w[:, None] + 1.0 * rng.standard_normal((d, m))
    ys = [(rng.random(n) < 1 / (1 + np.exp(-x @ W[:, i]))).astype(float) for i, x in enumerate(Xs)]
    return Xs, ys


# ------------------------------------------------------------------- independent oracles
def _clip(W: np.ndarray, K: float) -> np.ndarray:
    norms = np.linalg.norm(W, axis=0)
    return W / np.maximum(1.0, norms / K)


def oracle(Xs, ys, *, prox, K, T, eta, accelerate, mu=0.0, loss="squared", W0=None):
    """Alg. 2/3 written from the paper's formulas: prox-like step on the clipped models, then an
    (accelerated) gradient step; beta_t = (t-1)/(t+2) or the strongly convex constant."""
    d, m = Xs[0].shape[1], len(Xs)
    W = np.zeros((d, m)) if W0 is None else W0.copy()
    prev = _clip(W, K)
    # every task's own Lipschitz constant (its momentum under strong convexity uses it)
    c = 1 if loss == "squared" else 0.25
    L = np.array([c * np.linalg.norm(x, 2) ** 2 / x.shape[0] + mu for x in Xs])
    hat = prev
    for t in range(1, T + 1):
        hat = prox(_clip(W, K))
        if not accelerate:
            beta = 0.0
        elif mu > 0:
            beta = (1 - np.sqrt(mu / L)) / (1 + np.sqrt(mu / L))
        else:
            beta = (t - 1) / (t + 2)
        Z = hat + beta * (hat - prev)
        W = Z - eta * task_gradients(loss, Xs, ys, Z, mu=mu)
        prev = hat
    return hat


# ------------------------------------------------------------- zero noise = non-private solver
@pytest.mark.parametrize("accelerate", [False, True])
@pytest.mark.parametrize("mu", [0.0, 1e-2])
def test_lowrank_without_noise_is_trace_norm_proximal_gradient(accelerate, mu):
    Xs, ys, _ = make_lowrank()
    lam, K, T, eta = 0.05, 5.0, 25, 2.0
    est = MPMTLLowRank(
        lam=lam, clip=K, iterations=T, step_size=eta, accelerate=accelerate, mu=mu
    ).fit(Xs, ys)
    ref = oracle(
        Xs,
        ys,
        prox=lambda V: prox_trace_norm(V, eta * lam),
        K=K,
        T=T,
        eta=eta,
        accelerate=accelerate,
        mu=mu,
    )
    np.testing.assert_allclose(est.coef_, ref, rtol=1e-9, atol=1e-9)
    assert np.all(est.noise_to_signal_ == 0)
    assert not est.privacy_.is_private and math.isinf(est.privacy_.epsilon)
    # the threshold is active: some singular values were cut
    assert np.linalg.matrix_rank(est.coef_, tol=1e-8) < min(est.coef_.shape)


def test_groupsparse_without_noise_is_l21_proximal_gradient():
    Xs, ys, _ = make_lowrank(d=8)
    lam, K, T, eta = 0.3, 5.0, 20, 2.0
    est = MPMTLGroupSparse(lam=lam, clip=K, iterations=T, step_size=eta).fit(Xs, ys)
    ref = oracle(Xs, ys, prox=lambda V: prox_l21(V, eta * lam), K=K, T=T, eta=eta, accelerate=True)
    np.testing.assert_allclose(est.coef_, ref, rtol=1e-9, atol=1e-9)


def test_lowrank_sparse_without_noise_matches_formula():
    Xs, ys, _ = make_lowrank()
    lam, lam2, K, T, eta = 0.05, 0.02, 5.0, 15, 1.0
    est = MPMTLLowRankSparse(lam=lam, lam_sparse=lam2, clip=K, iterations=T, step_size=eta).fit(
        Xs, ys
    )
    d, m = Xs[0].shape[1], len(Xs)
    P, Q = np.zeros((d, m)), np.zeros((d, m))
    P_prev, Q_prev = _clip(P, K), Q.copy()
    for t in range(1, T + 1):
        P_hat = prox_trace_norm(_clip(P, K), eta * lam)
        Q_hat = prox_l1(Q, eta * lam2)
        b = (t - 1) / (t + 2)
        Zp, Zq = P_hat + b * (P_hat - P_prev), Q_hat + b * (Q_hat - Q_prev)
        G = task_gradients("squared", Xs, ys, Zp + Zq)
        P, Q = Zp - eta * G, Zq - eta * G
        P_prev, Q_prev = P_hat, Q_hat
    np.testing.assert_allclose(est.lowrank_, P_hat, atol=1e-9)
    np.testing.assert_allclose(est.sparse_, Q_hat, atol=1e-9)
    np.testing.assert_allclose(est.coef_, P_hat + Q_hat, atol=1e-9)
    # default step of Alg. 4 is 1/(2 L_i), every task its own
    np.testing.assert_allclose(
        MPMTLLowRankSparse(iterations=2).fit(Xs, ys).step_size_,
        0.5 / MPMTLLowRank(iterations=2).fit(Xs, ys).lipschitz_,
    )


def test_lowrank_sparse_with_huge_l1_weight_is_lowrank():
    Xs, ys, _ = make_lowrank()
    kw = {"lam": 0.05, "clip": 5.0, "iterations": 10, "step_size": 1.5}
    a = MPMTLLowRankSparse(lam_sparse=1e9, **kw).fit(Xs, ys)
    b = MPMTLLowRank(**kw).fit(Xs, ys)
    assert np.all(a.sparse_ == 0)
    np.testing.assert_allclose(a.coef_, b.coef_, atol=1e-10)


def test_stl_init_is_local_ridge():
    Xs, ys, _ = make_lowrank()
    from privmtl.linear.losses import TaskBatch
    from privmtl.linear.stl import STLRidge

    W0 = local_ridge(TaskBatch.from_tasks(Xs, ys), "squared", 0.01)
    np.testing.assert_allclose(W0, STLRidge(lam=0.01).fit(Xs, ys).coef_, atol=1e-10)
    K, T, eta, lam = 50.0, 6, 1.0, 0.1
    est = MPMTLLowRank(
        lam=lam, clip=K, iterations=T, step_size=eta, init="stl", init_alpha=0.01
    ).fit(Xs, ys)
    ref = oracle(
        Xs,
        ys,
        prox=lambda V: prox_trace_norm(V, eta * lam),
        K=K,
        T=T,
        eta=eta,
        accelerate=True,
        W0=W0,
    )
    np.testing.assert_allclose(est.coef_, ref, atol=1e-9)


# ------------------------------------------------------- very high noise = single-task learning
@pytest.mark.parametrize("noise", ["gaussian", "wishart"])
def test_very_high_noise_degrades_to_stl_gradient_descent(noise):
    Xs, ys, _ = make_lowrank()
    K, T, eta, lam = 5.0, 20, 2.0, 0.05
    est = MPMTLLowRank(
        lam=lam,
        clip=K,
        iterations=T,
        step_size=eta,
        epsilon=1e-8,
        delta=1e-6,
        noise=noise,
        random_state=3,
        noise_source="seeded",
    ).fit(Xs, ys)
    stl = oracle(Xs, ys, prox=lambda V: V, K=K, T=T, eta=eta, accelerate=True)
    # M -> I: the shrinkage 1 - eta*lam/sqrt(Lambda) is within ~1e-3 of 1 for every direction
    np.testing.assert_allclose(est.coef_, stl, rtol=2e-3, atol=1e-3 * np.abs(stl).max())
    assert np.all(est.noise_to_signal_ > 1e3)
    # "never worse than STL": the same training error as the STL iteration, up to 1%
    err = nmse(ys, est.decision_function(Xs))
    err_stl = nmse(ys, [x @ stl[:, i] for i, x in enumerate(Xs)])
    assert err <= 1.01 * err_stl


def test_groupsparse_very_high_noise_is_stl():
    Xs, ys, _ = make_lowrank()
    K, T, eta = 5.0, 10, 2.0
    est = MPMTLGroupSparse(
        lam=0.3, clip=K, iterations=T, step_size=eta, epsilon=1e-8, delta=1e-6, random_state=0
    ).fit(Xs, ys)
    stl = oracle(Xs, ys, prox=lambda V: V, K=K, T=T, eta=eta, accelerate=True)
    np.testing.assert_allclose(est.coef_, stl, rtol=2e-3, atol=1e-3 * np.abs(stl).max())


def test_moderate_noise_is_between_and_reported():
    Xs, ys, _ = make_lowrank(m=30)
    est = MPMTLLowRank(
        lam=0.05, clip=5.0, iterations=8, epsilon=1.0, random_state=0, noise_source="seeded"
    ).fit(Xs, ys)
    g = est.privacy_
    assert g.is_private and g.valid
    assert g.epsilon <= 1.0 + 1e-6
    # the default delta is DP practice's min(1e-5, 1/(100 m)), below 1/m; the paper's on request
    assert g.delta == pytest.approx(user_data_delta(30)) == pytest.approx(1e-5)
    assert est.delta_ == pytest.approx(1e-5) and est.delta_ < 1 / 30
    paper = MPMTLLowRank(
        lam=0.05, clip=5.0, iterations=2, epsilon=1.0, delta="paper", noise_source="seeded"
    ).fit(Xs, ys)
    assert paper.delta_ == pytest.approx(1 / (30 * math.log(30)))
    assert est.noise_to_signal_.shape == (8,) and np.all(est.noise_to_signal_ > 0)
    assert est.n_iter_ == 8 and len(est.epsilons_) == 8


def test_wishart_reports_invalid_guarantee_with_real_delta():
    Xs, ys, _ = make_lowrank()
    est = MPMTLLowRank(
        clip=5.0, iterations=4, epsilon=1.0, noise="wishart", random_state=0, noise_source="seeded"
    )
    est.fit(Xs, ys)
    assert not est.privacy_.valid
    assert est.privacy_.delta >= 1 - math.exp(-float(np.sum(est.epsilons_))) - 1e-12
    assert est.privacy_.delta > 0.5


def test_determinism_by_seed():
    Xs, ys, _ = make_lowrank()
    kw = {
        "lam": 0.05,
        "clip": 5.0,
        "iterations": 5,
        "epsilon": 0.5,
        "privacy": MPMTLPrivacy(instance_epsilon=5.0),
        "noise_source": "seeded",
    }
    a = MPMTLLowRank(random_state=7, **kw).fit(Xs, ys).coef_
    b = MPMTLLowRank(random_state=7, **kw).fit(Xs, ys).coef_
    c = MPMTLLowRank(random_state=8, **kw).fit(Xs, ys).coef_
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    g = np.random.default_rng(7)
    d_ = MPMTLLowRank(random_state=g, **kw).fit(Xs, ys).coef_
    np.testing.assert_array_equal(a, d_)


# --------------------------------------------------------------------- Alg. 5 (instance level)
def test_l2_laplace_noise_distribution():
    d, K, eps = 7, 2.0, 0.5
    scale = 2 * K / eps
    b = sample_l2_laplace(np.random.default_rng(0), d, scale, 40_000)
    r = np.linalg.norm(b, axis=0)
    # radius ~ Gamma(d, 2K/eps): mean 2Kd/eps, sd sqrt(d) 2K/eps
    se = math.sqrt(d) * scale / math.sqrt(r.size)
    assert abs(r.mean() - 2 * K * d / eps) < 4 * se
    assert stats.kstest(r, stats.gamma(a=d, scale=scale).cdf).pvalue > 1e-3
    # direction uniform on the sphere: mean ~ 0, second moment I/d
    u = b / r
    assert np.abs(u.mean(axis=1)).max() < 4 / math.sqrt(r.size)
    np.testing.assert_allclose(u @ u.T / r.size, np.eye(d) / d, atol=0.01)


def test_instance_protection_wiring_and_guarantee():
    Xs, ys, _ = make_lowrank()
    est = MPMTLLowRank(
        lam=0.05,
        clip=5.0,
        iterations=6,
        epsilon=1.0,
        random_state=0,
        privacy=MPMTLPrivacy(instance_epsilon=3.0),
    ).fit(Xs, ys)
    ip = est.instance_privacy_
    assert ip.notion == "IP-MTL" and ip.delta == 0.0 and ip.epsilon == pytest.approx(3.0)
    assert sum(ip.details["per_release"]) == pytest.approx(3.0)
    assert est.privacy_.is_private
    assert MPMTLLowRank(iterations=2).fit(Xs, ys).instance_privacy_ is None
    # tiny instance budget: the shared models are pure noise (clipped to K), so the projection is
    # learned from noise, but every task still projects its own clean model
    noisy = MPMTLLowRank(
        lam=0.05,
        clip=5.0,
        iterations=6,
        epsilon=None,
        random_state=0,
        privacy=MPMTLPrivacy(instance_epsilon=1e-6),
    ).fit(Xs, ys)
    clean = MPMTLLowRank(lam=0.05, clip=5.0, iterations=6).fit(Xs, ys)
    assert np.all(np.isfinite(noisy.coef_))
    assert not np.allclose(noisy.coef_, clean.coef_)
    assert np.all(noisy.noise_to_signal_ == 0)  # the covariance itself was not perturbed


# ------------------------------------------------------------------------------ W^T W variant
def test_wtw_without_noise_equals_wwt():
    Xs, ys, _ = make_lowrank()
    kw = {"lam": 0.05, "clip": 5.0, "iterations": 12, "step_size": 2.0}
    a = MPMTLLowRank(covariance="WtW", **kw).fit(Xs, ys)
    b = MPMTLLowRank(**kw).fit(Xs, ys)
    assert a.coef_.shape == (Xs[0].shape[1], len(Xs))
    np.testing.assert_allclose(a.coef_, b.coef_, atol=1e-8)


def test_wtw_private_shape_and_invalid_guarantee():
    Xs, ys, _ = make_lowrank()
    m = len(Xs)
    a = MPMTLLowRank(
        covariance="WtW", lam=0.05, clip=5.0, iterations=3, epsilon=1.0, random_state=0
    ).fit(Xs, ys)
    assert a.coef_.shape == (Xs[0].shape[1], m)
    assert not a.privacy_.valid
    assert any("WtW" in n for n in a.privacy_.notes)
    # the m x m release is planned with the larger sensitivity (K^2 sqrt(m) under add/remove)
    assert a.privacy_.details["sensitivity"] == pytest.approx(25.0 * math.sqrt(m))
    # very high noise: still degrades to STL
    stl = oracle(Xs, ys, prox=lambda V: V, K=5.0, T=6, eta=2.0, accelerate=True)
    h = MPMTLLowRank(
        covariance="WtW",
        lam=0.05,
        clip=5.0,
        iterations=6,
        step_size=2.0,
        epsilon=1e-8,
        delta=1e-6,
        random_state=0,
        noise_source="seeded",
    ).fit(Xs, ys)
    np.testing.assert_allclose(h.coef_, stl, rtol=2e-3, atol=1e-3 * np.abs(stl).max())


def test_wtw_refused_for_groupsparse():
    Xs, ys, _ = make_lowrank()
    with pytest.raises(InvalidParameterError, match="covariance"):
        MPMTLGroupSparse(covariance="WtW").fit(Xs, ys)


# --------------------------------------------------------------------------------- logistic
def test_logistic_loss_works():
    Xs, ys = make_logistic()
    est = MPMTLLowRank(
        loss="logistic", lam=0.01, clip=20.0, iterations=30, epsilon=5.0, random_state=0
    ).fit(Xs, ys)
    auc = est.score(Xs, ys)
    assert 0.75 < auc <= 1.0
    labels = est.predict(Xs)
    assert set(np.unique(np.concatenate(labels))) <= {0.0, 1.0}
    stl = MPMTLLowRank(loss="logistic", clip=20.0, iterations=1, init="stl").fit(Xs, ys)
    assert stl.score(Xs, ys) > 0.75


# ----------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"lam": -1.0}, "lam"),
        ({"epsilon": 0.0}, "epsilon"),
        ({"epsilon": -2.0}, "epsilon"),
        ({"delta": 1.5}, "delta"),
        ({"noise": "laplace"}, "noise"),
        ({"clip": 0.0}, "clip"),
        ({"iterations": 0}, "iterations"),
        ({"step_size": -1.0}, "step_size"),
        ({"accelerate": "yes"}, "accelerate"),
        ({"allocation": "linear"}, "allocation"),
        ({"covariance": "WW"}, "covariance"),
        ({"loss": "hinge"}, "loss"),
        ({"relation": "swap"}, "relation"),
        ({"instance_epsilon": 0.0}, "instance_epsilon"),
        ({"init": "random"}, "init"),
        ({"init_alpha": 0.0}, "init_alpha"),
    ],
)
def test_bad_parameters(kwargs, name):
    Xs, ys, _ = make_lowrank(m=3)
    with pytest.raises(InvalidParameterError, match=name):
        MPMTLLowRank(**kwargs).fit(Xs, ys)


def test_bad_data():
    Xs, ys, _ = make_lowrank(m=4)
    with pytest.raises(DataFormatError):
        MPMTLLowRank().fit(Xs, ys[:3])
    with pytest.raises(DataFormatError):
        MPMTLLowRank().fit(np.ones((5, 3)), ys)
    with pytest.raises(DataFormatError):
        MPMTLLowRank().fit([Xs[0], Xs[1][:, :2], Xs[2], Xs[3]], ys)
    bad = [y.copy() for y in ys]
    bad[1][0] = np.nan
    with pytest.raises(DataFormatError):
        MPMTLLowRank().fit(Xs, bad)
    with pytest.raises(DataFormatError, match="labels"):
        MPMTLLowRank(loss="logistic").fit(Xs, ys)
    with pytest.raises(DataFormatError, match="init"):
        MPMTLLowRank(init=np.zeros((2, 2))).fit(Xs, ys)
    with pytest.raises(InvalidParameterError, match="delta"):
        MPMTLLowRank(epsilon=1.0, delta="paper").fit(Xs[:1], ys[:1])
    with pytest.raises(InvalidParameterError, match="delta"):
        MPMTLLowRank(epsilon=1.0, delta="papers").fit(Xs, ys)
    est = MPMTLLowRank(iterations=2).fit(Xs, ys)
    with pytest.raises(DataFormatError, match="tasks"):
        est.predict(Xs[:2])
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError):
        MPMTLLowRank().predict(Xs)


def test_sklearn_params_roundtrip():
    from sklearn.base import clone

    est = MPMTLLowRankSparse(lam=0.2, lam_sparse=0.3, epsilon=1.0, covariance="WtW")
    c = clone(est)
    assert c.get_params() == est.get_params()
    assert c.get_params()["lam_sparse"] == 0.3


def test_folded_eigen_fix_equals_planner_fix():
    """The shift/clip done on the projection's eigenvalues equals the planner's PSD fix."""
    from privmtl.linear.mpmtl import _apply_lowrank_left
    from privmtl.privacy.covariance import plan_covariance_releases

    rng = np.random.default_rng(0)
    Wc = _clip(rng.standard_normal((6, 20)), 1.0)
    cov = Wc @ Wc.T
    for fix in ("shift", "clip"):
        kw = {"noise": "gaussian", "epsilon": 2.0, "delta": 1e-4, "iterations": 3, "clip": 1.0}
        fixed = plan_covariance_releases(dim=6, eigen_fix=fix, **kw)
        raw = plan_covariance_releases(dim=6, eigen_fix="none", **kw)
        A = fixed.release(1, cov, np.random.default_rng(5))
        B = raw.release(1, cov, np.random.default_rng(5))
        shift = _mpmtl.MPMTLLowRank._eigen_shift(raw, 1, fix, 6)
        for thr in (0.05, 0.5):
            np.testing.assert_allclose(
                _apply_lowrank_left(A, thr, Wc), _apply_lowrank_left(B, thr, Wc, shift), atol=1e-10
            )


def test_prepared_tasks_reuse_gives_identical_fits():
    Xs, ys, _ = make_lowrank()
    est = MPMTLLowRank(
        lam=0.05,
        clip=5.0,
        iterations=4,
        epsilon=1.0,
        init="stl",
        random_state=0,
        noise_source="seeded",
    )
    prepared = est.prepare_tasks(Xs, ys)
    a = est.fit(prepared).coef_.copy()
    b = MPMTLLowRank(**est.get_params()).fit(Xs, ys).coef_
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(est.fit(prepared).coef_, a)  # the cache is not mutated
    with pytest.raises(InvalidParameterError, match="loss"):
        MPMTLLowRank(loss="logistic").fit(prepared)


# ------------------------------------------------- mediation: other tasks only through releases
def _replayed_fit(est, Xs, ys, releases, monkeypatch):
    """Fit ``est``; record every release in ``releases`` (first run) or, when it holds them,
    replay their matrices (the curator still clips this run's own models for ``shared``)."""
    from privmtl.linear import mpmtl as mod

    original = mod.CovarianceCurator.release
    replay = bool(releases)

    def release(self, t, messages):
        out = original(self, t, messages)
        if not replay:
            releases.append(out)
            return out
        rec = releases[t]
        return mod.CovarianceRelease(t, rec.Sigma, rec.shift, out.shared, rec.noise_to_signal)

    monkeypatch.setattr(mod.CovarianceCurator, "release", release)
    try:
        return est.fit(Xs, ys)
    finally:
        monkeypatch.setattr(mod.CovarianceCurator, "release", original)


@pytest.mark.parametrize(
    "make",
    [
        lambda: MPMTLLowRank(lam=0.05, clip=5.0, iterations=6, epsilon=3.0),
        lambda: MPMTLLowRank(lam=0.05, clip=5.0, iterations=6, epsilon=3.0, mu=0.05),
        lambda: MPMTLGroupSparse(lam=0.3, clip=5.0, iterations=6, epsilon=3.0),
        lambda: MPMTLLowRankSparse(lam=0.05, lam_sparse=0.01, clip=5.0, iterations=6, epsilon=3.0),
        lambda: _mpmtl.MPMTLLowRank(epsilon=3.0),  # the defaults (STL start, local refit)
        lambda: _mpmtl.MPMTLGroupSparse(epsilon=3.0),
    ],
)
def test_other_tasks_depend_on_a_task_only_through_the_releases(make, monkeypatch):
    """Oracle of the billboard structure: rescale task 0's features (its Lipschitz constant
    becomes 9x the others', so a step shared by all tasks would change) and replay the first
    run's releases: every other task's column is bit-identical."""
    Xs, ys, _ = make_lowrank(m=10)
    Xs2 = [x.copy() for x in Xs]
    Xs2[0] = 3.0 * Xs2[0]
    releases: list = []
    kw = {"noise_source": "seeded", "random_state": 0}
    a = _replayed_fit(make().set_params(**kw), Xs, ys, releases, monkeypatch)
    b = _replayed_fit(make().set_params(**kw), Xs2, ys, releases, monkeypatch)
    assert b.lipschitz_[0] > 5 * a.lipschitz_[0]
    np.testing.assert_array_equal(a.coef_[:, 1:], b.coef_[:, 1:])
    np.testing.assert_array_equal(a.step_size_[1:], b.step_size_[1:])
    assert not np.array_equal(a.coef_[:, 0], b.coef_[:, 0])


def test_replay_oracle_detects_a_coupling(monkeypatch):
    """The same replay catches a path that mixes other tasks' models outside the release
    (covariance='WtW': W^ = W~ M uses the others' clipped models) and a step shared by all tasks."""
    Xs, ys, _ = make_lowrank(m=10)
    Xs2 = [x.copy() for x in Xs]
    Xs2[0] = 3.0 * Xs2[0]
    kw = {"lam": 0.05, "clip": 5.0, "iterations": 6, "noise_source": "seeded", "random_state": 0}
    releases: list = []
    a = _replayed_fit(MPMTLLowRank(covariance="WtW", **kw), Xs, ys, releases, monkeypatch)
    b = _replayed_fit(MPMTLLowRank(covariance="WtW", **kw), Xs2, ys, releases, monkeypatch)
    assert not np.array_equal(a.coef_[:, 1:], b.coef_[:, 1:])
    # a shared step from all tasks (the mutant: max_i L_i for every task) changes the others
    shared = {"step_size": 1.0 / max(np.linalg.norm(x, 2) ** 2 / x.shape[0] for x in Xs)}
    shared2 = {"step_size": 1.0 / max(np.linalg.norm(x, 2) ** 2 / x.shape[0] for x in Xs2)}
    releases = []
    a = _replayed_fit(MPMTLLowRank(**kw, **shared), Xs, ys, releases, monkeypatch)
    b = _replayed_fit(MPMTLLowRank(**kw, **shared2), Xs2, ys, releases, monkeypatch)
    assert not np.array_equal(a.coef_[:, 1:], b.coef_[:, 1:])


def test_task_steps_read_only_the_own_task():
    from privmtl.linear.common import PreparedTasks, task_steps

    Xs, ys, _ = make_lowrank(m=6)
    lips, eta = task_steps(PreparedTasks(Xs, ys, loss="squared"), 0.1)
    for i, x in enumerate(Xs):  # independent computation: largest eigenvalue of X^T X / n + mu
        top = np.linalg.eigvalsh(x.T @ x / x.shape[0])[-1] + 0.1
        assert lips[i] == pytest.approx(top, rel=1e-12) and eta[i] == pytest.approx(1 / top)
    Xs2 = [x.copy() for x in Xs]
    Xs2[2] = 10.0 * Xs2[2]
    Xs2.append(np.ones((50, Xs[0].shape[1])))  # another, longer task changes the padding
    lips2, _ = task_steps(PreparedTasks(Xs2, [*ys, np.ones(50)], loss="squared"), 0.1)
    np.testing.assert_array_equal(np.delete(lips2[:6], 2), np.delete(lips, 2))
    _, half = task_steps(PreparedTasks(Xs, ys, loss="squared"), 0.1, decomposed=True)
    np.testing.assert_allclose(half, eta / 2)


# ---------------------------------------------------- the covariance releases' typed target
def test_covariance_releases_are_calibrated_to_the_runs_privacy_target():
    from privmtl.privacy.calibration import PrivacyTarget
    from privmtl.privacy.covariance import plan_covariance_releases

    Xs, ys, _ = make_lowrank()
    est = MPMTLLowRank(clip=2.0, iterations=3, epsilon=1.0, noise_source="seeded").fit(Xs, ys)
    target = PrivacyTarget(1.0, est.delta_, "rdp", "add-remove", sampling="all")
    first, *rest = est.ledger_.records
    assert first["params"]["target"] == target.to_dict()  # recorded with release 0 only
    assert all("target" not in r["params"] for r in rest)
    # the target object plans exactly what its keywords plan
    kw = {"iterations": 3, "clip": 2.0, "dim": 5}
    typed = plan_covariance_releases(target=target, **kw)
    assert typed.target == target
    assert (
        typed.per_release
        == plan_covariance_releases(epsilon=1.0, delta=est.delta_, **kw).per_release
    )
    with pytest.raises(InvalidParameterError, match=r"'target'.*not both"):
        plan_covariance_releases(target=target, epsilon=1.0, **kw)
