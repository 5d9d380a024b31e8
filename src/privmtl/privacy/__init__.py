"""Privacy layer: mechanisms emit events, accountants compose them, guarantees state the result.

Solvers in :mod:`privmtl.linear` and :mod:`privmtl.federated` never compute ε themselves: they draw
clients with a :class:`ClientSampler`, release statistics through the primitives here, and ask the
planning object (sampler + :class:`PrivacyLedger`, or :class:`CovarianceSchedule`) for the guarantee.
"""

from __future__ import annotations

from privmtl.privacy.accounting import (
    adapt_event,
    compute_epsilon,
    event_from_dict,
    event_to_dict,
    make_accountant,
)
from privmtl.privacy.calibration import (
    calibrate_mean_noise_std,
    calibrate_noise_multiplier,
    covariance_sensitivity,
)
from privmtl.privacy.closed_form import (
    pmtl_theorem1_epsilon,
    pmtl_theorem1_noise_std,
    pmtl_theorem1_valid,
    workshop_noise_std,
)
from privmtl.privacy.composition import (
    allocate_budgets,
    allocation_weights,
    composition_bound,
    ip_to_mp,
    mp_budget_for_ip,
)
from privmtl.privacy.covariance import (
    CovarianceSchedule,
    plan_covariance_releases,
    wishart_real_delta,
)
from privmtl.privacy.guarantee import ACCOUNTANTS, RELATIONS, SAMPLINGS, PrivacyGuarantee
from privmtl.privacy.ledger import PrivacyLedger, reaccount
from privmtl.privacy.mechanisms import (
    clip_columns,
    clip_rows,
    symmetric_gaussian_noise,
    wishart_noise,
    wishart_support_mismatch,
)
from privmtl.privacy.noise import (
    NOISE_SOURCES,
    NoiseSource,
    SecureNoise,
    SeededNoise,
    make_noise_source,
)
from privmtl.privacy.release import AdaptiveClip, GaussianMeanRelease, Release
from privmtl.privacy.sampling import (
    ClientSampler,
    FixedSizeSampler,
    FullParticipation,
    PoissonSampler,
    make_sampler,
)
from privmtl.privacy.selection import (
    SELECTION_METHODS,
    ClientVote,
    VotePlan,
    VoteResult,
    client_vote_shares,
    client_votes,
    plan_vote,
    record_candidates,
    vote_sensitivity,
)

__all__ = [
    "ACCOUNTANTS",
    "NOISE_SOURCES",
    "RELATIONS",
    "SAMPLINGS",
    "SELECTION_METHODS",
    "AdaptiveClip",
    "ClientSampler",
    "ClientVote",
    "CovarianceSchedule",
    "FixedSizeSampler",
    "FullParticipation",
    "GaussianMeanRelease",
    "NoiseSource",
    "PoissonSampler",
    "PrivacyGuarantee",
    "PrivacyLedger",
    "Release",
    "SecureNoise",
    "SeededNoise",
    "VotePlan",
    "VoteResult",
    "adapt_event",
    "allocate_budgets",
    "allocation_weights",
    "calibrate_mean_noise_std",
    "calibrate_noise_multiplier",
    "client_vote_shares",
    "client_votes",
    "clip_columns",
    "clip_rows",
    "composition_bound",
    "compute_epsilon",
    "covariance_sensitivity",
    "event_from_dict",
    "event_to_dict",
    "ip_to_mp",
    "make_accountant",
    "make_noise_source",
    "make_sampler",
    "mp_budget_for_ip",
    "plan_covariance_releases",
    "plan_vote",
    "pmtl_theorem1_epsilon",
    "pmtl_theorem1_noise_std",
    "pmtl_theorem1_valid",
    "reaccount",
    "record_candidates",
    "symmetric_gaussian_noise",
    "vote_sensitivity",
    "wishart_noise",
    "wishart_real_delta",
    "wishart_support_mismatch",
    "workshop_noise_std",
]
