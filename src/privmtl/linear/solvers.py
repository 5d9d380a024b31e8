"""Solvers of the penalized linear multi-task problems, and their duality-gap certificate.

Every solver here minimizes

    P(W) = sum_i L_i(w_i) + (mu/2) ||W||_F^2 + lam h(W),   L_i(w) = (1/n_i) sum_j l(x_ij^T w, y_ij)

with ``h`` one of the norms of :data:`privmtl.linear.prox.PENALTIES`, and stops on the **relative
duality gap** ``(P(W) - D(a)) / |P(W)| <= tol``. The gap bounds the suboptimality ``P(W) - P*``, so
a stop certifies the answer (as scikit-learn's coordinate descent does with its dual gap).

Duality (Fenchel): with one dual variable ``a_ij`` per sample and
``Theta = -[X_1^T a_1 / n_1, ..., X_m^T a_m / n_m]``,

    D(a) = - sum_i (1/n_i) sum_j l*(a_ij, y_ij) - G*(Theta),   G = (mu/2) ||.||_F^2 + lam h,

and ``D(a) <= P*`` for every ``a``. :func:`duality_gap` takes ``a = c * l'(X_i w_i)`` (the dual
point the primal iterate suggests): with ``mu > 0``, ``c = 1`` and ``G*`` is evaluated through one
proximal step; with ``mu = 0``, ``G*`` is the indicator of ``h°(Theta) <= lam`` (``h°`` the dual
norm) and ``c = min(1, lam / h°(Theta))`` makes the point feasible (per task when ``h`` separates
over tasks). At the optimum the gap is zero.

:func:`admm_squared` (squared loss) is ADMM on ``W = Z`` with every task's Hessian
``X_i^T X_i / n_i + mu I`` eigendecomposed once, so each iteration is two batched ``d x d``
products and one proximal step, and the penalty parameter can change at no cost; it is set and
kept near ``3 lam / ||Z||_2`` (the scale at which the proximal step moves the iterate as much as
the loss does). It suits problems where some tasks have fewer samples than features, on which one
global gradient step ``1/L`` is slow. :func:`fista` (any smooth loss) is accelerated proximal
gradient with adaptive restart. ``benchmarks/linear_solvers.py`` compares the two.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg
from numpy.typing import NDArray

from privmtl.linear.losses import TaskBatch, loss_conjugate, loss_derivative, per_sample_loss
from privmtl.linear.prox import Penalty

__all__ = ["SolverResult", "admm_squared", "conjugate_gradient", "duality_gap", "fista"]

FloatArray = NDArray[np.float64]
ProxFn = Callable[[FloatArray, Any], tuple[FloatArray, float]]

#: ADMM penalty parameter as a multiple of lam / ||Z||_2 (see the module docstring).
_ADMM_SCALE = 3.0
#: Certificate checked every this many iterations.
_CHECK_EVERY = 5


@dataclass
class SolverResult:
    """Outcome of a certified solve: model, objective after every iteration, certificate."""

    W: FloatArray
    objective: list[float]
    n_iter: int
    gap: float
    converged: bool


def _primal_parts(
    batch: TaskBatch, loss: str, W: FloatArray
) -> tuple[FloatArray, FloatArray, float]:
    """(scores, l'(scores) masked, sum_i L_i(w_i))."""
    S = batch.scores(W)
    kind: Any = loss
    lsum = float(((per_sample_loss(kind, S, batch.y) * batch.mask).sum(axis=1) / batch.n).sum())
    A = loss_derivative(kind, S, batch.y) * batch.mask
    return S, A, lsum


def duality_gap(
    batch: TaskBatch, loss: str, W: FloatArray, *, lam: float, mu: float, penalty: Penalty
) -> tuple[float, float]:
    """Primal objective ``P(W)`` and duality gap ``P(W) - D(a)`` (see the module docstring).

    Returns ``(P(W), gap)``; ``gap >= P(W) - P*``, up to rounding. With ``lam = mu = 0`` there is
    no useful dual point (``G*`` forces ``Theta = 0``) and the gap is ``nan``.
    """
    kind: Any = loss
    _, A, lsum = _primal_parts(batch, loss, W)
    primal = lsum + 0.5 * mu * float(np.sum(W * W)) + lam * penalty.norm(W)
    if lam == 0.0 and mu == 0.0:
        return primal, math.nan
    Aw = A / batch.n[:, None]
    Theta = -np.matmul(Aw[:, None, :], batch.X)[:, 0, :].T  # (d, m)
    if mu > 0.0:
        c: float | FloatArray = 1.0
        P, hP = penalty.prox(Theta / mu, lam / mu)
        g_conj = float(np.sum(Theta * P)) - 0.5 * mu * float(np.sum(P * P)) - lam * hP
    else:
        dn = penalty.dual_norm(Theta)
        c = np.minimum(1.0, lam / np.maximum(dn, 1e-300))
        g_conj = 0.0
    # c scales every dual variable (per task when separable: c has shape (m,)).
    cc = np.asarray(c, dtype=np.float64)
    scale = cc[:, None] if cc.ndim == 1 else cc
    conj = loss_conjugate(kind, scale * A, batch.y) * batch.mask
    dual = -float((conj.sum(axis=1) / batch.n).sum()) - g_conj
    return primal, primal - dual


def _certified(primal: float, gap: float, tol: float) -> bool:
    return gap <= tol * max(abs(primal), 1e-300)


def fista(
    smooth: Callable[[FloatArray], tuple[float, FloatArray]],
    prox: ProxFn,
    W0: FloatArray,
    step: float | FloatArray,
    *,
    max_iter: int,
    tol: float,
    accelerate: bool = True,
    certificate: Callable[[FloatArray], tuple[float, float]] | None = None,
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
        With ``certificate``: stop when ``gap <= tol * |P|`` (checked every few iterations).
        Without: stop when ``||W_k - Y_{k-1}||_F <= tol * max(||W_k||_F, 1e-12)``, the scaled
        gradient mapping (zero exactly at optima).
    accelerate : bool, default=True
        FISTA momentum (Beck & Teboulle 2009) restarted whenever the momentum points against the
        step (O'Donoghue & Candès 2015 gradient scheme); plain proximal gradient when False.
    certificate : callable, optional
        ``certificate(W) -> (P(W), gap)``, e.g. :func:`duality_gap`.

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
        if certificate is None:
            res = float(np.linalg.norm(Xn - Y))
            if res <= tol * max(float(np.linalg.norm(Xn)), 1e-12):
                return Xn, hist, k, True
        elif k % _CHECK_EVERY == 0 or k == max_iter:
            primal, gap = certificate(Xn)
            if _certified(primal, gap, tol):
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


def admm_squared(
    batch: TaskBatch,
    *,
    lam: float,
    mu: float,
    penalty: Penalty,
    tol: float,
    max_iter: int,
    relaxation: float = 1.6,
) -> SolverResult:
    """Certified ADMM for the squared loss (see the module docstring); starts from ``W = 0``.

    Splits ``P`` into the smooth part ``sum_i L_i(w_i) + (mu/2)||w_i||^2`` (exact per-task solves
    through the cached eigendecompositions) and ``lam h(Z)`` (proximal step), with over-relaxation
    ``relaxation`` (Eckstein & Bertsekas). The penalty parameter is one number, or one per task
    when ``h`` separates over tasks.
    """
    d, m = batch.n_features, batch.n_tasks
    Xb, n = batch.X, batch.n
    H = np.matmul(Xb.transpose(0, 2, 1), Xb) / n[:, None, None]  # (m, d, d)
    # scipy's divide-and-conquer driver: far faster than numpy's batched eigh on small matrices.
    pairs = [scipy.linalg.eigh(h, driver="evd", check_finite=False) for h in H]
    evals = np.stack([p[0] for p in pairs])
    Q = np.stack([p[1] for p in pairs])
    evals = np.maximum(evals, 0.0) + mu  # (m, d)
    b = np.matmul((batch.y / n[:, None])[:, None, :], Xb)[:, 0, :].T  # (d, m): X_i^T y_i / n_i
    Qtb = np.einsum("mji,jm->im", Q, b)

    def solve(shift: FloatArray | float, rhs_t: FloatArray) -> FloatArray:
        """Columns ``(H_i + mu I + shift_i I)^-1 Q_i rhs_t_i`` given ``Q_i^T``-coordinates."""
        return np.einsum("mij,jm->im", Q, rhs_t / (evals.T + shift))

    def cert(W: FloatArray) -> tuple[float, float]:
        return duality_gap(batch, "squared", W, lam=lam, mu=mu, penalty=penalty)

    if lam == 0.0:  # no penalty: the per-task (minimum-norm) solutions
        top = float(evals.max(initial=0.0))
        inv = np.divide(1.0, evals.T, out=np.zeros_like(evals.T), where=evals.T > 1e-12 * top)
        W = np.einsum("mij,jm->im", Q, Qtb * inv)
        primal, gap = cert(W)
        return SolverResult(W, [primal], 1, gap, True)

    def beta_for(Z: FloatArray, old: Any) -> Any:
        """``3 lam / ||Z||_2`` (per task when separable; a zero column keeps its value)."""
        if not penalty.separable:
            sz = float(np.linalg.norm(Z, 2))
            return _ADMM_SCALE * lam / sz if sz > 0 else old
        cols = np.linalg.norm(Z, axis=0)
        safe = np.where(cols > 0, cols, 1.0)
        return np.where(cols > 0, _ADMM_SCALE * lam / safe, old)

    # Start the penalty parameter from the scale of the nearly unpenalized solutions.
    top = evals.max(axis=1, keepdims=True)
    W_ls = np.einsum("mij,jm->im", Q, Qtb / (evals + 1e-6 * top).T)
    beta: Any = beta_for(W_ls, np.ones(m) if penalty.separable else 1.0)
    Z = np.zeros((d, m))
    U = np.zeros((d, m))  # scaled dual variable
    hist: list[float] = []
    changes = 0
    gap = math.inf
    for k in range(1, max_iter + 1):
        W = solve(beta, Qtb + beta * np.einsum("mji,jm->im", Q, Z - U))
        Wr = relaxation * W + (1.0 - relaxation) * Z
        Z, hZ = penalty.prox(Wr + U, lam / beta)
        U = U + Wr - Z
        lsum = float(batch.losses("squared", Z).sum())
        hist.append(lsum + 0.5 * mu * float(np.sum(Z * Z)) + lam * hZ)
        if k % _CHECK_EVERY == 0 or k == max_iter:
            primal, gap = cert(Z)
            if _certified(primal, gap, tol):
                return SolverResult(Z, hist, k, gap, True)
            if changes < 50:
                new = beta_for(Z, beta)
                ratio = np.asarray(new) / np.asarray(beta)
                if np.any((ratio > 2.0) | (ratio < 0.5)):
                    U = U * (np.asarray(beta) / np.asarray(new))
                    beta, changes = new, changes + 1
    return SolverResult(Z, hist, max_iter, gap, False)


def conjugate_gradient(
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
