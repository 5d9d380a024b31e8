r"""The low-rank refit's eigenvalue floor: a public grid, and the tasks' recorded vote among it.

The MP-MTL low-rank refit (:class:`~privmtl.linear.mpmtl.MPMTLLowRank`, ``refit_lam`` set) builds
its metric from the eigen-directions of the released covariance :math:`\tilde W\tilde W^\top + E`
that survive a cut. ``eigen_fix="denoise"`` cuts at :math:`2\sigma\sqrt d`, the edge of what the
privacy noise alone produces; that cut falls with σ ∝ 1/ε, and at large ε it keeps directions
that are the tasks' own estimation noise (the noiseless pipeline keeps all of them), so more
budget can give a worse model. The floor adds a cut that does not shrink with ε:

.. math:: \text{cut} = \max(2\sigma\sqrt d,\; \tau\, e), \qquad
          e = K^2 (\sqrt m + \sqrt d)^2 / d,

with :math:`e` the largest eigenvalue that m clipped models (norm K) pointing at random in d
dimensions produce (public: K, m, d) and τ a multiple of it. Which τ suits depends on the data
(a spectrum with one strong direction and a tail at the level of :math:`e` wants τ ≥ 1; one with
several true directions just above :math:`e/2` wants τ ≈ 0.5), so τ is chosen under the
guarantee:

1. **Public plan** (:func:`plan_floor`). The grid (:data:`FLOOR_GRID`) and the vote's share of
   the budget (:data:`VOTE_SHARE`) are public. The covariance releases keep ``1 - share`` of the
   precision of the planned Gaussian schedule and the vote gets the rest
   (:func:`~privmtl.privacy.covariance.reserve_share`): releases and vote compose to exactly the
   target (ε, δ). The vote is held only where it can matter and carry signal, decided from public
   quantities alone: at least two floors of the grid give different cuts at the releases' σ
   (otherwise every candidate is the same metric), and the vote's noise std is at most
   ``m /`` :data:`VOTE_SIGNAL` (a unanimous count then stands that many σ above the noise).
   Otherwise nothing is spent on it, the releases keep the whole budget and τ is
   :data:`DEFAULT_FLOOR` (today's cut).
2. **Scores** (post-processing of the same release plus each task's own data). For every distinct
   candidate cut every task builds the refit metric from the one release and scores it on its own
   samples: the least validation loss over its own ridge weights (:func:`~privmtl.linear.local.
   ridge_cv_losses`, leave-one-out for the squared loss). No candidate costs a release.
3. **Vote** (:class:`~privmtl.privacy.selection.ClientVote`). Every task votes for its best
   candidate (ties: the smaller floor); the histogram gets Gaussian noise and is recorded in the
   run's ledger (write-ahead, ``mechanism="client-vote"``). The floor every task refits with is
   the **median** of the noisy histogram (:func:`median_winner`; post-processing): the
   candidates are ordered (a larger floor keeps a subset of the directions), and a plurality
   splits the tasks that want a floor among its neighbouring values (counts 48, 43, 41 over
   τ = 0, 1, 2 elect τ = 0 by plurality, τ = 1 by the median). Given the release, one task moves
   one count by 1, so the vote is a Gaussian mechanism of sensitivity 1 composed adaptively with
   the releases.

A non-private run (``epsilon=None``) takes the exact vote (no noise; its ε is ∞ already).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from privmtl.exceptions import InvalidParameterError
from privmtl.linear.local import (
    COVARIANCE_POWER,
    TRACE_POWER,
    best_ridge,
    ridge_cv_losses,
    variational_factor,
)
from privmtl.linear.losses import TaskBatch
from privmtl.privacy.covariance import eigen_shift, noise_norm, reserve_share
from privmtl.privacy.guarantee import DEFAULT_RELATION
from privmtl.privacy.noise import NoiseSource
from privmtl.privacy.selection import VOTE_SIGNAL, ClientVote, client_votes

__all__ = [
    "DEFAULT_FLOOR",
    "FLOOR_GRID",
    "FLOOR_VOTE",
    "FLOOR_VOTE_ID",
    "POWER_AUTO",
    "POWER_EDGE",
    "VOTE_SHARE",
    "VOTE_SIGNAL",
    "FloorPlan",
    "auto_refit_power",
    "estimation_noise_edge",
    "floored_shift",
    "median_winner",
    "plan_floor",
    "refit_metric",
]

FloatArray = NDArray[np.float64]

#: ``eigen_floor="vote"``: the tasks choose τ from the grid by a recorded vote.
FLOOR_VOTE = "vote"
#: The public grid of floors τ, in multiples of the estimation-noise edge e.
FLOOR_GRID: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0)
#: τ when no vote is held (and the first candidate, which wins the tasks' ties): the privacy cut.
DEFAULT_FLOOR = 0.0
#: The vote's share of the run's budget (of the precision of its Gaussian releases).
VOTE_SHARE = 0.05
#: Ledger id of the floor vote.
FLOOR_VOTE_ID = "floor-vote:0"
#: ``refit_power="auto"``: the refit metric's power from the release's noise (:func:`auto_refit_power`).
POWER_AUTO = "auto"
#: ``"auto"`` takes power 1 where the release's noise norm 2σ√d is at most this share of e.
POWER_EDGE = 0.5


def estimation_noise_edge(clip: float, n_tasks: int, dim: int) -> float:
    """``e = K² (√m + √d)² / d``: the top eigenvalue of m random clipped models' ``W̃W̃ᵀ``."""
    return float(clip**2 * (math.sqrt(n_tasks) + math.sqrt(dim)) ** 2 / dim)


def auto_refit_power(noise_std: float, *, clip: float, n_tasks: int, dim: int) -> float:
    """The low-rank refit metric's power for a release with Gaussian noise std ``noise_std``.

    :data:`~privmtl.linear.local.COVARIANCE_POWER` (``D ∝`` the denoised release: the Gaussian
    prior it describes) where ``2σ√d``, about the spectral norm of the privacy noise, is at most
    :data:`POWER_EDGE` times the estimation-noise edge ``e`` (:func:`estimation_noise_edge`),
    i.e. where the release is well inside the precision the tasks' own models allow;
    :data:`~privmtl.linear.local.TRACE_POWER` (the trace norm's variational metric,
    ``D ∝ Λ^(1/2)``) elsewhere. The power-1 metric leans harder on the top released directions,
    which pays when they are the shared ones and costs when the noise has turned them. Public
    quantities only (σ of the plan, K, m, d); σ = 0 for a non-private run.
    """
    edge = estimation_noise_edge(clip, n_tasks, dim)
    return COVARIANCE_POWER if noise_norm(noise_std, dim) <= POWER_EDGE * edge else TRACE_POWER


def median_winner(noisy_counts: Sequence[float]) -> int:
    """The weighted median of an ordered noisy histogram: the first candidate whose cumulative
    count reaches half the total (negative noisy counts read as 0; all zero: candidate 0)."""
    c = np.maximum(np.asarray(noisy_counts, dtype=np.float64), 0.0)
    if not c.sum() > 0:
        return 0
    return int(np.searchsorted(np.cumsum(c), 0.5 * c.sum()))


def floored_shift(shift: float | None, cut_floor: float) -> float | None:
    """The eigenvalue shift of the cut ``max(-shift, cut_floor)``; ``shift`` itself when ≤ 0 floor.

    ``shift`` is the release's fix (``-2σ√d`` for ``"denoise"``, 0 for ``"clip"``, None without
    noise, i.e. 0 as well); eigenvalues ``Λ`` become ``max(Λ + shift, 0)``.
    """
    if cut_floor <= 0:
        return shift
    return float(min(0.0 if shift is None else shift, -cut_floor))


@dataclass(frozen=True)
class FloorPlan:
    """The public plan of a run's floor: a fixed τ, or a vote among ``candidates``.

    Attributes
    ----------
    mode : {"fixed", "vote"}
    grid : tuple of float
        The public grid (multiples of ``edge``).
    edge : float
        The estimation-noise edge e of the run (eigenvalue units).
    floor : float
        The fixed τ (``mode="fixed"``); the default candidate otherwise.
    candidates : tuple of int
        Indices into ``grid`` voted on (the distinct cuts; empty for ``"fixed"``).
    vote_noise_std : float
        σ of the vote's counts (0: an exact vote of a non-private run).
    share : float
        The vote's share of the budget (0 when nothing is spent on a vote).
    relation : str
    reason : str
        Why a vote is or is not held, in words.
    """

    mode: str
    grid: tuple[float, ...]
    edge: float
    floor: float
    candidates: tuple[int, ...] = ()
    vote_noise_std: float = 0.0
    share: float = 0.0
    relation: str = DEFAULT_RELATION
    reason: str = ""

    def vote(self) -> ClientVote:
        """The vote's mechanism."""
        return ClientVote(len(self.candidates), self.vote_noise_std, self.relation)


def _distinct(shift: float | None, grid: Sequence[float], edge: float) -> tuple[int, ...]:
    seen: list[float | None] = []
    keep: list[int] = []
    for i, g in enumerate(grid):
        s = floored_shift(shift, g * edge)
        if s not in seen:
            seen.append(s)
            keep.append(i)
    return tuple(keep)


def plan_floor(
    eigen_floor: float | str,
    *,
    grid: Sequence[float],
    share: float,
    schedule: Any,
    eigen_fix: str,
    applicable: bool,
    n_tasks: int,
    dim: int,
    clip: float,
) -> tuple[FloorPlan, Any]:
    """The floor's public plan and the covariance schedule the run releases with.

    ``schedule`` is planned for the whole target; when a vote is held the returned schedule keeps
    ``1 - share`` of it (:func:`~privmtl.privacy.covariance.reserve_share`). ``applicable`` is
    False where the run has no low-rank refit (the floor has nothing to act on): a vote is then
    never held, and a fixed τ > 0 is refused by the caller.
    """
    grid = tuple(float(g) for g in grid)
    edge = estimation_noise_edge(clip, n_tasks, dim)
    relation = schedule.guarantee.relation

    def fixed(why: str, tau: float = DEFAULT_FLOOR) -> tuple[FloorPlan, Any]:
        return FloorPlan("fixed", grid, edge, tau, relation=relation, reason=why), schedule

    if eigen_floor != FLOOR_VOTE:
        return fixed("fixed floor", float(eigen_floor))
    if not applicable:
        return fixed("no low-rank refit with a 'denoise' or 'clip' eigenvalue fix: no floor")
    if schedule.noise == "none":
        why = "non-private run: the tasks' exact vote (no noise)"
        cands = _distinct(None, grid, edge)
        return FloorPlan(
            "vote", grid, edge, DEFAULT_FLOOR, cands, 0.0, 0.0, relation, why
        ), schedule
    if schedule.noise != "gaussian":
        return fixed("Wishart releases: the ledger cannot compose a vote with them")
    reserved, z_vote = reserve_share(schedule, share)
    shift = eigen_shift("gaussian", reserved.per_release[-1], dim, eigen_fix)
    cands = _distinct(shift, grid, edge)
    sigma_v = ClientVote.for_multiplier(len(cands), z_vote, relation=relation).noise_std
    cut = 0.0 if shift is None else -shift
    if len(cands) < 2:
        return fixed(
            f"every floor of the grid (at most {max(grid) * edge:.4g}) is below the privacy cut "
            f"{cut:.4g}: the candidates coincide, no vote, the releases keep the whole budget"
        )
    if sigma_v > n_tasks / VOTE_SIGNAL:
        return fixed(
            f"a vote with {share:g} of the budget would have noise std {sigma_v:.4g} > m / "
            f"{VOTE_SIGNAL:g} = {n_tasks / VOTE_SIGNAL:.4g}: it could not carry signal, no vote"
        )
    why = f"vote among {len(cands)} distinct cuts with {share:g} of the budget"
    plan = FloorPlan("vote", grid, edge, DEFAULT_FLOOR, cands, sigma_v, share, relation, why)
    return plan, reserved


def refit_metric(
    plan: FloorPlan,
    *,
    Sigma: FloatArray,
    shift: float | None,
    batch: TaskBatch,
    loss: str,
    refit_floor: float,
    power: float = TRACE_POWER,
    cv_seed: int,
    noise: NoiseSource,
    ledger: Any,
    delta: float,
    accountant: str,
    replay_ok: bool,
) -> tuple[FloatArray, FloatArray | None, dict[str, Any]]:
    """The refit's metric ``A`` from the last release, its per-task CV weights, and the record.

    ``power`` is the metric's power (:func:`~privmtl.linear.local.variational_factor`): every
    candidate cut is scored, and the winner refitted, with the metric of that power.
    Returns ``(A, rho, info)``: ``rho`` is None for a fixed floor (the caller chooses the weights
    as before); ``info`` is the JSON-ready description of the floor (grid, candidates, winner, the
    vote's noisy counts and ε).
    """
    info: dict[str, Any] = {
        "mode": plan.mode,
        "grid": list(plan.grid),
        "edge": plan.edge,
        "privacy_cut": 0.0 if shift is None else -shift,
        "reason": plan.reason,
        "vote_share": plan.share,
    }

    def metric(tau: float) -> FloatArray:
        s = floored_shift(shift, tau * plan.edge)
        return variational_factor(Sigma, penalty="lowrank", shift=s, floor=refit_floor, power=power)

    if plan.mode == "fixed":
        info.update(floor=plan.floor, cut=_cut(shift, plan.floor * plan.edge), vote_epsilon=0.0)
        return metric(plan.floor), None, info
    vote = plan.vote()
    event = vote.event()
    if (
        vote.private
        and ledger is not None
        and not (replay_ok and ledger.has_release(FLOOR_VOTE_ID))
        and ledger.would_exceed(event)
    ):
        info.update(
            mode="fixed",
            floor=plan.floor,
            cut=_cut(shift, plan.floor * plan.edge),
            vote_epsilon=0.0,
            vote_share=0.0,
            reason="the vote would exceed the ledger's budget: not held, the default floor",
        )
        return metric(plan.floor), None, info
    metrics, rhos = [], []
    scores = np.empty((batch.n_tasks, len(plan.candidates)))
    for j, c in enumerate(plan.candidates):
        A = metric(plan.grid[c])
        table = ridge_cv_losses(batch, loss, A=A, seed=cv_seed)
        scores[:, j] = table.min(axis=0)
        metrics.append(A)
        rhos.append(best_ridge(table))
    votes = client_votes(scores, higher_is_better=False)
    res = vote.select(
        votes,
        noise,
        ledger=ledger if vote.private else None,
        release_id=FLOOR_VOTE_ID,
        replay_ok=replay_ok,
        delta=delta,
        accountant=accountant,
    )
    winner = median_winner(res.noisy_counts)
    tau = plan.grid[plan.candidates[winner]]
    info.update(
        floor=tau,
        cut=_cut(shift, tau * plan.edge),
        rule="median",
        candidates=[plan.grid[c] for c in plan.candidates],
        candidate_cuts=[_cut(shift, plan.grid[c] * plan.edge) for c in plan.candidates],
        noisy_counts=list(res.noisy_counts),
        vote_noise_std=vote.noise_std,
        vote_epsilon=vote.epsilon(delta, accountant=accountant),
        abstained=int(np.sum(votes < 0)),
    )
    return metrics[winner], rhos[winner], info


def _cut(shift: float | None, cut_floor: float) -> float:
    s = floored_shift(shift, cut_floor)
    return 0.0 if s is None else -s


def check_grid(grid: Any) -> tuple[float, ...]:
    """Validate a floor grid: a strictly increasing sequence of finite numbers ≥ 0 (the vote's
    median needs the candidates in the order of their cuts)."""
    try:
        values = tuple(float(g) for g in grid)
    except (TypeError, ValueError):
        values = ()
    if (
        not values
        or not all(math.isfinite(g) and g >= 0 for g in values)
        or (list(values) != sorted(set(values)))
    ):
        raise InvalidParameterError(
            "The 'floor_grid' parameter must be a non-empty, strictly increasing sequence of finite "
            f"numbers >= 0 (multiples of the estimation-noise edge); got {grid!r}."
        )
    return values
