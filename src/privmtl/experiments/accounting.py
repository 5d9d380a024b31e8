"""Client-level accounting for PMTL-style training: one function behind ``privmtl account``.

The released statistic is the server's mean of q clipped client updates plus N(0, σ²I); its add/remove
sensitivity is γ/q, so the noise multiplier is z = σ·q/γ
(:func:`~privmtl.privacy.calibration.noise_multiplier`). T rounds are composed. A target ε is
calibrated by :func:`~privmtl.privacy.calibration.calibrate_release`, the function every training
run calibrates with.
"""

from __future__ import annotations

import math
from typing import Any

from privmtl._validation import check_choice, check_int, check_real
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.spec import SPEC
from privmtl.privacy import (
    PrivacyGuarantee,
    make_sampler,
    pmtl_theorem1_epsilon,
    pmtl_theorem1_noise_std,
    pmtl_theorem1_valid,
)
from privmtl.privacy.calibration import (
    PrivacyTarget,
    calibrate_release,
    noise_multiplier,
    rounds_epsilon,
)

__all__ = ["account_rounds"]

PAPER_CODE_NOTE = (
    "accountant 'paper' with q < m reproduces the PMTL reference code: RDP of the Poisson-sampled "
    "Gaussian under add/remove (tensorflow_privacy compute_dp_sgd_privacy), whatever sampling is run"
)


def account_rounds(
    *,
    clip: float,
    num_clients: int,
    clients_per_round: int,
    rounds: int,
    delta: float,
    noise_std: float | None = None,
    target_epsilon: float | None = None,
    accountant: str = SPEC.accountant,
    sampling: str = SPEC.sampling,
    relation: str = SPEC.relation,
    per_round: bool = False,
) -> dict[str, Any]:
    """ε for a given σ, or the σ for a target ε, of T rounds of the PMTL server mechanism.

    Exactly one of ``noise_std`` and ``target_epsilon`` must be given. Returns a JSON-ready dict with
    ``epsilon, delta, noise_std, noise_multiplier, accountant, sampling, relation`` and the full
    :class:`~privmtl.privacy.PrivacyGuarantee` under ``guarantee``.
    """
    g = check_real("clip", clip, low=0.0, closed="neither")
    m = check_int("num_clients", num_clients, low=1)
    q = check_int("clients_per_round", clients_per_round, low=1, high=m)
    T = check_int("rounds", rounds, low=1)
    dlt = check_real("delta", delta, low=0.0, high=1.0, closed="neither")
    check_choice("accountant", accountant, ("rdp", "pld", "paper"))
    check_choice("sampling", sampling, ("poisson", "fixed"))
    if (noise_std is None) == (target_epsilon is None):
        raise InvalidParameterError(
            "Exactly one of 'noise_std' and 'target_epsilon' must be given; got "
            f"noise_std={noise_std!r}, target_epsilon={target_epsilon!r}."
        )
    sampled_kind = "all" if q == m else sampling
    notes: list[str] = []
    if accountant == "paper":
        if q == m:
            # Thm 1 of the PMTL paper (replace-one, all clients each round).
            if noise_std is not None:
                sigma = check_real("noise_std", noise_std, low=0.0, closed="neither")
                eps = pmtl_theorem1_epsilon(sigma, g, m, T, dlt)
            else:
                eps = check_real("target_epsilon", target_epsilon, low=0.0, closed="neither")
                sigma = pmtl_theorem1_noise_std(eps, g, m, T, dlt)
            notes.append("closed form of PMTL Thm 1: sigma = 4*clip*sqrt(T*log(1/delta))/(eps*m)")
            if not pmtl_theorem1_valid(eps, dlt):
                notes.append("Thm 1's proof needs eps <= 2*log(1/delta): this value is outside it")
            if relation != "replace-one":
                notes.append("Thm 1 is stated for replace-one; it also bounds add/remove")
            eff_sampling = "all"
        else:
            eff_sampling = "poisson"
            rel = "add-remove"
            sampler = make_sampler("poisson", m, q)
            sigma, eps = _tight(sampler, g, q, T, dlt, noise_std, target_epsilon, "rdp", rel)
            notes.append(PAPER_CODE_NOTE)
            if sampling != "poisson" or relation != "add-remove":
                notes.append(
                    f"MISMATCH: you asked for sampling={sampling!r}, relation={relation!r}, but the "
                    "paper's accountant assumes Poisson sampling and add/remove"
                )
        z = noise_multiplier(sigma, q, g)
        guarantee = PrivacyGuarantee(
            epsilon=eps,
            delta=dlt,
            relation=relation,
            sampling=eff_sampling,
            accountant="paper",
            notes=tuple(notes),
        )
    else:
        sampler = make_sampler(sampled_kind, m, q)
        sigma, eps = _tight(sampler, g, q, T, dlt, noise_std, target_epsilon, accountant, relation)
        z = noise_multiplier(sigma, q, g)
        guarantee = PrivacyGuarantee(
            epsilon=eps,
            delta=dlt,
            relation=relation,
            sampling=sampled_kind,
            accountant=accountant,
            details={"noise_multiplier": z, "rounds": T, "rate": q / m},
        )
    out: dict[str, Any] = {
        "epsilon": eps,
        "delta": dlt,
        "noise_std": sigma,
        "noise_multiplier": z,
        "accountant": accountant,
        "sampling": guarantee.sampling,
        "relation": relation,
        "clip": g,
        "num_clients": m,
        "clients_per_round": q,
        "rounds": T,
        "notion": guarantee.notion,
        "guarantee": guarantee.to_dict(),
        "summary": guarantee.describe(),
    }
    if per_round and accountant != "paper":
        sampler = make_sampler(sampled_kind, m, q)
        out["epsilon_per_round"] = [
            rounds_epsilon(sampler, z, t, delta=dlt, accountant=accountant, relation=relation)
            for t in range(1, T + 1)
        ]
    return out


def _tight(
    sampler: Any,
    clip: float,
    q: int,
    T: int,
    delta: float,
    noise_std: float | None,
    target_epsilon: float | None,
    accountant: str,
    relation: str,
) -> tuple[float, float]:
    if noise_std is not None:
        sigma = check_real("noise_std", noise_std, low=0.0)
        if sigma == 0:
            return 0.0, math.inf
        z = noise_multiplier(sigma, q, clip)
        return sigma, rounds_epsilon(
            sampler, z, T, delta=delta, accountant=accountant, relation=relation
        )
    target = check_real("target_epsilon", target_epsilon, low=0.0, closed="neither")
    # the calibration every training run uses (run_pmtl, the sweep, Flower's ServerApp)
    cal = calibrate_release(
        PrivacyTarget(target, delta),
        sampler,
        rounds=T,
        clip=clip,
        divisor=q,
        accountant=accountant,
        relation=relation,
    )
    return cal.noise_std, cal.epsilon
