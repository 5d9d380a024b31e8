"""Empirical privacy audits: ε lower bounds from distinguishing experiments on the real releases.

:func:`run_audit` (:mod:`privmtl.audit.experiments`) runs one audit; :mod:`privmtl.audit.stats`
holds the statistics (Clopper–Pearson, the threshold audit, the one-run bound).
"""

from privmtl.audit.experiments import AUDIT_MECHANISMS, DEFAULT_TRIALS, MUTATIONS, run_audit
from privmtl.audit.stats import (
    clopper_pearson,
    epsilon_from_counts,
    one_run_epsilon,
    one_run_p_value,
    threshold_audit,
)

__all__ = [
    "AUDIT_MECHANISMS",
    "DEFAULT_TRIALS",
    "MUTATIONS",
    "clopper_pearson",
    "epsilon_from_counts",
    "one_run_epsilon",
    "one_run_p_value",
    "run_audit",
    "threshold_audit",
]
