"""Model-protected multi-task learning (MP-MTL, Liang et al.): Algorithms 2, 3, 4 and 5.

Linear tasks ``i = 1..m`` own ``X_i`` (``n_i x d``) and ``y_i``; the model matrix is
``W = [w_1 .. w_m]`` (``d x m``). The estimators approximate proximal gradient descent on::

    min_W  sum_i L_i(w_i) + lam * g(W),
    L_i(w) = (1/n_i) sum_j l(x_ij^T w, y_ij) + (mu/2) ||w||^2

(``l`` is ``0.5 (s - y)^2`` or the logistic loss, see :mod:`privmtl.linear.losses``), with
``g = ||W||_*`` (:class:`MPMTLLowRank`), ``g = ||W||_{2,1}`` (:class:`MPMTLGroupSparse`) or the
decomposition ``W = P + Q`` with ``lam ||P||_* + lam_sparse ||Q||_1`` (:class:`MPMTLLowRankSparse`).

Every iteration ``t = 0..T-1`` does exactly (Alg. 2/3 of the paper, 0-based here)::

    W~    = clip_columns(W, K)                         # each task, locally
    S~    = W~ W~^T                                    # curator (d x d)
    S     = schedule.release(t, S~, rng)               # the only privatized message
    M_i   = U diag(max(0, 1 - eta_i*lam/sqrt(Lambda))) U^T  with U Lambda U^T = S  (low rank;
                                                       directions with Lambda <= 0 get 0)
          = diag(max(0, 1 - eta_i*lam/sqrt(|S_jj|)))                            (group sparse)
    w^_i  = M_i w~_i                                   # each task, locally
    z_i   = w^_i + beta_t (w^_i - w^_i_prev)
    w_i   = z_i - eta_i * grad L_i(z_i)

and returns ``coef_ = W^^(T)``, the last projected models ``w^_i`` (the paper's output; the
final local gradient step is skipped since it would not reach the output). ``eta_i = 1/L_i`` is
task i's own step (:func:`~privmtl.linear.common.task_steps`). Only ``S``
depends on other tasks, so each task's output is post-processing of the covariance releases: the
guarantee is the one of the :class:`~privmtl.privacy.covariance.CovarianceSchedule` (MP-MTL, the
whole task — data and model sequence — is the unit of privacy). The schedule is planned by
:func:`privmtl.privacy.covariance.plan_covariance_releases`; solvers never compute ε themselves.

The protocol is written once, as explicit state and steps (:class:`MPMTLState`): every task hands
its model to the :class:`CovarianceCurator`, which clips, forms the covariance, checks the budget,
records the release in the run's :class:`~privmtl.privacy.ledger.PrivacyLedger` (on disk first when
the ledger is durable: write-ahead) and only then adds the noise; :class:`TaskStep` then applies the
release to every task (projection, momentum, local gradient step). What differs between Algorithms
2, 3, 4 and the ``W~^T W~`` variant is a small strategy (the projection given a release, and Alg. 4's
sparse part). The noise is secure (OS entropy) by default, or seeded from ``random_state`` for
reproducible simulation; the state can be checkpointed and resumed (``checkpoint_dir``).

Performance: the per-iteration cost is one ``d x d`` symmetric eigendecomposition (the PSD fix of a
Gaussian release is folded into it), ``d x d x m`` matrix products (``W~ W~^T``, and ``U (S U^T W~)``
restricted to the cheaper of the kept or shrunk eigenvectors; BLAS) and the batched gradients of a zero-padded
:class:`~privmtl.linear.losses.TaskBatch` (``O(m n_max d)``, no Python loop over tasks).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Real
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import scipy.linalg
from numpy.typing import ArrayLike, NDArray
from sklearn.base import BaseEstimator

from privmtl._validation import (
    Boolean,
    Interval,
    Options,
    check_choice,
    check_rng,
    validate_params,
)
from privmtl.exceptions import DataFormatError, InvalidParameterError
from privmtl.io import arrays_sha256
from privmtl.linear.common import (
    PreparedTasks,
    _clip_columns,
    _LinearMTLMixin,
    resolve_delta,
    task_steps,
)
from privmtl.linear.eigen_floor import (
    FLOOR_GRID,
    FLOOR_VOTE,
    POWER_AUTO,
    VOTE_SHARE,
    auto_refit_power,
    check_grid,
    plan_floor,
    refit_metric,
)
from privmtl.linear.local import (
    TRACE_POWER,
    _apply_lowrank_left,
    _apply_lowrank_right,
    _group_shrink,
    local_ridge,
    refit_with_metric,
    select_ridge_per_task,
    variational_factor,
)
from privmtl.linear.losses import LOSSES, TaskBatch, public_lipschitz_bound
from privmtl.linear.spec import DEFAULT_ITERATIONS, SPEC, MPMTLSpec, spec_constraints
from privmtl.locking import DirectoryLock
from privmtl.privacy.curator import ReleaseCurator
from privmtl.privacy.ledger import PrivacyLedger, warn_budget_stop
from privmtl.privacy.mechanisms import sample_l2_laplace
from privmtl.privacy.noise import NoiseSource, NumpySeededNoise, SecureNoise
from privmtl.privacy.selection import VOTE_MECHANISM

__all__ = [
    "CALLBACK_STAGES",
    "CHECKPOINT_KIND",
    "CovarianceCurator",
    "CovarianceRelease",
    "MPMTLGroupSparse",
    "MPMTLLowRank",
    "MPMTLLowRankSparse",
    "MPMTLState",
    "PreparedTasks",
    "TaskStep",
    "local_ridge",
    "sample_l2_laplace",
    "task_steps",
]

FloatArray = NDArray[np.float64]

COVARIANCES = ("WWt", "WtW")
ALLOCATIONS = ("power", "geometric")
EIGEN_FIXES = ("shift", "denoise", "clip", "none")
#: ``init_alpha="cv"`` / ``refit_lam="cv"``: every task chooses its own ridge weight by k-fold
#: cross-validation on its own samples (:func:`~privmtl.linear.local.select_ridge_per_task`).
CV = "cv"


# --------------------------------------------------------------------------------------------------
# the shared solver
# --------------------------------------------------------------------------------------------------
_COMMON_PARAMS_DOC = """
    lam : float, default=1.0
        Regularization weight ``lam >= 0`` of the structured penalty.
    epsilon : float or None, default=None
        Total MP-MTL budget ε over the T covariance releases. ``None`` ⇒ non-private (the covariance
        is used without noise; the solver is then exactly the non-private proximal-gradient method).
    delta : float, "paper" or None, default=None
        δ of the guarantee; ``None`` ⇒ ``min(1e-5, 1/(100 m))`` at fit time
        (:func:`~privmtl.privacy.delta.user_data_delta`, below ``1/m`` as DP practice asks);
        ``"paper"`` ⇒ the MP-MTL paper's ``1/(m log m)``, for reproductions.
    noise : {"gaussian", "wishart"}, default="gaussian"
        Covariance mechanism. ``"gaussian"`` is the Analyze-Gauss mechanism with RDP/PLD accounting
        (a valid guarantee); ``"wishart"`` is the published Wishart step, kept for reproduction: its
        claimed ε-DP does not hold (SPEC §4) and ``privacy_`` then carries ``valid=False`` and the real δ.
    clip : float, default=1.0
        Clipping norm K: every task model is rescaled to ``||w_i|| <= K`` before sharing. With the
        local refit, a K below the models' norms shares their directions (each clipped model has
        norm K), which is what the refit's metric needs; the noise grows with K².
    iterations : int, default=1
        Number of iterations T (= number of covariance releases). The default spends the whole
        budget on one release of the tasks' own ridge models' covariance, which the local refit
        then uses (the paper's Algorithm 2 uses many, e.g. 50, with ``refit_lam=None``).
    step_size : float or None, default=None
        η, the same for every task; ``None`` ⇒ every task its own step ``η_i = 1/L_i`` with
        ``L_i`` the Lipschitz constant of its own ``grad L_i`` (``1/(2 L_i)`` for the low-rank +
        sparse estimator, whose gradient in (P, Q) is ``2 L_i``-Lipschitz), computed from task
        i's rows only (:func:`~privmtl.linear.common.task_steps`): no task's trajectory depends on
        another task's data except through the releases. Task i's projection threshold is
        ``η_i lam``; when all ``L_i`` are equal this is exactly the paper's iteration.
    accelerate : bool, default=True
        Momentum β_t = (t-1)/(t+2) (t = 1..T, convex case, μ = 0) or, per task,
        β_i = (1-√(μ/L_i))/(1+√(μ/L_i)) (μ > 0); β_t = 0 when False.
    mu : float, default=0.0
        Strong-convexity weight: ``(mu/2)||w_i||^2`` is added to every L_i (the paper uses 1e-3).
    allocation : {"power", "geometric"}, default="power"
        Budget allocation ε_t ∝ t^α or ε_t ∝ Q^{-t} (paper §4.5), ε₀ the largest with CB ≤ ε.
    alpha : float or None, default=None
        α of the power allocation; ``None`` ⇒ the paper's optimum, 0 without and 2/5 with acceleration.
    Q : float or None, default=None
        Q of the geometric allocation; ``None`` ⇒ the paper's optimum, ``(1-μ/L)^{2/5}`` without and
        ``(1-√(μ/L))^{1/5}`` with acceleration (1, i.e. uniform, when μ = 0), evaluated at the
        public bound ``L = c + μ`` of unit-norm rows
        (:func:`~privmtl.linear.losses.public_lipschitz_bound`): the allocation is part of the
        privacy schedule, so it reads no task's data.
    covariance : {"WWt", "WtW"}, default="WWt"
        ``"WWt"``: the d x d feature covariance of Alg. 2/3. ``"WtW"``: the m x m task covariance
        (Alg. 1 alternative); the low-rank projection is then applied from the right,
        ``W^ = W~ M`` with ``M = V diag(max(0, 1 - ηλ/√Λ)) V^T`` and ``V Λ V^T`` the released
        ``W~^T W~`` (the same singular-value thresholding). Each task's output then mixes the other
        tasks' *unperturbed* clipped models, so this variant has **no** MP-MTL guarantee
        (``privacy_.valid`` is False), whatever the noise on the covariance.
    loss : {"squared", "logistic"}, default="squared"
        Per-sample loss; logistic labels are in {0, 1}.
    relation : {"add-remove", "replace-one"}, default="add-remove"
        Neighbouring relation of the guarantee (one whole task added/removed or replaced).
    accountant : str or None, default=None
        Passed to the covariance planner (e.g. ``"rdp"``, ``"pld"``); None ⇒ the planner's default.
    eigen_fix : {"denoise", "shift", "clip", "none"}, default="denoise"
        Post-processing of a released Gaussian covariance (the planner's PSD fix, applied here to
        the eigenvalues of the one eigendecomposition per iteration): ``"denoise"`` drops the
        eigenvalues the noise alone can produce (below the noise edge; under pure noise nothing is
        kept, the refit metric is then the identity and the output single-task ridge);
        ``"shift"`` adds ``c_t = shift_scale * sigma_t * sqrt(dim)`` to every eigenvalue and clips
        at 0, so that under high noise M -> I (single-task learning, Prop. 1); ``"clip"`` only
        clips negative eigenvalues (less shrinkage bias at moderate noise, but no STL limit);
        ``"none"``: raw. Ignored for Wishart noise (positive definite already).
    instance_epsilon : float or None, default=None
        Alg. 5 (appendix B): each task additionally perturbs its clipped model before the covariance
        step, ``w-_i = clip(w~_i + b_i, K)`` with density ``p(b_i) ∝ exp(-ε_dp,t ||b_i|| / (2K))``
        (ℓ2 sensitivity 2K); ε_dp,t follow the same allocation shape and sum to ``instance_epsilon``
        (pure ε, basic composition = CB with δ = 0). ``instance_privacy_`` reports the IP-MTL
        guarantee. The perturbed models are clipped to K again before the covariance step: the
        paper's proof of Prop. 4 bounds the covariance density ratio at perturbed models, whose
        norm is not bounded by K, so without re-clipping the covariance release would have
        unbounded sensitivity. Only the shared (curator-side) copy is perturbed; each task projects
        its own clean clipped model (its own state is never released unperturbed). None ⇒ off.
    refit_lam : float, "cv" or None, default="cv"
        ``None``: the output is the paper's, ``W^(T)`` (projected clipped models). A float ``rho > 0``
        or ``"cv"`` replaces it by a *local variational refit* against the last release ``S``
        (``"cv"``: every task chooses its own ``rho`` by cross-validation on its own samples given
        ``S``, :func:`~privmtl.linear.local.select_ridge_per_task`; ``refit_lam_`` holds the
        choices): every task
        solves ``argmin_w L_i(w) + (rho/2) w^T D^-1 w`` on its own data (μ not included), with
        ``D = (max(Lambda + c_T, 0)^(1/2) + tau)`` in the eigenbasis of ``S`` (diagonal of ``S``
        for the group-sparse estimator), normalised to mean eigenvalue 1 — one W-step of the
        alternating minimisation of the trace-norm (l2,1) problem in its variational form
        (Argyriou et al. 2008; :mod:`privmtl.linear.local`). It reads only the task's own data and
        the private release, so the MP-MTL guarantee is unchanged; unlike the projection it uses
        unclipped data, so clipping biases nothing, and it keeps the STL limit (pure noise ⇒
        ``D = I`` ⇒ ridge with weight ``rho``). Not available for the low-rank + sparse estimator
        or ``covariance="WtW"`` (pass ``refit_lam=None`` there).
    refit_floor : float, default=1e-3
        ``tau = refit_floor * K * sqrt(m)`` (``K sqrt(m)`` bounds ``sqrt(Lambda)``), so that ``D > 0``.
    refit_power : "auto" or float > 0, default="auto"
        Low-rank refit only (the group-sparse refit keeps the l2,1 metric, power 1/2): the power
        p of the refit's metric ``D ∝ max(Lambda + c_T, 0)^p`` (:func:`~privmtl.linear.local.
        variational_factor`). 0.5 is the trace norm's variational W-step; 1 makes ``D`` the
        denoised released covariance itself, i.e. the refit is each task's posterior mean under
        the Gaussian prior that covariance describes (empirical-Bayes generalized ridge), which
        leans harder on the top released directions. ``"auto"``: 1 where the last release's
        noise norm ``2 sigma sqrt(d)`` is at most half the estimation-noise edge
        ``e = K^2 (sqrt(m) + sqrt(d))^2 / d`` (non-private runs included), else 0.5
        (:func:`~privmtl.linear.eigen_floor.auto_refit_power`; public quantities only, no budget
        spent). ``refit_power_`` holds the power used.
    eigen_floor : "vote" or float >= 0, default="vote"
        Low-rank refit only: the refit keeps the eigen-directions of the release above
        ``max(2 sigma sqrt(d), eigen_floor * e)`` with ``e = K^2 (sqrt(m) + sqrt(d))^2 / d``, the
        top eigenvalue of m random clipped models (:mod:`privmtl.linear.eigen_floor`). A number
        fixes the floor (0: the privacy cut alone). ``"vote"``: the tasks choose it from
        ``floor_grid`` by a noisy vote recorded in the ledger (each task scores every distinct cut
        of the same release on its own samples; the median of the noisy counts wins), which takes
        ``vote_share`` of the budget from the releases so that ε stays the target; no vote, and
        the floor 0, where the grid's floors are all under the privacy cut or the vote's noise
        would exceed m/4. ``eigen_floor_`` describes the choice.
    floor_grid : sequence of float, default=(0.0, 0.5, 1.0, 2.0)
        The public grid of the vote (multiples of ``e``; strictly increasing).
    vote_share : float in (0, 1), default=0.05
        The vote's share of the budget (of the precision of the Gaussian releases).
    init : {"zeros", "stl"} or array of shape (d, m), default="stl"
        Initial task models W^(0). ``"stl"``: every task's own ridge solution
        ``argmin L_i(w) + ((init_alpha + mu)/2)||w||^2`` (local, no privacy cost; the paper allows
        "initial task models acquired via arbitrary STL methods", and its analysis assumes them).
    init_alpha : float or "cv", default="cv"
        Ridge weight of the ``"stl"`` initialization; ``"cv"``: every task chooses its own by
        cross-validation on its own samples (``init_alpha_`` holds the choices).
    random_state : None, int or numpy.random.Generator, default=None
        Source of all noise when ``noise_source="seeded"`` (same seed ⇒ same result); unused by
        secure noise.
    noise_source : {"secure", "seeded"}, default="secure"
        Where the noise of the covariance releases (and of Alg. 5) comes from: ``"secure"`` draws
        from the operating system's entropy (:class:`~privmtl.privacy.noise.SecureNoise`; not
        reproducible, never checkpointed); ``"seeded"`` from ``random_state`` — reproducible
        bit for bit, for research simulation only (anyone who knows the seed can subtract the
        noise). ``privacy_.noise_source`` states it.
    budget_epsilon : float or None, default=None
        Stop before the covariance release that would take the ledger's ε above this budget; the
        model is then the output rule applied to the state reached (``stopped_on_budget_``).
        Gaussian releases only (the ledger cannot account the Wishart step).
    checkpoint_dir : str, path or None, default=None
        Directory of the run's durable privacy ledger (``ledger.jsonl``, every release recorded
        before it is used) and of its atomic checkpoints (:mod:`privmtl.checkpoint`): iteration,
        models, momentum and sparse state, and the noise generator's state in seeded mode.
    checkpoint_every : int, default=1
        Iterations between checkpoints (the starting point and the end are always saved).
    resume : bool, default=False
        Continue the run checkpointed in ``checkpoint_dir``; a checkpoint of another configuration,
        data or format version is refused naming what differs. A seeded run resumed after a crash
        ends exactly as the uninterrupted one, its repeated releases not charged twice; a secure
        run charges the repeated releases again (fresh noise).
    callback : callable or None, default=None
        ``callback(stage, t)`` at ``"recorded"`` (release ``t`` is in the ledger and not yet
        used), ``"iteration"`` (iteration ``t`` applied) and ``"checkpoint"`` (state of ``t``
        releases saved): lets a caller observe or interrupt the run between its steps.
"""

_FITTED_DOC = """
    Attributes
    ----------
    coef_ : ndarray of shape (d, m)
        Final models ``W^(T)`` (columns are tasks).
    privacy_ : PrivacyGuarantee
        MP-MTL guarantee of the covariance releases (from the schedule; ``valid=False`` for Wishart
        and for ``covariance="WtW"``).
    instance_privacy_ : PrivacyGuarantee or None
        IP-MTL guarantee of the Alg.-5 perturbation (None when ``instance_epsilon`` is None).
    noise_to_signal_ : ndarray of shape (T,)
        ``||E||_F / ||S~||_F`` per iteration, E = the raw noise of the release before the eigenvalue
        fix (paper Fig. 5); 0 when non-private, inf when ``S~ = 0``. A curator diagnostic computed
        from the *un-noised* covariance of all tasks: not covered by ``privacy_`` (for analysis
        only; do not publish it alongside the models).
    epsilons_ : ndarray of shape (T,) or None
        Per-release budgets / noise parameters reported by the schedule (``per_release``).
    init_alpha_ : ndarray of shape (m,) or None
        Every task's ridge weight of the ``"stl"`` start (None for other starts).
    refit_lam_ : ndarray of shape (m,) or None
        Every task's refit weight (None without the refit).
    refit_power_ : float or None
        The power of the low-rank refit's metric (None without a low-rank refit).
    eigen_floor_ : dict or None
        The low-rank refit's floor: ``mode`` ("vote" or "fixed"), ``grid``, ``edge``,
        ``privacy_cut``, ``floor`` and ``cut`` used, ``vote_share``, ``vote_epsilon`` (the vote's
        own ε, 0 without a vote), ``reason``; with a vote also ``candidates``,
        ``candidate_cuts``, ``noisy_counts``, ``vote_noise_std``, ``rule`` and ``abstained``.
        None where the floor does not apply (no low-rank refit).
    step_size_ : ndarray of shape (m,)
        η_i used by every task.
    lipschitz_ : ndarray of shape (m,)
        L_i, the Lipschitz constant of every task's ``grad L_i`` (including μ), from its own data.
    delta_ : float
        δ used.
    n_iter_ : int
        Number of iterations run (T, or fewer when stopped on budget).
    stopped_on_budget_ : bool
        True when the run stopped before a release that would have exceeded ``budget_epsilon``.
    noise_source_ : {"secure", "seeded", "none"}
        The noise source used; ``"none"`` when the fit added no noise (``epsilon=None``).
    ledger_ : PrivacyLedger
        Every covariance release of the run (durable in ``checkpoint_dir``); ``privacy_.epsilon``
        is its ε for Gaussian releases.
    resumed_from_ : int or None
        Iteration of the checkpoint the fit resumed from.
    state_ : MPMTLState
        The protocol state reached.
"""


# --------------------------------------------------------------------------------------------------
# the protocol: explicit state, a curator step, a task step, one loop
# --------------------------------------------------------------------------------------------------
CALLBACK_STAGES = ("recorded", "iteration", "checkpoint")
SEEDED_NOISE_NOTE = (
    "seeded noise (noise_source='seeded', --reproducible-noise): anyone who knows the seed can "
    "regenerate and subtract it; for research simulation only, it protects nobody"
)
CHECKPOINT_KIND = "mpmtl"


@dataclass
class MPMTLState:
    """Everything an MP-MTL run needs to continue after ``iteration`` releases (serializable).

    Attributes
    ----------
    iteration : int
        Number of covariance releases made (the index of the next one).
    W : ndarray of shape (d, m)
        The tasks' models after their last local gradient step (``W^(0)`` initially).
    W_hat_prev : ndarray of shape (d, m)
        The tasks' last projected models (momentum term, and the output ``W^(t)``); ``clip(W^(0))``
        before the first release.
    Q, Q_hat_prev : ndarray of shape (d, m) or None
        Sparse part and its last soft-thresholded value (low-rank + sparse estimator only).
    noise_to_signal : ndarray of shape (T,)
        ``||E||_F / ||S~||_F`` of the releases made so far (0 after them).
    last_release : ndarray or None
        The last released matrix (raw, before the eigenvalue fix), for the local refit.
    last_shift : float or None
        Its eigenvalue shift (see :func:`privmtl.privacy.covariance.eigen_shift`).
    stopped_on_budget : bool
        True when the next release would have exceeded ``budget_epsilon``.
    """

    iteration: int
    W: FloatArray
    W_hat_prev: FloatArray
    Q: FloatArray | None
    Q_hat_prev: FloatArray | None
    noise_to_signal: FloatArray
    last_release: FloatArray | None = None
    last_shift: float | None = None
    stopped_on_budget: bool = False

    _ARRAYS = ("W", "W_hat_prev", "Q", "Q_hat_prev", "noise_to_signal", "last_release")

    def to_dict(self) -> dict[str, Any]:
        """Tensors and JSON scalars (for :func:`privmtl.checkpoint.save_checkpoint`)."""
        import torch

        out: dict[str, Any] = {
            "iteration": int(self.iteration),
            "last_shift": self.last_shift,
            "stopped_on_budget": bool(self.stopped_on_budget),
        }
        for name in self._ARRAYS:
            value = getattr(self, name)
            out[name] = None if value is None else torch.from_numpy(np.array(value, copy=True))
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MPMTLState:
        """Inverse of :meth:`to_dict` (float64 bits preserved)."""

        def arr(name: str) -> FloatArray | None:
            value = data[name]
            if value is None:
                return None
            return np.asarray(value.numpy(), dtype=np.float64).copy()

        W, W_hat_prev, nsr = arr("W"), arr("W_hat_prev"), arr("noise_to_signal")
        assert W is not None and W_hat_prev is not None and nsr is not None
        shift = data["last_shift"]
        return cls(
            iteration=int(data["iteration"]),
            W=W,
            W_hat_prev=W_hat_prev,
            Q=arr("Q"),
            Q_hat_prev=arr("Q_hat_prev"),
            noise_to_signal=nsr,
            last_release=arr("last_release"),
            last_shift=None if shift is None else float(shift),
            stopped_on_budget=bool(data["stopped_on_budget"]),
        )


@dataclass(frozen=True)
class CovarianceRelease:
    """One release of the curator: ``Sigma`` (raw, symmetrized) and its eigenvalue shift.

    ``shared`` are the clipped models the curator saw; only the ``covariance="WtW"`` projection
    uses them (which is why that variant has no MP-MTL guarantee).
    """

    iteration: int
    Sigma: FloatArray
    shift: float | None
    shared: FloatArray
    noise_to_signal: float


class CovarianceCurator(ReleaseCurator):
    """The MP-MTL curator: clip → ``W~W~^T`` → budget check → ledger record → noisy release.

    The ledger entry (mechanism ``schedule.mechanism``, the schedule's event and parameters of
    release ``t``, ``release_id="covariance:t"``) is recorded — on disk, when the ledger is durable —
    *before* the noise is drawn and the release leaves (write-ahead), through the gate of
    :class:`~privmtl.privacy.curator.ReleaseCurator`: a seeded run resumed from a checkpoint
    repeats bit-identical releases, whose ids are in the ledger already, so they are not charged
    again; a secure run's repeat is a new release (fresh noise) and is charged.

    Parameters
    ----------
    schedule : CovarianceSchedule
    covariance : {"WWt", "WtW"}
    clip : float
        K: the curator clips every model to norm K before forming the covariance (the schedule
        of the ``"WtW"`` variant is planned with a larger equivalent clip, see ``_plan``).
    noise : NoiseSource
    ledger : PrivacyLedger
    eigen_fix : str
        The fix whose shift accompanies every release (:meth:`CovarianceSchedule.eigen_shift`).
    notify : callable or None
        ``notify("recorded", t)`` once the entry is written and before the release is used.
    """

    def __init__(
        self,
        schedule: Any,
        *,
        covariance: str,
        clip: float,
        noise: NoiseSource,
        ledger: PrivacyLedger,
        eigen_fix: str,
        notify: Callable[[str, int], None] | None = None,
    ) -> None:
        super().__init__(ledger=ledger, noise=noise)
        self.schedule = schedule
        self.covariance = covariance
        self.clip = clip
        self.eigen_fix = eigen_fix
        self.notify = notify

    release_kind = "covariance"

    def release_id(self, t: int) -> str:
        """The ledger id of release ``t``."""
        return self.release_id_at(t)

    def would_exceed_budget(self, t: int) -> bool:
        """True when release ``t`` is new and would take the ledger above its budget."""
        return self.would_exceed(self.schedule.event(t), self.release_id(t))

    def release(self, t: int, messages: FloatArray) -> CovarianceRelease:
        """Release ``t`` of the covariance of the tasks' ``messages`` (their models, d x m)."""
        shared = _clip_columns(messages, self.clip)
        cov = shared.T @ shared if self.covariance == "WtW" else shared @ shared.T
        self.record(
            self.schedule.event(t),
            release_id=self.release_id(t),
            round=t,
            mechanism=self.schedule.mechanism,
            params=self.schedule.params(t),
        )
        if self.notify is not None:
            self.notify("recorded", t)
        Sigma = np.asarray(self.schedule.noisy(t, cov, self.noise), dtype=np.float64)
        Sigma = 0.5 * (Sigma + Sigma.T)
        cov_norm = float(np.linalg.norm(cov))
        err = float(np.linalg.norm(Sigma - cov))  # ||E||_F of the raw release
        nsr = err / cov_norm if cov_norm > 0 else (0.0 if err == 0 else math.inf)
        shift = (
            None if self.schedule.noise == "none" else self.schedule.eigen_shift(t, self.eigen_fix)
        )
        return CovarianceRelease(t, Sigma, shift, shared, nsr)


class _Strategy:
    """What differs between the MP-MTL algorithms: the projection given a release (and Alg. 4's
    sparse part). ``project(release, own, thr)`` maps the task's own clipped models to ``W^``."""

    name = "base"
    decomposed = False
    refit_penalty: str | None = None

    def project(self, release: CovarianceRelease, own: FloatArray, thr: FloatArray) -> FloatArray:
        raise NotImplementedError


class _LowRank(_Strategy):
    """Alg. 2: ``W^ = U diag(max(0, 1 - thr/sqrt(Λ))) U^T W~`` from the released ``W~W~^T``."""

    name = "lowrank"
    refit_penalty = "lowrank"

    def project(self, release: CovarianceRelease, own: FloatArray, thr: FloatArray) -> FloatArray:
        return _apply_lowrank_left(release.Sigma, thr, own, release.shift)


class _LowRankTaskCovariance(_Strategy):
    """Alg. 1 alternative (``covariance="WtW"``): ``W^ = W~ V diag(...) V^T`` from ``W~^T W~``."""

    name = "lowrank-WtW"

    def project(self, release: CovarianceRelease, own: FloatArray, thr: FloatArray) -> FloatArray:
        return _apply_lowrank_right(release.Sigma, thr, release.shared, own, release.shift)


class _GroupSparse(_Strategy):
    """Alg. 3: ``W^ = diag(max(0, 1 - thr/sqrt(S_jj))) W~`` (after the eigenvalue fix)."""

    name = "groupsparse"
    refit_penalty = "groupsparse"

    def project(self, release: CovarianceRelease, own: FloatArray, thr: FloatArray) -> FloatArray:
        Sigma, shift = release.Sigma, release.shift
        if shift is None:
            diag = np.abs(np.diag(Sigma))
        else:
            vals, U = scipy.linalg.eigh(Sigma, check_finite=False, driver="evd")
            diag = (U * U) @ np.maximum(vals + shift, 0.0)
        shrink = _group_shrink(diag, thr)
        return (shrink if shrink.ndim == 2 else shrink[:, None]) * own


class _LowRankSparse(_Strategy):
    """Alg. 4: the low-rank part projected as in Alg. 2 (or its WtW variant), plus a local
    entry-wise soft-thresholded sparse part."""

    name = "lowrank-sparse"
    decomposed = True

    def __init__(self, lowrank: _Strategy) -> None:
        self.lowrank = lowrank

    def project(self, release: CovarianceRelease, own: FloatArray, thr: FloatArray) -> FloatArray:
        return self.lowrank.project(release, own, thr)


def _strategy(penalty: str, covariance: str) -> _Strategy:
    lowrank: _Strategy = _LowRankTaskCovariance() if covariance == "WtW" else _LowRank()
    if penalty == "groupsparse":
        return _GroupSparse()
    if penalty == "lowrank-sparse":
        return _LowRankSparse(lowrank)
    return lowrank


class TaskStep:
    """The tasks' side of an iteration, batched over tasks (each column only reads its own data).

    :meth:`messages` is what every task hands to the curator (its model; under Alg. 5 its clipped
    model plus l2-Laplace noise); :meth:`update` is the local step given the release: projection
    (through the strategy), momentum, the sparse part of Alg. 4, and a gradient step on the task's
    own loss (skipped after the last release: the output is the projection ``W^(T)``).
    """

    def __init__(
        self,
        strategy: _Strategy,
        batch: TaskBatch,
        *,
        loss: str,
        clip: float,
        eta: FloatArray,
        lam: float,
        mu: float,
        lam_sparse: float,
        beta: Callable[[int], float | FloatArray],
        iterations: int,
        instance_epsilons: FloatArray | None,
        noise: NoiseSource,
        rng: np.random.Generator,
    ) -> None:
        self.strategy = strategy
        self.batch = batch
        self.loss: Any = loss
        self.clip = clip
        self.eta = eta
        self.lam = lam
        self.mu = mu
        self.lam_sparse = lam_sparse
        self.beta = beta
        self.iterations = iterations
        self.instance_epsilons = instance_epsilons
        self.noise = noise
        self.rng = rng

    def messages(self, state: MPMTLState) -> FloatArray:
        """The models sent to the curator for release ``state.iteration``."""
        if self.instance_epsilons is None:
            return state.W
        Wc = _clip_columns(state.W, self.clip)
        d, m = Wc.shape
        scale = 2.0 * self.clip / self.instance_epsilons[state.iteration]
        return Wc + _l2_laplace(self.noise, self.rng, d, scale, m)

    def update(self, state: MPMTLState, release: CovarianceRelease) -> None:
        """Apply release ``t = state.iteration`` to every task, in place, and advance ``t``."""
        t = state.iteration
        eta = self.eta
        if self.instance_epsilons is None:
            # the curator clipped exactly the task's own model: the same array, not recomputed
            Wc = release.shared
        else:
            Wc = _clip_columns(state.W, self.clip)
        W_hat = self.strategy.project(release, Wc, eta * self.lam)
        bt = self.beta(t + 1)
        momentum = bool(np.any(bt))
        Z = W_hat + bt * (W_hat - state.W_hat_prev) if momentum else W_hat
        Q_hat = None
        if self.strategy.decomposed:
            assert state.Q is not None
            Q_hat = np.sign(state.Q) * np.maximum(np.abs(state.Q) - eta * self.lam_sparse, 0.0)
        if t < self.iterations - 1:  # the last gradient step would not reach the output W^(T)
            if self.strategy.decomposed:
                assert Q_hat is not None and state.Q_hat_prev is not None
                Zq = Q_hat + bt * (Q_hat - state.Q_hat_prev) if momentum else Q_hat
                G = self.batch.gradients(self.loss, Z + Zq, mu=self.mu)
                state.W = Z - eta * G
                state.Q = Zq - eta * G
            else:
                G = self.batch.gradients(self.loss, Z, mu=self.mu)
                state.W = Z - eta * G
        state.W_hat_prev = W_hat
        if Q_hat is not None:
            state.Q_hat_prev = Q_hat
        state.noise_to_signal[t] = release.noise_to_signal
        state.last_release = release.Sigma
        state.last_shift = release.shift
        state.iteration = t + 1


def _l2_laplace(
    noise: NoiseSource, rng: np.random.Generator, dim: int, scale: float, size: int
) -> FloatArray:
    """Alg. 5 noise, density ∝ exp(-||b|| / scale): from ``rng`` when seeded (the same draws as
    :func:`~privmtl.privacy.mechanisms.sample_l2_laplace`), else from the secure source, with the
    Gamma(dim, scale) radius as ``scale/2`` times a chi-square with ``2 dim`` degrees of freedom
    (a sum of ``dim`` exponentials, each half the squared norm of two standard normals)."""
    if noise.kind == "seeded":
        return sample_l2_laplace(rng, dim, scale, size)
    direction = noise.normal_numpy((dim, size), 1.0)
    norms = np.linalg.norm(direction, axis=0)
    norms[norms == 0] = 1.0
    radius = 0.5 * scale * np.sum(noise.normal_numpy((2 * dim, size), 1.0) ** 2, axis=0)
    return np.asarray(direction / norms * radius, dtype=np.float64)


# checkpoint of an MP-MTL run: parameters that say where and how often, not what is computed
_RUNTIME_PARAMS = ("budget_epsilon", "callback", "checkpoint_dir", "checkpoint_every", "resume")


def _jsonable_param(value: Any) -> Any:
    if isinstance(value, np.random.Generator):
        return "numpy-generator"
    if isinstance(value, np.ndarray | list | tuple):
        arr = np.ascontiguousarray(np.asarray(value, dtype=np.float64))
        return f"array{list(arr.shape)}:sha256:{hashlib.sha256(arr.tobytes()).hexdigest()[:16]}"
    if isinstance(value, np.generic):
        return value.item()
    return value


def _data_fingerprint(batch: TaskBatch) -> str:
    """SHA-256 of the tasks' training data (features, targets, row mask, rows per task)."""
    return arrays_sha256(
        np.asarray(arr, dtype=np.float64) for arr in (batch.X, batch.y, batch.mask, batch.n)
    )


class _Checkpointer:
    """The run's ledger (durable under ``checkpoint_dir``) and its atomic checkpoints.

    Without a directory: an in-memory ledger and no checkpoint. With one: ``ledger.jsonl`` continued
    with :meth:`PrivacyLedger.open`, and the state written by
    :func:`privmtl.checkpoint.save_checkpoint` after the initial models (before any release), every
    ``checkpoint_every`` iterations and at the end.
    """

    def __init__(
        self,
        directory: Path | None,
        *,
        every: int,
        config: dict[str, Any],
        ledger_kw: dict[str, Any],
        resume: bool,
        noise_source: str,
        notify: Callable[[str, int], None] | None,
    ) -> None:
        self.directory = directory
        self.every = every
        self.config = config
        self.ledger_kw = ledger_kw
        self.ledger = PrivacyLedger(**ledger_kw)  # in memory; durable from restore() on
        self.resume = resume
        self._saved_at: int | None = None
        self.noise_source = noise_source
        self.notify = notify

    @classmethod
    def create(
        cls,
        est: Any,
        p: dict[str, Any],
        *,
        prepared: PreparedTasks,
        schedule: Any,
        delta: float,
        accountant: str,
    ) -> _Checkpointer:
        ledger_kw: dict[str, Any] = {
            "delta": delta,
            "accountant": accountant,
            "relation": p["relation"],
            "budget": p["budget_epsilon"],
        }
        common: dict[str, Any] = {
            "every": p["checkpoint_every"],
            "resume": p["resume"],
            "noise_source": p["noise_source"],
            "notify": est.callback,
        }
        if est.checkpoint_dir is None:
            return cls(None, config={}, ledger_kw=ledger_kw, **common)
        from privmtl.checkpoint import has_checkpoint

        directory = Path(est.checkpoint_dir)
        params = {
            f"param.{k}": _jsonable_param(v)
            for k, v in est.get_params(deep=False).items()
            if k not in _RUNTIME_PARAMS
        }
        ident = dict(schedule.identity())
        per = np.asarray(ident.pop("per_release"), dtype=np.float64)
        ident["per_release_sha256"] = hashlib.sha256(per.tobytes()).hexdigest()[:16]
        config = {
            "estimator": type(est).__name__,
            "data_sha256": _data_fingerprint(prepared.batch),
            "n_tasks": prepared.batch.n_tasks,
            "n_features": prepared.batch.n_features,
            **params,
            **{f"schedule.{k}": v for k, v in ident.items()},
        }
        ledger_path = directory / "ledger.jsonl"
        # one writer per directory, for as long as the fit holds this checkpointer (or the process)
        lock = DirectoryLock.acquire(directory, name="checkpoint_dir")
        try:
            if not p["resume"] and (has_checkpoint(directory) or ledger_path.exists()):
                raise InvalidParameterError(
                    f"The 'checkpoint_dir' {directory} holds a run already; pass resume=True "
                    "(--resume) to continue it, or choose a new directory."
                )
        except BaseException:
            lock.release()
            raise
        out = cls(directory, config=config, ledger_kw=ledger_kw, **common)
        weakref.finalize(out, lock.release)
        return out

    def restore(self, noise: NoiseSource) -> MPMTLState | None:
        """The checkpointed state (noise state restored in seeded mode), or None to start anew.

        Opens (or creates) the durable ledger once the checkpoint was found to be this run's.
        """
        if self.directory is None:
            return None
        from privmtl.checkpoint import has_checkpoint, load_checkpoint

        state: MPMTLState | None = None
        seen = None
        if self.resume and has_checkpoint(self.directory):
            saved, manifest = load_checkpoint(
                self.directory, kind=CHECKPOINT_KIND, config=self.config
            )
            noise.load_state_dict(json.loads(saved["noise"]))
            state = MPMTLState.from_dict(saved["state"])
            state.stopped_on_budget = False  # re-checked against this run's budget
            seen = manifest.get("ledger") or {}
        self.directory.mkdir(parents=True, exist_ok=True)
        # the ledger must continue the one the checkpoint saw (deleted, cut or edited: refused)
        self.ledger = PrivacyLedger.open(
            self.directory / "ledger.jsonl",
            **self.ledger_kw,
            seen=seen,
            seen_by=f"the checkpoint of iteration {state.iteration if state else 0} in "
            f"{self.directory}",
        )
        if state is not None:
            self._saved_at = state.iteration
        return state

    def save(self, state: MPMTLState, noise: NoiseSource) -> None:
        """Write the checkpoint of ``state`` (atomic), unless it was just written."""
        if self.directory is None or self._saved_at == state.iteration:
            return
        from privmtl.checkpoint import save_checkpoint

        save_checkpoint(
            self.directory,
            kind=CHECKPOINT_KIND,
            config=self.config,
            state={"state": state.to_dict(), "noise": json.dumps(noise.state_dict())},
            step=state.iteration,
            noise_source=self.noise_source,
            ledger=self.ledger.seen(),
        )
        self._saved_at = state.iteration
        if self.notify is not None:
            self.notify("checkpoint", state.iteration)

    def maybe_save(self, state: MPMTLState, noise: NoiseSource) -> None:
        if state.iteration % self.every == 0:
            self.save(state, noise)


class _MPMTLBase(_LinearMTLMixin, BaseEstimator):
    _penalty = "lowrank"

    def __init__(
        self,
        *,
        lam: float = 1.0,
        epsilon: float | None = SPEC.epsilon,
        delta: float | str | None = SPEC.delta,
        noise: str = SPEC.noise,
        clip: float = 1.0,
        iterations: int = DEFAULT_ITERATIONS["lowrank"],
        step_size: float | None = None,
        accelerate: bool = True,
        mu: float = 0.0,
        allocation: str = "power",
        alpha: float | None = None,
        Q: float | None = None,
        covariance: str = "WWt",
        loss: str = "squared",
        relation: str = SPEC.relation,
        accountant: str | None = None,
        eigen_fix: str = "denoise",
        instance_epsilon: float | None = None,
        init: Any = "stl",
        init_alpha: float | str = CV,
        refit_lam: float | str | None = CV,
        refit_floor: float = 1e-3,
        refit_power: float | str = SPEC.refit_power,
        eigen_floor: float | str = SPEC.eigen_floor,
        floor_grid: Sequence[float] = FLOOR_GRID,
        vote_share: float = VOTE_SHARE,
        random_state: Any = None,
        noise_source: str = SPEC.noise_source,
        budget_epsilon: float | None = SPEC.budget_epsilon,
        checkpoint_dir: str | Path | None = None,
        checkpoint_every: int = SPEC.checkpoint_every,
        resume: bool = False,
        callback: Callable[[str, int], None] | None = None,
    ) -> None:
        self.lam = lam
        self.epsilon = epsilon
        self.delta = delta
        self.noise = noise
        self.clip = clip
        self.iterations = iterations
        self.step_size = step_size
        self.accelerate = accelerate
        self.mu = mu
        self.allocation = allocation
        self.alpha = alpha
        self.Q = Q
        self.covariance = covariance
        self.loss = loss
        self.relation = relation
        self.accountant = accountant
        self.eigen_fix = eigen_fix
        self.instance_epsilon = instance_epsilon
        self.init = init
        self.init_alpha = init_alpha
        self.refit_lam = refit_lam
        self.refit_floor = refit_floor
        self.refit_power = refit_power
        self.eigen_floor = eigen_floor
        self.floor_grid = floor_grid
        self.vote_share = vote_share
        self.random_state = random_state
        self.noise_source = noise_source
        self.budget_epsilon = budget_epsilon
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.resume = resume
        self.callback = callback

    # ---------------------------------------------------------------------------------- checks
    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "lam": Interval(Real, 0.0, None),
        **spec_constraints("epsilon", "delta", "noise"),
        "clip": Interval(Real, 0.0, None, closed="neither"),
        **spec_constraints("iterations", required=("iterations",)),
        "step_size": [None, Interval(Real, 0.0, None, closed="neither")],
        "accelerate": Boolean(),
        "mu": Interval(Real, 0.0, None),
        "allocation": Options(ALLOCATIONS),
        "alpha": [None, Interval(Real, None, None)],
        "Q": [None, Interval(Real, 0.0, None, closed="neither")],
        "covariance": Options(COVARIANCES),
        "loss": Options(LOSSES),
        "eigen_fix": Options(EIGEN_FIXES),
        **spec_constraints("relation"),
        # None: the spec's accountant (SPEC.accountant)
        "accountant": [None, MPMTLSpec._parameter_constraints["accountant"]],
        "instance_epsilon": [None, Interval(Real, 0.0, None, closed="neither")],
        "init_alpha": [Options((CV,)), Interval(Real, 0.0, None, closed="neither")],
        "refit_lam": [None, Options((CV,)), Interval(Real, 0.0, None, closed="neither")],
        "refit_floor": Interval(Real, 0.0, None),
        **spec_constraints("eigen_floor", "refit_power"),
        "vote_share": Interval(Real, 0.0, 1.0, closed="neither"),
        **spec_constraints("noise_source", "budget_epsilon", "checkpoint_every"),
        "resume": Boolean(),
    }
    """The declared constraint of every checked parameter (the settings an MP-MTL run shares
    with :class:`~privmtl.linear.spec.MPMTLSpec` are the spec's); ``init``, ``checkpoint_dir``,
    ``callback``, ``random_state`` and the combinations are checked in :meth:`_validate`."""

    def _validate(self) -> dict[str, Any]:
        p: dict[str, Any] = validate_params(self)
        if p["covariance"] == "WtW" and self._penalty == "groupsparse":
            raise InvalidParameterError(
                "The 'covariance' parameter must be 'WWt' for the group-sparse estimator (the l2,1 "
                "prox needs the feature norms, the diagonal of W W^T); got 'WtW'."
            )
        if isinstance(self.init, str):
            p["init"] = check_choice("init", self.init, ("zeros", "stl"))
        else:
            p["init"] = self.init
        if p["resume"] and self.checkpoint_dir is None:
            raise InvalidParameterError(
                "The 'resume' parameter needs a checkpoint_dir to resume from; got "
                "checkpoint_dir=None."
            )
        if self.callback is not None and not callable(self.callback):
            raise InvalidParameterError(
                f"The 'callback' parameter must be callable or None; got {self.callback!r}."
            )
        if p["refit_lam"] is not None and p["covariance"] == "WtW":
            raise InvalidParameterError(
                "The 'refit_lam' parameter must be None with covariance='WtW' (the refit needs the "
                f"d x d feature covariance); got {self.refit_lam!r}."
            )
        p["floor_grid"] = check_grid(self.floor_grid)
        if p["eigen_floor"] != FLOOR_VOTE and p["eigen_floor"] > 0 and not self._floor_applies(p):
            raise InvalidParameterError(
                "The 'eigen_floor' parameter must be 0 or 'vote' without a low-rank refit with "
                "eigen_fix 'denoise' or 'clip' (the floor cuts the refit's eigenvalues); got "
                f"{self.eigen_floor!r} with refit_lam={self.refit_lam!r}, "
                f"eigen_fix={self.eigen_fix!r}, covariance={self.covariance!r}."
            )
        return p

    def _floor_applies(self, p: dict[str, Any]) -> bool:
        """True when the run's output is a low-rank refit whose cut a floor can raise."""
        return (
            p["refit_lam"] is not None
            and _strategy(self._penalty, p["covariance"]).refit_penalty == "lowrank"
            and p["eigen_fix"] in ("denoise", "clip")
        )

    # ------------------------------------------------------------------------------------ fit
    def fit(
        self, Xs: Sequence[ArrayLike] | PreparedTasks, ys: Sequence[ArrayLike] | None = None
    ) -> Any:
        """Fit on per-task data ``Xs[i]`` (``n_i x d``) and ``ys[i]`` (``n_i``).

        ``Xs`` may also be a :class:`PreparedTasks` built with :meth:`prepare_tasks` (then ``ys``
        is ignored): cross-validation reuses it for every grid point of a split.
        """
        p = self._validate()
        prepared = Xs if isinstance(Xs, PreparedTasks) else self.prepare_tasks(Xs, ys)
        if prepared.loss != p["loss"]:
            raise InvalidParameterError(
                f"The prepared tasks were validated for loss={prepared.loss!r}; the estimator has "
                f"loss={p['loss']!r}."
            )
        self._fit_batch(prepared, p)
        return self

    def prepare_tasks(
        self, Xs: Sequence[ArrayLike], ys: Sequence[ArrayLike] | None
    ) -> PreparedTasks:
        """Validate and pad the tasks once (see :class:`PreparedTasks`)."""
        return PreparedTasks(Xs, ys, loss=check_choice("loss", self.loss, LOSSES))

    def _fit_batch(self, prepared: PreparedTasks, p: dict[str, Any]) -> None:
        self.init_alpha_: FloatArray | None = None
        self.refit_lam_: FloatArray | None = None
        self.eigen_floor_: dict[str, Any] | None = None
        self.refit_power_: float | None = None
        rng = check_rng(self.random_state)
        batch = prepared.batch
        m, d = batch.n_tasks, batch.n_features
        T, K, lam, mu = p["iterations"], p["clip"], p["lam"], p["mu"]
        strategy = _strategy(self._penalty, p["covariance"])
        # Every task's step comes from its own data (task_steps), never from the other tasks'.
        lips, eta = task_steps(prepared, mu, decomposed=strategy.decomposed)
        if p["step_size"] is not None:
            eta = np.full(m, float(p["step_size"]))
        delta = resolve_delta(p["delta"], m)

        # momentum and allocation defaults (paper §4.5); the allocation is part of the privacy
        # schedule, so its default uses the public Lipschitz bound, not the tasks' data
        if p["alpha"] is None:
            alpha = 0.4 if p["accelerate"] else 0.0
        else:
            alpha = p["alpha"]
        if p["Q"] is None:
            ratio_pub = min(mu / public_lipschitz_bound(p["loss"], mu), 1.0)
            Q = (1.0 - math.sqrt(ratio_pub)) ** 0.2 if p["accelerate"] else (1.0 - ratio_pub) ** 0.4
            Q = Q if Q > 0 else 1.0
        else:
            Q = p["Q"]
        ratio = np.minimum(mu / lips, 1.0)  # per task: each task's own momentum

        dim = m if p["covariance"] == "WtW" else d
        schedule = self._plan(p, delta=delta, dim=dim, alpha=alpha, Q=Q, n_tasks=m)
        # the refit's floor: a public plan, and the budget share of its vote (eigen_floor.py)
        floor_plan, schedule = plan_floor(
            p["eigen_floor"],
            grid=p["floor_grid"],
            share=p["vote_share"],
            schedule=schedule,
            eigen_fix=p["eigen_fix"],
            applicable=self._floor_applies(p),
            n_tasks=m,
            dim=d,
            clip=K,
        )
        if p["budget_epsilon"] is not None and schedule.noise != "gaussian":
            raise InvalidParameterError(
                "The 'budget_epsilon' parameter needs releases a ledger can account (epsilon set, "
                f"noise='gaussian'); got noise={p['noise']!r}, epsilon={p['epsilon']!r}."
            )

        inst_eps = None
        if p["instance_epsilon"] is not None:
            from privmtl.privacy.composition import allocation_weights

            w = allocation_weights(T, strategy=p["allocation"], alpha=alpha, Q=Q)
            inst_eps = np.asarray(p["instance_epsilon"] * w / float(w.sum()), dtype=np.float64)

        def beta(t1: int) -> float | FloatArray:  # t1 is the 1-based iteration index
            if not p["accelerate"]:
                return 0.0
            if mu > 0:
                r = np.sqrt(ratio)
                return np.asarray((1.0 - r) / (1.0 + r), dtype=np.float64)
            return (t1 - 1.0) / (t1 + 2.0)

        noise: NoiseSource = (
            NumpySeededNoise(rng) if p["noise_source"] == "seeded" else SecureNoise()
        )
        accountant = self.accountant if self.accountant is not None else SPEC.accountant
        ckpt = _Checkpointer.create(
            self,
            p,
            prepared=prepared,
            schedule=schedule,
            delta=delta,
            accountant=accountant,
        )
        state = ckpt.restore(noise)  # checks the checkpoint is this run's; opens the ledger
        self.resumed_from_ = None if state is None else state.iteration
        if state is None:
            W0 = self._initial_models(prepared, p)
            state = MPMTLState(
                iteration=0,
                W=W0,
                W_hat_prev=_clip_columns(W0, K),
                Q=np.zeros((d, m)) if strategy.decomposed else None,
                Q_hat_prev=np.zeros((d, m)) if strategy.decomposed else None,
                noise_to_signal=np.zeros(T),
            )
            ckpt.save(state, noise)  # the starting point, before any release
        ledger = ckpt.ledger
        tasks = TaskStep(
            strategy,
            batch,
            loss=p["loss"],
            clip=K,
            eta=eta,
            lam=lam,
            mu=mu,
            lam_sparse=p.get("lam_sparse", 0.0),
            beta=beta,
            iterations=T,
            instance_epsilons=inst_eps,
            noise=noise,
            rng=rng,
        )
        curator = CovarianceCurator(
            schedule,
            covariance=p["covariance"],
            clip=K,
            noise=noise,
            ledger=ledger,
            eigen_fix=p["eigen_fix"],
            notify=self.callback,
        )

        # ---- the loop, once: messages -> release (write-ahead) -> local update -> checkpoint
        while state.iteration < T and not state.stopped_on_budget:
            t = state.iteration
            messages = tasks.messages(state)
            if curator.would_exceed_budget(t):
                state.stopped_on_budget = True
                assert ledger is not None
                warn_budget_stop(
                    t, T, "iterations", ledger.epsilon(), float(p["budget_epsilon"]),
                    "stopped_on_budget_",
                )  # fmt: skip
                break
            release = curator.release(t, messages)
            tasks.update(state, release)
            if self.callback is not None:
                self.callback("iteration", t)
            ckpt.maybe_save(state, noise)
        ckpt.save(state, noise)

        # ---- output rule on the state reached
        if strategy.decomposed:
            assert state.Q_hat_prev is not None
            self.lowrank_ = state.W_hat_prev
            self.sparse_ = state.Q_hat_prev
            self.coef_ = state.W_hat_prev + state.Q_hat_prev
        elif p["refit_lam"] is not None:
            # local refit against the last release (post-processing + own data, see linear.local);
            # before any release the metric is the identity (single-task ridge)
            voted: FloatArray | None = None
            if state.last_release is not None and strategy.refit_penalty == "lowrank":
                self.refit_power_ = self._refit_power(p, schedule, state.iteration - 1, m, d)
            power = TRACE_POWER if self.refit_power_ is None else self.refit_power_
            if state.last_release is None or strategy.refit_penalty is None:
                A = np.eye(d)
            elif strategy.refit_penalty == "lowrank" and self._floor_applies(p):
                # the floor of the cut, fixed or chosen by the tasks' recorded vote
                A, voted, self.eigen_floor_ = refit_metric(
                    floor_plan,
                    Sigma=state.last_release,
                    shift=state.last_shift,
                    batch=batch,
                    loss=p["loss"],
                    refit_floor=p["refit_floor"] * K * math.sqrt(m),
                    power=power,
                    cv_seed=self._cv_seed(),
                    noise=noise,
                    ledger=ledger,
                    delta=delta,
                    accountant=accountant,
                    replay_ok=noise.kind == "seeded",
                )
            else:
                A = variational_factor(
                    state.last_release,
                    penalty=strategy.refit_penalty,
                    shift=state.last_shift,
                    floor=p["refit_floor"] * K * math.sqrt(m),
                    power=power,
                )
            rho = p["refit_lam"]
            if rho == CV and voted is not None:
                rho = voted  # the weights each task chose, by CV given the winning metric
            elif rho == CV:  # every task its own weight, by CV on its own samples given A
                rho = select_ridge_per_task(batch, p["loss"], A=A, seed=self._cv_seed())
            self.refit_lam_ = np.broadcast_to(np.asarray(rho, dtype=np.float64), (m,)).copy()
            self.coef_ = refit_with_metric(batch, p["loss"], rho, A)
        else:
            self.coef_ = state.W_hat_prev
        self.state_ = state
        self.noise_to_signal_ = state.noise_to_signal
        self.step_size_ = np.asarray(eta, dtype=np.float64)
        self.lipschitz_ = np.asarray(lips, dtype=np.float64)
        self.delta_ = float(delta)
        self.n_iter_ = state.iteration
        self.stopped_on_budget_ = bool(state.stopped_on_budget)
        self.noise_source_ = "none" if schedule.noise == "none" else noise.kind
        if isinstance(ledger, PrivacyLedger):
            ledger.close()  # the run's releases are all on record (its closing line)
        self.ledger_ = ledger
        per = getattr(schedule, "per_release", None)
        self.epsilons_ = None if per is None else np.asarray(per, dtype=np.float64)
        self.privacy_ = self._guarantee(schedule, p, ledger=ledger, state=state)
        self.instance_privacy_ = self._instance_guarantee(p, inst_eps)
        self.n_features_in_ = d

    @staticmethod
    def _refit_power(p: dict[str, Any], schedule: Any, t: int, m: int, d: int) -> float:
        """The low-rank refit's power after release ``t``: the parameter, or for ``"auto"`` the
        rule of :func:`~privmtl.linear.eigen_floor.auto_refit_power` at release t's noise std
        (Wishart releases, which have no Gaussian std: the trace norm's 1/2)."""
        if p["refit_power"] != POWER_AUTO:
            return float(p["refit_power"])
        if schedule.noise == "wishart":
            return TRACE_POWER
        std = 0.0 if schedule.noise == "none" else float(schedule.per_release[t])
        return auto_refit_power(std, clip=p["clip"], n_tasks=m, dim=d)

    def _cv_seed(self) -> int:
        """Seed of the tasks' own folds: ``random_state`` when it is an int, else 0."""
        rs = self.random_state
        return int(rs) if isinstance(rs, int | np.integer) and not isinstance(rs, bool) else 0

    def _initial_models(self, prepared: PreparedTasks, p: dict[str, Any]) -> FloatArray:
        d, m = prepared.batch.n_features, prepared.batch.n_tasks
        if isinstance(p["init"], str) and p["init"] == "zeros":
            return np.zeros((d, m))
        if isinstance(p["init"], str):
            alpha = p["init_alpha"]
            if alpha == CV:  # every task its own ridge weight, by CV on its own samples
                alpha = select_ridge_per_task(prepared.batch, p["loss"], seed=self._cv_seed())
                self.init_alpha_ = np.asarray(alpha, dtype=np.float64)
                return local_ridge(prepared.batch, p["loss"], alpha + p["mu"])
            self.init_alpha_ = np.full(m, float(alpha))
            return prepared.ridge(alpha + p["mu"])
        W0 = np.asarray(p["init"], dtype=np.float64)
        if W0.shape != (d, m):
            raise DataFormatError(
                f"The 'init' array must have shape (d, m) = ({d}, {m}); got {W0.shape}."
            )
        if not np.all(np.isfinite(W0)):
            raise DataFormatError("The 'init' array contains NaN or infinite values.")
        return W0.copy()

    def _plan(
        self, p: dict[str, Any], *, delta: float, dim: int, alpha: float, Q: float, n_tasks: int
    ) -> Any:
        kwargs: dict[str, Any] = {
            "noise": "none" if p["epsilon"] is None else p["noise"],
            "epsilon": p["epsilon"],
            "delta": delta,
            "iterations": p["iterations"],
            "clip": p["clip"],
            "dim": dim,
            "relation": p["relation"],
            "allocation": p["allocation"],
            "alpha": alpha,
            "Q": Q if p["allocation"] == "geometric" else None,
            # the eigenvalue fix is applied here, inside the one eigendecomposition per
            # iteration (identical post-processing, see _eigen_shift)
            "eigen_fix": "none",
        }
        if p["covariance"] == "WtW" and p["epsilon"] is not None and p["noise"] == "gaussian":
            # The m x m task covariance changes in a whole row and column when one task changes.
            # The Gaussian mechanism perturbs its upper triangle, whose change has squared norm
            # sum_{j != i} ((w_i - w_i')^T w_j)^2 + (||w_i||^2 - ||w_i'||^2)^2, i.e. at most
            # m K^4 (add/remove, the task replaced by a zero column) or (4m - 3) K^4 (replace-one),
            # instead of K^4 / 2 K^4 for W W^T. Plan with the clip K' whose d x d sensitivity
            # (K'^2, resp. sqrt(2) K'^2) equals that.
            K = p["clip"]
            if p["relation"] == "add-remove":
                kwargs["clip"] = K * float(n_tasks) ** 0.25
            else:
                kwargs["clip"] = K * ((4.0 * n_tasks - 3.0) / 2.0) ** 0.25
        kwargs["accountant"] = self.accountant if self.accountant is not None else SPEC.accountant
        return _cached_plan(tuple(sorted(kwargs.items())))

    @staticmethod
    def _eigen_shift(schedule: Any, t: int, fix: str, dim: int) -> float | None:
        """Shift of the PSD fix ``fix`` for release ``t`` (one home: :func:`~privmtl.privacy.
        covariance.eigen_shift`; ``dim`` is the released matrix's dimension)."""
        from privmtl.privacy.covariance import eigen_shift

        return eigen_shift(schedule.noise, schedule.per_release[t], dim, fix, schedule.shift_scale)

    def _guarantee(
        self, schedule: Any, p: dict[str, Any], *, ledger: PrivacyLedger, state: MPMTLState
    ) -> Any:
        """The schedule's guarantee, with ε from the ledger (what was actually recorded)."""
        from dataclasses import replace

        g = schedule.guarantee
        notes = list(g.notes)
        details = dict(g.details)
        T = schedule.iterations
        floor = self.eigen_floor_
        if schedule.noise == "gaussian":
            spent = ledger.epsilon()
            votes = sum(r.get("mechanism") == VOTE_MECHANISM for r in ledger.records)
            releases = len(ledger.records) - votes
            details.update(
                planned_epsilon=g.details.get("planned_epsilon", g.epsilon),
                releases=releases,
                iterations_run=state.iteration,
            )
            if floor is not None and floor["mode"] == "vote":
                notes.append(
                    f"the refit's eigenvalue floor was chosen by the tasks' recorded vote "
                    f"(client-vote, noise std {floor['vote_noise_std']:.4g}, its own epsilon "
                    f"{floor['vote_epsilon']:.4g}) among the cuts {floor['candidate_cuts']}; the "
                    f"vote holds {floor['vote_share']:g} of the budget and the epsilon above "
                    "composes it with the covariance releases"
                )
            if state.stopped_on_budget:
                notes.append(
                    f"stopped on budget: {state.iteration} of {T} planned releases made, "
                    f"epsilon spent {spent:.4g} <= budget {p['budget_epsilon']:g}; the model is "
                    "the output rule applied to the state reached"
                )
            if releases > state.iteration:
                notes.append(
                    f"the ledger holds {releases} releases for {state.iteration} "
                    "iterations: a resumed run with secure noise repeats the releases made after "
                    "its checkpoint with fresh noise, and each is charged"
                )
            g = replace(g, epsilon=spent)
        elif schedule.noise == "wishart":
            notes.append(
                "ledger: each Wishart release is recorded as a non-private event (no RDP/PLD bound "
                "holds), so re-accounting the ledger gives epsilon = inf; the epsilon above is the "
                "paper's claim, with the real delta"
            )
        if p["covariance"] == "WtW" and math.isfinite(g.epsilon):
            g = replace(g, valid=False)
            notes.append(
                "covariance='WtW': the projection W^ = W~ M mixes other tasks' unperturbed "
                "clipped models into each task's output, which is not post-processing of the "
                "private release; the stated epsilon is NOT an MP-MTL guarantee."
            )
        if p["instance_epsilon"] is not None:
            notes.append(
                "Alg. 5: models are perturbed (and re-clipped to K) before the covariance step; "
                "the instance-level guarantee is in instance_privacy_."
            )
        noise_source = p["noise_source"] if schedule.noise != "none" else "none"
        if noise_source == "seeded":
            notes.append(SEEDED_NOISE_NOTE)
        return replace(g, notes=tuple(notes), details=details, noise_source=noise_source)

    def _instance_guarantee(self, p: dict[str, Any], inst_eps: FloatArray | None) -> Any:
        if p["instance_epsilon"] is None or inst_eps is None:
            return None
        from privmtl.privacy.guarantee import PrivacyGuarantee

        return PrivacyGuarantee(
            epsilon=float(p["instance_epsilon"]),
            delta=0.0,
            relation="replace-one",
            sampling="all",
            accountant="kairouz-cb",
            notion="IP-MTL",
            notes=(
                "MP-MTL Alg. 5 (appendix B): output perturbation of each clipped model with density "
                "exp(-eps_t ||b|| / (2K)) (l2 sensitivity 2K, which bounds ANY change of a task's "
                "model, so it also protects the whole task); T pure-eps releases composed with "
                "CB({eps_t}, 0) = sum eps_t.",
            ),
            details={"per_release": [float(e) for e in inst_eps]},
            noise_source=p["noise_source"],
        )


@functools.lru_cache(maxsize=512)
def _cached_plan(items: tuple[tuple[str, Any], ...]) -> Any:
    """Plans depend only on (ε, δ, T, K, dim, ...), not on data: calibrating the Gaussian noise
    takes ~0.1-0.5 s, so cross-validation would otherwise recalibrate for every fold."""
    from privmtl.privacy.covariance import plan_covariance_releases

    return plan_covariance_releases(**dict(items))


# --------------------------------------------------------------------------------------------------
# public estimators
# --------------------------------------------------------------------------------------------------
class MPMTLLowRank(_MPMTLBase):
    __doc__ = (
        """MP-MTL low-rank estimator (Algorithm 2): private approximate trace-norm proximal gradient.

    Objective (approximated; exact when non-private)::

        min_W  sum_i [ (1/n_i) sum_j l(x_ij^T w_i, y_ij) + (mu/2)||w_i||^2 ] + lam * ||W||_*

    Per iteration: clip the task models to norm ``K``, release ``S = W~ W~^T`` through the
    covariance schedule, eigendecompose ``S = U Λ U^T``, project ``w^_i = U S U^T w~_i`` with
    ``S_ii = max(0, 1 - η λ / sqrt(Λ_ii))`` (without noise this is exactly the singular-value
    soft-thresholding prox of ``η λ ||.||_*``), then an (accelerated) gradient step per task.
    Under very high noise ``S -> I`` and the method is single-task gradient descent (Prop. 1).

    Parameters
    ----------"""
        + _COMMON_PARAMS_DOC
        + _FITTED_DOC
    )

    _penalty = "lowrank"


class MPMTLGroupSparse(_MPMTLBase):
    __doc__ = (
        """MP-MTL group-sparse estimator (Algorithm 3): private approximate l2,1 proximal gradient.

    Objective (approximated; exact when non-private)::

        min_W  sum_i [ (1/n_i) sum_j l(x_ij^T w_i, y_ij) + (mu/2)||w_i||^2 ] + lam * ||W||_{2,1}

    with ``||W||_{2,1} = sum_j ||W[j, :]||`` (rows = features). Per iteration the projection is
    ``M = diag(max(0, 1 - η λ / sqrt(|S_jj|)))`` from the diagonal of the released ``S = W~ W~^T``
    (without noise exactly the row-wise group soft-thresholding prox). Only ``covariance="WWt"``.

    Parameters
    ----------"""
        + _COMMON_PARAMS_DOC
        + _FITTED_DOC
    )

    _penalty = "groupsparse"


class MPMTLLowRankSparse(_MPMTLBase):
    __doc__ = (
        """MP-MTL low-rank + sparse estimator (Algorithm 4, appendix A): ``W = P + Q``.

    Objective (approximated; exact when non-private)::

        min_{P,Q}  sum_i L_i(p_i + q_i) + lam * ||P||_* + lam_sparse * ||Q||_1

    with ``L_i`` as in :class:`MPMTLLowRank`. The trace-norm part ``P`` goes through the private
    projection exactly as ``W`` in Algorithm 2 (only ``P`` is clipped and shared); the entry-wise
    soft-thresholding ``q^ = sign(q) max(0, |q| - η lam_sparse)`` of the outlier part ``Q`` is local
    to each task (no privacy cost, Corollary 2). Both parts take the gradient of
    ``L_i(z_p + z_q)``; the default step is ``1/(2L)`` because the joint gradient in ``(P, Q)`` is
    ``2L``-Lipschitz. ``P^(0) = W^(0)`` (see ``init``) and ``Q^(0) = 0`` (the paper starts both
    at ``W^(0)``, which double-counts a non-zero start).

    Its defaults are the paper's Algorithm 4 (no local refit exists for it): ``iterations=50``,
    ``eigen_fix="shift"``, ``init="zeros"``, ``init_alpha=1e-3``; the other parameters below
    have the defaults stated.

    Parameters
    ----------
    lam_sparse : float, default=1.0
        Weight of the entry-wise l1 penalty on ``Q``."""
        + _COMMON_PARAMS_DOC
        + _FITTED_DOC
        + """    lowrank_ : ndarray of shape (d, m)
        The projected low-rank part ``P^(T)``.
    sparse_ : ndarray of shape (d, m)
        The soft-thresholded part ``Q^(T)``; ``coef_ = lowrank_ + sparse_``.
"""
    )

    _penalty = "lowrank-sparse"

    def __init__(
        self,
        *,
        lam: float = 1.0,
        lam_sparse: float = 1.0,
        epsilon: float | None = SPEC.epsilon,
        delta: float | str | None = SPEC.delta,
        noise: str = SPEC.noise,
        clip: float = 1.0,
        iterations: int = DEFAULT_ITERATIONS["lowrank-sparse"],
        step_size: float | None = None,
        accelerate: bool = True,
        mu: float = 0.0,
        allocation: str = "power",
        alpha: float | None = None,
        Q: float | None = None,
        covariance: str = "WWt",
        loss: str = "squared",
        relation: str = SPEC.relation,
        accountant: str | None = None,
        eigen_fix: str = "shift",
        instance_epsilon: float | None = None,
        init: Any = "zeros",
        init_alpha: float = 1e-3,
        random_state: Any = None,
        noise_source: str = SPEC.noise_source,
        budget_epsilon: float | None = SPEC.budget_epsilon,
        checkpoint_dir: str | Path | None = None,
        checkpoint_every: int = SPEC.checkpoint_every,
        resume: bool = False,
        callback: Callable[[str, int], None] | None = None,
    ) -> None:
        super().__init__(
            lam=lam,
            epsilon=epsilon,
            delta=delta,
            noise=noise,
            clip=clip,
            iterations=iterations,
            step_size=step_size,
            accelerate=accelerate,
            mu=mu,
            allocation=allocation,
            alpha=alpha,
            Q=Q,
            covariance=covariance,
            loss=loss,
            relation=relation,
            accountant=accountant,
            eigen_fix=eigen_fix,
            instance_epsilon=instance_epsilon,
            init=init,
            init_alpha=init_alpha,
            refit_lam=None,
            random_state=random_state,
            noise_source=noise_source,
            budget_epsilon=budget_epsilon,
            checkpoint_dir=checkpoint_dir,
            checkpoint_every=checkpoint_every,
            resume=resume,
            callback=callback,
        )
        self.lam_sparse = lam_sparse

    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "lam_sparse": Interval(Real, 0.0, None),
        **_MPMTLBase._parameter_constraints,
    }
