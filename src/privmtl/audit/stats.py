r"""Statistics of privacy audits: Clopper–Pearson bounds, ε lower bounds, the one-run bound.

Two kinds of experiment are analysed.

**Many independent trials** (:func:`epsilon_from_counts`, :func:`threshold_audit`). Each trial runs
the mechanism once on one of two neighbouring inputs, ``D0`` (canary absent) or ``D1`` (canary
present), and a test "score > threshold ⇒ D1" is applied to the output. If the mechanism is
(ε, δ)-DP, every test satisfies (Kairouz et al. 2015)

.. math:: \mathrm{FPR} + e^{\varepsilon}\,\mathrm{FNR} \ge 1-\delta, \qquad
          \mathrm{FNR} + e^{\varepsilon}\,\mathrm{FPR} \ge 1-\delta,

so with upper confidence bounds :math:`\overline{\mathrm{FPR}}, \overline{\mathrm{FNR}}`

.. math:: \varepsilon \ge \max\Bigl(\log\frac{1-\delta-\overline{\mathrm{FNR}}}
          {\overline{\mathrm{FPR}}},\ \log\frac{1-\delta-\overline{\mathrm{FPR}}}
          {\overline{\mathrm{FNR}}}\Bigr).

Each upper bound is the one-sided Clopper–Pearson bound at level ``1 − (1 − confidence)/2`` (the
upper end of the two-sided exact interval), so by the union bound both hold together with
probability at least ``confidence``. The threshold is chosen on one half of the trials (the
*selection* half) and the bound is computed on the other half only, so the choice does not bias
the reported bound.

**One training run with many canaries** (:func:`one_run_p_value`, :func:`one_run_epsilon`).
Steinke, Nasr & Jagielski (2023), "Privacy auditing with one (1) training run", Theorem 3.1 / the
algorithm of their Appendix D: ``m`` canaries are each included independently with probability
1/2; the auditor abstains on all but ``r`` of them and guesses "in" or "out" for those; ``v``
guesses are right. Under (ε, δ)-DP,

.. math:: P[W \ge v] \le \beta + 2m\delta\,\alpha,\quad
          \beta = P[\mathrm{Bin}(r, p_\varepsilon) \ge v],\quad
          \alpha = \max_{1\le i\le v} \frac{P[v-i \le \mathrm{Bin}(r,p_\varepsilon) < v]}{i},

with :math:`p_\varepsilon = e^\varepsilon/(1+e^\varepsilon)`; the lower bound is the largest ε
whose p-value is below ``1 − confidence``. The implementation here is written from the statement.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import scipy.stats

from privmtl._validation import check_int, check_real
from privmtl.exceptions import InvalidParameterError

__all__ = [
    "clopper_pearson",
    "clopper_pearson_upper",
    "epsilon_from_counts",
    "epsilon_from_rates",
    "one_run_epsilon",
    "one_run_p_value",
    "threshold_audit",
]


#: Pooled-score quantiles tried as thresholds on the selection half.
_QUANTILES = np.linspace(0.05, 0.95, 19)


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided exact (Clopper–Pearson) interval for a binomial proportion ``k/n``."""
    n = check_int("n", n, low=1)
    k = check_int("k", k, low=0, high=n)
    conf = check_real("confidence", confidence, low=0.0, high=1.0, closed="neither")
    a = (1.0 - conf) / 2.0
    lo = 0.0 if k == 0 else float(scipy.stats.beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(scipy.stats.beta.ppf(1.0 - a, k + 1, n - k))
    return lo, hi


def clopper_pearson_upper(k: np.ndarray, n: np.ndarray | int, level: float) -> np.ndarray:
    """One-sided exact upper bounds at ``level`` for arrays of counts ``k`` out of ``n``."""
    k = np.asarray(k, dtype=float)
    n = np.broadcast_to(np.asarray(n, dtype=float), k.shape)
    with np.errstate(invalid="ignore"):
        hi = scipy.stats.beta.ppf(level, k + 1.0, np.maximum(n - k, 1e-300))
    return np.where(k >= n, 1.0, hi)


def epsilon_from_rates(fpr_hi: Any, fnr_hi: Any, delta: float) -> np.ndarray:
    """ε lower bound from upper bounds on FPR and FNR (module docstring); 0 when vacuous."""
    fpr = np.asarray(fpr_hi, dtype=float)
    fnr = np.asarray(fnr_hi, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.log(np.maximum(1.0 - delta - fnr, 0.0)) - np.log(fpr)
        b = np.log(np.maximum(1.0 - delta - fpr, 0.0)) - np.log(fnr)
    out = np.nan_to_num(np.fmax(a, b), nan=0.0, neginf=0.0)
    return np.maximum(out, 0.0)


def epsilon_from_counts(
    fp: Any, n_neg: int, fn: Any, n_pos: int, *, delta: float, confidence: float = 0.95
) -> np.ndarray:
    """ε lower bound with joint ``confidence`` from ``fp`` of ``n_neg`` and ``fn`` of ``n_pos``.

    Each rate is bounded above by the one-sided Clopper–Pearson bound at ``1 − (1−confidence)/2``.
    """
    level = 1.0 - (1.0 - confidence) / 2.0
    fpr_hi = clopper_pearson_upper(np.asarray(fp), n_neg, level)
    fnr_hi = clopper_pearson_upper(np.asarray(fn), n_pos, level)
    return epsilon_from_rates(fpr_hi, fnr_hi, delta)


def _counts(
    neg: np.ndarray, pos: np.ndarray, thresholds: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """False positives (neg > t) and false negatives (pos <= t) of every threshold."""
    neg_s, pos_s = np.sort(neg), np.sort(pos)
    fp = len(neg_s) - np.searchsorted(neg_s, thresholds, side="right")
    fn = np.searchsorted(pos_s, thresholds, side="right")
    return fp, fn


def threshold_audit(
    scores_out: np.ndarray,
    scores_in: np.ndarray,
    *,
    delta: float,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """ε lower bound of the test "score > t ⇒ canary in", t chosen on a separate half.

    ``scores_out`` are the scores of trials on ``D0`` (canary absent), ``scores_in`` on ``D1``.
    Trials with an even index form the selection half, odd ones the evaluation half (trials are
    independent and identically distributed, so this split is fixed in advance). On the selection
    half the threshold maximizing the bound is found among 19 quantiles (5 %, 10 %, …, 95 %) of the
    pooled selection scores; the reported
    bound uses the evaluation half only. Returns the bound, threshold, counts and rates.
    """
    neg = np.asarray(scores_out, dtype=float).ravel()
    pos = np.asarray(scores_in, dtype=float).ravel()
    if len(neg) < 2 or len(pos) < 2:
        raise InvalidParameterError(
            f"An audit needs at least 2 trials per input; got {len(neg)} and {len(pos)}."
        )
    if not (np.all(np.isfinite(neg)) and np.all(np.isfinite(pos))):
        raise InvalidParameterError("Audit scores must be finite.")
    sel_neg, ev_neg = neg[0::2], neg[1::2]
    sel_pos, ev_pos = pos[0::2], pos[1::2]
    # a fixed grid of pooled quantiles: the extreme tails, where a few lucky counts would win the
    # selection and lose on evaluation, are left out
    cand = np.unique(np.quantile(np.concatenate([sel_neg, sel_pos]), _QUANTILES))
    fp, fn = _counts(sel_neg, sel_pos, cand)
    eps_sel = epsilon_from_counts(
        fp, len(sel_neg), fn, len(sel_pos), delta=delta, confidence=confidence
    )
    best = int(np.argmax(eps_sel))
    t = float(cand[best])
    efp, efn = _counts(ev_neg, ev_pos, np.array([t]))
    eps = float(
        epsilon_from_counts(efp, len(ev_neg), efn, len(ev_pos), delta=delta, confidence=confidence)[
            0
        ]
    )
    return {
        "epsilon_lower_bound": eps,
        "threshold": t,
        "selection_bound": float(eps_sel[best]),
        "false_positives": int(efp[0]),
        "negatives": len(ev_neg),
        "false_negatives": int(efn[0]),
        "positives": len(ev_pos),
        "fpr": float(efp[0] / len(ev_neg)),
        "fnr": float(efn[0] / len(ev_pos)),
    }


# ------------------------------------------------------------------------------------- one run
def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """p-value of ``v`` correct guesses out of ``r`` among ``m`` canaries under (ε, δ)-DP."""
    m = check_int("m", m, low=1)
    r = check_int("r", r, low=0, high=m)
    v = check_int("v", v, low=0, high=r)
    eps = check_real("epsilon", epsilon, low=0.0)
    dlt = check_real("delta", delta, low=0.0, high=1.0)
    p = 1.0 / (1.0 + math.exp(-eps))
    beta = float(scipy.stats.binom.sf(v - 1, r, p))
    if v == 0 or dlt == 0.0:
        return min(beta, 1.0)
    # P[v - i <= Bin < v] for i = 1..v, divided by i: its maximum is alpha
    below = scipy.stats.binom.pmf(np.arange(v - 1, -1, -1), r, p)
    alpha = float(np.max(np.cumsum(below) / np.arange(1, v + 1)))
    return min(beta + 2.0 * m * dlt * alpha, 1.0)


def one_run_epsilon(
    m: int, r: int, v: int, *, delta: float, confidence: float = 0.95, tol: float = 1e-6
) -> float:
    """Largest ε (to ``tol``) rejected at level ``1 − confidence`` by :func:`one_run_p_value`."""
    conf = check_real("confidence", confidence, low=0.0, high=1.0, closed="neither")
    level = 1.0 - conf
    if one_run_p_value(m, r, v, 0.0, delta) >= level:
        return 0.0
    lo, hi = 0.0, 1.0
    while one_run_p_value(m, r, v, hi, delta) < level:
        lo, hi = hi, 2.0 * hi
        if hi > 1e3:
            return math.inf
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if one_run_p_value(m, r, v, mid, delta) < level:
            lo = mid
        else:
            hi = mid
    return lo
