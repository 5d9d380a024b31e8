"""Norm-penalized linear MTL with certified solvers: trace norm, l2,1 norm, and per-task l1 (Lasso).

Each estimator minimizes (``L_i`` the per-task mean loss of :mod:`privmtl.linear.losses`, no
intercept)

    P(W) = sum_i L_i(w_i) + (mu/2) ||W||_F^2 + lam h(W)

and stops when the relative duality gap ``(P(W) - D) / |P(W)|`` is at most ``tol``
(:func:`privmtl.linear.solvers.duality_gap`), so ``P(coef_) - P* <= dual_gap_``.

=========================  ==============================================  ========================
estimator                  ``h(W)``                                        structure
=========================  ==============================================  ========================
:class:`TraceNormMTL`      ``||W||_*`` (sum of singular values)            low rank (Ji & Ye 2009)
:class:`L21MTL`            ``sum_j ||W[j, :]||_2`` (rows = features)       shared features (Liu et
                                                                           al. 2009)
:class:`STLLasso`          ``sum_i ||w_i||_1``                             independent sparse tasks
=========================  ==============================================  ========================

Solvers (``solver="auto"``): ADMM with cached per-task factorizations for the squared loss, FISTA
with adaptive restart for the logistic loss (:mod:`privmtl.linear.solvers`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from privmtl._validation import Boolean, Interval, Options, validate_params
from privmtl.exceptions import InvalidParameterError
from privmtl.linear.common import PreparedTasks, _LinearMTLBase
from privmtl.linear.losses import LOSSES
from privmtl.linear.prox import PENALTIES, Penalty
from privmtl.linear.solvers import admm_squared, duality_gap, fista

__all__ = ["L21MTL", "STLLasso", "TraceNormMTL"]

FloatArray = NDArray[np.float64]

SOLVERS = ("auto", "admm", "proximal-gradient")


class _PenalizedMTL(_LinearMTLBase):
    """Shared ``fit`` of the norm-penalized estimators (subclasses name the penalty)."""

    _penalty: ClassVar[str]
    step_size_: float | FloatArray
    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "lam": Interval(Real, 0.0, None),
        "loss": Options(LOSSES),
        "mu": Interval(Real, 0.0, None),
        "tol": Interval(Real, 0.0, None, closed="neither"),
        "max_iter": Interval(Integral, 1, None),
        "accelerate": Boolean(),
        "solver": Options(SOLVERS),
    }

    def __init__(
        self,
        *,
        lam: float = 1.0,
        loss: str = "squared",
        mu: float = 0.0,
        tol: float = 1e-8,
        max_iter: int = 5000,
        accelerate: bool = True,
        solver: str = "auto",
    ) -> None:
        self.lam = lam
        self.loss = loss
        self.mu = mu
        self.tol = tol
        self.max_iter = max_iter
        self.accelerate = accelerate
        self.solver = solver

    def fit(self, Xs: Any, ys: Sequence[ArrayLike] | None = None) -> Any:
        """Solve the estimator's objective; ``Xs`` may be a MultiTaskDataset (then omit ``ys``)."""
        p = validate_params(self)
        tasks = self._prepare_fit(Xs, ys)
        penalty = PENALTIES[self._penalty]
        solver = p["solver"]
        if solver == "auto":
            solver = "admm" if p["loss"] == "squared" else "proximal-gradient"
        if solver == "admm" and p["loss"] != "squared":
            raise InvalidParameterError(
                "The 'solver' parameter 'admm' needs loss='squared'; got loss="
                f"{p['loss']!r} (use solver='auto' or 'proximal-gradient')."
            )
        lam, mu = p["lam"], p["mu"]
        zero = np.zeros((tasks.d, tasks.m))
        # W = 0 is optimal iff -grad(0) lies in lam * (unit ball of the dual norm).
        if np.all(penalty.dual_norm(tasks.grads(zero)) <= lam):
            primal, gap = duality_gap(tasks.batch, p["loss"], zero, lam=lam, mu=mu, penalty=penalty)
            self.step_size_ = math.nan
            self.dual_gap_ = max(gap, 0.0)
            self._set_fitted(zero, 0, [primal])
            return self
        if solver == "admm":
            res = admm_squared(
                tasks.batch, lam=lam, mu=mu, penalty=penalty, tol=p["tol"], max_iter=p["max_iter"]
            )
            W, hist, n_iter, ok, gap = res.W, res.objective, res.n_iter, res.converged, res.gap
            self.step_size_ = math.nan
        else:
            W, hist, n_iter, ok, step = self._proximal_gradient(tasks, penalty, p)
            gap = duality_gap(tasks.batch, p["loss"], W, lam=lam, mu=mu, penalty=penalty)[1]
            self.step_size_ = step
        if not ok:
            self._warn_not_converged("the solver")
        self.dual_gap_ = float(gap)
        self._set_fitted(W, n_iter, hist)
        return self

    def _proximal_gradient(
        self, tasks: PreparedTasks, penalty: Penalty, p: dict[str, Any]
    ) -> tuple[FloatArray, list[float], int, bool, float | FloatArray]:
        loss, lam, mu = p["loss"], p["lam"], p["mu"]
        lips = tasks.task_lipschitz(mu)
        if penalty.separable:
            step: float | FloatArray = 1.0 / np.maximum(lips, 1e-12)
        else:
            step = 1.0 / max(float(lips.max()), 1e-12)

        def smooth(W: FloatArray) -> tuple[float, FloatArray]:
            val = float(tasks.losses(W).sum() + 0.5 * mu * np.sum(W * W))
            return val, tasks.grads(W) + mu * W

        def prox(V: FloatArray, s: float | FloatArray) -> tuple[FloatArray, float]:
            P, h = penalty.prox(V, lam * s)
            return P, lam * h

        def certificate(W: FloatArray) -> tuple[float, float]:
            return duality_gap(tasks.batch, loss, W, lam=lam, mu=mu, penalty=penalty)

        W, hist, n_iter, ok = fista(
            smooth,
            prox,
            np.zeros((tasks.d, tasks.m)),
            step,
            max_iter=p["max_iter"],
            tol=p["tol"],
            accelerate=p["accelerate"],
            certificate=None if lam == 0.0 and mu == 0.0 else certificate,
        )
        return W, hist, n_iter, ok, step


_PARAMS_DOC = """
    Parameters
    ----------
    lam : float, default=1.0
        Penalty weight ``>= 0``.
    loss : {"squared", "logistic"}, default="squared"
    mu : float, default=0.0
        Strong-convexity weight (the MP-MTL paper uses 1e-3 in some runs).
    tol : float, default=1e-8
        Stop when the duality gap is at most ``tol`` times the objective. (With ``lam = mu = 0``
        there is no certificate and the proximal-gradient step size criterion of
        :func:`~privmtl.linear.solvers.fista` is used.)
    max_iter : int, default=5000
    accelerate : bool, default=True
        FISTA momentum with restart in the proximal-gradient solver; plain proximal gradient when
        False (the objective then decreases at every iteration).
    solver : {"auto", "admm", "proximal-gradient"}, default="auto"
        ``"auto"``: ADMM for the squared loss, proximal gradient otherwise.

    Attributes
    ----------
    coef_ : ndarray of shape (d, m)
    dual_gap_ : float
        Duality gap at ``coef_``: an upper bound on ``P(coef_) - P*``.
    n_iter_ : int
    objective_ : ndarray of shape ``(n_iter_,)``
        Objective after every iteration.
    step_size_ : float or ndarray
        Step of the proximal-gradient solver (``nan`` for ADMM).
"""


class TraceNormMTL(_PenalizedMTL):
    __doc__ = (
        """Trace-norm regularized multi-task learning (low-rank ``W``; Ji & Ye 2009).

    Minimizes ``sum_i L_i(w_i) + (mu/2) ||W||_F^2 + lam ||W||_*`` (``||.||_*``: sum of singular
    values) to a certified relative duality gap ``tol`` (see :mod:`privmtl.linear.regularized`).
"""
        + _PARAMS_DOC
    )

    _penalty = "trace"


class L21MTL(_PenalizedMTL):
    __doc__ = (
        """l2,1-regularized multi-task learning (joint feature selection; Liu, Ji & Ye 2009).

    Minimizes ``sum_i L_i(w_i) + (mu/2) ||W||_F^2 + lam sum_j ||W[j, :]||_2``: each row of ``W``
    (one feature across all tasks) is kept or dropped as a group.
"""
        + _PARAMS_DOC
    )

    _penalty = "l21"


class STLLasso(_PenalizedMTL):
    __doc__ = (
        """Single-task learning with an l1 penalty (one Lasso / l1-logistic model per task).

    Minimizes ``sum_i [L_i(w_i) + (mu/2) ||w_i||^2 + lam ||w_i||_1]``; the tasks are independent
    (the solvers use one step or penalty parameter per task and certify each task's dual point).
    For the squared loss this is scikit-learn's ``Lasso(alpha=lam, fit_intercept=False)``
    objective, which minimizes ``(1/(2 n)) ||y - X w||^2 + alpha ||w||_1`` per task.
"""
        + _PARAMS_DOC
    )

    _penalty = "l1"
