"""Joint DP: client-level DP of the concatenation of all ``m`` models (the billboard holds one
block per client; :func:`~privmtl.federated.baselines.train_joint_dp`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from privmtl.federated.algorithms import Params
from privmtl.federated.methods.base import Method, State, TrainFn, stack
from privmtl.federated.store import ClientStore

if TYPE_CHECKING:
    pass

__all__ = ["JointDP"]


class JointDP(Method):
    """Each client starts from its released block, pulled λ towards the blocks' mean; the
    release adds to every block with block std zγ."""

    name: ClassVar[str] = "joint-dp"
    start: ClassVar[str] = "block"
    billboard_update: ClassVar[str] = "blocks"
    message: ClassVar[str] = "delta"
    pulls: ClassVar[bool] = True
    engine_method: ClassVar[str | None] = "pmtl"
    notion: ClassVar[str] = "DP of the joint model"

    def release_settings(
        self, clip: float | None, sigma: float, q: int
    ) -> tuple[Any, float, float]:
        """Block std zγ with z = σq/γ (PMTL's multiplier), added to every block."""
        return clip, sigma * q, 1.0

    def initial_billboard(self, init: Params, shared: Sequence[str], m: int) -> Params:
        return stack(init, m)

    def initial_state(
        self, init: Params, m: int, initial_state: dict[str, Any] | None = None
    ) -> State:
        """No client state: a client's model is its block of the billboard."""
        return ClientStore(m, {})

    def starts(
        self, billboard: Params, sel: torch.Tensor, state: State
    ) -> tuple[Params, Params | None]:
        centre = {n: p.mean(0) for n, p in billboard.items()} if self.prox_weight else None
        return {n: p.index_select(0, sel) for n, p in billboard.items()}, centre

    def message_template(self, billboard: Params) -> Params:
        return {n: p[0] for n, p in billboard.items()}

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
        return billboard, {n: p.mean(0) for n, p in billboard.items()}
