"""Published closed-form noise calibrations of the PMTL papers, kept for comparison.

They are valid but loose: a tight accountant (RDP or PLD, :mod:`privmtl.privacy.accounting`) allows a
noise level several times smaller at the same (ε, δ) (docs/privacy-model.md).
"""

from __future__ import annotations

import math

from privmtl._validation import check_int, check_real

__all__ = [
    "pmtl_theorem1_epsilon",
    "pmtl_theorem1_noise_std",
    "pmtl_theorem1_valid",
    "workshop_noise_std",
]


def _common(
    clip: float, num_clients: int, rounds: int, delta: float
) -> tuple[float, int, int, float]:
    return (
        check_real("clip", clip, low=0.0, closed="neither"),
        check_int("num_clients", num_clients, low=1),
        check_int("rounds", rounds, low=1),
        check_real("delta", delta, low=0.0, high=1.0, closed="neither"),
    )


def pmtl_theorem1_noise_std(
    epsilon: float, clip: float, num_clients: int, rounds: int, delta: float
) -> float:
    """σ = 4γ√(T·log(1/δ))/(ε·m): Thm 1 of the PMTL paper (all m clients every round, replace-one).

    σ is the std of the Gaussian noise added to the *mean* of the m clipped updates. The proof
    (RDP of order α = 4 log(1/δ)/ε) holds for ε ≤ 2·log(1/δ); see :func:`pmtl_theorem1_valid`.
    """
    eps = check_real("epsilon", epsilon, low=0.0, closed="neither")
    g, m, T, d = _common(clip, num_clients, rounds, delta)
    return 4.0 * g * math.sqrt(T * math.log(1.0 / d)) / (eps * m)


def pmtl_theorem1_epsilon(
    noise_std: float, clip: float, num_clients: int, rounds: int, delta: float
) -> float:
    """ε = 4γ√(T·log(1/δ))/(σ·m), the inverse of :func:`pmtl_theorem1_noise_std`."""
    s = check_real("noise_std", noise_std, low=0.0, closed="neither")
    g, m, T, d = _common(clip, num_clients, rounds, delta)
    return 4.0 * g * math.sqrt(T * math.log(1.0 / d)) / (s * m)


def pmtl_theorem1_valid(epsilon: float, delta: float) -> bool:
    """Whether the Thm 1 proof step log(1/δ)/(α−1) ≤ ε/2 holds, i.e. ε ≤ 2·log(1/δ)."""
    return epsilon <= 2.0 * math.log(1.0 / delta)


def workshop_noise_std(
    epsilon: float, bound: float, num_clients: int, rounds: int, delta: float
) -> float:
    """σ = 8B√(T·log(1/δ))/(ε·m) for the workshop variant's noisy mean of models in the ball ‖w‖ ≤ B."""
    eps = check_real("epsilon", epsilon, low=0.0, closed="neither")
    b, m, T, d = _common(bound, num_clients, rounds, delta)
    return 8.0 * b * math.sqrt(T * math.log(1.0 / d)) / (eps * m)
