import math

import dp_accounting
import pytest

from privmtl.privacy import (
    calibrate_noise_multiplier,
    make_sampler,
    pmtl_theorem1_epsilon,
    pmtl_theorem1_noise_std,
    pmtl_theorem1_valid,
    workshop_noise_std,
)


def test_theorem1_values_by_hand():
    # sigma = 4*gamma*sqrt(T log(1/delta))/(eps m) with gamma=0.5, T=100, delta=1e-5, eps=1, m=100
    expected = 4 * 0.5 * math.sqrt(100 * math.log(1e5)) / 100
    assert pmtl_theorem1_noise_std(1.0, 0.5, 100, 100, 1e-5) == pytest.approx(expected)
    assert pmtl_theorem1_epsilon(expected, 0.5, 100, 100, 1e-5) == pytest.approx(1.0)
    assert pmtl_theorem1_valid(1.0, 1e-5) and not pmtl_theorem1_valid(30.0, 1e-5)
    assert workshop_noise_std(2.0, 1.0, 10, 4, math.exp(-1)) == pytest.approx(8 * 2 / 20)


def _tight_sigma(eps, relation, accountant, m=100, T=100, delta=1e-5, clip=1.0):
    sampler = make_sampler("all", m, m)
    z = calibrate_noise_multiplier(
        lambda z: dp_accounting.SelfComposedDpEvent(sampler.event(z), T),
        target_epsilon=eps,
        delta=delta,
        accountant=accountant,
        relation=relation,
    )
    return z * clip / m  # sigma on the mean = z * gamma / q


@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0, 4.0])
def test_tight_accountant_noise_far_below_closed_form(eps):
    """With q = m, the tight accountant's σ ≤ closed form / 2.5.

    Under the library's default relation (add/remove) the ratio is ≥ 2.5 with both RDP and PLD.
    Under replace-one, the relation Thm 1 is stated for, the gain is smaller but still real (> 1.3×):
    both numbers are reported by ``privmtl account``.
    """
    closed = pmtl_theorem1_noise_std(eps, 1.0, 100, 100, 1e-5)
    # PLD is never looser than RDP, so the RDP check covers both accountants.
    assert _tight_sigma(eps, "add-remove", "rdp") <= closed / 2.5
    assert _tight_sigma(eps, "replace-one", "rdp") <= closed / 1.3
