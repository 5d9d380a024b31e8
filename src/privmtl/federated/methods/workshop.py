r"""The workshop variant: task models projected onto a ball of radius ``ball``, every client
in every round, the release replaces the billboard with the noisy mean of the models
(:func:`~privmtl.federated.workshop.train_workshop`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from privmtl.exceptions import InvalidParameterError
from privmtl.federated.algorithms import Params
from privmtl.federated.client import ProxStep, UpdateRule
from privmtl.federated.methods.base import Method
from privmtl.federated.projection import project_to_ball

if TYPE_CHECKING:
    from privmtl.federated.config import TrainConfig

__all__ = ["Workshop"]


class Workshop(Method):
    """Own model, ProxStep(λ, w̃, B), message the model, the release replaces the billboard."""

    name: ClassVar[str] = "workshop"
    billboard_update: ClassVar[str] = "replace"
    message: ClassVar[str] = "model"
    pulls: ClassVar[bool] = True
    full_participation: ClassVar[bool] = True
    calibrates_mean_release: ClassVar[bool] = False
    in_runs: ClassVar[bool] = False

    @classmethod
    def check_config(cls, config: TrainConfig) -> None:
        super().check_config(config)
        if config.ball is None:
            raise InvalidParameterError("method='workshop' needs the ball radius 'ball'; got None.")

    @classmethod
    def is_private(cls, config: TrainConfig) -> bool:
        """Models projected to the ball are bounded by its radius: noise is enough."""
        return config.noise_std > 0

    def prepare_init(self, init: Params) -> Params:
        assert self.config.ball is not None
        return project_to_ball(init, self.config.ball, stacked=False)

    def release_settings(
        self, clip: float | None, sigma: float, q: int
    ) -> tuple[Any, float, float]:
        """Models are projected to the ball: the clip is its radius."""
        return self.config.ball, sigma, float(q)

    def rule(self, anchor: Params | None) -> UpdateRule:
        cfg = self.config
        return ProxStep(lr=cfg.lr, anchor=anchor, weight=self.prox_weight, ball=cfg.ball)
