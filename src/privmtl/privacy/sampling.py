"""Client sampling that is, by construction, the sampling the accountant assumes.

A sampler both *draws* the clients of a round and *names the privacy event* of one round of the
Gaussian mechanism run on them, so code and accounting cannot drift apart (the PMTL reference code
samples exactly q clients but accounts Poisson sampling; docs/privacy-model.md).

Normalization convention (all schemes): the server divides the sum of clipped updates by the fixed
``clients_per_round`` q — not by the realised number of Poisson-sampled clients — so the add/remove
sensitivity of the released mean is γ/q and the noise multiplier of noise std σ is z = σ·q/γ.
"""

from __future__ import annotations

from dataclasses import dataclass

import dp_accounting
import numpy as np

from privmtl._validation import check_choice, check_int, check_real
from privmtl.exceptions import InvalidParameterError
from privmtl.privacy.guarantee import SAMPLINGS

__all__ = [
    "SAMPLING_KINDS",
    "ClientSampler",
    "FixedSizeSampler",
    "FullParticipation",
    "PoissonSampler",
    "make_sampler",
]

#: The samplers a training run can use: every guarantee sampling except "none" (no release).
SAMPLING_KINDS = tuple(s for s in SAMPLINGS if s != "none")


@dataclass(frozen=True)
class ClientSampler:
    """Base class: m clients, q of them expected per round."""

    num_clients: int
    clients_per_round: int

    kind = "base"

    def __post_init__(self) -> None:
        check_int("num_clients", self.num_clients, low=1)
        check_int("clients_per_round", self.clients_per_round, low=1, high=self.num_clients)

    @property
    def expected_size(self) -> float:
        """Expected number of sampled clients, q (also the denominator of the server mean)."""
        return float(self.clients_per_round)

    @property
    def rate(self) -> float:
        """Sampling rate q/m."""
        return self.clients_per_round / self.num_clients

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        """Draw the sorted indices of the clients of one round."""
        raise NotImplementedError

    def event(self, noise_multiplier: float) -> dp_accounting.DpEvent:
        """The dp-accounting event of ONE round of the Gaussian mechanism on the sampled clients.

        ``noise_multiplier`` is z = σ/Δ with Δ the add/remove sensitivity of the released statistic
        (γ/q for the mean of clipped updates). The relation is chosen when accounting.
        """
        raise NotImplementedError

    def _gaussian(self, noise_multiplier: float) -> dp_accounting.GaussianDpEvent:
        z = check_real("noise_multiplier", noise_multiplier, low=0.0, allow_inf=True)
        return dp_accounting.GaussianDpEvent(z)


@dataclass(frozen=True)
class PoissonSampler(ClientSampler):
    """Each client joins a round independently with probability q/m."""

    kind = "poisson"

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        mask = rng.random(self.num_clients) < self.rate
        return np.flatnonzero(mask)

    def event(self, noise_multiplier: float) -> dp_accounting.DpEvent:
        gauss = self._gaussian(noise_multiplier)
        if self.clients_per_round == self.num_clients:
            return gauss
        return dp_accounting.PoissonSampledDpEvent(self.rate, gauss)


@dataclass(frozen=True)
class FixedSizeSampler(ClientSampler):
    """Exactly q of the m clients, uniformly without replacement."""

    kind = "fixed"

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        return np.sort(rng.choice(self.num_clients, size=self.clients_per_round, replace=False))

    def event(self, noise_multiplier: float) -> dp_accounting.DpEvent:
        gauss = self._gaussian(noise_multiplier)
        if self.clients_per_round == self.num_clients:
            return gauss
        return dp_accounting.SampledWithoutReplacementDpEvent(
            self.num_clients, self.clients_per_round, gauss
        )


@dataclass(frozen=True)
class FullParticipation(ClientSampler):
    """Every client, every round (q = m): the plain Gaussian mechanism."""

    kind = "all"

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        return np.arange(self.num_clients)

    def event(self, noise_multiplier: float) -> dp_accounting.DpEvent:
        return self._gaussian(noise_multiplier)


def make_sampler(
    kind: str, num_clients: int, clients_per_round: int | None = None
) -> ClientSampler:
    """Build a sampler by name: ``"poisson"``, ``"fixed"`` or ``"all"``.

    ``clients_per_round`` defaults to ``num_clients``; for ``"all"`` it must equal it.
    """
    check_choice("sampling", kind, SAMPLING_KINDS)
    m = check_int("num_clients", num_clients, low=1)
    q = (
        m
        if clients_per_round is None
        else check_int("clients_per_round", clients_per_round, low=1, high=m)
    )
    if kind == "all":
        if q != m:
            raise InvalidParameterError(
                "The 'clients_per_round' parameter must equal num_clients="
                f"{m} with sampling='all'; got {q}."
            )
        return FullParticipation(m, m)
    if kind == "poisson":
        return PoissonSampler(m, q)
    return FixedSizeSampler(m, q)
