"""δ defaults and checks shared by both families.

The default δ follows DP practice on every data set, δ well below 1/m: :func:`user_data_delta`.
A δ ≥ 1/m allows a mechanism to reveal one unit's data outright with probability δ and still meet
the definition, so any such δ warns (:func:`check_delta`); δ outside (0, 1) is refused. The PMTL
paper's δ = 1/m (:func:`pmtl_paper_delta`) is available for reproductions of its experiments by an
explicit choice only (``privmtl pmtl --paper-delta``).
"""

from __future__ import annotations

import warnings

from privmtl._validation import check_real
from privmtl.exceptions import PrivmtlWarning

__all__ = ["check_delta", "pmtl_paper_delta", "user_data_delta"]


def user_data_delta(m: int) -> float:
    """The default δ on a user's data with ``m`` units (tasks or clients): min(1e-5, 1/(100·m))."""
    return min(1e-5, 1.0 / (100.0 * m))


def pmtl_paper_delta(m: int) -> float:
    """The PMTL paper's δ = 1/m for ``m`` clients (reproductions only: δ ≥ 1/m, see the module)."""
    return 1.0 / m


def check_delta(delta: float, m: int, *, unit: str = "client") -> float:
    """Return ``delta`` after refusing δ ∉ (0, 1) and warning when δ ≥ 1/m (``m`` units)."""
    delta = check_real("delta", delta, low=0.0, high=1.0, closed="neither")
    if delta >= 1.0 / m:
        warnings.warn(
            f"delta={delta:g} >= 1/m = {1.0 / m:g} (m={m} {unit}s): a guarantee at this delta "
            f"allows revealing one {unit}'s data outright; use delta well below 1/m.",
            PrivmtlWarning,
            stacklevel=2,
        )
    return delta
