r"""From a target ε to the noise of a mechanism: every calibration of privmtl, in one place.

A Gaussian mechanism releasing a statistic of add/remove sensitivity Δ with noise std σ has the
noise multiplier :math:`z = \sigma/\Delta`; privacy events carry ``z`` (module
:mod:`privmtl.privacy.accounting`). Calibration runs the other way: it finds the smallest ``z``
whose composed event meets a target (ε, δ) (:func:`calibrate_noise_multiplier`), then turns it
into the σ that a mechanism adds, through the sensitivity of what it releases:

* **the federated mean release** (:class:`~privmtl.privacy.release.GaussianMeanRelease`): the mean
  of messages clipped to γ over the fixed divisor ``q`` has sensitivity γ/q, so
  :math:`z = \sigma q/\gamma` (:func:`noise_multiplier`, :func:`noise_std_for`). A run of ``T``
  rounds is the sampler's event of one round composed ``T`` times (:func:`rounds_event`);
  :func:`calibrate_release` is the one entry point from a :class:`PrivacyTarget` (ε, δ) to the
  mean release's noise: every run that trains to a target ε (``run_pmtl``, the sweep, Flower's
  ServerApp, the clusters) and ``privmtl account`` calibrate through it, and the
  :class:`ReleaseCalibration` it returns carries the target, ``z``, σ, the event and the ε it
  predicts. With adaptive clipping the calibrated multiplier is the joint one of mean and noisy
  count (:func:`mean_multiplier_for`), and the count's σ_b defaults to
  :func:`default_count_noise_std`.
* **the MP-MTL covariance release** (:class:`~privmtl.privacy.covariance.CovarianceSchedule`):
  the upper triangle of :math:`\tilde W\tilde W^\top` of models clipped to ``K`` has sensitivity
  ``K²`` (add/remove) or ``√2·K²`` (replace-one) (:func:`covariance_sensitivity`); the ``T``
  releases get multipliers :math:`z_0/w_t` and :func:`calibrate_covariance_noise` finds
  :math:`z_0`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import dp_accounting
import numpy as np
from dp_accounting import dp_event as dpe

from privmtl._validation import check_choice, check_real
from privmtl.exceptions import InvalidParameterError, PrivacyBudgetError
from privmtl.privacy.accounting import _check, adapt_event, compute_epsilon, make_accountant
from privmtl.privacy.guarantee import (
    ACCOUNTANTS,
    DEFAULT_ACCOUNTANT,
    DEFAULT_RELATION,
    RELATIONS,
)

__all__ = [
    "MAX_TARGET_EPSILON",
    "CovarianceCalibration",
    "GivenNoise",
    "PrivacyTarget",
    "ReleaseCalibration",
    "calibrate_covariance_noise",
    "calibrate_mean_noise_std",
    "calibrate_noise_multiplier",
    "calibrate_release",
    "calibrate_rounds_multiplier",
    "combined_noise_multiplier",
    "count_noise_multiplier",
    "covariance_event",
    "covariance_sensitivity",
    "default_count_noise_std",
    "mean_multiplier_for",
    "noise_multiplier",
    "noise_std_for",
    "rounds_epsilon",
    "rounds_event",
]

MAX_TARGET_EPSILON = 100.0
"""Largest target ε that noise calibration accepts.

ε bounds by ``e^ε`` how much more likely any output becomes when one client's (task's) data is
added or removed; ``e^100 ≈ 2.7e43`` rules out nothing an attacker could observe, while the noise
calibrated for such a target would still make a run look protected. Larger targets are refused
with this explanation; a run without a target ε (no noise) is the honest non-private baseline.
"""

#: Smallest noise multiplier calibration searches; looser targets get this much noise.
_MIN_NOISE_MULTIPLIER = 1e-3
_BRACKET_ACCOUNTANT = "rdp"  # brackets PLD's search: cheap, and never tighter than PLD

#: Adaptive clipping's default σ_b is the clients per round over this (Andrew et al. 2021).
COUNT_NOISE_DIVISOR = 20.0


@dataclass(frozen=True)
class PrivacyTarget:
    """The privacy a run is calibrated to: (ε, δ), the accountant and neighbouring relation ε
    is computed with, and the sampling its releases are charged under.

    The one object that carries a target ε from the run's settings to the release that meets it
    (:class:`~privmtl.privacy.release.GaussianMeanRelease`, MP-MTL's covariance releases): the
    release calibrates its noise to it (:func:`calibrate_release`) and the ledger records it, so
    that the ε reported can be read against the ε asked for. Serialized with :meth:`to_dict` and
    read back with :meth:`from_dict`.

    Parameters
    ----------
    epsilon : float
        Target ε, in (0, :data:`MAX_TARGET_EPSILON`].
    delta : float
        δ in (0, 1) at which ε is stated.
    accountant : {"rdp", "pld"}, default :data:`~privmtl.privacy.guarantee.DEFAULT_ACCOUNTANT`
    relation : {"add-remove", "replace-one"}, default :data:`~privmtl.privacy.guarantee.DEFAULT_RELATION`
    sampling : str or None
        The client sampling the releases are charged under (``"poisson"``, ``"fixed"``,
        ``"all"``, ``"cyclic"``; the sampler's ``kind``), None where the release samples no
        clients (MP-MTL's covariance releases see every task).
    """

    epsilon: float
    delta: float
    accountant: str = DEFAULT_ACCOUNTANT
    relation: str = DEFAULT_RELATION
    sampling: str | None = None

    def __post_init__(self) -> None:
        eps = check_real("target_epsilon", self.epsilon, low=0.0, closed="neither")
        if eps > MAX_TARGET_EPSILON:
            raise InvalidParameterError(
                f"The target epsilon must be at most {MAX_TARGET_EPSILON:g}; got {eps:g}. "
                f"e^epsilon bounds how much one client's data may change the odds of any output, "
                f"and e^{MAX_TARGET_EPSILON:g} protects nothing; for a non-private run give no "
                "epsilon."
            )
        object.__setattr__(self, "epsilon", eps)
        dlt = check_real("delta", self.delta, low=0.0, high=1.0, closed="neither")
        object.__setattr__(self, "delta", dlt)
        check_choice("accountant", self.accountant, ACCOUNTANTS)
        check_choice("relation", self.relation, RELATIONS)
        if self.sampling is not None and not isinstance(self.sampling, str):
            raise InvalidParameterError(
                f"The 'sampling' parameter must be a str or None; got {self.sampling!r}."
            )

    def to_dict(self) -> dict[str, Any]:
        """The target by name (JSON-ready): what the ledger records with the first release."""
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "accountant": self.accountant,
            "relation": self.relation,
            "sampling": self.sampling,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrivacyTarget:
        """The target :meth:`to_dict` wrote (a record with only ε and δ takes the defaults)."""
        return cls(
            float(data["epsilon"]),
            float(data["delta"]),
            accountant=data.get("accountant", DEFAULT_ACCOUNTANT),
            relation=data.get("relation", DEFAULT_RELATION),
            sampling=data.get("sampling"),
        )


@dataclass(frozen=True)
class GivenNoise:
    """The other way a run sets its privacy: the noise σ of the release given by the user, no
    target ε (the release adds it as it is; the ledger reports the ε it gives).

    Parameters
    ----------
    noise_std : float
        σ ≥ 0 of the released mean (0: no noise, not private).
    """

    noise_std: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise_std", check_real("noise_std", self.noise_std, low=0.0))

    def to_dict(self) -> dict[str, Any]:
        return {"noise_std": self.noise_std}


# ------------------------------------------------------------------------------- the search
def calibrate_noise_multiplier(
    event_fn: Callable[[float], dpe.DpEvent],
    *,
    target_epsilon: float,
    delta: float,
    accountant: str = DEFAULT_ACCOUNTANT,
    relation: str = DEFAULT_RELATION,
    rtol: float = 1e-4,
) -> float:
    """Smallest noise multiplier z (within ``rtol``) with ε(event_fn(z)) ≤ ``target_epsilon``.

    Uses :func:`dp_accounting.calibrate_dp_mechanism` (Brent's method) and then checks the result:
    the returned z always satisfies the target (it is nudged up if the search ended a hair below).
    """
    target = PrivacyTarget(target_epsilon, delta).epsilon
    _check(accountant, relation)

    def make_event(z: float) -> dpe.DpEvent:
        return adapt_event(event_fn(z), accountant=accountant, relation=relation)

    def eps_of(z: float) -> float:
        return compute_epsilon(event_fn(z), delta=delta, accountant=accountant, relation=relation)

    if accountant == "rdp":
        bracket: Any = dp_accounting.LowerEndpointAndGuess(_MIN_NOISE_MULTIPLIER, 1.0)
        tol = 1e-9
    else:
        # PLD is expensive at tiny noise (huge privacy-loss grids): bracket it with RDP, which is
        # cheap and never tighter than PLD.
        try:
            z_hi = calibrate_noise_multiplier(
                event_fn,
                target_epsilon=target,
                delta=delta,
                accountant=_BRACKET_ACCOUNTANT,
                relation=relation,
            )
        except InvalidParameterError:
            z_hi = 2.5 * calibrate_noise_multiplier(
                event_fn,
                target_epsilon=target,
                delta=delta,
                accountant=_BRACKET_ACCOUNTANT,
                relation=DEFAULT_RELATION,
            )
        while eps_of(z_hi) > target:
            z_hi *= 1.5
        bracket = dp_accounting.ExplicitBracketInterval(z_hi / 8.0, z_hi)
        tol = rtol * z_hi / 10.0
    if accountant == "rdp" and eps_of(_MIN_NOISE_MULTIPLIER) <= target:
        # The target is so loose that (almost) no noise meets it: return the floor of the search.
        return _MIN_NOISE_MULTIPLIER
    try:
        z = float(
            dp_accounting.calibrate_dp_mechanism(
                lambda: make_accountant(accountant, relation),
                make_event,
                target,
                delta,
                bracket_interval=bracket,
                tol=tol,
            )
        )
    except dp_accounting.mechanism_calibration.NoBracketIntervalFoundError:
        raise PrivacyBudgetError(
            f"No noise multiplier up to 2**30 meets epsilon={target:g} at delta={delta:g} "
            f"({accountant}, {relation}); increase epsilon or delta."
        ) from None
    for _ in range(60):
        if eps_of(z) <= target:
            return z
        z *= 1.0 + rtol
    raise PrivacyBudgetError(  # pragma: no cover - defensive
        f"Could not calibrate a noise multiplier for epsilon={target} at delta={delta}."
    )


def noise_multiplier(noise_std: float, divisor: float, clip: float) -> float:
    """:math:`z = \\sigma q/\\gamma`: the noise std over the add/remove sensitivity γ/q of the mean."""
    return noise_std * divisor / clip


def noise_std_for(multiplier: float, divisor: float, clip: float) -> float:
    """:math:`\\sigma = z\\gamma/q`, the inverse of :func:`noise_multiplier`."""
    return multiplier * clip / divisor


def combined_noise_multiplier(z: float, z_count: float) -> float:
    """:math:`(z^{-2} + z_b^{-2})^{-1/2}`: one Gaussian mechanism releasing mean and count."""
    return float((z**-2 + z_count**-2) ** -0.5)


def default_count_noise_std(clients_per_round: float) -> float:
    """σ_b of adaptive clipping's noisy count when none is given: ``q/20`` (Andrew et al. 2021)."""
    return clients_per_round / COUNT_NOISE_DIVISOR


def count_noise_multiplier(count_noise_std: float) -> float:
    r""":math:`z_b = 2\sigma_b`: the centred bit count has add/remove sensitivity 1/2."""
    return 2.0 * count_noise_std


def mean_multiplier_for(combined: float, count_noise_std: float) -> float:
    r"""The mean's multiplier :math:`z = (z_\Delta^{-2} - (2\sigma_b)^{-2})^{-1/2}` that gives the
    combined multiplier ``combined`` (Andrew et al. 2021); needs :math:`2\sigma_b > z_\Delta`."""
    zb = count_noise_multiplier(count_noise_std)
    if not zb > combined:
        raise InvalidParameterError(
            "The 'adaptive_clip_noise' parameter σ_b must satisfy 2σ_b > z_Δ (the combined noise "
            f"multiplier {combined:.4g} that the budget allows); got σ_b={count_noise_std!r}. "
            "Use more noise on the count, a larger budget or fewer rounds."
        )
    return float((combined**-2 - zb**-2) ** -0.5)


# ------------------------------------------------------------------------- federated mean release
def rounds_event(sampler: Any, multiplier: float, rounds: int) -> dpe.DpEvent:
    """The event of ``rounds`` releases: the sampler's one-round event for ``multiplier``, composed
    (``sampler.composed_event`` when it has one: a cyclic client takes part in ``ceil(T/b)``)."""
    composed = getattr(sampler, "composed_event", None)
    if composed is not None:
        return composed(multiplier, rounds)
    return dpe.SelfComposedDpEvent(sampler.event(multiplier), rounds)


def rounds_epsilon(
    sampler: Any,
    multiplier: float,
    rounds: int,
    *,
    delta: float,
    accountant: str = DEFAULT_ACCOUNTANT,
    relation: str = DEFAULT_RELATION,
) -> float:
    """ε at ``delta`` of :func:`rounds_event` (``sampler``, ``multiplier``, ``rounds``)."""
    return compute_epsilon(
        rounds_event(sampler, multiplier, rounds),
        delta=delta,
        accountant=accountant,
        relation=relation,
    )


def calibrate_rounds_multiplier(
    sampler: Any,
    *,
    rounds: int,
    target_epsilon: float,
    delta: float,
    accountant: str = DEFAULT_ACCOUNTANT,
    relation: str = DEFAULT_RELATION,
    count_noise_std: float | None = None,
) -> float:
    r"""The mean release's noise multiplier ``z`` so that ``rounds`` releases meet
    ``target_epsilon`` at ``delta``: :attr:`ReleaseCalibration.multiplier` of
    :func:`calibrate_release` (whose clip and divisor do not change ``z``)."""
    return calibrate_release(
        PrivacyTarget(target_epsilon, delta),
        sampler,
        rounds=rounds,
        clip=1.0,
        divisor=1.0,
        accountant=accountant,
        relation=relation,
        count_noise_std=count_noise_std,
    ).multiplier


def calibrate_mean_noise_std(
    sampler: Any,
    *,
    rounds: int,
    clip: float,
    divisor: float,
    target_epsilon: float,
    delta: float,
    accountant: str = DEFAULT_ACCOUNTANT,
    relation: str = DEFAULT_RELATION,
    count_noise_std: float | None = None,
) -> float:
    r""":math:`\sigma = z\gamma/q` (γ = ``clip``, q = ``divisor``): :attr:`ReleaseCalibration.noise_std`
    of :func:`calibrate_release`, the noise std of the mean release whose ``rounds`` releases
    meet ``target_epsilon`` at ``delta``."""
    return calibrate_release(
        PrivacyTarget(target_epsilon, delta),
        sampler,
        rounds=rounds,
        clip=clip,
        divisor=divisor,
        accountant=accountant,
        relation=relation,
        count_noise_std=count_noise_std,
    ).noise_std


@dataclass(frozen=True)
class ReleaseCalibration:
    r"""What :func:`calibrate_release` found for a federated mean release.

    Attributes
    ----------
    target : PrivacyTarget
        The (ε, δ) asked for.
    multiplier : float
        ``z`` of the mean (:math:`z = \sigma q/\gamma`, :func:`noise_multiplier`).
    noise_std : float
        σ, the std of the noise on the released mean (:func:`noise_std_for`).
    clip, divisor : float
        γ and the fixed divisor ``q`` σ was scaled by.
    rounds : int
        Releases composed.
    accountant, relation : str
    count_noise_std : float or None
        σ_b of adaptive clipping's count (the event's multiplier is then the joint one,
        :func:`combined_noise_multiplier`); None with a fixed clip.
    event : DpEvent
        The composed event of the ``rounds`` releases (:func:`rounds_event`).
    epsilon : float
        ε of ``event`` at ``target.delta``: what the ledger will report after every round has
        run, never above ``target.epsilon``.
    """

    target: PrivacyTarget
    multiplier: float
    noise_std: float
    clip: float
    divisor: float
    rounds: int
    accountant: str
    relation: str
    count_noise_std: float | None
    event: dpe.DpEvent
    epsilon: float

    def to_dict(self) -> dict[str, Any]:
        """The calibration by name (JSON-ready; the event as its multiplier and rounds)."""
        return {
            "target_epsilon": self.target.epsilon,
            "delta": self.target.delta,
            "noise_multiplier": self.multiplier,
            "noise_std": self.noise_std,
            "clip": self.clip,
            "divisor": self.divisor,
            "rounds": self.rounds,
            "accountant": self.accountant,
            "relation": self.relation,
            "count_noise_std": self.count_noise_std,
            "epsilon": self.epsilon,
        }


def calibrate_release(
    target: PrivacyTarget,
    sampler: Any,
    *,
    rounds: int,
    clip: float,
    divisor: float,
    accountant: str | None = None,
    relation: str | None = None,
    count_noise_std: float | None = None,
    reserve: dpe.DpEvent | None = None,
) -> ReleaseCalibration:
    r"""The noise of the federated mean release that meets ``target`` over ``rounds`` releases.

    The one calibration of the PMTL family: the smallest multiplier whose :func:`rounds_event`
    (the ``sampler``'s one-round event, composed ``rounds`` times) meets ``target`` with
    ``accountant`` and ``relation`` (:func:`calibrate_noise_multiplier`), turned into
    :math:`\sigma = z\gamma/q` (γ = ``clip``, q = ``divisor``). With ``count_noise_std`` σ_b
    (adaptive clipping) the calibrated multiplier is the joint :math:`z_\Delta` of mean and
    count, and the mean's is :math:`(z_\Delta^{-2} - (2\sigma_b)^{-2})^{-1/2}`
    (:func:`mean_multiplier_for`).

    Parameters
    ----------
    target : PrivacyTarget
    sampler : ClientSampler
        The run's client sampler (:func:`~privmtl.privacy.sampling.make_sampler`).
    rounds : int
    clip : float
        γ, the clip of every message.
    divisor : float
        ``q``, the fixed divisor of the mean.
    accountant : {"rdp", "pld"}, optional
        Default: ``target.accountant``.
    relation : {"add-remove", "replace-one"}, optional
        Default: ``target.relation``.
    count_noise_std : float or None
    reserve : DpEvent, optional
        A later release of the same run (e.g. a vote, :meth:`~privmtl.privacy.selection.VotePlan.
        event`): the rounds are calibrated so that they and ``reserve`` compose to ``target``;
        the calibration's ``event`` and ``epsilon`` are then the rounds' own.

    Returns
    -------
    ReleaseCalibration
    """
    if not isinstance(target, PrivacyTarget):
        raise InvalidParameterError(
            f"The 'target' parameter must be a PrivacyTarget; got {type(target).__name__}."
        )
    check_real("clip", clip, low=0.0, closed="neither")
    check_real("divisor", divisor, low=0.0, closed="neither")
    accountant = target.accountant if accountant is None else accountant
    relation = target.relation if relation is None else relation
    joint = calibrate_noise_multiplier(
        lambda zz: (
            rounds_event(sampler, zz, rounds)
            if reserve is None
            else dp_accounting.ComposedDpEvent([rounds_event(sampler, zz, rounds), reserve])
        ),
        target_epsilon=target.epsilon,
        delta=target.delta,
        accountant=accountant,
        relation=relation,
    )
    z = joint if count_noise_std is None else mean_multiplier_for(joint, count_noise_std)
    event = rounds_event(sampler, joint, rounds)
    return ReleaseCalibration(
        target=target,
        multiplier=z,
        noise_std=noise_std_for(z, divisor, clip),
        clip=float(clip),
        divisor=float(divisor),
        rounds=int(rounds),
        accountant=accountant,
        relation=relation,
        count_noise_std=count_noise_std,
        event=event,
        epsilon=compute_epsilon(
            event, delta=target.delta, accountant=accountant, relation=relation
        ),
    )


# ------------------------------------------------------------------------ covariance release
def covariance_sensitivity(clip: float, relation: str) -> float:
    """ℓ2 sensitivity of the upper triangle of W̃W̃ᵀ: K² (add-remove) or √2·K² (replace-one)."""
    k = check_real("clip", clip, low=0.0, closed="neither")
    check_choice("relation", relation, RELATIONS)
    return k * k * (math.sqrt(2.0) if relation == "replace-one" else 1.0)


def covariance_event(multipliers: Sequence[float]) -> dpe.DpEvent:
    """The event of the covariance releases with these noise multipliers (one Gaussian each)."""
    return dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(z) for z in multipliers])


@dataclass(frozen=True)
class CovarianceCalibration:
    """What :func:`calibrate_covariance_noise` found: per-release multipliers and stds, the
    sensitivity they were scaled by and the ε the composition achieves."""

    multipliers: tuple[float, ...]
    stds: tuple[float, ...]
    sensitivity: float
    epsilon: float


def calibrate_covariance_noise(
    inverse_weights: Sequence[float] | np.ndarray,
    *,
    clip: float,
    target_epsilon: float,
    delta: float,
    accountant: str = DEFAULT_ACCOUNTANT,
    relation: str = DEFAULT_RELATION,
) -> CovarianceCalibration:
    r"""Noise of the ``T`` covariance releases whose multipliers are :math:`z_0 r_t` (``r_t`` =
    ``inverse_weights[t]``, i.e. :math:`1/w_t`) with :math:`z_0` the smallest that meets
    ``target_epsilon`` at ``delta`` for their composition.

    Release ``t`` adds noise of std :math:`z_0 r_t \Delta_e` to every upper-triangular entry,
    where :math:`\Delta_e` is the sensitivity in the event convention (relative to add/remove):
    ``K²`` under add/remove and :math:`\sqrt2 K^2/2` under replace-one (the accountant doubles
    the sensitivity itself under replace-one).
    """
    inv = list(inverse_weights)

    def event(z0: float) -> dpe.DpEvent:
        return covariance_event([z0 * r for r in inv])

    z0 = calibrate_noise_multiplier(
        event, target_epsilon=target_epsilon, delta=delta, accountant=accountant, relation=relation
    )
    sens = covariance_sensitivity(clip, relation)
    event_sens = sens if relation == "add-remove" else sens / 2.0
    stds = tuple(float(z0 * r * event_sens) for r in inv)
    achieved = compute_epsilon(event(z0), delta=delta, accountant=accountant, relation=relation)
    return CovarianceCalibration(
        multipliers=tuple(float(z0 * r) for r in inv),
        stds=stds,
        sensitivity=sens,
        epsilon=achieved,
    )
