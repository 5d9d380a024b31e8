"""IP-MTL baselines of the MP-MTL paper, turned into MP-MTL methods by group privacy.

Both methods protect single records (instance-level, "IP-MTL", MP-MTL paper Def. 8). The paper
builds (ε, δ)-MP-MTL baselines from them with its Prop. 3 (group privacy over the n = max_i n_i
records of one task): run the IP-MTL method at (ε/n, δ/(n e^ε)) (:func:`mp_budget_for_ip`); then
it is (ε, δ)-MP-MTL (:func:`ip_to_mp`). ``privacy_`` reports that MP-MTL guarantee with notion
``"MP-MTL via group privacy (Prop. 3)"``; ``ip_privacy_`` the instance-level one it came from.

:class:`DPMTRL` — Gupta, Rana & Venkatesh (2016), as described and modified by the MP-MTL paper
    Multi-task relationship learning (Zhang & Yeung 2010) with the squared loss::

        min_{W, Omega}  sum_i L_i(w_i) + (lam1/2)||W||_F^2 + (lam2/2) tr(W Omega^-1 W^T),
        L_i(w) = (1/(2 n_i)) ||X_i w - y_i||^2,   Omega >= 0, tr(Omega) = 1,

    solved by T outer iterations. Each outer iteration is one Gauss-Seidel sweep over the tasks:
    task i solves, in closed form, its own block of the W-step given ``Omega`` and the *released*
    (perturbed) models of the other tasks,

        (X_i^T X_i / n_i + c_i I) w_i = X_i^T y_i / n_i - lam2 sum_{k != i} (Omega^-1)_ik wbar_k,
        c_i = lam1 + lam2 (Omega^-1)_ii,

    and releases ``wbar_i = w_i + b_i`` (output perturbation, Chaudhuri et al. 2011): the problem is
    c_i-strongly convex and the right-hand side's coupling term does not depend on task i's data,
    so replacing one record moves w_i by at most ``s_i = 2 L_i / (n_i c_i)``; ``b_i`` has density
    ``∝ exp(-eps_t ||b_i|| / s_i)`` (radius ~ Gamma(d, s_i/eps_t), uniform direction). The
    Omega-step ``Omega = (Wbar^T Wbar + eps I)^{1/2} / tr(.)`` uses only released models
    (post-processing). The T releases of every task are composed with the paper's bound CB
    (budgets ε_t = the power allocation with α = 0, i.e. equal, with CB({ε_t}, δ_ip) ≤ ε_ip).

    Following the MP-MTL paper (§5.1): the Lipschitz constant is *estimated* as
    ``L_i = max_j |x_ij^T w_i - y_ij| ||x_ij||`` at the non-private solve (the paper writes
    ``max_j |L_i'(x_ij w_i, y_ij)|`` for unit-norm rows), which is smaller than a true bound and
    data-dependent, so the stated ε is not rigorously met — ``privacy_.valid`` is False (the paper
    made this choice knowingly: it adds less noise than needed, i.e. it favours the baseline); and
    DP-MTRL always uses the least-squares loss, also for classification (labels 0/1 are regressed
    as -1/+1; scores are ``X_i w_i``).

    Where the sources are ambiguous (Gupta et al.'s text is not available here; this follows the
    MP-MTL paper's description and its proof of Prop. 2, which treats the per-task models as a
    sequence of T0 = m outputs): the per-task block update (instead of the joint W-step, whose
    columns would depend on every task's data), Gauss-Seidel order, the relative ridge
    ``omega_eps`` in the Omega-step (Omega^-1 must exist when m > d), Omega^(0) = I/m,
    wbar^(0) = 0, and the output (``output="perturbed"``, the released models as in the paper's
    Fig. 3e; ``output="local"`` lets each task use its own last unperturbed solve, which is
    post-processing of the others' releases and therefore keeps the same guarantee — note that
    with T = 1 it is exactly non-private STL ridge with weight ``lam1 + m lam2``).

:class:`DPAGGR` — Pathak, Rane & Raj (2010)
    Every task trains ``w_i = argmin L_i(w) + (lam/2)||w||^2`` locally (squared or logistic loss,
    mean over samples); the curator releases ``wbar = (1/m) sum_i w_i + b`` and every task uses
    ``wbar`` (one model for all tasks). Replacing one record of task i moves w_i by at most
    ``2 L_i / (n_i lam)`` and the average by ``1/m`` of that, so ``b`` has density
    ``∝ exp(-eps_ip ||b|| / s)``, ``s = max_i 2 L_i / (m n_i lam)`` (T = 1). ``L_i`` is
    ``max_j ||x_ij||`` for the logistic loss (``|l'| <= 1``; exactly 1 for unit-norm rows, then the
    guarantee is valid) and the same data-dependent estimate as DP-MTRL for the squared loss
    (``valid=False``). Pathak et al. state the noise in terms of the smallest local data set
    ``n_(1)``; the sensitivity of the *average* derived above is the tighter correct value (the
    strongest version of the baseline).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from numbers import Real
from typing import Any, ClassVar

import numpy as np
import scipy.linalg
from numpy.typing import ArrayLike, NDArray
from sklearn.base import BaseEstimator

from privmtl._validation import Interval, Options, RandomState, check_rng, validate_params
from privmtl.exceptions import InvalidParameterError
from privmtl.linear.common import _LinearMTLMixin, check_tasks, resolve_delta
from privmtl.linear.local import local_ridge
from privmtl.linear.losses import LOSSES, TaskBatch
from privmtl.linear.methods import DPMTRLMethod
from privmtl.linear.spec import spec_constraints
from privmtl.privacy.composition import (
    allocate_budgets,
    composition_bound,
    ip_to_mp,
    mp_budget_for_ip,
)
from privmtl.privacy.guarantee import PrivacyGuarantee
from privmtl.privacy.mechanisms import sample_l2_laplace

__all__ = [
    "DPAGGR",
    "DPMTRL",
    "GROUP_PRIVACY_NOTION",
    "NOT_COVERED_AGGR_SCALE",
    "NOT_COVERED_GROUP_FACTOR",
]

FloatArray = NDArray[np.float64]

#: Notion string of the MP-MTL guarantees obtained from IP-MTL methods by group privacy.
GROUP_PRIVACY_NOTION = "MP-MTL via group privacy (Prop. 3)"


#: Outputs of the two IP-MTL baselines that read every task's data outside the release.
NOT_COVERED_GROUP_FACTOR = (
    "every task's noise scale uses n = max_i n_i, the largest task's sample count (the group-"
    "privacy factor of Prop. 3): one task's size changes the noise of every other task"
)
NOT_COVERED_AGGR_SCALE = (
    "the noise scale of the released average is max_i 2 L_i/(m n_i lam), from every task's "
    "sample count and Lipschitz estimate (and the row-norm check of the logistic bound)"
)


def _budgets(
    epsilon: float, delta: float | str | None, m: int, n_max: int
) -> tuple[float, float, float, float]:
    """MP target (ε, δ) and the IP budget (ε/n, δ/(n e^ε)) of Prop. 3."""
    dlt = resolve_delta(delta, m)
    eps_ip, delta_ip = mp_budget_for_ip(epsilon, dlt, n_max)
    return epsilon, dlt, eps_ip, delta_ip


def _guarantees(
    *,
    eps_t: FloatArray,
    delta_ip: float,
    n_max: int,
    valid: bool,
    notes: tuple[str, ...],
    details: dict[str, Any],
    not_covered: tuple[str, ...] = (NOT_COVERED_GROUP_FACTOR,),
) -> tuple[Any, Any]:
    """(MP-MTL guarantee via group privacy, IP-MTL guarantee) of T pure-ε releases."""
    eps_ip = composition_bound(eps_t, delta_ip) if len(eps_t) > 1 else float(eps_t[0])
    dlt_ip = delta_ip if len(eps_t) > 1 else 0.0
    eps_mp, dlt_mp = ip_to_mp(eps_ip, dlt_ip, n_max)
    common: dict[str, Any] = {
        "relation": "replace-one",
        "sampling": "all",
        "accountant": "kairouz-cb",
        "valid": valid,
        "details": {**details, "n_max": n_max, "epsilon_t": [float(e) for e in eps_t]},
    }
    ip = PrivacyGuarantee(
        epsilon=float(eps_ip), delta=float(dlt_ip), notion="IP-MTL", notes=notes, **common
    )
    mp = PrivacyGuarantee(
        epsilon=float(eps_mp),
        delta=float(dlt_mp),
        notion=GROUP_PRIVACY_NOTION,
        notes=(
            *notes,
            f"group privacy over n = max_i n_i = {n_max} records of one task: "
            f"({eps_ip:.4g}, {dlt_ip:.3g})-IP-MTL => (n eps, n e^(n eps) delta)-MP-MTL "
            "(neighbouring tasks: the task's data replaced, same size)",
        ),
        **common,
    )
    return mp.with_not_covered(*not_covered), ip.with_not_covered(*not_covered)


def _estimated_lipschitz(X: FloatArray, y: FloatArray, w: FloatArray) -> float:
    """``max_j |x_j^T w - y_j| ||x_j||`` (squared loss; the MP-MTL paper's estimate)."""
    r = np.abs(X @ w - y) * np.linalg.norm(X, axis=1)
    return float(r.max())


#: Constraints shared by the two IP-MTL baselines.
_COMMON_CONSTRAINTS: dict[str, Any] = {
    **spec_constraints("epsilon", "delta"),
    "loss": Options(LOSSES),
    "random_state": RandomState(),
}


class _IPBase(_LinearMTLMixin, BaseEstimator):
    epsilon: float | None
    delta: float | None


class DPMTRL(_IPBase):
    """DP-MTRL (Gupta et al. 2016, as used by the MP-MTL paper) made MP-MTL by group privacy.

    Objective (least squares, every task weighted equally)::

        min_{W, Omega}  sum_i (1/(2 n_i))||X_i w_i - y_i||^2 + (lam1/2)||W||_F^2
                        + (lam2/2) tr(W Omega^-1 W^T),   Omega >= 0, tr(Omega) = 1,

    solved by ``iterations`` outer iterations of a per-task closed-form W-step with output
    perturbation and an Omega-step on the released models; see the module docstring for the exact
    algorithm, the noise, the composition and the paper's (non-rigorous) Lipschitz estimate.

    Parameters
    ----------
    lam1 : float, default=0.1
        Ridge weight ``>= 0``.
    lam2 : float, default=0.1
        Task-relationship weight ``>= 0`` (``lam1 + lam2 > 0`` so that every block is strongly
        convex).
    epsilon : float or None, default=None
        Target MP-MTL ε; the method runs at the IP budget ε/n. ``None`` ⇒ no noise (plain
        alternating MTRL with the same block solver).
    delta : float, "paper" or None, default=None
        Target MP-MTL δ; ``None`` ⇒ ``min(1e-5, 1/(100 m))``
        (:func:`~privmtl.privacy.delta.user_data_delta`), ``"paper"`` ⇒ the paper's
        ``1/(m log m)``. The IP budget is δ/(n e^ε).
    iterations : int, default=1
        Outer iterations T (the paper's cross-validation chose T = 1 on its synthetic data).
    omega_eps : float, default=1e-3
        Ridge of the Omega-step relative to the mean eigenvalue of ``Wbar^T Wbar``.
    output : {"perturbed", "local"}, default="perturbed"
        ``"perturbed"``: ``coef_`` are the released noisy models (the paper's DP-MTRL).
        ``"local"``: every task keeps its own last unperturbed block solve (same guarantee).
    loss : {"squared", "logistic"}, default="squared"
        Kind of *task*: ``"logistic"`` means binary 0/1 labels, which DP-MTRL still fits by least
        squares on ±1 targets; ``score`` is then the aAUC.
    random_state : None, int or Generator, default=None

    Attributes
    ----------
    coef_ : ndarray of shape (d, m)
    omega_ : ndarray of shape (m, m)
        Last task covariance (from released models).
    privacy_ : PrivacyGuarantee
        The MP-MTL guarantee via group privacy (``valid=False``: estimated Lipschitz constants).
    ip_privacy_ : PrivacyGuarantee
        The instance-level guarantee it comes from.
    noise_to_signal_ : ndarray of shape (T,)
        ``||Wbar - W||_F / ||W||_F`` per outer iteration.
    n_iter_ : int
    """

    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "lam1": Interval(Real, 0.0, None),
        "lam2": Interval(Real, 0.0, None),
        **spec_constraints("iterations", required=("iterations",)),
        "omega_eps": Interval(Real, 0.0, None, closed="neither"),
        "output": Options(("perturbed", "local")),
        **_COMMON_CONSTRAINTS,
    }

    def __init__(
        self,
        *,
        lam1: float = 0.1,
        lam2: float = 0.1,
        epsilon: float | None = None,
        delta: float | None = None,
        iterations: int = DPMTRLMethod.default_iterations,
        omega_eps: float = 1e-3,
        output: str = "perturbed",
        loss: str = "squared",
        random_state: Any = None,
    ) -> None:
        self.lam1 = lam1
        self.lam2 = lam2
        self.epsilon = epsilon
        self.delta = delta
        self.iterations = iterations
        self.omega_eps = omega_eps
        self.output = output
        self.loss = loss
        self.random_state = random_state

    def fit(self, Xs: Sequence[ArrayLike], ys: Sequence[ArrayLike]) -> DPMTRL:
        """Fit on per-task data ``Xs[i]`` (``n_i x d``) and ``ys[i]`` (``n_i``)."""
        p = validate_params(self)
        lam1, lam2, eps, dlt, loss = p["lam1"], p["lam2"], p["epsilon"], p["delta"], p["loss"]
        if lam1 + lam2 <= 0:
            raise InvalidParameterError(
                f"The 'lam1' and 'lam2' parameters must not both be 0; got {lam1!r}, {lam2!r}."
            )
        T, omega_eps, output = p["iterations"], p["omega_eps"], p["output"]
        Xl, yl = check_tasks(Xs, ys, loss=loss)
        assert yl is not None
        if loss == "logistic":
            yl = [2.0 * y - 1.0 for y in yl]
        rng = check_rng(self.random_state)
        m, d = len(Xl), Xl[0].shape[1]
        n = np.array([x.shape[0] for x in Xl])
        n_max = int(n.max())
        grams = np.stack([x.T @ x / x.shape[0] for x in Xl])
        rhs = np.stack([x.T @ y / x.shape[0] for x, y in zip(Xl, yl, strict=True)])

        eps_t: FloatArray | None = None
        delta_ip = 0.0
        if eps is not None:
            _, _, eps_ip, delta_ip = _budgets(eps, dlt, m, n_max)
            eps_t = (
                np.array([eps_ip])
                if T == 1
                else np.asarray(allocate_budgets(eps_ip, delta_ip, T), dtype=np.float64)
            )
        omega_inv = np.eye(m) * m  # Omega^(0) = I/m
        released = np.zeros((d, m))
        local = np.zeros((d, m))
        nsr = np.zeros(T)
        eye = np.eye(d)
        lips = np.zeros(m)
        self.omega_ = np.eye(m) / m
        diverged = False
        with np.errstate(over="ignore", invalid="ignore"):
            for t in range(T):
                for i in range(m):
                    c = lam1 + lam2 * omega_inv[i, i]
                    coupling = released @ omega_inv[:, i] - released[:, i] * omega_inv[i, i]
                    w = np.linalg.solve(grams[i] + c * eye, rhs[i] - lam2 * coupling)
                    local[:, i] = w
                    if eps_t is not None:
                        lips[i] = _estimated_lipschitz(Xl[i], yl[i], w)
                        sens = 2.0 * lips[i] / (n[i] * c)
                        # draw even when sens = 0, so that the noise stream of the next tasks
                        # does not depend on this task's data
                        b = sample_l2_laplace(rng, d, sens / eps_t[t] if sens > 0 else 1.0, 1)
                        if sens > 0:
                            w = w + b[:, 0]
                    released[:, i] = w
                wn = float(np.linalg.norm(local))
                en = float(np.linalg.norm(released - local))
                nsr[t] = en / wn if wn > 0 else (0.0 if en == 0 else math.inf)
                gram_t = released.T @ released
                if not (np.all(np.isfinite(released)) and np.all(np.isfinite(gram_t))):
                    diverged = True
                    nsr[t:] = math.inf
                    break
                # Omega-step on the released models: Omega = (G + eps I)^{1/2} / trace.
                vals, vecs = scipy.linalg.eigh(gram_t, check_finite=False, driver="evd")
                vals = np.maximum(vals, 0.0)
                root = np.sqrt(vals + omega_eps * max(float(vals.mean()), 1e-300))
                trace = float(root.sum())
                self.omega_ = (vecs * (root / trace)) @ vecs.T
                omega_inv = (vecs * (trace / root)) @ vecs.T

        self.coef_ = local.copy() if output == "local" else released.copy()
        if diverged:
            warnings.warn(
                "DP-MTRL diverged: the noise of the released models feeds back through the "
                "coupling term and the estimated Lipschitz constants (use fewer iterations or "
                "larger lam1/lam2); coef_ contains non-finite values.",
                RuntimeWarning,
                stacklevel=2,
            )
        self.noise_to_signal_ = nsr
        self.n_iter_ = T
        self.n_features_in_ = d
        if eps_t is None:
            self.privacy_ = PrivacyGuarantee.non_private(
                notion=GROUP_PRIVACY_NOTION, relation="replace-one", sampling="all"
            )
            self.ip_privacy_ = PrivacyGuarantee.non_private(
                notion="IP-MTL", relation="replace-one", sampling="all"
            )
        else:
            self.privacy_, self.ip_privacy_ = _guarantees(
                eps_t=eps_t,
                delta_ip=delta_ip,
                n_max=n_max,
                valid=False,
                notes=(
                    "DP-MTRL output perturbation with the MP-MTL paper's estimated Lipschitz "
                    "constants L_i = max_j |x_ij^T w_i - y_ij| ||x_ij|| (data-dependent and below "
                    "a true bound): the stated epsilon is not rigorously met",
                ),
                details={"lipschitz_last": lips.tolist(), "iterations": T},
            )
        return self


class DPAGGR(_IPBase):
    """DP-AGGR (Pathak et al. 2010): noisy average of locally trained models, MP-MTL by group privacy.

    Objective of the local models (one per task, then averaged)::

        w_i = argmin_w (1/n_i) sum_j l(x_ij^T w, y_ij) + (lam/2) ||w||^2,
        coef_[:, i] = (1/m) sum_k w_k + b   for every task i,

    with ``b`` the output-perturbation noise of the module docstring (T = 1). ``l`` is the squared
    or the logistic loss.

    Parameters
    ----------
    lam : float, default=1.0
        Local ridge weight ``> 0`` (the sensitivity is ``∝ 1/lam``).
    epsilon : float or None, default=None
        Target MP-MTL ε (run at ε/n). ``None`` ⇒ plain model averaging.
    delta : float, "paper" or None, default=None
        Target MP-MTL δ; ``None`` ⇒ ``min(1e-5, 1/(100 m))``, ``"paper"`` ⇒ ``1/(m log m)``. The
        mechanism is pure ε, so the reported δ is 0.
    loss : {"squared", "logistic"}, default="squared"
    random_state : None, int or Generator, default=None

    Attributes
    ----------
    coef_ : ndarray of shape (d, m)
        ``m`` identical columns.
    local_coef_ : ndarray of shape (d, m)
        The local models before averaging.
    privacy_, ip_privacy_ : PrivacyGuarantee
        MP-MTL (group privacy) and instance-level guarantees.
    noise_to_signal_ : ndarray of shape (1,)
        ``||b|| / ||mean model||``.
    """

    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "lam": Interval(Real, 0.0, None, closed="neither"),
        **_COMMON_CONSTRAINTS,
    }

    def __init__(
        self,
        *,
        lam: float = 1.0,
        epsilon: float | None = None,
        delta: float | None = None,
        loss: str = "squared",
        random_state: Any = None,
    ) -> None:
        self.lam = lam
        self.epsilon = epsilon
        self.delta = delta
        self.loss = loss
        self.random_state = random_state

    def fit(self, Xs: Sequence[ArrayLike], ys: Sequence[ArrayLike]) -> DPAGGR:
        """Fit the local models, average them and add the noise."""
        p = validate_params(self)
        lam, eps, dlt, loss = p["lam"], p["epsilon"], p["delta"], p["loss"]
        Xl, yl = check_tasks(Xs, ys, loss=loss)
        assert yl is not None
        rng = check_rng(self.random_state)
        m, d = len(Xl), Xl[0].shape[1]
        n = np.array([x.shape[0] for x in Xl])
        n_max = int(n.max())
        W = local_ridge(TaskBatch.from_tasks(Xl, yl), loss, lam)
        mean = W.mean(axis=1)
        noisy = mean.copy()
        self.noise_to_signal_ = np.zeros(1)
        if eps is not None:
            _, _, eps_ip, _ = _budgets(eps, dlt, m, n_max)
            row_norm = np.array([float(np.linalg.norm(x, axis=1).max()) for x in Xl])
            if loss == "logistic":
                # |l'| <= 1, so L_i <= max_j ||x_ij||: 1 for rows normalized to unit length (a
                # public bound); otherwise the data-dependent row norm (then not rigorous).
                valid = bool(np.all(row_norm <= 1.0 + 1e-12))
                lips = np.ones(m) if valid else np.maximum(row_norm, 1.0)
                note = "logistic loss: |l'| <= 1 and ||x|| <= 1, so L_i = 1"
            else:
                lips = np.array(
                    [
                        _estimated_lipschitz(x, y, W[:, i])
                        for i, (x, y) in enumerate(zip(Xl, yl, strict=True))
                    ]
                )
                valid = False
                note = (
                    "squared loss: estimated Lipschitz constants L_i = max_j |x_ij^T w_i - y_ij| "
                    "||x_ij|| (data-dependent, below a true bound): the stated epsilon is not "
                    "rigorously met"
                )
            sens = float(np.max(2.0 * lips / (m * n * lam)))
            if sens > 0:
                b = sample_l2_laplace(rng, d, sens / eps_ip, 1)[:, 0]
                noisy = mean + b
                mn = float(np.linalg.norm(mean))
                self.noise_to_signal_ = np.array(
                    [float(np.linalg.norm(b)) / mn if mn > 0 else math.inf]
                )
            self.privacy_, self.ip_privacy_ = _guarantees(
                eps_t=np.array([eps_ip]),
                delta_ip=0.0,
                n_max=n_max,
                valid=valid,
                notes=(
                    note,
                    "sensitivity of the average of m local ridge models: max_i 2 L_i/(m n_i lam)",
                ),
                details={"sensitivity": sens},
                not_covered=(NOT_COVERED_GROUP_FACTOR, NOT_COVERED_AGGR_SCALE),
            )
        else:
            self.privacy_ = PrivacyGuarantee.non_private(
                notion=GROUP_PRIVACY_NOTION, relation="replace-one", sampling="all"
            )
            self.ip_privacy_ = PrivacyGuarantee.non_private(
                notion="IP-MTL", relation="replace-one", sampling="all"
            )
        self.local_coef_ = W
        self.coef_ = np.repeat(noisy[:, None], m, axis=1)
        self.n_iter_ = 1
        self.n_features_in_ = d
        return self
