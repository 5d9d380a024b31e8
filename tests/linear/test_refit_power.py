"""The low-rank refit metric's power: 1/2 (the trace norm's W-step) or 1 (the Gaussian prior of
the released covariance), and the public rule ``refit_power="auto"`` that chooses between them."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event as dpe
from dp_accounting.rdp import RdpAccountant
from lowrank_tasks import lowrank_tasks

from privmtl.exceptions import InvalidParameterError
from privmtl.linear.eigen_floor import (
    POWER_AUTO,
    POWER_EDGE,
    auto_refit_power,
    estimation_noise_edge,
)
from privmtl.linear.local import (
    COVARIANCE_POWER,
    TRACE_POWER,
    local_ridge,
    refit_with_metric,
    variational_factor,
)
from privmtl.linear.losses import TaskBatch
from privmtl.linear.mpmtl import MPMTLGroupSparse, MPMTLLowRank
from privmtl.linear.options import MPMTLRefit
from privmtl.privacy.selection import VOTE_MECHANISM


def _fit(eps, **kw):
    Xs, ys = lowrank_tasks()
    return MPMTLLowRank(epsilon=eps, random_state=0, noise_source="seeded", **kw).fit(Xs, ys)


def test_the_rule_switches_at_half_the_estimation_noise_edge():
    """Power 1 exactly where 2σ√d ≤ e/2, e = K²(√m + √d)²/d (the bound itself included), else
    1/2."""
    assert POWER_EDGE == 0.5
    m, d, K = 40, 6, 1.5
    e = estimation_noise_edge(K, m, d)
    assert e == pytest.approx(K**2 * (math.sqrt(m) + math.sqrt(d)) ** 2 / d)
    at_edge = 0.5 * e / (2.0 * math.sqrt(d))
    assert auto_refit_power(at_edge, clip=K, n_tasks=m, dim=d) == COVARIANCE_POWER == 1.0
    assert auto_refit_power(at_edge * 1.001, clip=K, n_tasks=m, dim=d) == TRACE_POWER == 0.5
    assert auto_refit_power(0.0, clip=K, n_tasks=m, dim=d) == COVARIANCE_POWER
    assert auto_refit_power(1e6, clip=K, n_tasks=m, dim=d) == TRACE_POWER


def test_power_one_refit_is_the_posterior_mean_of_the_covariance_prior():
    """With power 1, ``D`` is the released covariance up to scale: the refit of a task is
    ``argmin (1/2n)||y - Xw||² + (ρ/2) wᵀ D⁻¹ w`` with ``D = S / mean(eig S)``."""
    rng = np.random.default_rng(3)
    d, n, rho = 5, 12, 0.3
    G = rng.standard_normal((d, d))
    S = G @ G.T + 0.1 * np.eye(d)
    X = rng.standard_normal((1, n, d))
    y = rng.standard_normal((1, n))
    batch = TaskBatch(X=X, y=y, mask=np.ones((1, n)), n=np.array([float(n)]))
    A = variational_factor(S, penalty="lowrank", shift=None, floor=0.0, power=1.0)
    D = S / np.trace(S) * d
    np.testing.assert_allclose(A @ A, D, atol=1e-10)
    w = refit_with_metric(batch, "squared", rho, A)[:, 0]
    x = X[0]
    expected = np.linalg.solve(x.T @ x / n + rho * np.linalg.inv(D), x.T @ y[0] / n)
    np.testing.assert_allclose(w, expected, atol=1e-9)
    # power 1/2 is the trace norm's metric, D ∝ S^(1/2): another model
    A_half = variational_factor(S, penalty="lowrank", shift=None, floor=0.0, power=0.5)
    vals, U = np.linalg.eigh(S)
    root = (U * np.sqrt(vals)) @ U.T
    np.testing.assert_allclose(A_half @ A_half, root / np.trace(root) * d, atol=1e-10)
    assert not np.allclose(refit_with_metric(batch, "squared", rho, A_half)[:, 0], expected)
    # pure ridge when the metric is the identity (sanity of the helper)
    np.testing.assert_allclose(
        refit_with_metric(batch, "squared", rho, np.eye(d)), local_ridge(batch, "squared", rho)
    )


def test_default_is_auto_and_follows_the_rule_at_the_release_noise():
    """At ε = 10 the release's noise norm is under e/2: power 1; at ε = 0.3 it is above: 1/2, and
    the fit is then the power-1/2 fit bit for bit."""
    assert MPMTLLowRank().refit is None and MPMTLRefit().refit_power == POWER_AUTO
    high = _fit(10.0)
    std = high.ledger_.records[0]["params"]["noise_std"]
    assert 2 * std * math.sqrt(6) <= 0.5 * estimation_noise_edge(1.0, 40, 6)
    assert high.refit_power_ == COVARIANCE_POWER
    one = _fit(10.0, refit=MPMTLRefit(refit_power=1.0))
    np.testing.assert_array_equal(high.coef_, one.coef_)
    half = _fit(10.0, refit=MPMTLRefit(refit_power=0.5))
    assert half.refit_power_ == 0.5 and not np.allclose(half.coef_, high.coef_)

    low = _fit(0.3)
    std = low.ledger_.records[0]["params"]["noise_std"]
    assert 2 * std * math.sqrt(6) > 0.5 * estimation_noise_edge(1.0, 40, 6)
    assert low.refit_power_ == TRACE_POWER
    np.testing.assert_array_equal(low.coef_, _fit(0.3, refit=MPMTLRefit(refit_power=0.5)).coef_)
    # between e/2 and e the release is still too noisy for power 1
    mid = _fit(3.0)
    std = mid.ledger_.records[0]["params"]["noise_std"]
    e = estimation_noise_edge(1.0, 40, 6)
    assert 0.5 * e < 2 * std * math.sqrt(6) <= e
    assert mid.refit_power_ == TRACE_POWER
    # a non-private run has no privacy noise: power 1
    assert _fit(None).refit_power_ == COVARIANCE_POWER


def _oracle_rdp_epsilon(multipliers, delta):
    """ε of independent Gaussian mechanisms (add/remove), composed by dp-accounting's RDP with
    privmtl's orders (integers 2..64, then sparse up to 1024)."""
    orders = [float(a) for a in range(2, 65)] + [80.0, 96.0, 128.0, 192.0, 256.0, 512.0, 1024.0]
    acc = RdpAccountant(orders=orders)
    for z in multipliers:
        acc.compose(dpe.GaussianDpEvent(z))
    return acc.get_epsilon(delta)


def test_the_power_rule_spends_nothing():
    """The rule reads public quantities only: the ledger holds the same release and vote as with
    the power fixed, and the reported ε is the independent composition of the two, the target."""
    auto = _fit(10.0)
    fixed = _fit(10.0, refit=MPMTLRefit(refit_power=0.5))
    assert auto.refit_power_ == 1.0
    assert [r["mechanism"] for r in auto.ledger_.records] == [
        "gaussian-covariance",
        VOTE_MECHANISM,
    ]
    assert [r["params"] for r in auto.ledger_.records] == [
        r["params"] for r in fixed.ledger_.records
    ]
    cov, vote = (r["params"] for r in auto.ledger_.records)
    oracle = _oracle_rdp_epsilon(
        [cov["noise_std"] / cov["sensitivity"], vote["noise_std"] / vote["sensitivity"]],
        auto.delta_,
    )
    assert auto.privacy_.epsilon == pytest.approx(oracle, rel=1e-6)
    assert auto.privacy_.epsilon == fixed.privacy_.epsilon
    assert 0.999 * 10.0 <= auto.privacy_.epsilon <= 10.0 * (1 + 1e-9)


def test_the_group_sparse_refit_keeps_its_metric():
    Xs, ys = lowrank_tasks(m=10)
    kw = {"epsilon": 10.0, "random_state": 0, "noise_source": "seeded"}
    a = MPMTLGroupSparse(**kw).fit(Xs, ys)
    b = MPMTLGroupSparse(**kw, refit=MPMTLRefit(refit_power=1.0)).fit(Xs, ys)
    assert a.refit_power_ is None and b.refit_power_ is None
    np.testing.assert_array_equal(a.coef_, b.coef_)


@pytest.mark.parametrize("value", [0.0, -1.0, "best", float("nan"), float("inf")])
def test_a_bad_refit_power_names_the_parameter(value):
    Xs, ys = lowrank_tasks(m=5)
    with pytest.raises(InvalidParameterError, match="refit_power"):
        MPMTLLowRank(epsilon=1.0, refit=MPMTLRefit(refit_power=value)).fit(Xs, ys)


@pytest.mark.parametrize("value", [0.0, -0.5, float("inf"), True])
def test_variational_factor_refuses_a_bad_power(value):
    with pytest.raises(InvalidParameterError, match=r"'power'.*> 0"):
        variational_factor(np.eye(3), penalty="lowrank", shift=None, floor=0.0, power=value)
