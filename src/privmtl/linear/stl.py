"""Single-task baselines: one ridge model per task (:class:`STLRidge`) and their average.

:class:`STLRidge` minimizes, independently for every task, ``L_i(w_i) + (lam/2) ||w_i||^2``
(``L_i`` the per-task mean loss of :mod:`privmtl.linear.losses`, no intercept).
:class:`ModelAveraging` gives every task the mean of those models. The l1 single-task baseline,
:class:`~privmtl.linear.regularized.STLLasso`, lives with the other norm-penalized estimators.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from privmtl._validation import Interval, Options, validate_params
from privmtl.linear.common import PreparedTasks, _LinearMTLBase
from privmtl.linear.local import select_ridge_per_task
from privmtl.linear.losses import LOSSES, loss_grad, loss_value
from privmtl.linear.prox import PENALTIES
from privmtl.linear.solvers import duality_gap

__all__ = ["ModelAveraging", "STLRidge"]

FloatArray = NDArray[np.float64]


def _ridge_stl(
    tasks: PreparedTasks, loss: str, lams: FloatArray, *, tol: float, max_iter: int
) -> tuple[FloatArray, int, bool]:
    """Per-task ``argmin L_i(w) + (lam_i/2)||w||^2``; returns (W, max iterations, converged)."""
    from scipy.optimize import minimize

    d, m = tasks.d, tasks.m
    W = np.zeros((d, m))
    if loss == "squared":
        for i, (X, y) in enumerate(zip(tasks.Xl, tasks.yl, strict=True)):
            n, lam = X.shape[0], float(lams[i])
            if lam == 0:
                W[:, i] = np.linalg.lstsq(X, y, rcond=None)[0]
            elif n < d:  # dual form: w = X^T (X X^T + n lam I)^-1 y
                W[:, i] = X.T @ np.linalg.solve(X @ X.T + n * lam * np.eye(n), y)
            else:
                W[:, i] = np.linalg.solve(X.T @ X / n + lam * np.eye(d), X.T @ y / n)
        return W, 1, True

    n_iter, ok = 0, True
    for i, (X, y) in enumerate(zip(tasks.Xl, tasks.yl, strict=True)):
        lam = float(lams[i])

        def fun(
            w: FloatArray, X: FloatArray = X, y: FloatArray = y, lam: float = lam
        ) -> tuple[float, FloatArray]:
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


class STLRidge(_LinearMTLBase):
    """Single-task learning with an l2 penalty: every task is fitted on its own.

    Minimizes, independently for every task ``i``, ``L_i(w_i) + (lam/2) ||w_i||^2`` (the module
    docstring defines ``L_i``, a mean loss without intercept).

    Parameters
    ----------
    lam : float or "cv", default=1.0
        Penalty weight ``>= 0``. With ``lam = 0`` the squared loss gives the minimum-norm least
        squares solution; the logistic loss may then diverge on separable data. ``"cv"``: every
        task chooses its own weight by cross-validation on its own samples only
        (:func:`~privmtl.linear.local.select_ridge_per_task`: exact leave-one-out for the squared
        loss), so a task's model depends on no other task's data; ``lam_`` holds the choices.
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
    lam_ : ndarray of shape (m,)
        Every task's penalty weight.
    dual_gap_ : float
        Duality gap at ``coef_`` (:func:`~privmtl.linear.solvers.duality_gap` with ``mu = lam``),
        a bound on the suboptimality; ``nan`` when ``lam = 0`` (no dual certificate).
    n_iter_ : int
        1 for the closed form; the largest L-BFGS iteration count over tasks otherwise.
    objective_ : ndarray of shape (1,)
        Final objective, summed over tasks.
    """

    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "lam": [Interval(Real, 0.0, None), Options(("cv",))],
        "loss": Options(LOSSES),
        "tol": Interval(Real, 0.0, None, closed="neither"),
        "max_iter": Interval(Integral, 1, None),
    }

    def __init__(
        self,
        *,
        lam: float | str = 1.0,
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
        p = validate_params(self)
        tasks = self._prepare_fit(Xs, ys)
        if p["lam"] == "cv":
            lams = select_ridge_per_task(tasks.batch, self.loss)
        else:
            lams = np.full(tasks.m, float(p["lam"]))
        W, n_iter, ok = _ridge_stl(tasks, self.loss, lams, tol=p["tol"], max_iter=p["max_iter"])
        if not ok:
            self._warn_not_converged("L-BFGS")
        if np.all(lams == lams[0]):
            primal, gap = duality_gap(
                tasks.batch, self.loss, W, lam=0.0, mu=float(lams[0]), penalty=PENALTIES["l1"]
            )
        else:  # the objective is separable: sum the tasks' own certificates
            primal, gap = 0.0, 0.0
            for i in range(tasks.m):
                one = PreparedTasks([tasks.Xl[i]], [tasks.yl[i]], loss=self.loss)
                pi, gi = duality_gap(
                    one.batch,
                    self.loss,
                    W[:, i : i + 1],
                    lam=0.0,
                    mu=float(lams[i]),
                    penalty=PENALTIES["l1"],
                )
                primal, gap = primal + pi, gap + gi
        self.lam_ = lams
        self.dual_gap_ = float(gap)
        self._set_fitted(W, n_iter, [primal])
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
    n_iter_, objective_, dual_gap_ :
        Those of the local fits (``objective_`` is the STLRidge objective of ``local_coef_``).
    """

    def fit(self, Xs: Any, ys: Sequence[ArrayLike] | None = None) -> ModelAveraging:
        """Fit the local models (:meth:`STLRidge.fit`) and give every task their mean."""
        super().fit(Xs, ys)
        self.local_coef_ = self.coef_
        mean = self.coef_.mean(axis=1, keepdims=True)
        self.coef_ = np.repeat(mean, self.coef_.shape[1], axis=1)
        return self
