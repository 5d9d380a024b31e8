"""Audit statistics against independent computations (SciPy's exact interval, closed forms)."""

import math

import numpy as np
import pytest
import scipy.stats

from privmtl.audit.stats import (
    clopper_pearson,
    clopper_pearson_upper,
    epsilon_from_counts,
    one_run_epsilon,
    one_run_p_value,
    threshold_audit,
)
from privmtl.exceptions import InvalidParameterError


@pytest.mark.parametrize(("k", "n"), [(0, 10), (3, 10), (10, 10), (17, 250), (500, 1000)])
def test_clopper_pearson_matches_scipy_exact_interval(k, n):
    ci = scipy.stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    lo, hi = clopper_pearson(k, n, 0.95)
    assert lo == pytest.approx(ci.low, abs=1e-12)
    assert hi == pytest.approx(ci.high, abs=1e-12)
    # the one-sided 97.5 % upper bound is the upper end of the two-sided 95 % interval
    assert clopper_pearson_upper(np.array([k]), n, 0.975)[0] == pytest.approx(ci.high, abs=1e-12)


def test_clopper_pearson_published_example():
    # 0 events in n trials: the exact upper bound is 1 - (alpha/2)^(1/n) ("rule of three" regime)
    assert clopper_pearson(0, 100)[1] == pytest.approx(1 - 0.025 ** (1 / 100), rel=1e-12)


def test_epsilon_from_counts_closed_form_for_perfect_separation():
    n, delta = 1000, 1e-5
    hi = 1 - 0.025 ** (1 / n)
    expected = math.log((1 - delta - hi) / hi)
    assert float(epsilon_from_counts(0, n, 0, n, delta=delta)) == pytest.approx(expected, rel=1e-10)
    # no separation at all: vacuous
    assert float(epsilon_from_counts(n // 2, n, n // 2, n, delta=delta)) == 0.0


def test_threshold_audit_is_valid_under_the_null():
    # identical distributions are 0-DP: a 95 % bound must be > 0 in at most ~5 % of repetitions
    rng = np.random.default_rng(0)
    positives = sum(
        threshold_audit(rng.standard_normal(400), rng.standard_normal(400), delta=1e-5)[
            "epsilon_lower_bound"
        ]
        > 0
        for _ in range(60)
    )
    # P[Binomial(60, 0.05) > 9] < 0.01
    assert positives <= 9


def test_threshold_audit_is_valid_and_informative_for_a_gaussian():
    # mu-GDP with mu = 1: epsilon(delta=1e-5) is about 4.4; the bound is below it and above 1
    rng = np.random.default_rng(1)
    mu, n = 1.0, 4000
    eps_true = _gdp_epsilon(mu, 1e-5)
    res = threshold_audit(rng.standard_normal(n), rng.standard_normal(n) + mu, delta=1e-5)
    assert 1.0 < res["epsilon_lower_bound"] < eps_true
    assert res["negatives"] == res["positives"] == n // 2  # evaluation half only


def _gdp_epsilon(mu, delta):
    from scipy.optimize import brentq
    from scipy.stats import norm

    def d(e):
        return norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2) - delta

    return brentq(d, 0.0, 50.0)


def test_threshold_audit_refuses_bad_input():
    with pytest.raises(InvalidParameterError, match="at least 2 trials"):
        threshold_audit(np.zeros(1), np.zeros(5), delta=1e-5)
    with pytest.raises(InvalidParameterError, match="finite"):
        threshold_audit(np.array([0.0, np.nan]), np.zeros(5), delta=1e-5)


def test_one_run_pure_dp_is_the_binomial_tail():
    # delta = 0: the p-value is P[Binomial(r, e^eps / (1 + e^eps)) >= v] (Steinke et al. Thm 3.1)
    p = math.exp(1.0) / (1 + math.exp(1.0))
    assert one_run_p_value(1000, 100, 80, 1.0, 0.0) == pytest.approx(
        scipy.stats.binom.sf(79, 100, p), rel=1e-12
    )


def test_one_run_all_correct_closed_form():
    # v = r and delta = 0: p-value q^r = 0.05 gives eps = log(q / (1 - q)), q = 0.05^(1/r)
    r = 200
    q = 0.05 ** (1 / r)
    expected = math.log(q / (1 - q))
    assert one_run_epsilon(1000, r, r, delta=0.0) == pytest.approx(expected, abs=1e-5)


def test_one_run_delta_term_matches_a_direct_sum():
    # alpha = max_i P[v - i <= Bin(r, p) < v] / i, written as a plain loop here
    m, r, v, eps, delta = 500, 60, 45, 0.5, 1e-3
    p = 1 / (1 + math.exp(-eps))
    beta = scipy.stats.binom.sf(v - 1, r, p)
    alpha = max(
        sum(scipy.stats.binom.pmf(v - j, r, p) for j in range(1, i + 1)) / i
        for i in range(1, v + 1)
    )
    assert one_run_p_value(m, r, v, eps, delta) == pytest.approx(
        min(1.0, beta + 2 * m * delta * alpha), rel=1e-10
    )
    # the delta term makes the bound smaller
    assert one_run_epsilon(m, r, v, delta=delta) < one_run_epsilon(m, r, v, delta=0.0)


def test_one_run_bound_is_valid_for_randomized_response():
    # each canary's guess is right with probability e^eps0/(1+e^eps0): exactly eps0-DP
    rng = np.random.default_rng(2)
    eps0, m = 1.0, 400
    p = math.exp(eps0) / (1 + math.exp(eps0))
    exceed = sum(
        one_run_epsilon(m, m, int(rng.binomial(m, p)), delta=0.0, tol=1e-3) > eps0
        for _ in range(60)
    )
    assert exceed <= 9  # at most ~5 % (P[Binomial(60, 0.05) > 9] < 0.01)
