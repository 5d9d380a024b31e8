"""Client-level accounting for PMTL-style training: one function behind ``privmtl account``.

The released statistic is the server's mean of q clipped client updates plus N(0, σ²I); its add/remove
sensitivity is γ/q, so the noise multiplier is z = σ·q/γ
(:func:`~privmtl.privacy.calibration.noise_multiplier`). T rounds are composed. A target ε is
a :class:`~privmtl.privacy.calibration.PrivacyTarget` calibrated by
:func:`~privmtl.privacy.release.plan_mean_release`, as every training run's release calibrates
itself.
"""

from __future__ import annotations

import math
from typing import Any

from privmtl._validation import check_choice, check_int, check_real
from privmtl.exceptions import InvalidParameterError
from privmtl.federated.spec import SPEC, check_participation
from privmtl.privacy import (
    PrivacyGuarantee,
    make_sampler,
    pmtl_theorem1_epsilon,
    pmtl_theorem1_noise_std,
    pmtl_theorem1_valid,
)
from privmtl.privacy.calibration import PrivacyTarget, noise_multiplier, rounds_epsilon
from privmtl.privacy.matrix_factorization import (
    CyclicParticipation,
    banded_epsilon,
    banded_event,
    run_strategy,
)
from privmtl.privacy.release import banded_groups, plan_mean_release
from privmtl.privacy.sampling import cyclic_group_size

__all__ = ["account_rounds"]

PAPER_CODE_NOTE = (
    "accountant 'paper' with q < m reproduces the PMTL reference code: RDP of the Poisson-sampled "
    "Gaussian under add/remove (tensorflow_privacy compute_dp_sgd_privacy), whatever sampling is run"
)


def account_rounds(
    *,
    clip: float,
    num_clients: int,
    clients_per_round: int | None,
    rounds: int,
    delta: float,
    noise_std: float | None = None,
    target_epsilon: float | None = None,
    accountant: str = SPEC.accountant,
    sampling: str = SPEC.sampling,
    relation: str = SPEC.relation,
    per_round: bool = False,
    groups: int = SPEC.groups,
    noise_mechanism: str = SPEC.noise_mechanism,
) -> dict[str, Any]:
    """ε for a given σ, or the σ for a target ε, of T rounds of the PMTL server mechanism.

    Exactly one of ``noise_std`` and ``target_epsilon`` must be given. ``sampling="cyclic"``:
    ``groups`` public groups in turn, ``clients_per_round`` then ``ceil(m / groups)`` (None: that
    value). ``noise_mechanism="banded"``: the whole run is one Gaussian mechanism of banded
    matrix-factorization noise (:func:`~privmtl.privacy.matrix_factorization.run_strategy`, as a
    training run calibrates it; needs ``sampling`` "cyclic" or ``q = m``). Returns a JSON-ready
    dict with ``epsilon, delta, noise_std, noise_multiplier, accountant, sampling, relation`` and
    the full :class:`~privmtl.privacy.PrivacyGuarantee` under ``guarantee`` (banded: also
    ``banded``, its bands, groups, sensitivity and the run's noise multiplier).
    """
    g = check_real("clip", clip, low=0.0, closed="neither")
    m = check_int("num_clients", num_clients, low=1)
    check_choice("sampling", sampling, ("poisson", "fixed", "cyclic"))
    if clients_per_round is None and sampling == "cyclic":
        clients_per_round = cyclic_group_size(m, check_int("groups", groups, low=1, high=m))
    if clients_per_round is None:
        raise InvalidParameterError(
            f"The 'clients_per_round' parameter is required with sampling={sampling!r} (an "
            "integer in [1, num_clients]); got None."
        )
    q = check_int("clients_per_round", clients_per_round, low=1, high=m)
    T = check_int("rounds", rounds, low=1)
    dlt = check_real("delta", delta, low=0.0, high=1.0, closed="neither")
    check_choice("accountant", accountant, ("rdp", "pld", "paper"))
    sampled_kind = "all" if q == m and sampling != "cyclic" else sampling
    check_participation(sampled_kind, groups, noise_mechanism)
    if (noise_std is None) == (target_epsilon is None):
        raise InvalidParameterError(
            "Exactly one of 'noise_std' and 'target_epsilon' must be given; got "
            f"noise_std={noise_std!r}, target_epsilon={target_epsilon!r}."
        )
    if accountant == "paper" and (sampled_kind == "cyclic" or noise_mechanism == "banded"):
        raise InvalidParameterError(
            "The 'accountant' parameter 'paper' accounts the papers' samplings with independent "
            f"noise only; got sampling={sampling!r}, noise_mechanism={noise_mechanism!r}."
        )
    if noise_mechanism == "banded":
        return _banded(g, m, q, T, dlt, noise_std, target_epsilon, accountant, relation,
                       sampler=make_sampler(sampled_kind, m, q, groups=groups))  # fmt: skip
    if accountant == "paper":
        sigma, eps, z, guarantee = _paper(
            g, m, q, T, dlt, noise_std, target_epsilon, sampling, relation
        )
    else:
        sampler = make_sampler(sampled_kind, m, q, groups=groups)
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
    if sampled_kind == "cyclic":
        out["groups"] = groups
    if per_round and accountant != "paper":
        sampler = make_sampler(sampled_kind, m, q, groups=groups)
        out["epsilon_per_round"] = [
            rounds_epsilon(sampler, z, t, delta=dlt, accountant=accountant, relation=relation)
            for t in range(1, T + 1)
        ]
    return out


def _paper(
    g: float,
    m: int,
    q: int,
    T: int,
    dlt: float,
    noise_std: float | None,
    target_epsilon: float | None,
    sampling: str,
    relation: str,
) -> tuple[float, float, float, PrivacyGuarantee]:
    """``accountant="paper"``: σ, ε, the noise multiplier and the guarantee of the papers'
    accounting (PMTL's Theorem 1 when every client takes part, else the paper code's Poisson
    RDP), with notes where the asked sampling or relation differs from the paper's."""
    notes: list[str] = []
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
    return sigma, eps, z, guarantee


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
    # the calibration every training run's release makes (run_pmtl, the sweep, Flower's ServerApp)
    goal = PrivacyTarget(target, delta, accountant, relation, sampling=sampler.kind)
    plan = plan_mean_release(goal, sampler, rounds=T, clip=clip, divisor=q)
    assert plan.calibration is not None  # independent noise
    return plan.noise_std, plan.calibration.epsilon


def _banded(
    clip: float,
    m: int,
    q: int,
    T: int,
    delta: float,
    noise_std: float | None,
    target_epsilon: float | None,
    accountant: str,
    relation: str,
    *,
    sampler: Any,
) -> dict[str, Any]:
    """:func:`account_rounds` of banded noise: the run's one Gaussian event, as
    :meth:`~privmtl.privacy.release.GaussianMeanRelease.for_target` calibrates it and the release
    records it."""
    groups = banded_groups(sampler)
    strategy, part, bound = run_strategy(T, groups), CyclicParticipation(groups), clip / q
    kw: dict[str, Any] = {"delta": delta, "bound": bound, "accountant": accountant}
    if noise_std is not None:
        sigma = check_real("noise_std", noise_std, low=0.0, closed="neither")
        eps = banded_epsilon(strategy, sigma, part, relation=relation, **kw)
    else:
        eps = check_real("target_epsilon", target_epsilon, low=0.0, closed="neither")
        goal = PrivacyTarget(eps, delta, accountant, relation, sampling=sampler.kind)
        sigma = plan_mean_release(
            goal, sampler, rounds=T, clip=clip, divisor=q, strategy=strategy
        ).noise_std  # the σ the run's release calibrates itself to
        eps = banded_epsilon(strategy, sigma, part, relation=relation, **kw)
    run_z = float(banded_event(strategy, sigma, part, bound=bound).noise_multiplier)
    banded = {
        "mechanism": "banded", "bands": strategy.bands, "groups": groups, "rounds": T,
        "sensitivity": float(strategy.sensitivity(part)) * bound, "noise_std": sigma,
        "run_noise_multiplier": run_z,
    }  # fmt: skip
    guarantee = PrivacyGuarantee(
        epsilon=eps,
        delta=delta,
        relation=relation,
        sampling=sampler.kind,
        accountant=accountant,
        details={"run_noise_multiplier": run_z, "rounds": T, "rate": q / m},
        notes=(
            "banded matrix-factorization noise: the whole run is one Gaussian mechanism "
            "(noise_multiplier is sigma*q/clip of the strategy's z)",
        ),
    )
    return {
        "epsilon": eps,
        "delta": delta,
        "noise_std": sigma,
        "noise_multiplier": noise_multiplier(sigma, q, clip),
        "accountant": accountant,
        "sampling": sampler.kind,
        "relation": relation,
        "clip": clip,
        "num_clients": m,
        "clients_per_round": q,
        "rounds": T,
        **({"groups": groups} if sampler.kind == "cyclic" else {}),
        "noise_mechanism": "banded",
        "banded": banded,
        "notion": guarantee.notion,
        "guarantee": guarantee.to_dict(),
        "summary": guarantee.describe(),
    }
