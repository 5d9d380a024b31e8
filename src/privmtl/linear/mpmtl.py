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

from numbers import Real
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from privmtl._validation import (
    Interval,
)
from privmtl.linear.common import (
    PreparedTasks,
    task_steps,
)
from privmtl.linear.local import _apply_lowrank_left as _apply_lowrank_left
from privmtl.linear.local import local_ridge
from privmtl.linear.methods import LowRankSparse
from privmtl.linear.mpmtl_base import (
    ALLOCATIONS,
    COVARIANCES,
    CV,
    EIGEN_FIXES,
    SEEDED_NOISE_NOTE,
    _MPMTLBase,
    _refuse_moved,
)
from privmtl.linear.mpmtl_checkpoint import CHECKPOINT_KIND
from privmtl.linear.mpmtl_protocol import (
    CALLBACK_STAGES,
    CovarianceCurator,
    CovarianceRelease,
    MPMTLState,
    TaskStep,
)
from privmtl.linear.options import MPMTLExecution, MPMTLPrivacy, MPMTLRefit
from privmtl.linear.spec import SPEC
from privmtl.privacy.covariance import cached_covariance_plan as _cached_plan  # noqa: F401
from privmtl.privacy.mechanisms import l2_laplace_noise as _l2_laplace  # noqa: F401
from privmtl.privacy.mechanisms import sample_l2_laplace

__all__ = [
    "ALLOCATIONS",
    "CALLBACK_STAGES",
    "CHECKPOINT_KIND",
    "COVARIANCES",
    "CV",
    "EIGEN_FIXES",
    "SEEDED_NOISE_NOTE",
    "CovarianceCurator",
    "CovarianceRelease",
    "MPMTLExecution",
    "MPMTLGroupSparse",
    "MPMTLLowRank",
    "MPMTLLowRankSparse",
    "MPMTLPrivacy",
    "MPMTLRefit",
    "MPMTLState",
    "PreparedTasks",
    "TaskStep",
    "local_ridge",
    "sample_l2_laplace",
    "task_steps",
]

FloatArray = NDArray[np.float64]

# the parameters and fitted attributes every estimator's docstring lists
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
    eigen_fix : {"denoise", "shift", "clip", "none"}, default="denoise"
        Post-processing of a released Gaussian covariance (the planner's PSD fix, applied here to
        the eigenvalues of the one eigendecomposition per iteration): ``"denoise"`` drops the
        eigenvalues the noise alone can produce (below the noise edge; under pure noise nothing is
        kept, the refit metric is then the identity and the output single-task ridge);
        ``"shift"`` adds ``c_t = shift_scale * sigma_t * sqrt(dim)`` to every eigenvalue and clips
        at 0, so that under high noise M -> I (single-task learning, Prop. 1); ``"clip"`` only
        clips negative eigenvalues (less shrinkage bias at moderate noise, but no STL limit);
        ``"none"``: raw. Ignored for Wishart noise (positive definite already).
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
    privacy : MPMTLPrivacy or None, default=None
        The privacy settings beside ε and δ (:class:`~privmtl.linear.options.MPMTLPrivacy`): the
        neighbouring ``relation`` and the ``accountant`` of the guarantee, the ``budget_epsilon``
        stop and Alg. 5's ``instance_epsilon``; None: their defaults.
    refit : MPMTLRefit or None, default=None
        How the local refit builds its metric (:class:`~privmtl.linear.options.MPMTLRefit`:
        ``refit_floor``, ``refit_power``, ``eigen_floor``, ``floor_grid``, ``vote_share``); None:
        their defaults. The low-rank + sparse estimator, which has no refit, does not take it.
    execution : MPMTLExecution or None, default=None
        How the fit executes, not what it computes (:class:`~privmtl.linear.options.
        MPMTLExecution`: ``checkpoint_dir``, ``checkpoint_every``, ``resume``, ``callback``);
        None: no checkpoint, no callback.

    A setting of a grouped parameter given by its own name (``relation="replace-one"``) is
    refused, naming the parameter that holds it.
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

    _param_groups: ClassVar[dict[str, type]] = {
        "privacy": MPMTLPrivacy,
        "execution": MPMTLExecution,
    }

    def __init__(
        self,
        *,
        lam: float = 1.0,
        lam_sparse: float = 1.0,
        epsilon: float | None = SPEC.epsilon,
        delta: float | str | None = SPEC.delta,
        noise: str = SPEC.noise,
        clip: float = 1.0,
        iterations: int = LowRankSparse.default_iterations,
        step_size: float | None = None,
        accelerate: bool = True,
        mu: float = 0.0,
        allocation: str = "power",
        alpha: float | None = None,
        Q: float | None = None,
        covariance: str = "WWt",
        loss: str = "squared",
        eigen_fix: str = "shift",
        init: Any = "zeros",
        init_alpha: float = 1e-3,
        random_state: Any = None,
        noise_source: str = SPEC.noise_source,
        privacy: MPMTLPrivacy | None = None,
        execution: MPMTLExecution | None = None,
        **moved: Any,
    ) -> None:
        if moved:  # (the base's refit is not this estimator's)
            _refuse_moved(type(self), moved)
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
            eigen_fix=eigen_fix,
            init=init,
            init_alpha=init_alpha,
            refit_lam=None,
            random_state=random_state,
            noise_source=noise_source,
            privacy=privacy,
            execution=execution,
        )
        self.lam_sparse = lam_sparse

    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "lam_sparse": Interval(Real, 0.0, None),
        **_MPMTLBase._parameter_constraints,
    }
