r"""The gain of a result over each client's own baseline, and its interval over clients.

A private method's score means little without what every client (task) reaches alone, with no
sharing and no privacy cost. The gain compares the two client by client:

.. math::

    \text{gain} = \frac{\sum_k (a_k - b_k)}{\sum_k n_k},

with :math:`a_k` and :math:`b_k` the method's and the baseline's score sums of client :math:`k`
(correct predictions, or minus a squared error: higher is better) and :math:`n_k` its examples.
Its interval is the normal interval of this ratio estimator over the clients,
:math:`\text{gain} \pm z\,\widehat{se}` with
:math:`\widehat{se}^2 = \frac{K}{K-1} \sum_k (d_k - \text{gain}\, n_k)^2 / (\sum_k n_k)^2`,
:math:`d_k = a_k - b_k` and :math:`K` the clients with examples: the clients taken as a sample of
clients like them, so that a gain whose interval holds 0 is not one a user can count on.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["GAIN_LEVEL", "describe_gain", "gain_interval", "gain_verdict"]

GAIN_LEVEL = 0.95
"""The coverage of every ``gain_interval``."""


def gain_interval(
    method: np.ndarray, baseline: np.ndarray, n: np.ndarray, level: float = GAIN_LEVEL
) -> tuple[float, tuple[float, float]]:
    """The paired gain over clients and its normal interval (module docstring).

    ``method`` and ``baseline`` are every client's score sums (higher is better), ``n`` its
    examples; clients without examples do not count. The interval is ``(nan, nan)`` with fewer
    than two clients.
    """
    from scipy.stats import norm

    n = np.asarray(n, dtype=np.float64)
    keep = n > 0
    d = (np.asarray(method, np.float64) - np.asarray(baseline, np.float64))[keep]
    n = n[keep]
    total = float(n.sum())
    if total == 0.0:
        return float("nan"), (float("nan"), float("nan"))
    gain = float(d.sum()) / total
    k = len(n)
    if k < 2:
        return gain, (float("nan"), float("nan"))
    resid = d - gain * n
    se = math.sqrt(k / (k - 1) * float((resid**2).sum())) / total
    z = float(norm.ppf(0.5 + level / 2))
    return gain, (gain - z * se, gain + z * se)


def gain_verdict(low: float, high: float, *, alone: str = "training alone") -> str:
    """Plain words for a gain's interval: helped, hurt, or no clear gain over ``alone``."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"too few clients to tell whether collaboration helped over {alone}"
    if low > 0:
        return "collaboration helped"
    if high < 0:
        return f"collaboration hurt: on average the clients did better with {alone}"
    return f"no clear gain from collaboration over {alone}"


def describe_gain(out: dict[str, Any]) -> str | None:
    """The human line of a result's baseline (None without one): the local accuracy, the gain
    with its interval, and plainly whether collaboration helped."""
    if "gain_over_local" not in out:
        return None
    gain = float(out["gain_over_local"])
    low, high = (float(v) for v in out["gain_interval"])
    where = (
        f" ({out['baseline_clients']} sampled clients)"
        if out.get("baseline_clients", 0) < out.get("num_clients", 0)
        else ""
    )
    text = (
        f"local training alone: test accuracy {out['local_test_accuracy']:.4f}{where}; "
        f"gain {gain * 100:+.1f} points [{low * 100:+.1f}, {high * 100:+.1f}]"
    )
    return f"{text}: {gain_verdict(low, high)}"
