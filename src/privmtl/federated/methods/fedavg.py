r"""FedAvg and FedProx: every sampled client starts from the billboard :math:`\tilde w` and sends
its change; the output is the billboard (one global model).

FedProx adds the proximal term :math:`\frac{\mu}{2}\lVert w-\tilde w\rVert^2` with μ = ``lam``.
"""

from __future__ import annotations

from typing import ClassVar

from privmtl.federated.methods.base import Method

__all__ = ["DEFAULT_FEDPROX_MU", "FedAvg", "FedProx"]

#: FedProx's μ when none is given, as in the committed FEMNIST sweep.
DEFAULT_FEDPROX_MU = 0.01


class FedAvg(Method):
    """FedAvg: start from the billboard, plain local SGD, the global model is the output."""

    name: ClassVar[str] = "fedavg"
    start: ClassVar[str] = "global"
    personalized: ClassVar[bool] = False
    backends: ClassVar[tuple[str, ...]] = ("in-process", "flower")


class FedProx(FedAvg):
    """FedProx: FedAvg with the proximal pull μ = ``lam`` towards the billboard."""

    name: ClassVar[str] = "fedprox"
    pulls: ClassVar[bool] = True
    tunes_lam: ClassVar[bool] = True

    @classmethod
    def default_lam(cls, *, private: bool) -> float:
        return DEFAULT_FEDPROX_MU
