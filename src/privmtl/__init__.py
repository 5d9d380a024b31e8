"""privmtl: private multi-task learning with computed, recorded and checked privacy guarantees.

Sub-packages
------------
privmtl.privacy
    Mechanisms (clipping, Gaussian and Wishart releases), privacy events, accountants
    (dp-accounting RDP/PLD, closed forms, the Kairouz composition bound) and guarantees.
privmtl.data
    Multi-task (linear) and federated datasets: readers, splits and synthetic generators.
privmtl.linear
    MP-MTL estimators and linear multi-task baselines (NumPy/SciPy).
privmtl.federated
    PMTL and federated baselines on PyTorch, batched across clients.
"""

from __future__ import annotations

from privmtl.exceptions import (
    DataFormatError,
    InvalidParameterError,
    PrivacyBudgetError,
    PrivmtlError,
)

__version__ = "0.1.0"

__all__ = [
    "DataFormatError",
    "InvalidParameterError",
    "PrivacyBudgetError",
    "PrivmtlError",
    "__version__",
]
