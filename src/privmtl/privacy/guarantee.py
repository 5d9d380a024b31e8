"""The statement of a privacy guarantee, as every privmtl result reports it.

A number ε means nothing without δ, the neighbouring relation (what "one task differs" means), the
client-sampling scheme the accountant assumed and the accountant itself. :class:`PrivacyGuarantee`
carries all of them, and :meth:`PrivacyGuarantee.to_dict` is what the CLI writes into every JSON result.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "ACCOUNTANTS",
    "RELATIONS",
    "SAMPLINGS",
    "PrivacyGuarantee",
]

#: Neighbouring relations between datasets of tasks/clients.
#: ``add-remove``: one whole task is added or removed; ``replace-one``: one task's data is replaced.
RELATIONS = ("add-remove", "replace-one")

#: Client-sampling schemes: Poisson (each client independently with rate q/m), fixed-size (exactly q
#: of m without replacement), all (every task every round), none (one release, no sampling).
SAMPLINGS = ("poisson", "fixed", "all", "none")

#: Accountants. ``rdp`` and ``pld`` come from Google's dp-accounting; ``paper`` is a published closed
#: form; ``kairouz-cb`` the composition bound used by MP-MTL for pure-ε releases; ``none`` non-private.
ACCOUNTANTS = ("rdp", "pld", "paper", "kairouz-cb", "none")


@dataclass(frozen=True)
class PrivacyGuarantee:
    """An (ε, δ) guarantee together with everything needed to interpret it.

    Parameters
    ----------
    epsilon, delta : float
        The guarantee. ``epsilon = inf`` means no guarantee (non-private).
    relation : {"add-remove", "replace-one"}
        Neighbouring relation: the two inputs differ in one whole task (client).
    sampling : {"poisson", "fixed", "all", "none"}
        Client-sampling scheme the accountant assumed — and the one the code performed.
    accountant : {"rdp", "pld", "paper", "kairouz-cb", "none"}
        How ε was computed.
    notion : str
        The privacy notion, e.g. ``"JDP (billboard)"`` for PMTL or ``"MP-MTL"`` for model protection.
    valid : bool
        False when the mechanism does not satisfy the stated ε (e.g. the published Wishart step); the
        (ε, δ) then records the *claimed* ε and the *real* (lower bound on) δ.
    notes : tuple of str
        Caveats a reader must see (tuning not charged, closed-form conditions, ...).
    details : dict
        Machine-readable parameters of the release (noise multiplier, rounds, rate, ...).
    """

    epsilon: float
    delta: float
    relation: str
    sampling: str
    accountant: str
    notion: str = "JDP (billboard)"
    valid: bool = True
    notes: tuple[str, ...] = ()
    details: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def non_private(
        cls, *, notion: str = "none", relation: str = "add-remove", sampling: str = "none"
    ) -> PrivacyGuarantee:
        """The guarantee of a method that releases its statistics without noise (ε = ∞)."""
        return cls(
            epsilon=math.inf,
            delta=0.0,
            relation=relation,
            sampling=sampling,
            accountant="none",
            notion=notion,
            notes=("non-private: no noise is added, epsilon is infinite",),
        )

    @property
    def is_private(self) -> bool:
        """True when ε is finite and the mechanism satisfies it."""
        return math.isfinite(self.epsilon) and self.valid

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary (ε = ∞ is written as ``None`` with ``private = False``)."""
        out = asdict(self)
        out["epsilon"] = self.epsilon if math.isfinite(self.epsilon) else None
        out["notes"] = list(self.notes)
        out["private"] = self.is_private
        return out

    def describe(self) -> str:
        """One line for humans, e.g. ``(ε=1, δ=1e-05) JDP (billboard), add-remove one task, ...``."""
        if not math.isfinite(self.epsilon):
            return f"non-private (ε = ∞); {self.notion}"
        head = f"(ε={self.epsilon:.4g}, δ={self.delta:.3g})"
        text = (
            f"{head} {self.notion}, neighbours: {self.relation} one task (client), "
            f"sampling: {self.sampling}, accountant: {self.accountant}"
        )
        if not self.valid:
            text += " — NOT a valid ε-DP guarantee (see notes)"
        return text

    def __str__(self) -> str:
        return self.describe()
