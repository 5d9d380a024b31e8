r"""PMTL (Hu, Wu & Smith, Algorithm 1): each client keeps its own model, pulled towards the
billboard :math:`\tilde w` with weight λ.

A sampled client starts from its own model and runs local SGD on
:math:`l_k(w) + \frac{\lambda}{2}\lVert w-\tilde w\rVert^2`. Its message (``server_update``) is
its model minus the billboard (``"offset"``, the authors' code), minus its model before the round
(``"delta"``, Algorithm 1 as printed) or, with ``"ditto"``, the change of a copy of the billboard
trained on the same minibatches without the pull (FedAvg's message; the personalized model is
kept and never sent).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import ClassVar

from privmtl.exceptions import PrivmtlWarning
from privmtl.federated.algorithms import Params
from privmtl.federated.methods.base import ClientStep, Method, TrainFn, train_sets

__all__ = ["PMTL"]


class PMTL(Method):
    """PMTL: own model, pull λ towards the billboard, message per ``server_update``."""

    name: ClassVar[str] = "pmtl"
    pulls: ClassVar[bool] = True
    tunes_lam: ClassVar[bool] = True
    partial_sharing: ClassVar[bool] = True
    backends: ClassVar[tuple[str, ...]] = ("in-process", "flower")

    @property
    def message(self) -> str:  # type: ignore[override]
        """``config.server_update``: ``"offset"``, ``"delta"`` or ``"ditto"``."""
        return str(self.config.server_update)

    def setup_warnings(self, q: int, m: int) -> None:
        if self.message == "delta" and q < m:
            warnings.warn(
                f"server_update='delta' (Algorithm 1 as printed) with partial participation "
                f"(q={q} of m={m} clients per round) moves the billboard m/q = {m / q:.3g} times "
                "faster than the mean of the personalized models and can diverge; "
                "server_update='offset' (the authors' code) has the same privacy guarantee.",
                PrivmtlWarning,
                stacklevel=4,
            )

    def client_update(
        self,
        billboard: Params,
        shared: Sequence[str],
        starts: Params,
        anchor: Params | None,
        train: TrainFn,
    ) -> ClientStep:
        """With Ditto's message a copy of the billboard (the clients' own values for the
        parameters that are not shared) is trained on the same minibatches without the pull and
        the message is computed from it; else :meth:`Method.client_update`."""
        if self.message != "ditto":
            return super().client_update(billboard, shared, starts, anchor, train)
        copies = {
            n: billboard[n].unsqueeze(0).expand_as(p).clone() if n in shared else p.clone()
            for n, p in starts.items()
        }
        # the copies' training reads nothing of the personal models': both on the same rows
        (kept, losses), (news, _) = train_sets(
            train, [(starts, self.rule(anchor)), (copies, self.rule(None))]
        )
        return ClientStep(kept, self.messages(billboard, shared, starts, news), losses)
