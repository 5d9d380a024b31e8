r"""Server optimizers applied to the released noisy mean (DP-FedAvgM, DP-FedAdam).

The curator releases :math:`r_t = \frac1q\sum_k \mathrm{clip}(g_k) + N(0, \sigma^2 I)`. A server
optimizer turns the sequence of *released* values into the billboard's increments; because it
reads nothing but :math:`r_1, \dots, r_t` it is post-processing of the released sequence and costs
no privacy (the ledger is unchanged). Following Reddi et al. (2021, "Adaptive federated
optimization") with the server step size :math:`\eta_s`:

* ``"momentum"`` (FedAvgM): :math:`v_t = \beta v_{t-1} + r_t`, increment :math:`\eta_s v_t`;
* ``"adam"`` (FedAdam): :math:`m_t = \beta_1 m_{t-1} + (1-\beta_1) r_t`,
  :math:`v_t = \beta_2 v_{t-1} + (1-\beta_2) r_t^2`, increment
  :math:`\eta_s m_t / (\sqrt{v_t} + \tau)` (no bias correction, as in the paper).
"""

from __future__ import annotations

from typing import Any

import torch

from privmtl._validation import check_choice, check_real
from privmtl.federated.spec import SPEC

__all__ = ["SERVER_OPTIMIZERS", "ServerOptimizer"]

SERVER_OPTIMIZERS = ("none", "momentum", "adam")

Params = dict[str, torch.Tensor]


class ServerOptimizer:
    """Billboard increments from released noisy means (module docstring).

    Parameters
    ----------
    kind : {"momentum", "adam"}
    lr : float > 0
        Server step size :math:`\\eta_s`.
    momentum : float in [0, 1)
        :math:`\\beta` (momentum) or :math:`\\beta_1` (adam).
    beta2 : float in [0, 1)
        Adam's second-moment decay.
    eps : float > 0
        Adam's adaptivity :math:`\\tau`.
    """

    def __init__(
        self,
        kind: str,
        *,
        lr: float = SPEC.server_lr,
        momentum: float = SPEC.server_momentum,
        beta2: float = 0.99,
        eps: float = 1e-3,
    ) -> None:
        self.kind = check_choice("server_optimizer", kind, SERVER_OPTIMIZERS[1:])
        self.lr = check_real("server_lr", lr, low=0.0, closed="neither")
        self.momentum = check_real("server_momentum", momentum, low=0.0, high=1.0, closed="left")
        self.beta2 = check_real("server_beta2", beta2, low=0.0, high=1.0, closed="left")
        self.eps = check_real("server_adam_eps", eps, low=0.0, closed="neither")
        self.state: dict[str, Params] = {}

    def step(self, released: Params) -> Params:
        """The billboard increment for one released value (updates the optimizer's state)."""
        if not self.state:
            zeros = {n: torch.zeros_like(r) for n, r in released.items()}
            self.state = {"m": zeros}
            if self.kind == "adam":
                self.state["v"] = {n: torch.zeros_like(r) for n, r in released.items()}
        m = self.state["m"]
        if self.kind == "momentum":
            for n, r in released.items():
                m[n] = self.momentum * m[n] + r
            return {n: self.lr * m[n] for n in released}
        v = self.state["v"]
        for n, r in released.items():
            m[n] = self.momentum * m[n] + (1 - self.momentum) * r
            v[n] = self.beta2 * v[n] + (1 - self.beta2) * r * r
        return {n: self.lr * m[n] / (v[n].sqrt() + self.eps) for n in released}

    def state_dict(self) -> dict[str, Any]:
        return {k: {n: t.clone() for n, t in d.items()} for k, d in self.state.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = {k: {n: t.clone() for n, t in d.items()} for k, d in state.items()}
