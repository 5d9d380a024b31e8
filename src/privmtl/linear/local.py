"""Local (per-task) solvers shared by the MP-MTL estimators: ridge and the variational refit.

Everything here runs inside one task on its own data, given a matrix everybody may see (a privately
released covariance): it is post-processing plus local computation and never changes a privacy
guarantee.

**Variational refit.** The trace norm and the l2,1 norm have the variational forms (Argyriou,
Evgeniou & Pontil, *Convex multi-task feature learning*, 2008)::

    ||W||_*^2     = min_{D > 0, tr D = 1}            sum_i w_i^T D^-1 w_i,  D* = (W W^T)^(1/2) / tr(.)
    ||W||_{2,1}^2 = min_{D > 0 diagonal, tr D = 1}   sum_i w_i^T D^-1 w_i,  D*_jj = ||w^j|| / sum(.)

so their alternating minimisation is: D from the current ``W W^T``, then every task solves the
generalized ridge problem ``argmin_w L_i(w) + (rho/2) w^T D^-1 w`` on its own. With ``W W^T``
replaced by a privately released covariance ``S`` this second step is a purely local refit;
:func:`variational_factor` builds ``D`` from ``S`` (eigenvalues ``max(Lambda + shift, 0)``, square
roots, a floor ``tau`` so that ``D > 0``, normalised to mean eigenvalue 1 so that ``D = I`` — pure
noise — gives back single-task ridge with weight ``rho``) and :func:`refit_with_metric` solves the
refit through the substitution ``w = A v``, ``A = D^(1/2)``: ``argmin_v L_i(X_i A v) +
(rho/2)||v||^2`` is an ordinary ridge problem.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
from numpy.typing import NDArray

from privmtl.exceptions import InvalidParameterError
from privmtl.linear.losses import TaskBatch

__all__ = ["local_ridge", "refit_with_metric", "variational_factor"]

FloatArray = NDArray[np.float64]


def local_ridge(batch: TaskBatch, loss: str, alpha: float) -> FloatArray:
    """Per-task ridge solutions ``argmin_w L_i(w) + (alpha/2)||w||^2`` (columns of a d x m matrix).

    Batched over tasks (no Python loop), through the smaller of the ``d x d`` primal or the
    ``n_max x n_max`` dual systems. Squared loss: closed form. Logistic loss: 30 Newton steps
    (in the dual, ``w = X^T a``, when ``n_max < d``), which converge to machine precision for
    well-posed ridge problems.
    """
    X, y, mask, n = batch.X, batch.y, batch.mask, batch.n
    m, n_max, d = X.shape
    if alpha <= 0:
        raise InvalidParameterError(f"The ridge weight must be > 0; got {alpha!r}.")
    Xt = X.transpose(0, 2, 1)
    primal = d <= n_max
    if loss == "squared":
        if primal:
            A = np.matmul(Xt, X) / n[:, None, None] + alpha * np.eye(d)
            b = np.matmul(Xt, (y * mask)[:, :, None]) / n[:, None, None]
            return np.asarray(np.linalg.solve(A, b)[:, :, 0].T, dtype=np.float64)
        G = np.matmul(X, Xt) + (n * alpha)[:, None, None] * np.eye(n_max)
        a = np.linalg.solve(G, (y * mask)[:, :, None])
        return np.asarray(np.matmul(Xt, a)[:, :, 0].T, dtype=np.float64)
    from scipy.special import expit

    if primal:
        W = np.zeros((m, d))
        for _ in range(30):
            prob = expit(np.matmul(X, W[:, :, None])[:, :, 0])
            r = (prob - y) * mask / n[:, None]
            g = np.matmul(r[:, None, :], X)[:, 0, :] + alpha * W
            D = prob * (1.0 - prob) * mask / n[:, None]
            H = np.matmul(Xt * D[:, None, :], X) + alpha * np.eye(d)
            W = W - np.linalg.solve(H, g[:, :, None])[:, :, 0]
        return np.asarray(W.T, dtype=np.float64)
    # Dual Newton: w = X^T a, Kg = X X^T. grad_w = X^T (r + alpha a) and the Newton system
    # (X^T D X + alpha I) dw = grad is solved by dw = X^T da with (D Kg + alpha I) da = r + alpha a.
    Kg = np.matmul(X, Xt)
    a = np.zeros((m, n_max))
    eye_n = np.eye(n_max)
    for _ in range(30):
        prob = expit(np.matmul(Kg, a[:, :, None])[:, :, 0])
        r = (prob - y) * mask / n[:, None]
        D = prob * (1.0 - prob) * mask / n[:, None]
        A = D[:, :, None] * Kg + alpha * eye_n
        a = a - np.linalg.solve(A, (r + alpha * a)[:, :, None])[:, :, 0]
    return np.asarray(np.matmul(Xt, a[:, :, None])[:, :, 0].T, dtype=np.float64)


def variational_factor(
    Sigma: FloatArray,
    *,
    penalty: str,
    shift: float | None,
    floor: float,
) -> FloatArray:
    """``A = D^(1/2)`` of the variational metric ``D`` built from a released covariance ``Sigma``.

    Parameters
    ----------
    Sigma : ndarray of shape (d, d)
        Released (noisy) ``W W^T``, symmetric.
    penalty : {"lowrank", "groupsparse"}
        Trace norm (``D`` from the eigen-decomposition) or l2,1 (``D`` diagonal from
        ``diag(Sigma)``, after the same eigenvalue fix).
    shift : float or None
        Eigenvalue fix: ``Lambda -> max(Lambda + shift, 0)`` (None: ``max(Lambda, 0)``).
    floor : float
        ``tau >= 0`` added to the square roots, in the units of ``sqrt(Lambda)`` (a model norm).

    Returns
    -------
    ndarray of shape (d, d)
        Symmetric positive semi-definite ``A`` with ``A^2 = D`` and ``mean(eig(D)) = 1``.
    """
    d = Sigma.shape[0]
    vals, U = scipy.linalg.eigh(Sigma, check_finite=False, driver="evd")
    lam = np.maximum(vals + (0.0 if shift is None else shift), 0.0)
    if penalty == "groupsparse":
        diag = (U * U) @ lam
        Dv = np.sqrt(diag) + floor
        if not Dv.mean() > 0:
            return np.eye(d)
        return np.diag(np.sqrt(Dv / Dv.mean()))
    if penalty != "lowrank":
        raise InvalidParameterError(
            f"The 'penalty' parameter must be 'lowrank' or 'groupsparse'; got {penalty!r}."
        )
    Dv = np.sqrt(lam) + floor
    if not Dv.mean() > 0:
        return np.eye(d)
    return np.asarray((U * np.sqrt(Dv / Dv.mean())) @ U.T, dtype=np.float64)


def refit_with_metric(batch: TaskBatch, loss: str, rho: float, A: FloatArray) -> FloatArray:
    """Per-task ``argmin_w L_i(w) + (rho/2) w^T D^-1 w`` with ``D = A^2`` (columns, d x m).

    Solved as ``w = A v`` with ``v`` the ridge solution of the features ``X_i A``, which is exact
    for any ``A`` (singular ``A`` restricts ``w`` to its range, the ``tau = 0`` limit).
    """
    Xa = np.matmul(batch.X, A)
    from dataclasses import replace

    V = local_ridge(replace(batch, X=Xa), loss, rho)
    return np.asarray(A @ V, dtype=np.float64)


# ----------------------------------------------- projections of Alg. 2/3 given a release
def _shrink_table(root: FloatArray, thr: FloatArray) -> FloatArray:
    """``S[k, i] = max(0, 1 - thr_i / root_k)`` (0 where ``root_k = 0``; 1 where ``thr_i = 0``).

    Column ``i`` depends only on ``root`` (from the release) and task i's own threshold.
    """
    with np.errstate(divide="ignore"):
        inv = np.where(root > 0, 1.0 / np.where(root > 0, root, 1.0), 0.0)
        s = np.where(root[:, None] > 0, 1.0 - inv[:, None] * thr[None, :], 0.0)
    s = np.where(thr[None, :] == 0, 1.0, s)
    return np.asarray(np.maximum(s, 0.0), dtype=np.float64)


def _group_shrink(diag: FloatArray, thr: float | FloatArray) -> FloatArray:
    """Row-wise shrinkage ``max(0, 1 - thr / sqrt(diag))``: a vector for a scalar ``thr``, a
    ``(d, m)`` table (one column per task) for per-task thresholds."""
    if np.ndim(thr) > 0:
        return _shrink_table(np.sqrt(np.maximum(diag, 0.0)), np.asarray(thr, dtype=np.float64))
    with np.errstate(divide="ignore"):
        root = np.sqrt(diag)
        s = np.where(root > 0, 1.0 - thr / np.where(root > 0, root, 1.0), 0.0)
    if thr == 0:
        s = np.ones_like(diag)
    return np.asarray(np.maximum(s, 0.0), dtype=np.float64)


def _spectral_factors(
    Sigma: FloatArray, thr: float, shift: float | None = None
) -> tuple[FloatArray, FloatArray]:
    """Eigenvectors U and shrinkage S_ii = max(0, 1 - thr/sqrt(Λ_ii)) of a symmetric matrix.

    ``shift`` (not None) first maps Λ -> max(Λ + shift, 0) (the PSD fix of a Gaussian release).
    Directions with Λ <= 0 get S_ii = 0 (λ > 0) or 1 (λ = 0: M = I).
    """
    lam_, U = scipy.linalg.eigh(Sigma, check_finite=False, driver="evd")
    if thr == 0:
        return U, np.ones_like(lam_)
    if shift is not None:
        lam_ = lam_ + shift
    pos = np.maximum(lam_, 0.0)
    with np.errstate(divide="ignore"):
        root = np.sqrt(pos)
        s = np.where(root > 0, 1.0 - thr / np.where(root > 0, root, 1.0), 0.0)
    return U, np.asarray(np.maximum(s, 0.0), dtype=np.float64)


def _spectral_table(
    Sigma: FloatArray, thr: FloatArray, shift: float | None = None
) -> tuple[FloatArray, FloatArray]:
    """Eigenvectors U and the per-task shrinkage table ``S[k, i]`` (threshold ``thr[i]``)."""
    lam_, U = scipy.linalg.eigh(Sigma, check_finite=False, driver="evd")
    if shift is not None:
        lam_ = lam_ + shift
    return U, _shrink_table(np.sqrt(np.maximum(lam_, 0.0)), np.asarray(thr, dtype=np.float64))


def _apply_lowrank_left(
    Sigma: FloatArray, thr: float | FloatArray, Wc: FloatArray, shift: float | None = None
) -> FloatArray:
    """``U S U^T Wc`` using the cheaper of the kept (S > 0) or shrunk (S < 1) eigenvectors.

    With per-task thresholds (``thr`` of shape ``(m,)``) column ``i`` is ``U S_i U^T Wc[:, i]``
    with its own shrinkage ``S_i``, computed without any branch that depends on other tasks.
    """
    if np.ndim(thr) > 0:
        U, S = _spectral_table(Sigma, np.asarray(thr, dtype=np.float64), shift)
        return np.asarray(U @ (S * (U.T @ Wc)), dtype=np.float64)
    U, s = _spectral_factors(Sigma, float(thr), shift)
    keep = s > 0
    shrunk = s < 1
    if int(keep.sum()) <= int(shrunk.sum()):
        Uk = U[:, keep]
        return np.asarray(Uk @ (s[keep, None] * (Uk.T @ Wc)), dtype=np.float64)
    Us = U[:, shrunk]
    return np.asarray(Wc - Us @ ((1.0 - s[shrunk])[:, None] * (Us.T @ Wc)), dtype=np.float64)


def _apply_lowrank_right(
    Sigma: FloatArray,
    thr: float | FloatArray,
    shared: FloatArray,
    own: FloatArray,
    shift: float | None = None,
) -> FloatArray:
    """``W^ = shared M`` with ``M = V S V^T`` (m x m), each task keeping its own clean column.

    ``shared`` are the models the curator sees (noisy under Alg. 5, else equal to ``own``); task i's
    output uses its own clean model for the diagonal term ``M_ii``. With per-task thresholds,
    column ``i`` of ``M`` is ``V S_i V^T e_i``.
    """
    if np.ndim(thr) > 0:
        V, S = _spectral_table(Sigma, np.asarray(thr, dtype=np.float64), shift)
        M = V @ (S * V.T)
    else:
        V, s = _spectral_factors(Sigma, float(thr), shift)
        M = (V * s) @ V.T
    out = shared @ M
    if shared is not own:
        out += (own - shared) * np.diag(M)[None, :]
    return np.asarray(out, dtype=np.float64)
