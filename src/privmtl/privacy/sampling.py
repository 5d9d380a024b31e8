"""Client sampling that is, by construction, the sampling the accountant assumes.

A sampler both *draws* the clients of a round and *names the privacy event* of one round of the
Gaussian mechanism run on them, so code and accounting cannot drift apart (the PMTL reference code
samples exactly q clients but accounts Poisson sampling; docs/privacy-model.md).

Normalization convention (all schemes): the server divides the sum of clipped updates by the fixed
``clients_per_round`` q — not by the realised number of Poisson-sampled clients — so the add/remove
sensitivity of the released mean is γ/q and the noise multiplier of noise std σ is z = σ·q/γ.

Cyclic participation (:class:`CyclicSampler`) is not random at all: client ``k`` belongs to the
public group ``k mod b`` and round ``t`` takes group ``t mod b``. A client then takes part in at
most ``ceil(T/b)`` of ``T`` rounds and is untouched by the others, so with independent noise the
run composes ``ceil(T/b)`` Gaussian rounds (no amplification): the per-round event
(:meth:`ClientSampler.event_at`) is the Gaussian in the rounds of group 0 (the group with the
most rounds, ``ceil((t+1)/b)`` after round ``t``) and nothing in the others, whose releases are
covered by parallel composition (they touch other clients only). The ledger's ε after round ``t``
is therefore exactly that of the client with the most rounds so far.
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
    "CyclicSampler",
    "FixedSizeSampler",
    "FullParticipation",
    "PoissonSampler",
    "cyclic_group_size",
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

    def sample_at(self, rng: np.random.Generator, round: int) -> np.ndarray:
        """The sorted indices of the clients of round ``round`` (0-based); :meth:`sample` for
        every sampler whose draw does not depend on the round."""
        return self.sample(rng)

    def event_at(self, noise_multiplier: float, round: int) -> dp_accounting.DpEvent:
        """The event recorded for round ``round`` (0-based): :meth:`event` unless the sampler's
        rounds differ (:class:`CyclicSampler`)."""
        return self.event(noise_multiplier)

    def composed_event(self, noise_multiplier: float, rounds: int) -> dp_accounting.DpEvent:
        """The event of ``rounds`` rounds: :meth:`event` composed ``rounds`` times (what the
        ledger's per-round events of :meth:`event_at` compose to)."""
        return dp_accounting.SelfComposedDpEvent(self.event(noise_multiplier), int(rounds))

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


def cyclic_group_size(num_clients: int, groups: int) -> int:
    """The size of the largest of ``groups`` cyclic groups of ``num_clients`` clients,
    ``ceil(m / b)``: the fixed divisor q of a cyclic run's mean."""
    m = check_int("num_clients", num_clients, low=1)
    b = check_int("groups", groups, low=1, high=m)
    return -(-m // b)


@dataclass(frozen=True)
class CyclicSampler(ClientSampler):
    """Clients in ``groups`` public groups (client ``k`` in group ``k mod b``); round ``t`` takes
    group ``t mod b`` (module docstring). ``clients_per_round`` is the largest group's size,
    ``ceil(m / b)``: the divisor of the mean."""

    groups: int = 1

    kind = "cyclic"

    def __post_init__(self) -> None:
        super().__post_init__()
        q = cyclic_group_size(self.num_clients, self.groups)
        if self.clients_per_round != q:
            raise InvalidParameterError(
                "The 'clients_per_round' parameter must be the largest group's size "
                f"ceil(num_clients / groups) = {q} with sampling='cyclic'; got "
                f"{self.clients_per_round}."
            )

    @property
    def rate(self) -> float:
        return 1.0 / self.groups

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        raise InvalidParameterError(
            "A cyclic sampler's clients depend on the round: call sample_at(rng, round)."
        )

    def sample_at(self, rng: np.random.Generator, round: int) -> np.ndarray:
        t = check_int("round", round, low=0)
        return np.arange(t % self.groups, self.num_clients, self.groups)

    def event(self, noise_multiplier: float) -> dp_accounting.DpEvent:
        """One participation of one client: the plain Gaussian (no amplification)."""
        return self._gaussian(noise_multiplier)

    def event_at(self, noise_multiplier: float, round: int) -> dp_accounting.DpEvent:
        gauss = self._gaussian(noise_multiplier)
        if check_int("round", round, low=0) % self.groups == 0:
            return gauss
        return dp_accounting.NoOpDpEvent()

    def composed_event(self, noise_multiplier: float, rounds: int) -> dp_accounting.DpEvent:
        k = -(-check_int("rounds", rounds, low=1) // self.groups)
        return dp_accounting.SelfComposedDpEvent(self._gaussian(noise_multiplier), k)


def make_sampler(
    kind: str,
    num_clients: int,
    clients_per_round: int | None = None,
    *,
    groups: int | None = None,
) -> ClientSampler:
    """Build a sampler by name: ``"poisson"``, ``"fixed"``, ``"all"`` or ``"cyclic"``.

    ``clients_per_round`` defaults to ``num_clients``; for ``"all"`` it must equal it, for
    ``"cyclic"`` it defaults to, and must equal, ``ceil(num_clients / groups)``. ``groups``
    (integer in [1, num_clients]) is required by ``"cyclic"`` and refused (unless 1) by the
    others.
    """
    check_choice("sampling", kind, SAMPLING_KINDS)
    m = check_int("num_clients", num_clients, low=1)
    if kind == "cyclic":
        if groups is None:
            raise InvalidParameterError(
                "The 'groups' parameter is required with sampling='cyclic' (an integer in "
                f"[1, {m}]); got None."
            )
        b = check_int("groups", groups, low=1, high=m)
        q = cyclic_group_size(m, b) if clients_per_round is None else clients_per_round
        return CyclicSampler(m, q, b)
    if groups is not None and groups != 1:
        raise InvalidParameterError(
            f"The 'groups' parameter applies to sampling='cyclic' only; got groups={groups!r} "
            f"with sampling={kind!r}."
        )
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
