"""What a federated training gives: :class:`TrainResult` (the released global model, the
personalized models, the history of the rounds, the guarantee's numbers and the ledger), the
output of :func:`privmtl.federated.train` and of every method's ``fit``."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from privmtl.federated.client_models import ClientModels
from privmtl.privacy.guarantee import PrivacyGuarantee

if TYPE_CHECKING:
    from privmtl.federated.config import TrainConfig

__all__ = ["TrainResult"]


@dataclass
class TrainResult:
    """Output of :func:`privmtl.federated.train`.

    Attributes
    ----------
    config : TrainConfig
    client_ids : list of str
    personalized_params : dict of str to Tensor, or None
        Stacked per-client parameters ``(m, *shape)`` (pmtl, local); ``None`` for fedavg/fedprox.
        A method whose clients keep their models in a store gives a
        :class:`~privmtl.federated.client_models.StoredModels`: read a block of clients at a time
        (:meth:`~privmtl.federated.client_models.ClientModels.rows`), it never holds every
        client's model; read as a dict, it stacks them once.
    global_params : dict of str to Tensor
        The released global model :math:`\tilde w^T` (unchanged initial model for ``local``).
    history : list of dict
        One record per round: ``round``, ``sampled`` (client indices), ``n_sampled``,
        ``train_loss`` (mean over sampled clients of their mean minibatch loss ``l_k`` during the
        round; NaN if none sampled), ``update_norms`` (before clipping), ``clipped_fraction``,
        ``noise_multiplier`` (``z = σq/γ`` or None), for a mean release ``signal_norm`` (norm of
        the un-noised mean of clipped messages: a curator-side diagnostic, not covered by the
        guarantee), ``noise_norm`` and ``released_dim``
        (:func:`~privmtl.privacy.release.signal_noise`), ``epsilon`` (after the round; ``inf``
        if not private, 0 for ``local``), ``seconds`` (wall clock) and ``cpu_seconds`` (CPU time
        of the process, all threads); plus ``val_accuracy`` and
        ``val_mean_client_accuracy`` on evaluation rounds.
    accuracies : dict
        ``accuracies[split][model]`` with ``split`` in {"val", "test"} and ``model`` in
        {"personalized", "global"}: ``{"accuracy": pooled over all examples,
        "mean_client_accuracy": mean over clients with data of their accuracy, "loss": pooled mean
        cross-entropy, "n": examples}``.
    primary : {"personalized", "global"}
        The model the method is evaluated with (pmtl/local: personalized; fedavg/fedprox: global).
    epsilon, delta : float
        Final guarantee of the released global-model sequence (``inf`` if not private, 0 for
        ``local``); the personalized outputs are (ε, δ) billboard/joint DP by post-processing.
    ledger : PrivacyLedger or None
    seconds : float
        Wall-clock training time (rounds only, without the final evaluation).
    seconds_per_round : float
    noise_source : {"secure", "seeded"}
        Where the server's noise came from.
    stopped_on_budget : bool
        True when the run stopped before the release that would have exceeded its ε budget.
    """

    config: TrainConfig
    client_ids: list[str]
    personalized_params: dict[str, torch.Tensor] | None
    global_params: dict[str, torch.Tensor]
    history: list[dict[str, Any]]
    accuracies: dict[str, dict[str, dict[str, float]]]
    primary: str
    epsilon: float
    delta: float
    ledger: Any = None
    seconds: float = 0.0
    seconds_per_round: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    noise_source: str = "seeded"
    stopped_on_budget: bool = False

    @property
    def guarantee(self) -> Any:
        """The :class:`~privmtl.privacy.PrivacyGuarantee` of the released billboard sequence.

        Client-level (ε, δ) with the config's relation, sampling and accountant and the noise
        source; ``notion`` is billboard privacy (joint DP of the personalized models). ``local``
        has ε = 0 towards the others; a run without noise is non-private (ε = ∞).
        """
        method = self.config.method_class()
        if not method.communicates:
            return PrivacyGuarantee(
                epsilon=0.0, delta=0.0, relation=self.config.relation, sampling="none",
                accountant="none", notion="JDP (billboard)",
                notes=("local training: nothing leaves a client",),
            )  # fmt: skip
        sampling = method.guarantee_sampling(self.config)
        if not math.isfinite(self.epsilon):
            return PrivacyGuarantee.non_private(
                notion="JDP (billboard)", relation=self.config.relation, sampling=sampling
            )
        notion = method.notion
        return PrivacyGuarantee(
            epsilon=self.epsilon,
            delta=self.delta,
            relation=self.config.relation,
            sampling=sampling,
            accountant=self.config.accountant,
            notion=notion,
            noise_source=self.noise_source,
            details={"rounds_run": len(self.history), "stopped_on_budget": self.stopped_on_budget},
        )

    @property
    def test_accuracy(self) -> float:
        """Pooled test accuracy of the method's model (personalized or global)."""
        return self.accuracies["test"][self.primary]["accuracy"]

    @property
    def mean_client_accuracy(self) -> float:
        """Mean over clients of their test accuracy with the method's model."""
        return self.accuracies["test"][self.primary]["mean_client_accuracy"]

    @property
    def val_accuracy(self) -> float:
        """Pooled validation accuracy of the method's model (NaN without validation data)."""
        return self.accuracies["val"][self.primary]["accuracy"]

    def client_params(self, k: int) -> dict[str, torch.Tensor]:
        """Parameters used by client ``k`` (its personalized model, or the global model)."""
        if self.personalized_params is None:
            return dict(self.global_params)
        if isinstance(self.personalized_params, ClientModels):  # its row only, nothing stacked
            return {n: p[0] for n, p in self.personalized_params.rows(np.array([k])).items()}
        return {name: p[k] for name, p in self.personalized_params.items()}

    def client_model(self, model: nn.Module, k: int) -> nn.Module:
        """A deep copy of ``model`` holding client ``k``'s parameters."""
        out = copy.deepcopy(model)
        with torch.no_grad():
            for name, p in out.named_parameters():
                p.copy_(self.client_params(k)[name])
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable summary (no tensors; infinities as the string "inf")."""

        def clean(v: Any) -> Any:
            if isinstance(v, float) and math.isinf(v):
                return "inf" if v > 0 else "-inf"
            if isinstance(v, float) and math.isnan(v):
                return None
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            if isinstance(v, list | tuple):
                return [clean(x) for x in v]
            return v

        return clean(
            {
                "config": self.config.to_dict(),
                "n_clients": len(self.client_ids),
                "primary": self.primary,
                "epsilon": self.epsilon,
                "delta": self.delta,
                "accuracies": self.accuracies,
                "seconds": self.seconds,
                "seconds_per_round": self.seconds_per_round,
                "history": self.history,
                "noise_source": self.noise_source,
                "stopped_on_budget": self.stopped_on_budget,
                **self.extra,
            }
        )
