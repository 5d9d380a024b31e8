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
  :func:`calibrate_mean_noise_std` is the σ of every entry point that trains to a target ε
  (the PMTL family, ``privmtl account``, the audits). With adaptive clipping the calibrated
  multiplier is the joint one of mean and noisy count (:func:`mean_multiplier_for`).
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
from privmtl.privacy.guarantee import RELATIONS

__all__ = [
    "MAX_TARGET_EPSILON",
    "CovarianceCalibration",
    "calibrate_covariance_noise",
    "calibrate_mean_noise_std",
    "calibrate_noise_multiplier",
    "calibrate_rounds_multiplier",
    "combined_noise_multiplier",
    "count_noise_multiplier",
    "covariance_event",
    "covariance_sensitivity",
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


# ------------------------------------------------------------------------------- the search
def calibrate_noise_multiplier(
    event_fn: Callable[[float], dpe.DpEvent],
    *,
    target_epsilon: float,
    delta: float,
    accountant: str = "rdp",
    relation: str = "add-remove",
    rtol: float = 1e-4,
) -> float:
    """Smallest noise multiplier z (within ``rtol``) with ε(event_fn(z)) ≤ ``target_epsilon``.

    Uses :func:`dp_accounting.calibrate_dp_mechanism` (Brent's method) and then checks the result:
    the returned z always satisfies the target (it is nudged up if the search ended a hair below).
    """
    target = check_real("target_epsilon", target_epsilon, low=0.0, closed="neither")
    if target > MAX_TARGET_EPSILON:
        raise InvalidParameterError(
            f"The target epsilon must be at most {MAX_TARGET_EPSILON:g}; got {target:g}. "
            f"e^epsilon bounds how much one client's data may change the odds of any output, and "
            f"e^{MAX_TARGET_EPSILON:g} protects nothing; for a non-private run give no epsilon."
        )
    check_real("delta", delta, low=0.0, high=1.0, closed="neither")
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
                event_fn, target_epsilon=target, delta=delta, accountant="rdp", relation=relation
            )
        except InvalidParameterError:
            z_hi = 2.5 * calibrate_noise_multiplier(
                event_fn,
                target_epsilon=target,
                delta=delta,
                accountant="rdp",
                relation="add-remove",
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
    """The event of ``rounds`` releases: the sampler's one-round event for ``multiplier``, composed."""
    return dpe.SelfComposedDpEvent(sampler.event(multiplier), rounds)


def rounds_epsilon(
    sampler: Any,
    multiplier: float,
    rounds: int,
    *,
    delta: float,
    accountant: str = "rdp",
    relation: str = "add-remove",
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
    accountant: str = "rdp",
    relation: str = "add-remove",
    count_noise_std: float | None = None,
) -> float:
    r"""The mean release's noise multiplier ``z`` so that ``rounds`` releases meet
    ``target_epsilon`` at ``delta``.

    The multiplier is calibrated on :func:`rounds_event` (the ``sampler``'s event, composed
    ``rounds`` times). With ``count_noise_std`` σ_b (adaptive clipping) the calibrated multiplier
    is the joint :math:`z_\Delta` of mean and count, and the mean's is
    :math:`(z_\Delta^{-2} - (2\sigma_b)^{-2})^{-1/2}` (:func:`mean_multiplier_for`).
    """
    z = calibrate_noise_multiplier(
        lambda zz: rounds_event(sampler, zz, rounds),
        target_epsilon=target_epsilon,
        delta=delta,
        accountant=accountant,
        relation=relation,
    )
    if count_noise_std is not None:  # the event's multiplier is the joint one of mean and count
        z = mean_multiplier_for(z, count_noise_std)
    return z


def calibrate_mean_noise_std(
    sampler: Any,
    *,
    rounds: int,
    clip: float,
    divisor: float,
    target_epsilon: float,
    delta: float,
    accountant: str = "rdp",
    relation: str = "add-remove",
    count_noise_std: float | None = None,
) -> float:
    r""":math:`\sigma = z\gamma/q` (γ = ``clip``, q = ``divisor``) for the multiplier ``z`` of
    :func:`calibrate_rounds_multiplier`: the noise std of the mean release whose ``rounds``
    releases meet ``target_epsilon`` at ``delta``."""
    z = calibrate_rounds_multiplier(
        sampler,
        rounds=rounds,
        target_epsilon=target_epsilon,
        delta=delta,
        accountant=accountant,
        relation=relation,
        count_noise_std=count_noise_std,
    )
    return noise_std_for(z, divisor, clip)


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
    accountant: str = "rdp",
    relation: str = "add-remove",
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
