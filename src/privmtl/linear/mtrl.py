"""Multi-task relationship learning (MTRL; Zhang & Yeung, UAI 2010): learns a task covariance.

See :class:`MTRL` for the problem, its reduction to a squared trace-norm penalty and the two
solvers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral, Real
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from privmtl._validation import Interval, Options, validate_params
from privmtl.linear.common import PreparedTasks, _LinearMTLBase
from privmtl.linear.losses import LOSSES
from privmtl.linear.prox import PENALTIES
from privmtl.linear.solvers import conjugate_gradient, fista

__all__ = ["MTRL"]

FloatArray = NDArray[np.float64]


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

    _parameter_constraints: ClassVar[dict[str, Any]] = {
        "lam1": Interval(Real, 0.0, None),
        "lam2": Interval(Real, 0.0, None, closed="neither"),
        "loss": Options(LOSSES),
        "solver": Options(("exact", "alternating")),
        "eps": Interval(Real, 0.0, None),
        "tol": Interval(Real, 0.0, None, closed="neither"),
        "max_iter": Interval(Integral, 1, None),
        "inner_tol": Interval(Real, 0.0, None, closed="neither"),
        "inner_max_iter": Interval(Integral, 1, None),
    }

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
        solver = validate_params(self)["solver"]
        tasks = self._prepare_fit(Xs, ys)
        if solver == "exact":
            self._fit_exact(tasks)
        else:
            self._fit_alternating(tasks)
        return self

    def _objective(self, tasks: PreparedTasks, W: FloatArray) -> float:
        tn = float(np.linalg.svd(W, compute_uv=False).sum()) if W.size else 0.0
        return float(
            tasks.losses(W).sum() + 0.5 * self.lam1 * np.sum(W * W) + 0.5 * self.lam2 * tn * tn
        )

    def _fit_exact(self, tasks: PreparedTasks) -> None:
        from scipy.optimize import brentq

        lam1, lam2 = float(self.lam1), float(self.lam2)
        trace = PENALTIES["trace"]
        step = 1.0 / max(float(tasks.task_lipschitz().max()) + lam1, 1e-12)

        def smooth(W: FloatArray) -> tuple[float, FloatArray]:
            val = float(tasks.losses(W).sum() + 0.5 * lam1 * np.sum(W * W))
            return val, tasks.grads(W) + lam1 * W

        state: dict[str, Any] = {"W": np.zeros((tasks.d, tasks.m)), "ok": True, "hist": []}

        def solve(tau: float) -> FloatArray:
            W, _, _, ok = fista(
                smooth,
                lambda V, s: trace.prox(V, tau * s),
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
        hi = float(np.linalg.norm(tasks.grads(np.zeros((tasks.d, tasks.m))), 2))
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

    def _fit_alternating(self, tasks: PreparedTasks) -> None:
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
                hist.append(float(tasks.losses(W).sum()))
                converged = True
                break
            omega = (Q * (sq / c)) @ Q.T
            root = (Q * np.sqrt(sq / c)) @ Q.T
            # Express the current W in the new coordinates (warm start of the next W-step).
            inv_root = (Q * np.sqrt(c / sq)) @ Q.T if eps > 0 else np.linalg.pinv(root)
            V = W @ inv_root
            J = float(tasks.losses(W).sum() + 0.5 * lam1 * np.sum(W * W) + 0.5 * lam2 * c * c)
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
        tasks: PreparedTasks,
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

            return conjugate_gradient(apply, tasks.rhs_sq() @ root, V0, tol=tol, max_iter=max_iter)
        from scipy.optimize import minimize

        shape = V0.shape

        def fun(v: FloatArray) -> tuple[float, FloatArray]:
            V = v.reshape(shape)
            W = V @ root
            val = tasks.losses(W).sum() + 0.5 * lam1 * np.sum(W * W)
            val += 0.5 * lam2 * np.sum(V * V)
            G = (tasks.grads(W) + lam1 * W) @ root + lam2 * V
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
