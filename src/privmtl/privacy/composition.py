"""Pure-ε composition and budget allocation used by MP-MTL, and the group-privacy conversion.

These are the published formulas (MP-MTL paper §4, Kairouz et al. 2015 Thm 3.5, Prop. 3 of the MP-MTL
paper), implemented exactly so that results can be reproduced and compared.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.optimize import brentq

from privmtl._validation import check_choice, check_int, check_real
from privmtl.exceptions import InvalidParameterError

__all__ = [
    "ALLOCATION_STRATEGIES",
    "allocate_budgets",
    "allocation_weights",
    "composition_bound",
    "ip_to_mp",
    "mp_budget_for_ip",
]

ALLOCATION_STRATEGIES = ("power", "geometric")


def composition_bound(epsilons: Sequence[float] | np.ndarray, delta: float) -> float:
    r"""Composition bound CB({ε_t}, δ) of T pure ε_t-DP releases (Kairouz et al., Thm 3.5).

    .. math::

        CB = \min\Big\{ \sum_t ε_t,\;
             \sum_t \frac{(e^{ε_t}-1)ε_t}{e^{ε_t}+1} + \sqrt{2\textstyle\sum_t ε_t^2 \log(1/δ)},\;
             \sum_t \frac{(e^{ε_t}-1)ε_t}{e^{ε_t}+1}
               + \sqrt{2\textstyle\sum_t ε_t^2 \log\big(e + \sqrt{\textstyle\sum_t ε_t^2}/δ\big)}
             \Big\}

    The composition is (CB, δ)-DP. With ``delta == 0`` only the first term applies.
    """
    eps = np.asarray(epsilons, dtype=float)
    if eps.ndim != 1 or eps.size == 0:
        raise InvalidParameterError(
            f"The 'epsilons' parameter must be a non-empty 1-d sequence; got shape {eps.shape}."
        )
    if np.any(~np.isfinite(eps)) or np.any(eps < 0):
        raise InvalidParameterError("The 'epsilons' parameter must contain finite values >= 0.")
    check_real("delta", delta, low=0.0, high=1.0, closed="left")
    total = float(eps.sum())
    if delta == 0.0:
        return total
    # (e^ε − 1)ε/(e^ε + 1) = ε·tanh(ε/2), stable for large ε.
    drift = float(np.sum(eps * np.tanh(eps / 2.0)))
    sq = float(np.sum(eps**2))
    second = drift + math.sqrt(2.0 * sq * math.log(1.0 / delta))
    third = drift + math.sqrt(2.0 * sq * math.log(math.e + math.sqrt(sq) / delta))
    return min(total, second, third)


def allocation_weights(
    iterations: int, *, strategy: str = "power", alpha: float = 0.0, Q: float | None = None
) -> np.ndarray:
    """Relative budgets w_t, t = 1..T: ``t**alpha`` (power) or ``Q**(-t)`` (geometric)."""
    T = check_int("iterations", iterations, low=1)
    check_choice("strategy", strategy, ALLOCATION_STRATEGIES)
    t = np.arange(1, T + 1, dtype=float)
    if strategy == "power":
        a = check_real("alpha", alpha)
        return t**a
    if Q is None:
        raise InvalidParameterError(
            "The 'Q' parameter must be a positive real with strategy='geometric'; got None."
        )
    q = check_real("Q", Q, low=0.0, closed="neither")
    # Normalise by the largest weight to avoid overflow; only ratios matter.
    logw = -t * math.log(q)
    return np.exp(logw - logw.max())


def allocate_budgets(
    epsilon: float,
    delta: float,
    iterations: int,
    *,
    strategy: str = "power",
    alpha: float = 0.0,
    Q: float | None = None,
) -> np.ndarray:
    """Per-iteration budgets ε_t = ε₀·w_t with the largest ε₀ such that CB({ε_t}, δ) ≤ ε.

    ``strategy="power"``: w_t = t^α (MP-MTL §4.5: α = 0 without acceleration, 2/5 with, convex
    losses). ``strategy="geometric"``: w_t = Q^{−t} (strongly convex: Q = (1−μ/L)^{2/5} without
    acceleration, (1−√(μ/L))^{1/5} with). Returns an array of length ``iterations``.
    """
    eps = check_real("epsilon", epsilon, low=0.0, closed="neither")
    w = allocation_weights(iterations, strategy=strategy, alpha=alpha, Q=Q)

    def gap(e0: float) -> float:
        return composition_bound(e0 * w, delta) - eps

    hi = eps / float(w.sum())  # CB ≤ Σ ε_t, so this ε₀ is always feasible
    while gap(hi) < 0:
        hi *= 2.0
    if gap(hi) == 0:
        return hi * w
    lo = hi / 2.0 if hi > eps / float(w.sum()) else 0.0
    e0 = brentq(gap, lo, hi, xtol=1e-14, rtol=1e-12)
    # brentq may land a hair above the root: step down until the bound holds.
    while gap(e0) > 0:
        e0 *= 1.0 - 1e-12
    return e0 * w


def ip_to_mp(epsilon: float, delta: float, n: int) -> tuple[float, float]:
    """Group privacy (MP-MTL paper, Prop. 3): (ε, δ)-IP-MTL ⇒ (nε, n·e^{nε}·δ)-MP-MTL.

    ``n`` is the largest number of records of one task, max_i n_i.
    """
    e = check_real("epsilon", epsilon, low=0.0)
    d = check_real("delta", delta, low=0.0, high=1.0)
    k = check_int("n", n, low=1)
    return k * e, min(1.0, k * math.exp(k * e) * d)


def mp_budget_for_ip(epsilon: float, delta: float, n: int) -> tuple[float, float]:
    """The IP-MTL budget (ε/n, δ/(n·e^ε)) that :func:`ip_to_mp` turns into (ε, δ)-MP-MTL."""
    e = check_real("epsilon", epsilon, low=0.0, closed="neither")
    d = check_real("delta", delta, low=0.0, high=1.0)
    k = check_int("n", n, low=1)
    return e / k, d / (k * math.exp(e))
