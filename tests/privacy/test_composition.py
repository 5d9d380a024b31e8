import math

import numpy as np
import pytest

from privmtl.exceptions import InvalidParameterError
from privmtl.privacy.composition import (
    allocate_budgets,
    allocation_weights,
    composition_bound,
    ip_to_mp,
    mp_budget_for_ip,
)


def test_cb_equals_sum_when_sum_is_smallest():
    # eps_t = 0.1 x 10, delta = 1e-3: sum = 1.0; second ≈ 1.2254; third ≈ 1.1237 (by hand).
    assert composition_bound([0.1] * 10, 1e-3) == pytest.approx(1.0, abs=1e-12)


def test_cb_third_term_by_hand():
    # eps_t = 0.01 x 1000, delta = 1e-5 (hand computation):
    # drift = 1000*0.01*tanh(0.005) = 0.0499996; sum eps^2 = 0.1
    # second = drift + sqrt(0.2*ln(1e5)) = 1.567427; third = drift + sqrt(0.2*ln(e+sqrt(.1)/1e-5))
    #        = drift + sqrt(0.2*10.361710) = 1.489563
    assert composition_bound([0.01] * 1000, 1e-5) == pytest.approx(1.489563, abs=2e-6)


def test_cb_delta_zero_is_sum_and_heterogeneous_drift():
    eps = [0.5, 1.0, 2.0]
    assert composition_bound(eps, 0.0) == pytest.approx(3.5)
    drift = sum((math.exp(e) - 1) * e / (math.exp(e) + 1) for e in eps)
    sq = sum(e * e for e in eps)
    second = drift + math.sqrt(2 * sq * math.log(1 / 0.5))
    third = drift + math.sqrt(2 * sq * math.log(math.e + math.sqrt(sq) / 0.5))
    assert composition_bound(eps, 0.5) == pytest.approx(min(3.5, second, third))


def test_cb_rejects_bad_input():
    with pytest.raises(InvalidParameterError, match="epsilons"):
        composition_bound([-1.0], 0.1)
    with pytest.raises(InvalidParameterError, match="delta"):
        composition_bound([1.0], 1.5)


@pytest.mark.parametrize(
    ("strategy", "kw"),
    [("power", {"alpha": 0.0}), ("power", {"alpha": 0.4}), ("geometric", {"Q": 0.97})],
)
def test_allocation_meets_budget_tightly(strategy, kw):
    eps_t = allocate_budgets(0.5, 1e-4, 40, strategy=strategy, **kw)
    cb = composition_bound(eps_t, 1e-4)
    assert cb <= 0.5
    assert cb == pytest.approx(0.5, rel=1e-9)
    # shape follows the weights exactly
    w = allocation_weights(40, strategy=strategy, **kw)
    assert np.allclose(eps_t / eps_t[0], w / w[0])


def test_allocation_power_values():
    w = allocation_weights(4, alpha=0.5)
    assert np.allclose(w, [1.0, math.sqrt(2), math.sqrt(3), 2.0])
    # geometric: eps_t ∝ Q^{-t}, increasing for Q < 1 (non-decreasing budgets)
    g = allocation_weights(3, strategy="geometric", Q=0.5)
    assert np.allclose(g / g[0], [1.0, 2.0, 4.0])


def test_allocation_alpha_zero_with_pure_composition():
    # With delta tiny enough that the sum is the min, eps_t = eps / T exactly.
    eps_t = allocate_budgets(1.0, 1e-300, 4)
    assert np.allclose(eps_t, 0.25)


def test_allocation_geometric_requires_Q():
    with pytest.raises(InvalidParameterError, match="'Q'"):
        allocate_budgets(1.0, 1e-3, 5, strategy="geometric")


def test_group_privacy_roundtrip_and_values():
    assert ip_to_mp(0.1, 1e-6, 10) == pytest.approx((1.0, 10 * math.e * 1e-6))
    e, d = mp_budget_for_ip(1.0, 1e-3, 50)
    assert (e, d) == pytest.approx((0.02, 1e-3 / (50 * math.e)))
    assert ip_to_mp(e, d, 50) == pytest.approx((1.0, 1e-3))
