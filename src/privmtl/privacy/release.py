r"""The server release of the federated family: clip every update, average over a fixed q, add noise.

:class:`GaussianMeanRelease` is the one place where a PMTL-family curator turns client messages
into something that leaves it. For ``K`` sampled clients with messages :math:`g_k` it releases

.. math:: \frac{1}{q}\sum_{k=1}^{K} g_k \min\Bigl(1, \frac{\gamma}{\lVert g_k\rVert_2}\Bigr)
          + N(0, \sigma^2 I),

with the *fixed* divisor ``q`` (``clients_per_round`` of the sampler, never the realised Poisson
count), so that adding or removing one client moves the mean by at most :math:`\gamma/q`. The
noise multiplier handed to the accountant is therefore

.. math:: z = \sigma q / \gamma,

and the privacy event of one release is the sampler's own event for ``z``
(:meth:`ClientSampler.event`): the sampling performed is the sampling accounted. The order inside
:meth:`GaussianMeanRelease.release` is the write-ahead order: clip → mean → noise → ledger record
(on disk when the ledger is durable) → return; the caller publishes only what was returned.

Two options change what is released, not the sensitivity argument:

* **Random subspace** (``subspace_dim = k``): the release is
  :math:`P_t^\top(P_t \bar g + N(0, \sigma^2 I_k))` where :math:`\bar g` is the clipped mean
  above and :math:`P_t` selects ``k`` of the ``d`` coordinates, drawn afresh every round from the
  *public* generator ``default_rng([subspace_seed, round])`` (it depends on no data). Clipping
  comes first and :math:`P_t` has orthonormal rows, so :math:`\lVert P_t g\rVert \le
  \lVert g\rVert \le \gamma`: the sensitivity of the projected mean is still γ/q and the
  privacy event is exactly that of the full release (noise only in ``k`` coordinates, norm
  :math:`\sigma\sqrt k` instead of :math:`\sigma\sqrt d`). Clipping after the projection would
  also be correct, but at the same γ it is a larger clip on the full vector (the projected norm is
  about :math:`\sqrt{k/d}` of the full one); clipping first keeps γ comparable across ``k``.
  A random subspace shrinks the signal too (by about :math:`\sqrt{k/d}` unless the mean
  concentrates on few coordinates), so the per-round signal-to-noise ratio is unchanged in
  expectation; the release details report both norms.
* **Noisy count for adaptive clipping** (``count_noise_std = σ_b``; Andrew et al. 2021): with the
  mean, the curator releases :math:`\tilde b = \frac1q\bigl(\sum_k (b_k - \tfrac12) +
  N(0, \sigma_b^2)\bigr) + \tfrac12` with :math:`b_k = [\lVert g_k\rVert \le \gamma]`, the
  fraction of unclipped messages (:class:`AdaptiveClip` turns it into the next round's clip).
  The centred bit moves the sum by at most 1/2 when one client is added or removed, so the count
  is a Gaussian mechanism with multiplier :math:`z_b = 2\sigma_b`, on the *same* Poisson sample
  as the mean. Mean and count together are one Gaussian mechanism on the pair with multiplier
  :math:`z_\Delta = (z^{-2} + z_b^{-2})^{-1/2}` (the privacy loss of independent Gaussian noise
  on two outputs depends only on the sensitivity vector scaled by the noise, whose norm is
  :math:`(z^{-2}+z_b^{-2})^{1/2}`), and the round's event is the sampler's event for
  :math:`z_\Delta`, recorded once per round with both parts in its parameters. Recording the
  count as a *second* Poisson-sampled event would undercount: both releases see the same
  sample, and amplification by sampling of a composed mechanism is weaker than the composition of
  two independently amplified ones. Under replace-one both sensitivities double (2γ/q and 1),
  so :math:`z_\Delta` is the same and the accountant applies the relation as for the mean alone.

**Banded noise** (``strategy``, a :class:`~privmtl.privacy.matrix_factorization.BandedStrategy`
:math:`C` of the run's ``T`` rounds): round ``t``'s mean gets :math:`w_t = (C^{-1}z)_t` instead of
fresh noise (:class:`BandedMeanNoise`, one
:class:`~privmtl.privacy.matrix_factorization.BandedNoise` per parameter tensor), so that the
billboard, the prefix sum of the releases, carries the factorization's noise. The whole run is
then ONE Gaussian mechanism (:meth:`GaussianMeanRelease.run_event`: multiplier
:math:`\sigma/(\frac{\gamma}{q}\,\mathrm{sens}(C))` with the sensitivity of the sampler's
participation pattern, every client or cyclic groups); it is recorded before the first round,
and each round's release is recorded as part of it (a :class:`~dp_accounting.NoOpDpEvent`, whose
``params`` say so). Other samplers, a random subspace and adaptive clipping's count are refused
with it.

The norm is taken over all parameters of a message jointly. A *block* release
(:meth:`GaussianMeanRelease.release_blocks`, joint-model DP) puts each client's clipped message in
its own block of an ``m``-block vector and adds noise to every block; with ``divisor = 1`` its
noise multiplier is again :math:`z = \sigma/\gamma`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from dp_accounting import dp_event as dpe

from privmtl._validation import check_int, check_real
from privmtl.exceptions import InvalidParameterError
from privmtl.privacy.calibration import (
    PrivacyTarget,
    ReleaseCalibration,
    calibrate_release,
    combined_noise_multiplier,
    count_noise_multiplier,
    mean_multiplier_for,
    noise_multiplier,
    noise_std_for,
)
from privmtl.privacy.curator import ReleaseCurator
from privmtl.privacy.ledger import PrivacyLedger
from privmtl.privacy.matrix_factorization import (
    BandedNoise,
    BandedStrategy,
    CyclicParticipation,
    banded_event,
    banded_noise_std,
)
from privmtl.privacy.noise import NoiseSource
from privmtl.privacy.sampling import ClientSampler

__all__ = [
    "BANDED_ROUND_MECHANISM",
    "BANDED_RUN_MECHANISM",
    "AdaptiveClip",
    "BandedMeanNoise",
    "GaussianMeanRelease",
    "MeanReleasePlan",
    "Release",
    "banded_groups",
    "billboard_carries_signal",
    "billboard_noise_and_bound",
    "clip_factors",
    "clipped_mean",
    "combined_noise_multiplier",
    "count_noise_multiplier",
    "drop_nonfinite",
    "mean_multiplier_for",
    "noise_multiplier",
    "noise_std_for",
    "plan_mean_release",
    "signal_noise",
    "update_norms",
]


Params = dict[str, torch.Tensor]

#: The ledger's ``mechanism`` of a banded run's one event, and of each of its rounds' releases.
BANDED_RUN_MECHANISM = "banded-mf"
BANDED_ROUND_MECHANISM = "banded-mf-round"


def banded_groups(sampler: ClientSampler) -> int:
    """The participation groups of a sampler that banded noise can account: 1 for ``"all"``,
    ``groups`` for ``"cyclic"``; any other sampler is refused."""
    kind = getattr(sampler, "kind", None)
    if kind == "all":
        return 1
    if kind == "cyclic":
        return int(sampler.groups)  # type: ignore[attr-defined]
    raise InvalidParameterError(
        "The 'noise_mechanism' parameter 'banded' needs the 'sampling' parameter 'all' or "
        f"'cyclic' (a participation pattern it can account exactly); got sampling={kind!r}."
    )


class BandedMeanNoise:
    """The mutable noise state of a banded release: one
    :class:`~privmtl.privacy.matrix_factorization.BandedNoise` per parameter tensor (its shape),
    created at the first round and fed by the run's noise source, in the parameters' order.

    Parameters
    ----------
    strategy : BandedStrategy
    noise_std : float
        σ of the strategy's :math:`z`.
    noise : NoiseSource
    """

    def __init__(self, strategy: BandedStrategy, noise_std: float, noise: NoiseSource) -> None:
        self.strategy, self.noise_std, self.noise = strategy, noise_std, noise
        self.noises: dict[str, BandedNoise] = {}
        self.round = 0

    def draw(self, mean: Params, round: int | None) -> Params:
        """Round ``round``'s noise for every tensor of ``mean`` (rounds in order, from 0)."""
        if round is not None and int(round) != self.round:
            raise InvalidParameterError(
                f"Banded noise is drawn round after round; the next round is {self.round}, "
                f"got round={round}."
            )
        out = {}
        for n, t in mean.items():
            if n not in self.noises:
                self.noises[n] = BandedNoise(
                    self.strategy, self.noise_std, self.noise, tuple(t.shape)
                )
            w = self.noises[n].next()
            out[n] = torch.as_tensor(w, dtype=t.dtype).to(t.device)
        self.round += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        """The round and every tensor's past noise (secret: checkpointed with seeded noise only)."""
        return {"round": self.round, "noises": {n: b.state_dict() for n, b in self.noises.items()}}

    def load_state_dict(self, state: dict[str, Any], template: Params) -> None:
        """Restore :meth:`state_dict` output; ``template`` gives the tensors' shapes."""
        self.round = int(state["round"])
        self.noises = {}
        for n, st in state["noises"].items():
            b = BandedNoise(self.strategy, self.noise_std, self.noise, tuple(template[n].shape))
            b.load_state_dict(st)
            self.noises[n] = b


def update_norms(updates: Params) -> torch.Tensor:
    """ℓ2 norm over all parameters of every row ``k`` of stacked ``(K, ...)`` updates (float64)."""
    sq = sum(t.double().flatten(1).pow(2).sum(1) for t in updates.values())
    return torch.as_tensor(sq).sqrt()


def clip_factors(norms: torch.Tensor, clip: float | None) -> torch.Tensor:
    """``min(1, γ / ‖g_k‖)`` per row (1 for a zero update, or for every row when ``clip`` is None).

    A row whose norm is not finite (a client whose local training diverged) gets factor 0: with
    :func:`drop_nonfinite` it contributes nothing, still a message of norm at most γ, so the
    sensitivity is unchanged and one diverged client cannot turn the release into NaN.
    """
    ones = torch.ones_like(norms)
    if clip is None:
        factors = ones
    else:
        factors = torch.where(norms > clip, clip / norms.clamp_min(1e-30), ones)
    return torch.where(torch.isfinite(norms), factors, torch.zeros_like(norms))


def drop_nonfinite(updates: Params, norms: torch.Tensor) -> Params:
    """``updates`` with every row of non-finite norm set to zero (``0 * nan`` is still NaN)."""
    finite = torch.isfinite(norms)
    if bool(finite.all()):
        return updates
    return {
        n: torch.where(finite.view(-1, *([1] * (t.ndim - 1))), t, torch.zeros_like(t))
        for n, t in updates.items()
    }


def _norm(params: Params) -> float:
    return float(sum(t.double().pow(2).sum() for t in params.values()) ** 0.5)


def signal_noise(mean: Params, draws: Params | None) -> dict[str, Any]:
    """Curator-side diagnostics of one release: ``signal_norm`` ‖mean of clipped messages‖,
    ``noise_norm`` ‖noise drawn‖ (0 without noise) and ``released_dim`` (coordinates noised).

    The signal norm is computed from the un-noised mean: it is *not* covered by the privacy
    guarantee and stays in the curator's history (a simulation diagnostic, like the per-client
    update norms).
    """
    return {
        "signal_norm": _norm(mean),
        "noise_norm": 0.0 if draws is None else _norm(draws),
        "released_dim": int(sum(t.numel() for t in mean.values())),
    }


def clipped_mean(
    updates: Params, clip: float | None, divisor: float, template: Params | None = None
) -> tuple[Params, np.ndarray, np.ndarray]:
    """Clip every row of stacked ``(K, ...)`` messages to ``clip`` and sum over ``divisor``.

    Returns the clipped mean (zeros like ``template`` when ``K = 0``), the norms before
    clipping and a boolean "was clipped" per row.
    """
    first = next(iter(updates.values()))
    if first.shape[0] == 0:
        if template is None:
            raise InvalidParameterError("A mean of no messages needs a 'template'.")
        zeros = {n: torch.zeros_like(p) for n, p in template.items()}
        return zeros, np.zeros(0), np.zeros(0, dtype=bool)
    norms = update_norms(updates)
    factors = clip_factors(norms, clip)
    updates = drop_nonfinite(updates, norms)
    mean = {
        n: torch.tensordot(factors.to(t.dtype), t, dims=1) / divisor for n, t in updates.items()
    }
    return mean, norms.cpu().numpy(), (factors < 1).cpu().numpy()


def billboard_carries_signal(
    noise_std: float, clip: float | None, released_dim: int, releases: int = 1
) -> bool:
    r"""Whether the billboard is worth starting from (``personal_init="auto"``: one release;
    ``finetune="auto"`` of :func:`~privmtl.experiments.pmtl.run_pmtl`: the ``T`` releases of a run).

    True when the norm of the noise that ``n = releases`` releases add up to,
    :math:`\sigma\sqrt{kn}` over the ``k`` released coordinates, is at most :math:`n\gamma`, the
    largest norm ``n`` un-noised means of messages clipped to γ can add up to; also without noise
    or clipping. For ``n = 1``: one round's noise at most the clip. Otherwise the noise can exceed
    any signal the billboard carries, and a client is better off without it. The rule reads only
    public parameters of the release (σ, γ, k, n), so it costs no privacy.
    """
    noise, bound = billboard_noise_and_bound(noise_std, clip, released_dim, releases)
    return bound is None or noise == 0.0 or noise <= bound


def billboard_noise_and_bound(
    noise_std: float, clip: float | None, released_dim: int, releases: int = 1
) -> tuple[float, float | None]:
    r"""The two sides of :func:`billboard_carries_signal`: the norm :math:`\sigma\sqrt{kn}` of the
    noise ``n`` releases of ``k`` coordinates add up to, and :math:`n\gamma` (None without clip)."""
    noise = noise_std * math.sqrt(released_dim * releases)
    return noise, None if clip is None else releases * clip


@dataclass
class Release:
    """What one release produced: the released ``value`` and what the curator may log about it.

    ``norms`` are the message norms before clipping and ``clipped`` whether each was clipped (both
    stay with the curator: they are not part of the release); ``epsilon`` is the ledger's ε after
    the release (``inf`` when not private) and ``event`` the recorded privacy event.
    """

    value: Params
    norms: np.ndarray
    clipped: np.ndarray
    epsilon: float
    event: dpe.DpEvent | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MeanReleasePlan:
    """What :func:`plan_mean_release` found: the ``target``, σ of the released mean (of the banded
    strategy's :math:`z` with banded noise) and, with independent noise, the ``calibration``
    (multiplier, event, predicted ε; None with banded noise, whose run is one event)."""

    target: PrivacyTarget
    noise_std: float
    calibration: ReleaseCalibration | None = None


def plan_mean_release(
    target: PrivacyTarget,
    sampler: ClientSampler,
    *,
    rounds: int,
    clip: float,
    divisor: float,
    count_noise_std: float | None = None,
    strategy: BandedStrategy | None = None,
    reserve: dpe.DpEvent | None = None,
) -> MeanReleasePlan:
    """σ of the mean release (clip γ, fixed divisor q) whose ``rounds`` releases meet ``target``.

    The one place the federated family turns a target into noise: independent noise through
    :func:`~privmtl.privacy.calibration.calibrate_release` (``reserve``, a later release of the
    run, composed in; ``count_noise_std``, adaptive clipping's count), banded noise
    (``strategy``) through :func:`~privmtl.privacy.matrix_factorization.banded_noise_std` with
    bound γ/q. The release (:meth:`GaussianMeanRelease.for_target`) and every caller that needs
    σ before a run (a plan, ``privmtl account``) ask it with the same target object.
    """
    if not isinstance(target, PrivacyTarget):
        raise InvalidParameterError(
            f"The 'target' parameter must be a PrivacyTarget; got {type(target).__name__}."
        )
    if strategy is not None:
        if reserve is not None:  # the run's one event is charged whole, before round 1
            raise InvalidParameterError("Banded noise takes no 'reserve'; got one.")
        sigma = banded_noise_std(
            strategy,
            CyclicParticipation(banded_groups(sampler)),
            target_epsilon=target.epsilon,
            delta=target.delta,
            bound=clip / divisor,
            accountant=target.accountant,
            relation=target.relation,
        )
        return MeanReleasePlan(target, sigma)
    cal = calibrate_release(
        target, sampler, rounds=rounds, clip=clip, divisor=divisor,
        count_noise_std=count_noise_std, reserve=reserve,
    )  # fmt: skip
    return MeanReleasePlan(target, cal.noise_std, cal)


@dataclass(frozen=True)
class GaussianMeanRelease:
    """Clipped mean of client messages over a fixed divisor plus Gaussian noise (module docstring).

    Parameters
    ----------
    clip : float or None
        γ. ``None`` disables clipping (the release is then not private, whatever the noise).
    noise_std : float
        σ: standard deviation of the noise on the released mean.
    sampler : ClientSampler
        Draws the clients and names the privacy event of one release.
    divisor : float, optional
        The fixed divisor (default ``sampler.clients_per_round``, i.e. q); ``1`` for block
        releases.
    subspace_dim : int, optional
        ``k``: release the mean in a public random subspace of ``k`` coordinates, fresh every
        round (module docstring); None: all coordinates. Mean releases only.
    subspace_seed : int, default 0
        Public seed of the subspaces (``default_rng([subspace_seed, round])``).
    count_noise_std : float, optional
        σ_b: also release the noisy fraction of unclipped messages (adaptive clipping, module
        docstring), accounted jointly with the mean. None: no count. Mean releases only.
    strategy : BandedStrategy, optional
        Banded noise of this strategy over the run's rounds (module docstring); ``noise_std`` is
        then σ of its :math:`z`. Needs a sampler of every client or of cyclic groups. None:
        independent noise.
    target : PrivacyTarget, optional
        The target ``noise_std`` was calibrated to (:meth:`for_target`): recorded with the first
        release (round 0) and with a banded run's one event. None: σ was given.
    """

    clip: float | None
    noise_std: float
    sampler: ClientSampler
    divisor: float | None = None
    subspace_dim: int | None = None
    subspace_seed: int = 0
    count_noise_std: float | None = None
    strategy: BandedStrategy | None = None
    target: PrivacyTarget | None = None

    def __post_init__(self) -> None:
        if self.strategy is not None:
            if not isinstance(self.strategy, BandedStrategy):
                raise InvalidParameterError(
                    "The 'strategy' parameter must be a BandedStrategy or None; got "
                    f"{type(self.strategy).__name__}."
                )
            banded_groups(self.sampler)
            for name in ("subspace_dim", "count_noise_std"):
                if getattr(self, name) is not None:
                    raise InvalidParameterError(
                        f"The '{name}' parameter must be None with banded noise; got "
                        f"{getattr(self, name)!r}."
                    )
        if self.clip is not None:
            check_real("clip", self.clip, low=0.0, closed="neither")
        check_real("noise_std", self.noise_std, low=0.0)
        if self.divisor is not None:
            check_real("divisor", self.divisor, low=0.0, closed="neither")
        if self.subspace_dim is not None:
            check_int("subspace_dim", self.subspace_dim, low=1)
        if self.count_noise_std is not None:
            check_real("count_noise_std", self.count_noise_std, low=0.0, closed="neither")
        if self.target is not None and not isinstance(self.target, PrivacyTarget):
            raise InvalidParameterError(
                "The 'target' parameter must be a PrivacyTarget or None; got "
                f"{type(self.target).__name__}."
            )

    @classmethod
    def for_target(
        cls,
        target: PrivacyTarget,
        sampler: ClientSampler,
        *,
        rounds: int,
        clip: float,
        divisor: float | None = None,
        subspace_dim: int | None = None,
        subspace_seed: int = 0,
        count_noise_std: float | None = None,
        strategy: BandedStrategy | None = None,
        reserve: dpe.DpEvent | None = None,
    ) -> GaussianMeanRelease:
        """The release of ``rounds`` rounds calibrated to ``target`` (:func:`plan_mean_release`):
        it carries the target, which the ledger records with its first release."""
        q = float(sampler.clients_per_round if divisor is None else divisor)
        plan = plan_mean_release(
            target, sampler, rounds=rounds, clip=clip, divisor=q,
            count_noise_std=count_noise_std, strategy=strategy, reserve=reserve,
        )  # fmt: skip
        return cls(
            clip, plan.noise_std, sampler, divisor, subspace_dim, subspace_seed,
            count_noise_std, strategy, target,
        )  # fmt: skip

    @property
    def q(self) -> float:
        """The fixed divisor of the sum of clipped messages."""
        return float(self.sampler.clients_per_round if self.divisor is None else self.divisor)

    @property
    def private(self) -> bool:
        """True when the release is a Gaussian mechanism (finite clip and positive noise)."""
        return self.clip is not None and self.noise_std > 0

    @property
    def noise_multiplier(self) -> float | None:
        """:math:`z = \\sigma q/\\gamma` (None when not private): noise std over sensitivity."""
        if not self.private:
            return None
        assert self.clip is not None
        return noise_multiplier(self.noise_std, self.q, self.clip)

    @property
    def event_multiplier(self) -> float | None:
        r"""The multiplier of the round's event: :math:`z`, or :math:`z_\Delta` with the count."""
        z = self.noise_multiplier
        if z is None or self.count_noise_std is None:
            return z
        return combined_noise_multiplier(z, count_noise_multiplier(self.count_noise_std))

    def event(self, round: int | None = None) -> dpe.DpEvent | None:
        """The dp-accounting event of one release, of round ``round`` when given (None when not
        private); with banded noise a :class:`~dp_accounting.NoOpDpEvent`: the round is part of
        :meth:`run_event`."""
        z = self.event_multiplier
        if z is None:
            return None
        if self.strategy is not None:
            return dpe.NoOpDpEvent()
        at = getattr(self.sampler, "event_at", None)  # a sampler of event() alone: every round's
        return self.sampler.event(z) if round is None or at is None else at(z, round)

    @property
    def participation(self) -> CyclicParticipation:
        """The participation pattern banded noise is accounted for (every client, or cyclic)."""
        return CyclicParticipation(banded_groups(self.sampler))

    def run_event(self) -> dpe.DpEvent | None:
        """The one event of a banded run (None with independent noise or when not private):
        :func:`~privmtl.privacy.matrix_factorization.banded_event` with bound γ/q."""
        if self.strategy is None or not self.private:
            return None
        assert self.clip is not None
        return banded_event(
            self.strategy, self.noise_std, self.participation, bound=self.clip / self.q
        )

    def run_params(self) -> dict[str, Any]:
        """What the ledger records with :meth:`run_event`: the release's parameters, the
        participation, the sensitivity of the released means and the strategy itself."""
        assert self.strategy is not None and self.clip is not None
        sens = self.strategy.sensitivity(self.participation)
        return {
            **self.params(),
            "groups": self.participation.groups,
            "rounds": self.strategy.rounds,
            "bands": self.strategy.bands,
            "sensitivity": sens * self.clip / self.q,
            "run_noise_multiplier": self.noise_std / (sens * self.clip / self.q),
            "strategy": self.strategy.to_dict(),
            **({} if self.target is None else {"target": self.target.to_dict()}),
        }

    def params(self) -> dict[str, Any]:
        """The release's parameters as a ledger entry records them."""
        return {
            "clip": self.clip,
            "noise_std": self.noise_std,
            "divisor": self.q,
            "noise_multiplier": self.noise_multiplier,
            "sampling": getattr(self.sampler, "kind", None),
            "num_clients": getattr(self.sampler, "num_clients", None),
            "clients_per_round": getattr(self.sampler, "clients_per_round", None),
            **({"subspace_dim": self.subspace_dim} if self.subspace_dim is not None else {}),
            **(
                {
                    "count_noise_std": self.count_noise_std,
                    "count_noise_multiplier": count_noise_multiplier(self.count_noise_std),
                    "combined_noise_multiplier": self.event_multiplier,
                }
                if self.count_noise_std is not None
                else {}
            ),
            **(
                {"groups": self.sampler.groups}  # type: ignore[attr-defined]
                if getattr(self.sampler, "kind", None) == "cyclic"
                else {}
            ),
            **({"noise_mechanism": "banded"} if self.strategy is not None else {}),
        }

    def subspace(self, round: int | None, dim: int) -> np.ndarray:
        """The sorted coordinates (of the flattened message) released in ``round``."""
        if self.subspace_dim is None:
            return np.arange(dim)
        if round is None:
            raise InvalidParameterError("A subspace release needs its 'round' index.")
        if self.subspace_dim > dim:
            raise InvalidParameterError(
                f"The 'subspace_dim' parameter must be at most the released dimension {dim}; "
                f"got {self.subspace_dim}."
            )
        rng = np.random.default_rng([self.subspace_seed, int(round)])
        return np.sort(rng.choice(dim, size=self.subspace_dim, replace=False))

    # ------------------------------------------------------------------------------- pieces
    def aggregate(
        self, updates: Params, template: Params | None = None
    ) -> tuple[Params, np.ndarray, np.ndarray]:
        """:func:`clipped_mean` with this release's clip and divisor."""
        return clipped_mean(updates, self.clip, self.q, template)

    def _record(
        self, ledger: Any, round: int | None, release_id: str | None, replay_ok: bool, kind: str
    ) -> tuple[float, dpe.DpEvent | None]:
        event = self.event(round)
        if event is None or ledger is None:
            return (float("inf") if event is None else float("nan")), event
        params = self.params()
        if self.target is not None and round == 0 and self.strategy is None:
            params["target"] = self.target.to_dict()  # the first release: what σ was meant for
        if isinstance(ledger, ReleaseCurator):  # the curator's gate: its ids and replay policy
            assert release_id is not None
            eps = ledger.record(
                event, release_id=release_id, round=round, mechanism=kind, params=params
            )
            return eps, event

        if not isinstance(ledger, PrivacyLedger):  # a stand-in with record(event, round=...)
            return float(ledger.record(event, round=round)), event
        eps = ledger.record(
            event,
            round=round,
            mechanism=kind,
            params=params,
            release_id=release_id,
            replay_ok=replay_ok,
        )
        return float(eps), event

    # ------------------------------------------------------------------------------- releases
    def release(
        self,
        updates: Params,
        noise: NoiseSource,
        *,
        template: Params | None = None,
        ledger: Any = None,
        round: int | None = None,
        release_id: str | None = None,
        replay_ok: bool = False,
        banded: BandedMeanNoise | None = None,
    ) -> Release:
        """Clip → mean over the fixed divisor → noise → ledger record → the released mean.

        ``updates`` are stacked ``(K, ...)`` messages (``K`` may be 0; then ``template`` gives the
        shapes). Noise is drawn from ``noise`` only when σ > 0, one tensor per parameter in
        ``updates`` order. The ledger (when given and the release is private) records the
        sampler's event before this method returns; ``replay_ok`` is passed on to
        :meth:`~privmtl.privacy.ledger.PrivacyLedger.record` (seeded replays after resume).
        ``ledger`` may also be a :class:`~privmtl.privacy.curator.ReleaseCurator`: the event is
        then recorded through its gate (:meth:`~privmtl.privacy.curator.ReleaseCurator.record`,
        its replay policy instead of ``replay_ok``). ``banded`` holds the noise state of a banded
        release (required with ``strategy``; the caller records :meth:`run_event` first).
        """
        mean, norms, clipped = self.aggregate(updates, template)
        value, details = self._noised(mean, noise, round, banded)
        kind = "gaussian-mean" if self.strategy is None else BANDED_ROUND_MECHANISM
        if self.count_noise_std is not None:
            details.update(self._count_release(norms, noise))
            kind = "gaussian-mean+count"
        details["clip"] = self.clip
        eps, event = self._record(ledger, round, release_id, replay_ok, kind)
        return Release(value, norms, clipped, eps, event, details)

    def _noised(
        self,
        mean: Params,
        noise: NoiseSource,
        round: int | None,
        banded: BandedMeanNoise | None = None,
    ) -> tuple[Params, dict[str, Any]]:
        if self.strategy is not None and self.noise_std > 0:
            if banded is None:
                raise InvalidParameterError(
                    "A banded release needs its noise state ('banded', a BandedMeanNoise)."
                )
            banded_draws = banded.draw(mean, round)
            value = {n: mean[n] + banded_draws[n] for n in mean}
            return value, signal_noise(mean, banded_draws)
        if self.subspace_dim is not None:
            return self._subspace_release(mean, noise, round)
        draws = noise.normal_like(mean, self.noise_std) if self.noise_std > 0 else None
        value = mean if draws is None else {n: mean[n] + draws[n] for n in mean}
        return value, signal_noise(mean, draws)

    def _subspace_release(
        self, mean: Params, noise: NoiseSource, round: int | None
    ) -> tuple[Params, dict[str, Any]]:
        flat = torch.cat([t.flatten() for t in mean.values()])
        idx = torch.from_numpy(self.subspace(round, flat.numel())).to(flat.device)
        part = flat.index_select(0, idx)
        draws = None
        if self.noise_std > 0:
            draws = noise.normal_like({"subspace": part}, self.noise_std)
            part = part + draws["subspace"]
        out = torch.zeros_like(flat)
        out[idx] = part
        value, start = {}, 0
        for n, t in mean.items():
            value[n] = out[start : start + t.numel()].view_as(t)
            start += t.numel()
        details = signal_noise({"subspace": flat.index_select(0, idx)}, draws)
        details["full_signal_norm"] = float(flat.double().norm())
        return value, details

    def _count_release(self, norms: np.ndarray, noise: NoiseSource) -> dict[str, Any]:
        assert self.count_noise_std is not None and self.clip is not None
        centred = float(np.sum((norms <= self.clip) - 0.5)) if len(norms) else 0.0
        draw = float(noise.normal((1,), self.count_noise_std, dtype=torch.float64)[0])
        return {"unclipped_fraction": (centred + draw) / self.q + 0.5}

    def release_sum(
        self,
        total: Params,
        noise: NoiseSource,
        *,
        ledger: Any = None,
        round: int | None = None,
        release_id: str | None = None,
        replay_ok: bool = False,
        banded: BandedMeanNoise | None = None,
    ) -> Release:
        """Mean over the fixed divisor → noise → ledger record, from a sum clipped elsewhere.

        ``total`` is the sum of the round's messages, each already clipped to ℓ2 norm at most
        γ by whoever computed the sum (client-side clipping under secure aggregation: the curator
        never sees a single message). Everything else is :meth:`release`: the same divisor,
        noise draws, privacy event and ledger entry, so the accounting is that of
        :meth:`release` exactly when the clipping holds. ``norms`` and ``clipped`` of the result
        are empty (unknown to the curator). Adaptive clipping needs every message's norm and is
        refused.
        """
        if self.count_noise_std is not None:
            raise InvalidParameterError(
                "Adaptive clipping needs each message's norm, which a release from a sum "
                "(secure aggregation) does not have; got count_noise_std="
                f"{self.count_noise_std}."
            )
        mean = {n: t / self.q for n, t in total.items()}
        value, details = self._noised(mean, noise, round, banded)
        details["clip"] = self.clip
        kind = "gaussian-mean" if self.strategy is None else BANDED_ROUND_MECHANISM
        eps, event = self._record(ledger, round, release_id, replay_ok, kind)
        return Release(value, np.zeros(0), np.zeros(0, dtype=bool), eps, event, details)

    def release_blocks(
        self,
        updates: Params,
        rows: np.ndarray,
        num_blocks: int,
        noise: NoiseSource,
        *,
        ledger: Any = None,
        round: int | None = None,
        release_id: str | None = None,
        replay_ok: bool = False,
    ) -> Release:
        """Block release: row ``j`` of the clipped messages lands in block ``rows[j]`` of an
        ``(num_blocks, ...)`` vector (divided by the divisor), and every block gets noise."""
        if self.strategy is not None:
            raise InvalidParameterError(
                "Banded noise releases means; a block release (update='blocks') is refused."
            )
        first = next(iter(updates.values()))
        value = {
            n: torch.zeros((num_blocks, *t.shape[1:]), dtype=t.dtype, device=t.device)
            for n, t in updates.items()
        }
        norms, clipped = np.zeros(0), np.zeros(0, dtype=bool)
        if first.shape[0]:
            nrm = update_norms(updates)
            fac = clip_factors(nrm, self.clip)
            idx = torch.as_tensor(np.asarray(rows, dtype=np.int64), device=first.device)
            for n, t in updates.items():
                shape = (-1,) + (1,) * (t.ndim - 1)
                value[n][idx] = t * fac.to(t.dtype).view(shape) / self.q
            norms, clipped = nrm.cpu().numpy(), (fac < 1).cpu().numpy()
        if self.noise_std > 0:
            draws = noise.normal_like(value, self.noise_std)
            value = {n: value[n] + draws[n] for n in value}
        eps, event = self._record(ledger, round, release_id, replay_ok, "gaussian-blocks")
        return Release(value, norms, clipped, eps, event)


@dataclass(frozen=True)
class AdaptiveClip:
    r"""Geometric update of the clip towards a quantile of the update norms (Andrew et al. 2021).

    After a release with clip :math:`C` whose noisy fraction of unclipped messages is
    :math:`\tilde b` (:class:`GaussianMeanRelease` with ``count_noise_std``), the next clip is
    :math:`C \exp(-\eta_C (\tilde b - \kappa))`: it shrinks while more than the target fraction
    κ of the messages fit, and grows otherwise. It reads released values only (post-processing).

    Parameters
    ----------
    quantile : float in (0, 1)
        κ, the target fraction of unclipped messages.
    lr : float > 0
        :math:`\eta_C` (the paper's default 0.2).
    """

    quantile: float
    lr: float = 0.2

    def __post_init__(self) -> None:
        check_real("adaptive_clip_quantile", self.quantile, low=0.0, high=1.0, closed="neither")
        check_real("adaptive_clip_lr", self.lr, low=0.0, closed="neither")

    def next_clip(self, clip: float, unclipped_fraction: float) -> float:
        """The clip of the next round."""
        return float(clip * np.exp(-self.lr * (unclipped_fraction - self.quantile)))
