"""Non-private linear single-task and multi-task baselines of the MP-MTL paper.

Every estimator fits ``m`` linear models at once, the columns of ``coef_`` (shape ``(d, m)``), from
per-task data ``Xs[i]`` (``n_i x d``) and ``ys[i]`` (``n_i``). Objectives use the per-task mean
losses of :mod:`privmtl.linear.losses`::

    L_i(w) = (1/n_i) sum_j l(x_ij^T w, y_ij),
    l = 0.5 (s - y)^2 ("squared")  or  log(1 + exp(-(2y - 1) s)) ("logistic", labels 0/1),

so every task counts equally whatever its size. **No intercept** is fitted: append a constant
feature if one is wanted (the School data has one).

=========================  ========================================================================
estimator                  objective (minimized over ``W = [w_1..w_m]``)
=========================  ========================================================================
:class:`STLRidge`          ``sum_i [L_i(w_i) + (lam/2) ||w_i||^2]``  (tasks independent)
:class:`STLLasso`          ``sum_i [L_i(w_i) + (mu/2) ||w_i||^2 + lam ||w_i||_1]``
:class:`TraceNormMTL`      ``sum_i L_i(w_i) + (mu/2) ||W||_F^2 + lam ||W||_*``  (Ji & Ye 2009)
:class:`L21MTL`            ``sum_i L_i(w_i) + (mu/2) ||W||_F^2 + lam ||W||_{2,1}``  (Liu et al.)
:class:`MTRL`              ``sum_i L_i(w_i) + (lam1/2) ||W||_F^2 + (lam2/2) tr(W Omega^-1 W^T)``
                           over W and ``Omega >= 0, tr(Omega) = 1`` (Zhang & Yeung 2010)
:class:`ModelAveraging`    STLRidge per task, then every task uses the mean model (DP-AGGR, no noise)
=========================  ========================================================================

Common API: ``fit(Xs, ys)`` (``Xs`` may also be a :class:`~privmtl.data.MultiTaskDataset`, then
``ys`` is omitted), ``decision_function(Xs)`` (scores ``X_i w_i``), ``predict(Xs)`` (scores for
the squared loss, 0/1 labels for the logistic loss), ``predict_proba(Xs)`` (logistic only) and
``score(Xs, ys)``, which returns the **nMSE for the squared loss (lower is better)** and the
**aAUC for the logistic loss (higher is better)** (:mod:`privmtl.linear.metrics`). Fitted
attributes: ``coef_``, ``n_iter_``, ``objective_`` (objective after every iteration of the
solver; a single value for closed-form fits), ``n_tasks_``, ``n_features_in_``.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from sklearn.base import BaseEstimator
from sklearn.exceptions import ConvergenceWarning

from privmtl._validation import check_choice, check_int, check_real
from privmtl.linear.common import _check_tasks, _LinearMTLMixin
from privmtl.linear.losses import LOSSES, TaskBatch, task_gradients, task_lipschitz, task_losses

__all__ = [
    "L21MTL",
    "MTRL",
    "ModelAveraging",
    "STLLasso",
    "STLRidge",
    "TraceNormMTL",
    "fista",
]

FloatArray = NDArray[np.float64]
ProxFn = Callable[[FloatArray, Any], tuple[FloatArray, float]]


# --------------------------------------------------------------------------------------------------
# data handling
# --------------------------------------------------------------------------------------------------
class _Tasks:
    """Per-task data with batched (padded) evaluation when padding wastes little memory."""

    def __init__(self, Xl: list[FloatArray], yl: list[FloatArray]) -> None:
        self.Xl, self.yl = Xl, yl
        n = np.array([len(y) for y in yl])
        self.n = n
        self.m, self.d = len(Xl), Xl[0].shape[1]
        self.batch: TaskBatch | None = None
        self.zero_batch: TaskBatch | None = None
        if self.m * int(n.max()) <= 2 * int(n.sum()) + 100_000:
            self.batch = TaskBatch.from_tasks(Xl, yl)
            self.zero_batch = dataclasses.replace(self.batch, y=np.zeros_like(self.batch.y))
        self.zeros = [np.zeros_like(y) for y in yl]

    def _src(self) -> Any:
        return self.batch if self.batch is not None else self.Xl

    def losses(self, loss: str, W: FloatArray) -> FloatArray:
        return task_losses(loss, self._src(), self.yl, W)  # type: ignore[arg-type]

    def grads(self, loss: str, W: FloatArray) -> FloatArray:
        return task_gradients(loss, self._src(), self.yl, W)  # type: ignore[arg-type]

    def lipschitz(self, loss: str) -> FloatArray:
        return task_lipschitz(loss, self._src())  # type: ignore[arg-type]

    def hess_sq(self, W: FloatArray) -> FloatArray:
        """Columns ``H_i w_i`` with ``H_i = X_i^T X_i / n_i`` (Hessian of the squared loss)."""
        if self.zero_batch is not None:
            return self.zero_batch.gradients("squared", W)
        return task_gradients("squared", self.Xl, self.zeros, W)

    def rhs_sq(self) -> FloatArray:
        """Columns ``X_i^T y_i / n_i``."""
        return -task_gradients("squared", self._src(), self.yl, np.zeros((self.d, self.m)))


# --------------------------------------------------------------------------------------------------
# accelerated proximal gradient
# --------------------------------------------------------------------------------------------------
def fista(
    smooth: Callable[[FloatArray], tuple[float, FloatArray]],
    prox: ProxFn,
    W0: FloatArray,
    step: float | FloatArray,
    *,
    max_iter: int,
    tol: float,
    accelerate: bool = True,
) -> tuple[FloatArray, list[float], int, bool]:
    """Minimize ``f(W) + h(W)`` by proximal gradient with FISTA momentum and adaptive restart.

    Parameters
    ----------
    smooth : callable
        ``smooth(W) -> (f(W), grad f(W))``.
    prox : callable
        ``prox(V, step) -> (P, h(P))`` with ``P = argmin_W 0.5 ||W - V||^2 + step * h(W)``.
    W0 : ndarray
        Starting point.
    step : float or ndarray
        Step size ``1/L`` (``L`` a Lipschitz constant of ``grad f``). An array of shape ``(m,)``
        gives one step per column; valid only when ``f`` and ``h`` are separable over columns.
    max_iter : int
        Maximum number of iterations.
    tol : float
        Stop when ``||W_k - Y_{k-1}||_F <= tol * max(||W_k||_F, 1e-12)``: the proximal-gradient
        step from the extrapolated point (the scaled gradient mapping, zero exactly at optima).
    accelerate : bool, default=True
        FISTA momentum (Beck & Teboulle 2009) restarted whenever the momentum points against the
        step (O'Donoghue & Candès 2015 gradient scheme); plain proximal gradient when False.

    Returns
    -------
    W : ndarray
        Last iterate.
    objective : list of float
        ``f(W_k) + h(W_k)`` after every iteration.
    n_iter : int
    converged : bool
    """
    X = np.array(W0, dtype=np.float64, copy=True)
    Y = X.copy()
    t = 1.0
    hist: list[float] = []
    for k in range(1, max_iter + 1):
        _, G = smooth(Y)
        Xn, h = prox(Y - step * G, step)
        f, _ = smooth(Xn)
        hist.append(float(f + h))
        res = float(np.linalg.norm(Xn - Y))
        if res <= tol * max(float(np.linalg.norm(Xn)), 1e-12):
            return Xn, hist, k, True
        if accelerate:
            if float(np.vdot(Y - Xn, Xn - X)) > 0:  # momentum against the descent: restart
                t, Y = 1.0, Xn
            else:
                tn = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t * t))
                Y = Xn + ((t - 1.0) / tn) * (Xn - X)
                t = tn
        else:
            Y = Xn
        X = Xn
    return X, hist, max_iter, False


def _svt(V: FloatArray, tau: float) -> tuple[FloatArray, float]:
    U, s, Vt = np.linalg.svd(V, full_matrices=False)
    s = np.maximum(s - tau, 0.0)
    keep = s > 0
    return np.asarray((U[:, keep] * s[keep]) @ Vt[keep], dtype=np.float64), float(s.sum())


def _group_soft(V: FloatArray, tau: float) -> tuple[FloatArray, float]:
    norms = np.linalg.norm(V, axis=1, keepdims=True)
    shrunk = np.maximum(norms - tau, 0.0)
    scale = np.divide(shrunk, norms, out=np.zeros_like(norms), where=norms > 0)
    return np.asarray(V * scale, dtype=np.float64), float(shrunk.sum())


def _soft(V: FloatArray, tau: float | FloatArray) -> FloatArray:
    return np.asarray(np.sign(V) * np.maximum(np.abs(V) - tau, 0.0), dtype=np.float64)


# --------------------------------------------------------------------------------------------------
# shared estimator machinery
# --------------------------------------------------------------------------------------------------
class _LinearMTLBase(_LinearMTLMixin, BaseEstimator):  # type: ignore[misc]
    """Fitting helpers of the non-private baselines (predict / score come from the mixin)."""

    loss: str
    coef_: FloatArray

    def _prepare_fit(self, Xs: Any, ys: Any) -> _Tasks:
        check_choice("loss", self.loss, LOSSES)
        Xl, yl = _check_tasks(Xs, ys, self.loss, need_y=True)
        assert yl is not None
        return _Tasks(Xl, yl)

    def _set_fitted(self, W: FloatArray, n_iter: int, objective: Sequence[float]) -> None:
        self.coef_ = np.asarray(W, dtype=np.float64)
        self.n_features_in_, self.n_tasks_ = self.coef_.shape
        self.n_iter_ = int(n_iter)
        self.objective_ = np.asarray(objective, dtype=np.float64)

    def _warn_not_converged(self, what: str) -> None:
        warnings.warn(
            f"{type(self).__name__}: {what} did not converge within max_iter; increase max_iter "
            "or tol.",
            ConvergenceWarning,
            stacklevel=3,
        )


def _ridge_stl(
    tasks: _Tasks, loss: str, lam: float, *, tol: float, max_iter: int
) -> tuple[FloatArray, int, bool]:
    """Per-task ``argmin L_i(w) + (lam/2)||w||^2``; returns (W, max iterations, all converged)."""
    from scipy.optimize import minimize

    d, m = tasks.d, tasks.m
    W = np.zeros((d, m))
    if loss == "squared":
        for i, (X, y) in enumerate(zip(tasks.Xl, tasks.yl, strict=True)):
            n = X.shape[0]
            if lam == 0:
                W[:, i] = np.linalg.lstsq(X, y, rcond=None)[0]
            elif n < d:  # dual form: w = X^T (X X^T + n lam I)^-1 y
                W[:, i] = X.T @ np.linalg.solve(X @ X.T + n * lam * np.eye(n), y)
            else:
                W[:, i] = np.linalg.solve(X.T @ X / n + lam * np.eye(d), X.T @ y / n)
        return W, 1, True
    from privmtl.linear.losses import loss_grad, loss_value

    n_iter, ok = 0, True
    for i, (X, y) in enumerate(zip(tasks.Xl, tasks.yl, strict=True)):

        def fun(w: FloatArray, X: FloatArray = X, y: FloatArray = y) -> tuple[float, FloatArray]:
            return loss_value("logistic", X, y, w, mu=lam), loss_grad("logistic", X, y, w, mu=lam)

        res = minimize(
            fun,
            np.zeros(d),
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": max_iter, "gtol": tol, "ftol": 1e-15},
        )
        W[:, i] = res.x
        n_iter = max(n_iter, int(res.nit))
        ok = ok and bool(res.success)
    return W, n_iter, ok


def _ridge_objective(tasks: _Tasks, loss: str, lam: float, W: FloatArray) -> float:
    return float(tasks.losses(loss, W).sum() + 0.5 * lam * np.sum(W * W))


# --------------------------------------------------------------------------------------------------
# estimators
# --------------------------------------------------------------------------------------------------
class STLRidge(_LinearMTLBase):
    """Single-task learning with an l2 penalty: every task is fitted on its own.

    Minimizes, independently for every task ``i``, ``L_i(w_i) + (lam/2) ||w_i||^2`` (the module
    docstring defines ``L_i``, a mean loss without intercept).

    Parameters
    ----------
    lam : float, default=1.0
        Penalty weight ``>= 0``. With ``lam = 0`` the squared loss gives the minimum-norm least
        squares solution; the logistic loss may then diverge on separable data.
    loss : {"squared", "logistic"}, default="squared"
        Squared loss: closed form (normal equations, or their ``n_i x n_i`` dual when
        ``n_i < d``). Logistic loss: L-BFGS per task.
    tol : float, default=1e-6
        Gradient tolerance of L-BFGS (logistic only).
    max_iter : int, default=1000
        Iteration cap of L-BFGS per task (logistic only).

    Attributes
    ----------
    coef_ : ndarray of shape (d, m)
    n_iter_ : int
        1 for the closed form; the largest L-BFGS iteration count over tasks otherwise.
    objective_ : ndarray of shape (1,)
        Final objective, summed over tasks.
    """

    def __init__(
        self,
        *,
        lam: float = 1.0,
        loss: str = "squared",
        tol: float = 1e-6,
        max_iter: int = 1000,
    ) -> None:
        self.lam = lam
        self.loss = loss
        self.tol = tol
        self.max_iter = max_iter

    def fit(self, Xs: Any, ys: Sequence[ArrayLike] | None = None) -> STLRidge:
        """Fit one ridge model per task; ``Xs`` may be a MultiTaskDataset (then omit ``ys``)."""
        lam = check_real("lam", self.lam, low=0.0)
        tol = check_real("tol", self.tol, low=0.0, closed="neither")
        max_iter = check_int("max_iter", self.max_iter, low=1)
        tasks = self._prepare_fit(Xs, ys)
        W, n_iter, ok = _ridge_stl(tasks, self.loss, lam, tol=tol, max_iter=max_iter)
        if not ok:
            self._warn_not_converged("L-BFGS")
        self._set_fitted(W, n_iter, [_ridge_objective(tasks, self.loss, lam, W)])
        return self


class ModelAveraging(STLRidge):
    """Model averaging: fit :class:`STLRidge` per task, then give every task the mean model.

    This is the paper's "plain model averaging" baseline, i.e. DP-AGGR (Pathak et al. 2010) without
    its noise: ``w_bar = (1/m) sum_i w_i`` with ``w_i = argmin L_i(w) + (lam/2)||w||^2``, and
    ``coef_[:, i] = w_bar`` for every task. It assumes homogeneous tasks.

    Parameters
    ----------
    lam, loss, tol, max_iter :
        As in :class:`STLRidge` (local models).

    Attributes
    ----------
    coef_ : ndarray of shape (d, m)
        ``m`` identical columns ``w_bar``.
    local_coef_ : ndarray of shape (d, m)
        The single-task models that were averaged.
    n_iter_, objective_ :
        Those of the local fits (``objective_`` is the STLRidge objective of ``local_coef_``).
    """

    def fit(self, Xs: Any, ys: Sequence[ArrayLike] | None = None) -> ModelAveraging:
        """Fit the local models (:meth:`STLRidge.fit`) and give every task their mean."""
        super().fit(Xs, ys)
        self.local_coef_ = self.coef_
        mean = self.coef_.mean(axis=1, keepdims=True)
        self.coef_ = np.repeat(mean, self.coef_.shape[1], axis=1)
        return self


class _ProxMTL(_LinearMTLBase):
    """Shared ``fit`` of the proximal-gradient estimators (subclasses choose the penalty)."""

    _separable = False

    def __init__(
        self,
        *,
        lam: float = 1.0,
        loss: str = "squared",
        mu: float = 0.0,
        tol: float = 1e-6,
        max_iter: int = 5000,
        accelerate: bool = True,
    ) -> None:
        self.lam = lam
        self.loss = loss
        self.mu = mu
        self.tol = tol
        self.max_iter = max_iter
        self.accelerate = accelerate

    def _prox(self, V: FloatArray, tau: float | FloatArray) -> tuple[FloatArray, float]:
        raise NotImplementedError

    def fit(self, Xs: Any, ys: Sequence[ArrayLike] | None = None) -> Any:
        """Solve the estimator's objective; ``Xs`` may be a MultiTaskDataset (then omit ``ys``)."""
        lam = check_real("lam", self.lam, low=0.0)
        mu = check_real("mu", self.mu, low=0.0)
        tol = check_real("tol", self.tol, low=0.0, closed="neither")
        max_iter = check_int("max_iter", self.max_iter, low=1)
        tasks = self._prepare_fit(Xs, ys)
        loss = self.loss
        lips = tasks.lipschitz(loss) + mu
        if self._separable:
            step: float | FloatArray = 1.0 / np.maximum(lips, 1e-12)
        else:
            step = 1.0 / max(float(lips.max()), 1e-12)

        def smooth(W: FloatArray) -> tuple[float, FloatArray]:
            val = float(tasks.losses(loss, W).sum() + 0.5 * mu * np.sum(W * W))
            return val, tasks.grads(loss, W) + mu * W

        def prox(V: FloatArray, s: float | FloatArray) -> tuple[FloatArray, float]:
            P, h = self._prox(V, lam * s)
            return P, lam * h

        W, hist, n_iter, ok = fista(
            smooth,
            prox,
            np.zeros((tasks.d, tasks.m)),
            step,
            max_iter=max_iter,
            tol=tol,
            accelerate=bool(self.accelerate),
        )
        if not ok:
            self._warn_not_converged("proximal gradient")
        self.step_size_ = step
        self._set_fitted(W, n_iter, hist)
        return self


class TraceNormMTL(_ProxMTL):
    """Trace-norm regularized multi-task learning (low-rank ``W``; Ji & Ye 2009).

    Minimizes ``sum_i L_i(w_i) + (mu/2) ||W||_F^2 + lam ||W||_*`` (``||.||_*``: sum of singular
    values) by accelerated proximal gradient: FISTA with adaptive restart, fixed step ``1/L`` with
    ``L = max_i Lip(grad L_i) + mu`` (exact for the squared loss, the usual bound for the logistic
    loss), singular-value soft-thresholding as the proximal step, ``W = 0`` as the start.

    Parameters
    ----------
    lam : float, default=1.0
        Trace-norm weight ``>= 0``.
    loss : {"squared", "logistic"}, default="squared"
    mu : float, default=0.0
        Strong-convexity weight (the MP-MTL paper uses 1e-3 in some runs).
    tol : float, default=1e-6
        Relative size of the proximal-gradient step at which to stop (see :func:`fista`).
    max_iter : int, default=5000
    accelerate : bool, default=True
        FISTA momentum with restart; plain proximal gradient when False.

    Attributes
    ----------
    coef_ : ndarray of shape (d, m)
    n_iter_ : int
    objective_ : ndarray of shape (n_iter_,)
        Objective after every iteration.
    step_size_ : float
    """

    def _prox(self, V: FloatArray, tau: float | FloatArray) -> tuple[FloatArray, float]:
        return _svt(V, float(tau))


class L21MTL(_ProxMTL):
    """l2,1-regularized multi-task learning (joint feature selection; Liu, Ji & Ye 2009).

    Minimizes ``sum_i L_i(w_i) + (mu/2) ||W||_F^2 + lam sum_j ||W[j, :]||_2``: each row of ``W``
    (one feature across all tasks) is kept or dropped as a group. Solver as in
    :class:`TraceNormMTL`, with row-wise group soft-thresholding as the proximal step.

    Parameters and attributes are those of :class:`TraceNormMTL`.
    """

    def _prox(self, V: FloatArray, tau: float | FloatArray) -> tuple[FloatArray, float]:
        return _group_soft(V, float(tau))


class STLLasso(_ProxMTL):
    """Single-task learning with an l1 penalty (one Lasso / l1-logistic model per task).

    Minimizes ``sum_i [L_i(w_i) + (mu/2) ||w_i||^2 + lam ||w_i||_1]``; the tasks are independent.
    Solved jointly by FISTA with one step ``1/(Lip(grad L_i) + mu)`` per task (valid because the
    problem separates over tasks) and entry-wise soft-thresholding. For the squared loss this is
    scikit-learn's ``Lasso(alpha=lam, fit_intercept=False)`` objective up to a factor: sklearn
    minimizes ``(1/(2 n)) ||y - X w||^2 + alpha ||w||_1``, the same function of ``w``.

    Parameters and attributes are those of :class:`TraceNormMTL` (``step_size_`` is an array of
    shape ``(m,)``).
    """

    _separable = True

    def _prox(self, V: FloatArray, tau: float | FloatArray) -> tuple[FloatArray, float]:
        P = _soft(V, tau)
        # h must be reported for lam = 1 (the caller multiplies by lam).
        return P, float(np.abs(P).sum())


class MTRL(_LinearMTLBase):
    """Multi-task relationship learning (Zhang & Yeung, UAI 2010), without intercepts.

    Problem, over ``W`` and a task covariance ``Omega`` (``m x m``, ``Omega >= 0``,
    ``tr(Omega) = 1``)::

        min  J(W, Omega) = sum_i L_i(w_i) + (lam1/2) ||W||_F^2 + (lam2/2) tr(W Omega^-1 W^T)

    For fixed ``W`` the best ``Omega`` is ``(W^T W)^{1/2} / tr((W^T W)^{1/2})`` (Zhang & Yeung), and
    then ``tr(W Omega^-1 W^T) = ||W||_*^2``. So MTRL minimizes
    ``F(W) = sum_i L_i(w_i) + (lam1/2) ||W||_F^2 + (lam2/2) ||W||_*^2`` (a squared trace norm),
    whose optimality condition says that ``W`` solves :class:`TraceNormMTL` with ``mu = lam1`` and
    ``lam = tau``, where ``tau = lam2 ||W||_*``.

    Two solvers:

    * ``solver="exact"`` (default): finds the unique root of
      ``phi(tau) = tau - lam2 ||W_TN(tau)||_*`` (increasing in ``tau``) by bracketing and Brent's
      method, each evaluation a warm-started accelerated proximal-gradient trace-norm solve to
      ``inner_tol``. ``W`` is optimal for ``F`` up to the solver tolerances, and
      ``omega_ = (W^T W)^{1/2} / ||W||_*`` (singular when ``rank W < m``). ``eps`` is not used.
    * ``solver="alternating"``: Zhang & Yeung's alternating minimization of
      ``J_eps(W, Omega) = J(W, Omega) + (lam2/2) eps tr(Omega^-1)``, i.e. the Omega-step uses
      ``W^T W + eps I`` so that Omega stays invertible. The W-step is solved in ``V = W Omega^{-1/2}``
      (conjugate gradients for the squared loss, L-BFGS for the logistic loss); start
      ``Omega = I/m``; ``J_eps`` never increases. Caveat: with ``m > d`` the row space of ``W`` is
      almost frozen after the first W-step when ``eps`` is tiny compared with ``W^T W``, so the
      iterates stall far from the optimum of ``F``; a larger ``eps`` mitigates it but changes the
      problem. Provided for fidelity to the published algorithm (and DP-MTRL, which perturbs it).

    Cost: an SVD or ``m x m`` eigen-decomposition per iteration, so this baseline suits ``m`` up to
    a few thousand.

    Parameters
    ----------
    lam1 : float, default=0.1
        Weight of the ridge term ``>= 0``.
    lam2 : float, default=0.1
        Weight of the task-relationship term ``> 0``. Note the scale: the term equals
        ``(lam2/2) ||W||_*^2``, so useful values are far smaller than trace-norm weights.
    loss : {"squared", "logistic"}, default="squared"
    solver : {"exact", "alternating"}, default="exact"
    eps : float, default=1e-8
        Ridge added to ``W^T W`` in the Omega-step of the alternating solver (absolute).
    tol : float, default=1e-6
        Exact solver: relative tolerance on ``tau``. Alternating solver: stop when the relative
        decrease of ``J_eps`` between outer iterations is below ``tol``.
    max_iter : int, default=100
        Maximum number of trace-norm solves (exact) or outer iterations (alternating).
    inner_tol : float, default=1e-9
        Tolerance of the inner solver (proximal-gradient stopping rule of :func:`fista`; CG
        relative residual; L-BFGS gradient).
    inner_max_iter : int, default=5000

    Attributes
    ----------
    coef_ : ndarray of shape (d, m)
    omega_ : ndarray of shape (m, m)
        Learned task covariance (trace 1).
    tau_ : float
        Equivalent trace-norm weight ``lam2 ||W||_*`` (exact solver; ``nan`` otherwise).
    n_iter_ : int
        Number of trace-norm solves (exact) or outer iterations (alternating).
    objective_ : ndarray
        Exact: ``F`` at every evaluated ``tau`` (not monotone; the last is the solution).
        Alternating: ``J_eps`` after every outer iteration (non-increasing).
    """

    def __init__(
        self,
        *,
        lam1: float = 0.1,
        lam2: float = 0.1,
        loss: str = "squared",
        solver: str = "exact",
        eps: float = 1e-8,
        tol: float = 1e-6,
        max_iter: int = 100,
        inner_tol: float = 1e-9,
        inner_max_iter: int = 5000,
    ) -> None:
        self.lam1 = lam1
        self.lam2 = lam2
        self.loss = loss
        self.solver = solver
        self.eps = eps
        self.tol = tol
        self.max_iter = max_iter
        self.inner_tol = inner_tol
        self.inner_max_iter = inner_max_iter

    def fit(self, Xs: Any, ys: Sequence[ArrayLike] | None = None) -> MTRL:
        """Solve the MTRL problem; ``Xs`` may be a MultiTaskDataset (then omit ``ys``)."""
        check_real("lam1", self.lam1, low=0.0)
        check_real("lam2", self.lam2, low=0.0, closed="neither")
        check_real("eps", self.eps, low=0.0)
        check_real("tol", self.tol, low=0.0, closed="neither")
        check_int("max_iter", self.max_iter, low=1)
        check_real("inner_tol", self.inner_tol, low=0.0, closed="neither")
        check_int("inner_max_iter", self.inner_max_iter, low=1)
        solver = check_choice("solver", self.solver, ("exact", "alternating"))
        tasks = self._prepare_fit(Xs, ys)
        if solver == "exact":
            self._fit_exact(tasks)
        else:
            self._fit_alternating(tasks)
        return self

    def _objective(self, tasks: _Tasks, W: FloatArray) -> float:
        tn = float(np.linalg.svd(W, compute_uv=False).sum()) if W.size else 0.0
        return float(
            tasks.losses(self.loss, W).sum()
            + 0.5 * self.lam1 * np.sum(W * W)
            + 0.5 * self.lam2 * tn * tn
        )

    def _fit_exact(self, tasks: _Tasks) -> None:
        from scipy.optimize import brentq

        loss, lam1, lam2 = self.loss, float(self.lam1), float(self.lam2)
        step = 1.0 / max(float(tasks.lipschitz(loss).max()) + lam1, 1e-12)

        def smooth(W: FloatArray) -> tuple[float, FloatArray]:
            val = float(tasks.losses(loss, W).sum() + 0.5 * lam1 * np.sum(W * W))
            return val, tasks.grads(loss, W) + lam1 * W

        state: dict[str, Any] = {"W": np.zeros((tasks.d, tasks.m)), "ok": True, "hist": []}

        def solve(tau: float) -> FloatArray:
            W, _, _, ok = fista(
                smooth,
                lambda V, s: _svt(V, tau * s),
                state["W"],
                step,
                max_iter=int(self.inner_max_iter),
                tol=float(self.inner_tol),
            )
            state["W"], state["ok"] = W, state["ok"] and ok
            state["hist"].append(self._objective(tasks, W))
            return W

        def phi(tau: float) -> float:
            W = solve(tau)
            return tau - lam2 * float(np.linalg.svd(W, compute_uv=False).sum())

        # W_TN(tau) = 0 for tau >= ||grad f(0)||_2, so phi(hi) = hi > 0.
        hi = float(np.linalg.norm(tasks.grads(loss, np.zeros((tasks.d, tasks.m))), 2))
        if hi == 0.0:
            W, tau = np.zeros((tasks.d, tasks.m)), 0.0
            state["hist"].append(self._objective(tasks, W))
        else:
            lo = hi
            for _ in range(60):  # halve until phi < 0 (phi -> -lam2 ||W_TN(0)||_* as tau -> 0)
                lo /= 2.0
                phi_lo = phi(lo)
                if phi_lo < 0:
                    break
                hi = lo
            if phi_lo >= 0:  # root below 2^-60 of the start: the penalty is numerically inactive
                tau = lo
            else:
                tau = float(
                    brentq(
                        phi,
                        lo,
                        hi,
                        xtol=1e-15 * hi,
                        rtol=max(float(self.tol), 4e-16),
                        maxiter=int(self.max_iter),
                    )
                )
            W = solve(tau)
        if not state["ok"]:
            self._warn_not_converged("the trace-norm solver")
        _, s, Vt = np.linalg.svd(W, full_matrices=False)
        total = float(s.sum())
        self.omega_ = (Vt.T * (s / total)) @ Vt if total > 0 else np.eye(tasks.m) / tasks.m
        self.tau_ = tau
        self._set_fitted(W, len(state["hist"]), state["hist"])

    def _fit_alternating(self, tasks: _Tasks) -> None:
        lam1, lam2, eps = float(self.lam1), float(self.lam2), float(self.eps)
        tol, max_iter = float(self.tol), int(self.max_iter)
        m, d = tasks.m, tasks.d
        root = np.eye(m) / math.sqrt(m)  # Omega^{1/2} for Omega = I/m
        omega = np.eye(m) / m
        V = np.zeros((d, m))
        W = np.zeros((d, m))
        hist: list[float] = []
        inner_ok, converged = True, False
        for it in range(1, max_iter + 1):
            V, ok = self._w_step(
                tasks, root, V, lam1, lam2, float(self.inner_tol), int(self.inner_max_iter)
            )
            inner_ok = inner_ok and ok
            W = V @ root
            # Omega-step: Omega = (W^T W + eps I)^{1/2} / trace.
            evals, Q = np.linalg.eigh(W.T @ W)
            sq = np.sqrt(np.maximum(evals, 0.0) + eps)
            c = float(sq.sum())
            if c <= 0:  # W = 0 and eps = 0: nothing left to learn
                hist.append(float(tasks.losses(self.loss, W).sum()))
                converged = True
                break
            omega = (Q * (sq / c)) @ Q.T
            root = (Q * np.sqrt(sq / c)) @ Q.T
            # Express the current W in the new coordinates (warm start of the next W-step).
            inv_root = (Q * np.sqrt(c / sq)) @ Q.T if eps > 0 else np.linalg.pinv(root)
            V = W @ inv_root
            J = float(
                tasks.losses(self.loss, W).sum() + 0.5 * lam1 * np.sum(W * W) + 0.5 * lam2 * c * c
            )
            hist.append(J)
            if it > 1 and hist[-2] - J <= tol * max(abs(J), 1e-12):
                converged = True
                break
        if not inner_ok:
            self._warn_not_converged("the W-step solver")
        if not converged:
            self._warn_not_converged("the alternating minimization")
        self.omega_ = omega
        self.tau_ = float("nan")
        self._set_fitted(W, len(hist), hist)

    def _w_step(
        self,
        tasks: _Tasks,
        root: FloatArray,
        V0: FloatArray,
        lam1: float,
        lam2: float,
        tol: float,
        max_iter: int,
    ) -> tuple[FloatArray, bool]:
        """Minimize ``sum L_i((V R)_i) + lam1/2 tr(V Omega V^T) + lam2/2 ||V||^2`` (R = root)."""
        if self.loss == "squared":

            def apply(V: FloatArray) -> FloatArray:
                W = V @ root
                return (tasks.hess_sq(W) + lam1 * W) @ root + lam2 * V

            return _conjugate_gradient(apply, tasks.rhs_sq() @ root, V0, tol=tol, max_iter=max_iter)
        from scipy.optimize import minimize

        shape = V0.shape

        def fun(v: FloatArray) -> tuple[float, FloatArray]:
            V = v.reshape(shape)
            W = V @ root
            val = tasks.losses("logistic", W).sum() + 0.5 * lam1 * np.sum(W * W)
            val += 0.5 * lam2 * np.sum(V * V)
            G = (tasks.grads("logistic", W) + lam1 * W) @ root + lam2 * V
            return float(val), G.ravel()

        g0 = float(np.linalg.norm(fun(V0.ravel())[1]))
        res = minimize(
            fun,
            V0.ravel(),
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": max_iter, "gtol": tol * max(g0, 1.0), "ftol": 1e-15},
        )
        return res.x.reshape(shape), bool(res.success)


def _conjugate_gradient(
    apply: Callable[[FloatArray], FloatArray],
    B: FloatArray,
    X0: FloatArray,
    *,
    tol: float,
    max_iter: int,
) -> tuple[FloatArray, bool]:
    """Solve ``apply(X) = B`` for a symmetric positive definite operator on matrices."""
    X = X0.copy()
    R = B - apply(X)
    P = R.copy()
    rr = float(np.vdot(R, R))
    target = (tol * max(float(np.linalg.norm(B)), 1e-300)) ** 2
    if rr <= target:
        return X, True
    for _ in range(max_iter):
        AP = apply(P)
        alpha = rr / float(np.vdot(P, AP))
        X += alpha * P
        R -= alpha * AP
        rr_new = float(np.vdot(R, R))
        if rr_new <= target:
            return X, True
        P = R + (rr_new / rr) * P
        rr = rr_new
    return X, False
