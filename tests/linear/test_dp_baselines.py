"""Tests of the IP-MTL baselines (DP-MTRL, DP-AGGR) and their group-privacy conversion."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from privmtl.exceptions import DataFormatError, InvalidParameterError
from privmtl.linear.dp_baselines import DPAGGR, DPMTRL, GROUP_PRIVACY_NOTION
from privmtl.linear.stl import ModelAveraging, STLRidge
from privmtl.privacy.composition import composition_bound, ip_to_mp, mp_budget_for_ip


def _unit_rows(X):
    return X / np.linalg.norm(X, axis=1, keepdims=True)


def make_tasks(m=8, d=4, n=12, seed=0, classification=False):
    rng = np.random.default_rng(seed)
    w = 3.0 * rng.standard_normal(d)
    Xs = [_unit_rows(rng.standard_normal((n + i % 4, d))) for i in range(m)]
    W = w[:, None] + 0.5 * rng.standard_normal((d, m))
    if classification:
        ys = [
            (x @ W[:, i] + 0.3 * rng.standard_normal(x.shape[0]) > 0).astype(float)
            for i, x in enumerate(Xs)
        ]
    else:
        ys = [x @ W[:, i] + 0.1 * rng.standard_normal(x.shape[0]) for i, x in enumerate(Xs)]
    return Xs, ys


# --------------------------------------------------------------------- group-privacy wiring
def test_dpaggr_group_privacy_conversion():
    Xs, ys = make_tasks()
    n_max = max(x.shape[0] for x in Xs)
    est = DPAGGR(lam=0.1, epsilon=2.0, delta=1e-3, random_state=0).fit(Xs, ys)
    ip, mp = est.ip_privacy_, est.privacy_
    assert mp.notion == GROUP_PRIVACY_NOTION and ip.notion == "IP-MTL"
    assert ip.epsilon == pytest.approx(2.0 / n_max)  # run at eps / n
    assert ip.delta == 0.0  # pure-eps output perturbation, T = 1
    assert (mp.epsilon, mp.delta) == pytest.approx(ip_to_mp(ip.epsilon, ip.delta, n_max))
    assert mp.epsilon == pytest.approx(2.0)
    assert mp.relation == "replace-one"
    assert mp.details["n_max"] == n_max
    assert not mp.valid  # squared loss: estimated Lipschitz constants


def test_dpmtrl_group_privacy_conversion_with_composition():
    Xs, ys = make_tasks()
    m = len(Xs)
    n_max = max(x.shape[0] for x in Xs)
    eps, T = 3.0, 4
    est = DPMTRL(lam1=0.1, lam2=0.1, epsilon=eps, iterations=T, delta="paper", random_state=0).fit(
        Xs, ys
    )
    delta = 1 / (m * math.log(m))
    eps_ip, delta_ip = mp_budget_for_ip(eps, delta, n_max)
    ip, mp = est.ip_privacy_, est.privacy_
    eps_t = np.array(mp.details["epsilon_t"])
    assert eps_t.shape == (T,) and np.allclose(eps_t, eps_t[0])
    assert ip.delta == pytest.approx(delta_ip)
    assert ip.epsilon == pytest.approx(composition_bound(eps_t, delta_ip))
    assert ip.epsilon <= eps_ip * (1 + 1e-9)
    assert mp.epsilon <= eps * (1 + 1e-9) and mp.delta <= delta * (1 + 1e-9)
    assert (mp.epsilon, mp.delta) == pytest.approx(ip_to_mp(ip.epsilon, ip.delta, n_max))
    assert not mp.valid and any("Lipschitz" in n for n in mp.notes)
    # the noise scale reads every task's size (n_max): labelled, not covered
    assert not mp.covered and any("max_i n_i" in r for r in mp.not_covered)
    # the default delta is below 1/m (DP practice), whatever the data set
    default = DPMTRL(lam1=0.1, lam2=0.1, epsilon=eps, iterations=T, random_state=0).fit(Xs, ys)
    assert default.privacy_.delta <= min(1e-5, 1 / (100 * m)) * (1 + 1e-9) < 1 / m


def test_dpaggr_logistic_unit_rows_is_valid_and_scored_by_auc():
    Xs, ys = make_tasks(classification=True, n=30)
    est = DPAGGR(lam=0.5, epsilon=50.0, loss="logistic", random_state=0).fit(Xs, ys)
    assert est.privacy_.valid
    assert 0.5 < est.score(Xs, ys) <= 1.0


# ------------------------------------------------------------------------------ noise scale
def test_dpaggr_noise_radius_matches_output_perturbation():
    Xs, ys = make_tasks(d=3)
    d = Xs[0].shape[1]
    radii = []
    for seed in range(400):
        est = DPAGGR(lam=0.5, epsilon=5.0, random_state=seed).fit(Xs, ys)
        radii.append(np.linalg.norm(est.coef_[:, 0] - est.local_coef_.mean(axis=1)))
    sens = est.privacy_.details["sensitivity"]
    scale = sens / est.ip_privacy_.epsilon
    m = len(Xs)
    n = np.array([x.shape[0] for x in Xs])
    # the sensitivity of the mean of m local ridge models: max_i 2 L_i / (m n_i lam)
    assert sens == pytest.approx(
        max(
            2 * float(np.max(np.abs(x @ est.local_coef_[:, i] - y))) / (m * n[i] * 0.5)
            for i, (x, y) in enumerate(zip(Xs, ys, strict=True))
        )
    )
    r = np.array(radii)
    # radius ~ Gamma(d, scale): mean d * scale, sd sqrt(d) * scale
    assert abs(r.mean() - d * scale) < 4 * math.sqrt(d) * scale / math.sqrt(r.size)


# ------------------------------------------------------------------------- limits and options
def test_nonprivate_limits():
    Xs, ys = make_tasks()
    a = DPAGGR(lam=0.1).fit(Xs, ys)
    np.testing.assert_allclose(a.coef_, ModelAveraging(lam=0.1).fit(Xs, ys).coef_, atol=1e-10)
    assert not a.privacy_.is_private
    # one outer iteration with Omega = I/m is ridge with weight lam1 + m lam2
    m = len(Xs)
    b = DPMTRL(lam1=0.1, lam2=0.01, iterations=1).fit(Xs, ys)
    np.testing.assert_allclose(b.coef_, STLRidge(lam=0.1 + m * 0.01).fit(Xs, ys).coef_, atol=1e-10)
    # several iterations couple the tasks and lower the training error of the shared structure
    c = DPMTRL(lam1=1e-3, lam2=1e-3, iterations=10).fit(Xs, ys)
    assert np.all(np.isfinite(c.coef_)) and np.isclose(np.trace(c.omega_), 1.0)


def test_dpmtrl_local_output_ignores_own_noise():
    Xs, ys = make_tasks()
    kw = {"lam1": 0.1, "lam2": 0.01, "iterations": 1}
    ref = DPMTRL(**kw).fit(Xs, ys).coef_
    loc = DPMTRL(epsilon=0.01, output="local", random_state=0, **kw).fit(Xs, ys)
    pert = DPMTRL(epsilon=0.01, output="perturbed", random_state=0, **kw).fit(Xs, ys)
    np.testing.assert_allclose(loc.coef_, ref, atol=1e-10)
    assert np.linalg.norm(pert.coef_ - ref) > 10 * np.linalg.norm(ref)
    assert pert.noise_to_signal_[0] > 10


def test_dpmtrl_classification_runs_least_squares_on_pm1():
    Xs, ys = make_tasks(classification=True, n=30)
    est = DPMTRL(lam1=0.01, lam2=0.001, loss="logistic", iterations=2).fit(Xs, ys)
    ypm = [2 * y - 1 for y in ys]
    ref = DPMTRL(lam1=0.01, lam2=0.001, iterations=2).fit(Xs, ypm)
    np.testing.assert_allclose(est.coef_, ref.coef_, atol=1e-10)
    assert 0.7 < est.score(Xs, ys) <= 1.0  # aAUC
    assert set(np.unique(np.concatenate(est.predict(Xs)))) <= {0.0, 1.0}


def test_dpmtrl_divergence_is_reported_not_hidden():
    Xs, ys = make_tasks()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        est = DPMTRL(lam1=1e-6, lam2=1e-6, epsilon=1e-3, iterations=8, random_state=0)
        est.fit(Xs, ys)
    if any("diverged" in str(w.message) for w in rec):
        assert np.isinf(est.noise_to_signal_[-1])
    else:
        assert np.all(np.isfinite(est.coef_))


def test_determinism_by_seed():
    Xs, ys = make_tasks()
    for cls, kw in ((DPMTRL, {"iterations": 2}), (DPAGGR, {})):
        a = cls(epsilon=1.0, random_state=3, **kw).fit(Xs, ys).coef_
        b = cls(epsilon=1.0, random_state=3, **kw).fit(Xs, ys).coef_
        c = cls(epsilon=1.0, random_state=4, **kw).fit(Xs, ys).coef_
        np.testing.assert_array_equal(a, b)
        assert not np.allclose(a, c)


# ----------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize(
    ("cls", "kwargs", "name"),
    [
        (DPAGGR, {"lam": 0.0}, "lam"),
        (DPAGGR, {"epsilon": -1.0}, "epsilon"),
        (DPAGGR, {"delta": 0.0}, "delta"),
        (DPAGGR, {"loss": "hinge"}, "loss"),
        (DPMTRL, {"lam1": 0.0, "lam2": 0.0}, "lam1"),
        (DPMTRL, {"lam1": -1.0}, "lam1"),
        (DPMTRL, {"iterations": 0}, "iterations"),
        (DPMTRL, {"output": "noisy"}, "output"),
        (DPMTRL, {"omega_eps": 0.0}, "omega_eps"),
        (DPMTRL, {"epsilon": 0.0}, "epsilon"),
    ],
)
def test_bad_parameters(cls, kwargs, name):
    Xs, ys = make_tasks(m=3)
    with pytest.raises(InvalidParameterError, match=name):
        cls(**kwargs).fit(Xs, ys)


def test_bad_data():
    Xs, ys = make_tasks(m=3)
    with pytest.raises(DataFormatError):
        DPAGGR().fit(Xs, ys[:2])
    with pytest.raises(DataFormatError, match="labels"):
        DPMTRL(loss="logistic").fit(Xs, ys)
    with pytest.raises(InvalidParameterError, match="delta"):
        DPAGGR(epsilon=1.0, delta="paper").fit(Xs[:1], ys[:1])
    with pytest.raises(InvalidParameterError, match="delta"):
        DPAGGR(epsilon=1.0, delta="papers").fit(Xs, ys)
