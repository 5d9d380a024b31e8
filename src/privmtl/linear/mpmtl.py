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
    M     = U diag(max(0, 1 - eta*lam/sqrt(Lambda))) U^T   with U Lambda U^T = S   (low rank;
                                                       directions with Lambda <= 0 get 0)
          = diag(max(0, 1 - eta*lam/sqrt(|S_jj|)))                              (group sparse)
    w^_i  = M w~_i                                     # each task, locally
    z_i   = w^_i + beta_t (w^_i - w^_i_prev)
    w_i   = z_i - eta * grad L_i(z_i)

and returns ``coef_ = W^^(T)``, the last projected models ``w^_i`` (the paper's output; the
final local gradient step is skipped since it would not reach the output). Only ``S``
depends on other tasks, so each task's output is post-processing of the covariance releases: the
guarantee is the one of the :class:`~privmtl.privacy.covariance.CovarianceSchedule` (MP-MTL, the
whole task — data and model sequence — is the unit of privacy). The schedule is planned by
:func:`privmtl.privacy.covariance.plan_covariance_releases`; solvers never compute ε themselves.

Performance: the per-iteration cost is one ``d x d`` symmetric eigendecomposition (the PSD fix of a
Gaussian release is folded into it), ``d x d x m`` matrix products (``W~ W~^T``, and ``U (S U^T W~)``
restricted to the cheaper of the kept or shrunk eigenvectors; BLAS) and the batched gradients of a zero-padded
:class:`~privmtl.linear.losses.TaskBatch` (``O(m n_max d)``, no Python loop over tasks).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.linalg
from numpy.typing import ArrayLike, NDArray
from sklearn.base import BaseEstimator

from privmtl._validation import check_choice, check_int, check_real, check_rng
from privmtl.exceptions import DataFormatError, InvalidParameterError
from privmtl.linear.common import (
    PreparedTasks,
    _clip_columns,
    _LinearMTLMixin,
    default_delta,
)
from privmtl.linear.local import (
    _apply_lowrank_left,
    _apply_lowrank_right,
    _group_shrink,
    local_ridge,
    refit_with_metric,
    variational_factor,
)
from privmtl.linear.losses import LOSSES
from privmtl.privacy.mechanisms import sample_l2_laplace

__all__ = [
    "MPMTLGroupSparse",
    "MPMTLLowRank",
    "MPMTLLowRankSparse",
    "PreparedTasks",
    "default_delta",
    "local_ridge",
    "sample_l2_laplace",
]

FloatArray = NDArray[np.float64]

NOISES = ("gaussian", "wishart")
COVARIANCES = ("WWt", "WtW")
ALLOCATIONS = ("power", "geometric")
RELATIONS = ("add-remove", "replace-one")
EIGEN_FIXES = ("shift", "denoise", "clip", "none")


# --------------------------------------------------------------------------------------------------
# the shared solver
# --------------------------------------------------------------------------------------------------
_COMMON_PARAMS_DOC = """
    lam : float, default=1.0
        Regularization weight ``lam >= 0`` of the structured penalty.
    epsilon : float or None, default=None
        Total MP-MTL budget ε over the T covariance releases. ``None`` ⇒ non-private (the covariance
        is used without noise; the solver is then exactly the non-private proximal-gradient method).
    delta : float or None, default=None
        δ of the guarantee; ``None`` ⇒ ``1/(m log m)`` at fit time (the paper's choice).
    noise : {"gaussian", "wishart"}, default="gaussian"
        Covariance mechanism. ``"gaussian"`` is the Analyze-Gauss mechanism with RDP/PLD accounting
        (a valid guarantee); ``"wishart"`` is the published Wishart step, kept for reproduction: its
        claimed ε-DP does not hold (SPEC §4) and ``privacy_`` then carries ``valid=False`` and the real δ.
    clip : float, default=1.0
        Clipping norm K: every task model is rescaled to ``||w_i|| <= K`` before sharing.
    iterations : int, default=50
        Number of iterations T (= number of covariance releases).
    step_size : float or None, default=None
        η; ``None`` ⇒ ``1/L`` with ``L = max_i`` Lipschitz constant of ``grad L_i`` (``1/(2L)`` for
        the low-rank + sparse estimator, whose gradient in (P, Q) is ``2L``-Lipschitz).
    accelerate : bool, default=True
        Momentum β_t = (t-1)/(t+2) (t = 1..T, convex case, μ = 0) or
        β = (1-√(μ/L))/(1+√(μ/L)) (μ > 0); β_t = 0 when False.
    mu : float, default=0.0
        Strong-convexity weight: ``(mu/2)||w_i||^2`` is added to every L_i (the paper uses 1e-3).
    allocation : {"power", "geometric"}, default="power"
        Budget allocation ε_t ∝ t^α or ε_t ∝ Q^{-t} (paper §4.5), ε₀ the largest with CB ≤ ε.
    alpha : float or None, default=None
        α of the power allocation; ``None`` ⇒ the paper's optimum, 0 without and 2/5 with acceleration.
    Q : float or None, default=None
        Q of the geometric allocation; ``None`` ⇒ the paper's optimum, ``(1-μ/L)^{2/5}`` without and
        ``(1-√(μ/L))^{1/5}`` with acceleration (1, i.e. uniform, when μ = 0).
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
    eigen_fix : {"shift", "clip", "none"}, default="shift"
        Post-processing of a released Gaussian covariance (the planner's PSD fix, applied here to
        the eigenvalues of the one eigendecomposition per iteration): ``"shift"`` adds
        ``c_t = shift_scale * sigma_t * sqrt(dim)`` to every eigenvalue and clips at 0, so that under
        high noise M -> I (single-task learning, Prop. 1); ``"clip"`` only clips negative
        eigenvalues (less shrinkage bias at moderate noise, but no STL limit); ``"none"``: raw.
        Ignored for Wishart noise (positive definite already).
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
    refit_lam : float or None, default=None
        ``None``: the output is the paper's, ``W^(T)`` (projected clipped models). A float ``rho > 0``
        replaces it by a *local variational refit* against the last release ``S``: every task
        solves ``argmin_w L_i(w) + (rho/2) w^T D^-1 w`` on its own data (μ not included), with
        ``D = (max(Lambda + c_T, 0)^(1/2) + tau)`` in the eigenbasis of ``S`` (diagonal of ``S``
        for the group-sparse estimator), normalised to mean eigenvalue 1 — one W-step of the
        alternating minimisation of the trace-norm (l2,1) problem in its variational form
        (Argyriou et al. 2008; :mod:`privmtl.linear.local`). It reads only the task's own data and
        the private release, so the MP-MTL guarantee is unchanged; unlike the projection it uses
        unclipped data, so clipping biases nothing, and it keeps the STL limit (pure noise ⇒
        ``D = I`` ⇒ ridge with weight ``rho``). Not available for the low-rank + sparse estimator
        or ``covariance="WtW"``.
    refit_floor : float, default=1e-3
        ``tau = refit_floor * K * sqrt(m)`` (``K sqrt(m)`` bounds ``sqrt(Lambda)``), so that ``D > 0``.
    init : {"zeros", "stl"} or array of shape (d, m), default="zeros"
        Initial task models W^(0). ``"stl"``: every task's own ridge solution
        ``argmin L_i(w) + ((init_alpha + mu)/2)||w||^2`` (local, no privacy cost; the paper allows
        "initial task models acquired via arbitrary STL methods", and its analysis assumes them).
    init_alpha : float, default=1e-3
        Ridge weight of the ``"stl"`` initialization.
    random_state : None, int or numpy.random.Generator, default=None
        Source of all noise. Same seed ⇒ same result.
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
        fix (paper Fig. 5); 0 when non-private, inf when ``S~ = 0``.
    epsilons_ : ndarray of shape (T,) or None
        Per-release budgets / noise parameters reported by the schedule (``per_release``).
    step_size_ : float
        η used.
    lipschitz_ : float
        L = max_i Lipschitz constant of ``grad L_i`` (including μ).
    delta_ : float
        δ used.
    n_iter_ : int
        Number of iterations run (T).
"""


class _MPMTLBase(_LinearMTLMixin, BaseEstimator):
    _penalty = "lowrank"

    def __init__(
        self,
        *,
        lam: float = 1.0,
        epsilon: float | None = None,
        delta: float | None = None,
        noise: str = "gaussian",
        clip: float = 1.0,
        iterations: int = 50,
        step_size: float | None = None,
        accelerate: bool = True,
        mu: float = 0.0,
        allocation: str = "power",
        alpha: float | None = None,
        Q: float | None = None,
        covariance: str = "WWt",
        loss: str = "squared",
        relation: str = "add-remove",
        accountant: str | None = None,
        eigen_fix: str = "shift",
        instance_epsilon: float | None = None,
        init: Any = "zeros",
        init_alpha: float = 1e-3,
        refit_lam: float | None = None,
        refit_floor: float = 1e-3,
        random_state: Any = None,
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
        self.random_state = random_state

    # ---------------------------------------------------------------------------------- checks
    def _validate(self) -> dict[str, Any]:
        p: dict[str, Any] = {}
        p["lam"] = check_real("lam", self.lam, low=0.0)
        p["epsilon"] = (
            None
            if self.epsilon is None
            else check_real("epsilon", self.epsilon, low=0.0, closed="neither")
        )
        p["delta"] = (
            None
            if self.delta is None
            else check_real("delta", self.delta, low=0.0, high=1.0, closed="neither")
        )
        p["noise"] = check_choice("noise", self.noise, NOISES)
        p["clip"] = check_real("clip", self.clip, low=0.0, closed="neither")
        p["iterations"] = check_int("iterations", self.iterations, low=1)
        p["step_size"] = (
            None
            if self.step_size is None
            else check_real("step_size", self.step_size, low=0.0, closed="neither")
        )
        if not isinstance(self.accelerate, bool | np.bool_):
            raise InvalidParameterError(
                f"The 'accelerate' parameter must be a bool; got {self.accelerate!r}."
            )
        p["accelerate"] = bool(self.accelerate)
        p["mu"] = check_real("mu", self.mu, low=0.0)
        p["allocation"] = check_choice("allocation", self.allocation, ALLOCATIONS)
        p["alpha"] = None if self.alpha is None else check_real("alpha", self.alpha)
        p["Q"] = None if self.Q is None else check_real("Q", self.Q, low=0.0, closed="neither")
        p["covariance"] = check_choice("covariance", self.covariance, COVARIANCES)
        if p["covariance"] == "WtW" and self._penalty == "groupsparse":
            raise InvalidParameterError(
                "The 'covariance' parameter must be 'WWt' for the group-sparse estimator (the l2,1 "
                "prox needs the feature norms, the diagonal of W W^T); got 'WtW'."
            )
        p["loss"] = check_choice("loss", self.loss, LOSSES)
        p["eigen_fix"] = check_choice("eigen_fix", self.eigen_fix, EIGEN_FIXES)
        p["relation"] = check_choice("relation", self.relation, RELATIONS)
        p["instance_epsilon"] = (
            None
            if self.instance_epsilon is None
            else check_real("instance_epsilon", self.instance_epsilon, low=0.0, closed="neither")
        )
        if isinstance(self.init, str):
            p["init"] = check_choice("init", self.init, ("zeros", "stl"))
        else:
            p["init"] = self.init
        p["init_alpha"] = check_real("init_alpha", self.init_alpha, low=0.0, closed="neither")
        p["refit_lam"] = (
            None
            if self.refit_lam is None
            else check_real("refit_lam", self.refit_lam, low=0.0, closed="neither")
        )
        p["refit_floor"] = check_real("refit_floor", self.refit_floor, low=0.0)
        if p["refit_lam"] is not None and p["covariance"] == "WtW":
            raise InvalidParameterError(
                "The 'refit_lam' parameter must be None with covariance='WtW' (the refit needs the "
                f"d x d feature covariance); got {self.refit_lam!r}."
            )
        return p

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
        rng = check_rng(self.random_state)
        batch = prepared.batch
        m, d = batch.n_tasks, batch.n_features
        T, K, lam, mu = p["iterations"], p["clip"], p["lam"], p["mu"]
        lips = prepared.lipschitz(mu)
        if not np.isfinite(lips) or lips <= 0:
            raise DataFormatError(
                "the loss has a zero Lipschitz constant (all features are zero?); cannot set a step."
            )
        decomposed = self._penalty == "lowrank-sparse"
        eta = (
            p["step_size"]
            if p["step_size"] is not None
            else 1.0 / (2.0 * lips if decomposed else lips)
        )
        delta = p["delta"] if p["delta"] is not None else default_delta(m)

        # momentum and allocation defaults (paper §4.5)
        ratio = min(mu / lips, 1.0)
        if p["alpha"] is None:
            alpha = 0.4 if p["accelerate"] else 0.0
        else:
            alpha = p["alpha"]
        if p["Q"] is None:
            Q = (1.0 - math.sqrt(ratio)) ** 0.2 if p["accelerate"] else (1.0 - ratio) ** 0.4
            Q = Q if Q > 0 else 1.0
        else:
            Q = p["Q"]

        wtw = p["covariance"] == "WtW"
        dim = m if wtw else d
        schedule = self._plan(p, delta=delta, dim=dim, alpha=alpha, Q=Q, n_tasks=m)

        inst_eps = None
        if p["instance_epsilon"] is not None:
            from privmtl.privacy.composition import allocation_weights

            w = allocation_weights(T, strategy=p["allocation"], alpha=alpha, Q=Q)
            inst_eps = np.asarray(p["instance_epsilon"] * w / float(w.sum()), dtype=np.float64)

        def beta(t1: int) -> float:  # t1 is the 1-based iteration index
            if not p["accelerate"]:
                return 0.0
            if mu > 0:
                r = math.sqrt(ratio)
                return (1.0 - r) / (1.0 + r)
            return (t1 - 1.0) / (t1 + 2.0)

        W = self._initial_models(prepared, p)  # task models w_i^(0)
        Qs = np.zeros((d, m)) if decomposed else None  # sparse part (Alg. 4)
        W_hat_prev = _clip_columns(W, K)
        Q_hat_prev = np.zeros((d, m)) if decomposed else None
        nsr = np.zeros(T)
        W_hat = W_hat_prev
        Q_hat = Q_hat_prev
        for t in range(T):
            Wc = _clip_columns(W, K)
            shared = Wc
            if inst_eps is not None:
                b = sample_l2_laplace(rng, d, 2.0 * K / inst_eps[t], m)
                shared = _clip_columns(Wc + b, K)
            cov = shared.T @ shared if wtw else shared @ shared.T
            Sigma = np.asarray(schedule.release(t, cov, rng), dtype=np.float64)
            Sigma = 0.5 * (Sigma + Sigma.T)
            cov_norm = float(np.linalg.norm(cov))
            err = float(np.linalg.norm(Sigma - cov))  # ||E||_F of the raw release
            nsr[t] = err / cov_norm if cov_norm > 0 else (0.0 if err == 0 else math.inf)

            # eigenvalue fix of a Gaussian release (post-processing), folded into the one
            # eigendecomposition: Lambda -> max(Lambda + c_t, 0) ("shift") or max(Lambda, 0)
            shift = self._eigen_shift(schedule, t, p["eigen_fix"], dim)
            last_release = (Sigma, shift)
            thr = eta * lam
            if self._penalty == "groupsparse":
                if shift is None:
                    diag = np.abs(np.diag(Sigma))
                else:
                    vals, U = scipy.linalg.eigh(Sigma, check_finite=False, driver="evd")
                    diag = (U * U) @ np.maximum(vals + shift, 0.0)
                W_hat = _group_shrink(diag, thr)[:, None] * Wc
            elif wtw:
                W_hat = _apply_lowrank_right(Sigma, thr, shared, Wc, shift)
            else:
                W_hat = _apply_lowrank_left(Sigma, thr, Wc, shift)

            bt = beta(t + 1)
            Z = W_hat + bt * (W_hat - W_hat_prev) if bt else W_hat
            if decomposed:
                assert Qs is not None
                Q_hat = np.sign(Qs) * np.maximum(np.abs(Qs) - eta * p["lam_sparse"], 0.0)
            if t == T - 1:
                break  # the output is W^(T); the last local gradient step would not reach it
            if decomposed:
                assert Q_hat is not None and Q_hat_prev is not None
                Zq = Q_hat + bt * (Q_hat - Q_hat_prev) if bt else Q_hat
                G = batch.gradients(p["loss"], Z + Zq, mu=mu)
                W = Z - eta * G
                Qs = Zq - eta * G
                Q_hat_prev = Q_hat
            else:
                G = batch.gradients(p["loss"], Z, mu=mu)
                W = Z - eta * G
            W_hat_prev = W_hat

        if decomposed:
            assert Q_hat is not None
            self.lowrank_ = W_hat
            self.sparse_ = Q_hat
            self.coef_ = W_hat + Q_hat
        elif p["refit_lam"] is not None:
            # local refit against the last release (post-processing + own data, see linear.local)
            A = variational_factor(
                last_release[0],
                penalty=self._penalty,
                shift=last_release[1],
                floor=p["refit_floor"] * K * math.sqrt(m),
            )
            self.coef_ = refit_with_metric(batch, p["loss"], p["refit_lam"], A)
        else:
            self.coef_ = W_hat
        self.noise_to_signal_ = nsr
        self.step_size_ = float(eta)
        self.lipschitz_ = lips
        self.delta_ = float(delta)
        self.n_iter_ = T
        per = getattr(schedule, "per_release", None)
        self.epsilons_ = None if per is None else np.asarray(per, dtype=np.float64)
        self.privacy_ = self._guarantee(schedule, p)
        self.instance_privacy_ = self._instance_guarantee(p, inst_eps)
        self.n_features_in_ = d

    def _initial_models(self, prepared: PreparedTasks, p: dict[str, Any]) -> FloatArray:
        d, m = prepared.batch.n_features, prepared.batch.n_tasks
        if isinstance(p["init"], str) and p["init"] == "zeros":
            return np.zeros((d, m))
        if isinstance(p["init"], str):
            return prepared.ridge(p["init_alpha"] + p["mu"])
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
        if self.accountant is not None:
            kwargs["accountant"] = self.accountant
        return _cached_plan(tuple(sorted(kwargs.items())))

    @staticmethod
    def _eigen_shift(schedule: Any, t: int, fix: str, dim: int) -> float | None:
        """Eigenvalue shift c_t of the planner's PSD fix for Gaussian releases, or None.

        Same post-processing as ``CovarianceSchedule`` with ``eigen_fix`` ("shift": add
        ``shift_scale * sigma_t * sqrt(dim)`` to every eigenvalue, then clip at 0; "clip": clip at
        0), done on the eigenvalues of the single eigendecomposition the projection needs.
        """
        if schedule.noise != "gaussian" or fix == "none":
            return None
        if fix == "clip":
            return 0.0
        edge = schedule.per_release[t] * math.sqrt(dim)
        if fix == "denoise":
            return float(-2.0 * edge)
        return float(schedule.shift_scale * edge)

    def _guarantee(self, schedule: Any, p: dict[str, Any]) -> Any:
        from dataclasses import replace

        g = schedule.guarantee
        if p["covariance"] == "WtW" and math.isfinite(g.epsilon):
            g = replace(
                g,
                valid=False,
                notes=(
                    *g.notes,
                    "covariance='WtW': the projection W^ = W~ M mixes other tasks' unperturbed "
                    "clipped models into each task's output, which is not post-processing of the "
                    "private release; the stated epsilon is NOT an MP-MTL guarantee.",
                ),
            )
        if p["instance_epsilon"] is not None:
            g = replace(
                g,
                notes=(
                    *g.notes,
                    "Alg. 5: models are perturbed (and re-clipped to K) before the covariance step; "
                    "the instance-level guarantee is in instance_privacy_.",
                ),
            )
        return g

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
        epsilon: float | None = None,
        delta: float | None = None,
        noise: str = "gaussian",
        clip: float = 1.0,
        iterations: int = 50,
        step_size: float | None = None,
        accelerate: bool = True,
        mu: float = 0.0,
        allocation: str = "power",
        alpha: float | None = None,
        Q: float | None = None,
        covariance: str = "WWt",
        loss: str = "squared",
        relation: str = "add-remove",
        accountant: str | None = None,
        eigen_fix: str = "shift",
        instance_epsilon: float | None = None,
        init: Any = "zeros",
        init_alpha: float = 1e-3,
        random_state: Any = None,
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
            random_state=random_state,
        )
        self.lam_sparse = lam_sparse

    def _validate(self) -> dict[str, Any]:
        p = super()._validate()
        p["lam_sparse"] = check_real("lam_sparse", self.lam_sparse, low=0.0)
        return p
