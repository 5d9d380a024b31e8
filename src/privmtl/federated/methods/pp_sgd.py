r"""PP-SGD (Bietti et al. 2022): a shared model plus a local part :math:`\theta_k` per client
(:func:`~privmtl.federated.baselines.train_pp_sgd`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from privmtl.federated.algorithms import Params
from privmtl.federated.client import SplitStep, UpdateRule, split_names
from privmtl.federated.methods.base import Method, State, TrainFn
from privmtl.federated.store import ClientStore

if TYPE_CHECKING:
    pass

__all__ = ["PPSGD"]


class PPSGD(Method):
    """Clients start from (w̃, their own θ), take SplitStep(α, μ) and send u − w̃."""

    name: ClassVar[str] = "pp-sgd"
    start: ClassVar[str] = "split"
    engine_method: ClassVar[str | None] = "pmtl"
    models: ClassVar[tuple[str, ...] | None] = ("logreg",)

    def initial_state(
        self, init: Params, m: int, initial_state: dict[str, Any] | None = None
    ) -> State:
        """A store whose ``"theta"`` field defaults to zeros; a given ``initial_state["theta"]``
        (``(m, ...)`` per parameter) writes every client's row."""
        store = ClientStore(m, {"theta": {n: torch.zeros_like(p) for n, p in init.items()}})
        theta = (initial_state or {}).get("theta")
        if theta is not None:
            rows = {n: torch.as_tensor(theta[n], dtype=p.dtype) for n, p in init.items()}
            store.scatter("theta", torch.arange(m), rows)
        return store

    def starts(
        self, billboard: Params, sel: torch.Tensor, state: State
    ) -> tuple[Params, Params | None]:
        k = len(sel)
        starts = {n: p.unsqueeze(0).expand((k, *p.shape)).clone() for n, p in billboard.items()}
        starts.update({split_names(n): p for n, p in state.gather("theta", sel).items()})
        return starts, None

    def rule(self, anchor: Params | None) -> UpdateRule:
        cfg = self.config
        mu = float(cfg.lam or 0.0) if cfg.pp_theta_reg is None else cfg.pp_theta_reg
        return SplitStep(lr=cfg.lr, alpha=cfg.pp_alpha, mu=mu)

    def keep(self, state: State, sel: torch.Tensor, kept: Params) -> None:
        state.scatter("theta", sel, {n: kept[split_names(n)] for n in state.names("theta")})

    def outputs(
        self,
        billboard: Params,
        state: State,
        *,
        personal_init: Params,
        names: Sequence[str],
        round: int,
        train_all: TrainFn,
    ) -> tuple[Params | None, Params]:
        theta = state.dense("theta")
        return {n: billboard[n].unsqueeze(0) + theta[n] for n in billboard}, billboard
