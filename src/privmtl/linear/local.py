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

import math
from numbers import Real

import numpy as np
import scipy.linalg
from numpy.typing import NDArray

from privmtl.exceptions import InvalidParameterError
from privmtl.linear.losses import TaskBatch

__all__ = [
    "COVARIANCE_POWER",
    "RIDGE_GRID",
    "TRACE_POWER",
    "best_ridge",
    "local_ridge",
    "refit_with_metric",
    "ridge_cv_losses",
    "select_ridge_per_task",
    "task_fold_ids",
    "variational_factor",
]

FloatArray = NDArray[np.float64]

#: Power of the variational metric ``D ∝ Λ^p`` of the trace-norm (l2,1) problem's W-step.
TRACE_POWER = 0.5
#: Power of the metric ``D ∝ Λ`` of a Gaussian prior with the released covariance.
COVARIANCE_POWER = 1.0


def local_ridge(batch: TaskBatch, loss: str, alpha: float | FloatArray) -> FloatArray:
    """Per-task ridge solutions ``argmin_w L_i(w) + (alpha_i/2)||w||^2`` (columns of a d x m matrix).

    ``alpha`` is one weight for every task or an array of shape ``(m,)``, one per task.
    Batched over tasks (no Python loop), through the smaller of the ``d x d`` primal or the
    ``n_max x n_max`` dual systems. Squared loss: closed form. Logistic loss: 30 Newton steps
    (in the dual, ``w = X^T a``, when ``n_max < d``), which converge to machine precision for
    well-posed ridge problems.
    """
    X, y, mask, n = batch.X, batch.y, batch.mask, batch.n
    m, n_max, d = X.shape
    al = np.broadcast_to(np.asarray(alpha, dtype=np.float64), (m,))
    if not np.all(al > 0):
        raise InvalidParameterError(f"The ridge weight must be > 0; got {alpha!r}.")
    a3 = al[:, None, None]
    Xt = X.transpose(0, 2, 1)
    primal = d <= n_max
    if loss == "squared":
        if primal:
            A = np.matmul(Xt, X) / n[:, None, None] + a3 * np.eye(d)
            b = np.matmul(Xt, (y * mask)[:, :, None]) / n[:, None, None]
            return np.asarray(np.linalg.solve(A, b)[:, :, 0].T, dtype=np.float64)
        G = np.matmul(X, Xt) + (n * al)[:, None, None] * np.eye(n_max)
        a = np.linalg.solve(G, (y * mask)[:, :, None])
        return np.asarray(np.matmul(Xt, a)[:, :, 0].T, dtype=np.float64)
    from scipy.special import expit

    if primal:
        W = np.zeros((m, d))
        for _ in range(30):
            prob = expit(np.matmul(X, W[:, :, None])[:, :, 0])
            r = (prob - y) * mask / n[:, None]
            g = np.matmul(r[:, None, :], X)[:, 0, :] + al[:, None] * W
            D = prob * (1.0 - prob) * mask / n[:, None]
            H = np.matmul(Xt * D[:, None, :], X) + a3 * np.eye(d)
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
        A = D[:, :, None] * Kg + a3 * eye_n
        a = a - np.linalg.solve(A, (r + al[:, None] * a)[:, :, None])[:, :, 0]
    return np.asarray(np.matmul(Xt, a[:, :, None])[:, :, 0].T, dtype=np.float64)


#: Ridge weights searched by a task's own cross-validation (:func:`select_ridge_per_task`):
#: half-decades from 1e-6 to 10, the STL-l2 grid of :mod:`privmtl.linear.selection`.
RIDGE_GRID: tuple[float, ...] = tuple(float(10.0 ** (-6 + k / 2)) for k in range(15))


def task_fold_ids(batch: TaskBatch, n_splits: int, seed: int) -> NDArray[np.int64]:
    """Fold index of every sample, ``(m, n_max)`` (-1 on padding): task i's samples are cut into
    ``n_splits`` folds by a generator spawned for task i alone from ``seed`` (so its folds depend
    neither on the other tasks' sizes nor on their order). Tasks with fewer samples than folds
    put each sample in its own fold (the remaining folds validate nothing for that task)."""
    m, n_max = batch.mask.shape
    ids = np.full((m, n_max), -1, dtype=np.int64)
    seqs = np.random.SeedSequence(int(seed)).spawn(m)
    for i in range(m):
        ni = int(batch.n[i])
        perm = np.random.default_rng(seqs[i]).permutation(ni)
        fold = np.empty(ni, dtype=np.int64)
        for s, part in enumerate(np.array_split(perm, n_splits)):
            fold[part] = s
        ids[i, :ni] = fold
    return ids


def _restricted(batch: TaskBatch, keep: FloatArray) -> TaskBatch:
    """The batch with only the samples where ``keep`` is 1 (others zeroed like padding)."""
    from dataclasses import replace

    n = np.maximum(keep.sum(axis=1), 1.0)
    return replace(batch, X=batch.X * keep[:, :, None], y=batch.y * keep, mask=keep, n=n)


def _validation_loss(batch: TaskBatch, loss: str, W: FloatArray, val: FloatArray) -> FloatArray:
    """Per-task summed loss on the samples where ``val`` is 1 (squared error or log-loss)."""
    s = np.matmul(batch.X, W.T[:, :, None])[:, :, 0]
    if loss == "squared":
        per = 0.5 * (s - batch.y) ** 2
    else:
        per = np.logaddexp(0.0, -(2.0 * batch.y - 1.0) * s)
    return np.asarray((per * val).sum(axis=1), dtype=np.float64)


def _centred(batch: TaskBatch) -> NDArray[np.bool_]:
    """Per task: are its feature columns and targets centred (means ~0 relative to their scale)?"""
    n = batch.n
    mx = np.abs(batch.X.sum(axis=1)) / n[:, None]
    sx = np.sqrt((batch.X**2).sum(axis=1) / n[:, None])
    y = batch.y * batch.mask
    my = np.abs(y.sum(axis=1)) / n
    sy = np.sqrt((y**2).sum(axis=1) / n)
    return np.asarray(np.all(mx <= 1e-9 * (sx + 1e-300), axis=1) & (my <= 1e-9 * (sy + 1e-300)))


def _loo_squared(batch: TaskBatch, alpha: float) -> FloatArray:
    """Per-task leave-one-out squared error of ridge (exact, ``e_j / (1 - h_jj)``), summed; for a
    task centred with its own means, that of the equivalent model with an intercept."""
    X, y, n = batch.X, batch.y * batch.mask, batch.n
    d = X.shape[2]
    Xt = X.transpose(0, 2, 1)
    A = np.matmul(Xt, X) + (n * alpha)[:, None, None] * np.eye(d)
    B = np.linalg.solve(A, Xt)  # (m, d, n_max): A^-1 X^T
    h = np.einsum("mjd,mdj->mj", X, B)  # leverages, 0 on padding
    # A task whose features and targets were centred with its own means was fitted, in effect,
    # with an intercept: its leave-one-out residuals must count the mean too (leverage + 1/n);
    # without it every row is minus the sum of the others and LOO rewards interpolation.
    h = h + np.where(_centred(batch), 1.0 / n, 0.0)[:, None] * batch.mask
    fit = np.matmul(X, np.matmul(B, y[:, :, None]))[:, :, 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(batch.mask > 0, (y - fit) / (1.0 - h), 0.0)
    r = np.where(np.isfinite(r), r, np.inf)
    return np.asarray((r**2).sum(axis=1), dtype=np.float64)


def ridge_cv_losses(
    batch: TaskBatch,
    loss: str,
    *,
    A: FloatArray | None = None,
    grid: tuple[float, ...] = RIDGE_GRID,
    n_splits: int = 5,
    seed: int = 0,
) -> FloatArray:
    """Every task's own validation loss of every ridge weight in ``grid``, shape ``(len(grid), m)``.

    Task i fits ``argmin_w L_i(w) + (rho/2) w^T D^-1 w`` (``D = A^2``; plain ridge when ``A`` is
    None) for every ``rho`` in ``grid`` on its own samples only: the exact leave-one-out squared
    error (summed) for the squared loss, the log-loss summed over ``n_splits`` folds
    (:func:`task_fold_ids`) for the logistic loss. :func:`select_ridge_per_task` keeps each
    column's best weight; the column's least loss scores ``A`` itself (the floor vote of
    :mod:`privmtl.linear.eigen_floor`).
    """
    from dataclasses import replace

    m = batch.n_tasks
    work = batch if A is None else replace(batch, X=np.matmul(batch.X, A))
    if loss == "squared":
        return np.stack([_loo_squared(work, rho) for rho in grid])
    folds = task_fold_ids(batch, n_splits, seed)
    total = np.zeros((len(grid), m))
    for s in range(n_splits):
        val = (folds == s).astype(np.float64)
        train = _restricted(work, batch.mask * (1.0 - val))
        for g, rho in enumerate(grid):
            V = local_ridge(train, loss, rho)
            total[g] += _validation_loss(work, loss, V, val)
    return total


def best_ridge(total: FloatArray, grid: tuple[float, ...] = RIDGE_GRID) -> FloatArray:
    """Every task's weight of least loss in a :func:`ridge_cv_losses` table (ties: the larger)."""
    best = len(grid) - 1 - np.argmin(total[::-1], axis=0)
    return np.asarray([grid[int(k)] for k in best], dtype=np.float64)


def select_ridge_per_task(
    batch: TaskBatch,
    loss: str,
    *,
    A: FloatArray | None = None,
    grid: tuple[float, ...] = RIDGE_GRID,
    n_splits: int = 5,
    seed: int = 0,
) -> FloatArray:
    """Every task's own ridge weight, chosen by k-fold cross-validation on its own samples.

    Task i fits ``argmin_w L_i(w) + (rho/2) w^T D^-1 w`` (``D = A^2``; plain ridge when ``A`` is
    None) for every ``rho`` in ``grid`` and keeps the one with the least validation loss (ties:
    the larger weight): the exact leave-one-out squared error for the squared loss (a task with
    about as many samples as features is validated far more stably this way than by k folds, whose
    training parts fall below d samples), the log-loss summed over ``n_splits`` folds for the
    logistic loss (:func:`ridge_cv_losses`).
    Only task i's samples, its folds (:func:`task_fold_ids`) and ``A`` (a public matrix, e.g. built
    from a private release) enter task i's choice: a per-task, covered selection.

    Returns
    -------
    ndarray of shape (m,)
        The selected weights.
    """
    total = ridge_cv_losses(batch, loss, A=A, grid=grid, n_splits=n_splits, seed=seed)
    # ties (e.g. a task with too few samples for some folds) go to the larger weight
    return best_ridge(total, grid)


def variational_factor(
    Sigma: FloatArray,
    *,
    penalty: str,
    shift: float | None,
    floor: float,
    power: float = TRACE_POWER,
) -> FloatArray:
    """``A = D^(1/2)`` of the variational metric ``D`` built from a released covariance ``Sigma``.

    ``D`` has the eigenvectors of ``Sigma`` (low rank; the diagonal for the group-sparse
    penalty) and eigenvalues ``max(Lambda + shift, 0)^power + floor^(2 power)``: with
    ``power = 1/2`` (:data:`TRACE_POWER`) this is the minimiser of the variational trace-norm
    (l2,1) problem, one W-step of its alternating minimisation; with ``power = 1``
    (:data:`COVARIANCE_POWER`) ``D`` is proportional to the (denoised) covariance itself, and the
    refit ``argmin L_i(w) + (rho/2) w^T D^-1 w`` is, for the squared loss, the posterior mean
    under the Gaussian prior ``w ~ N(0, D / rho)`` (empirical-Bayes generalized ridge: the
    prior's covariance read off the tasks' released models, its scale chosen by each task's own
    cross-validation).

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
        ``tau >= 0``, in the units of ``sqrt(Lambda)`` (a model norm): ``tau^(2 power)`` is added
        to the eigenvalues' powers, so that ``D > 0``.
    power : float, default=0.5
        ``p > 0``, the power of the eigenvalues.

    Returns
    -------
    ndarray of shape (d, d)
        Symmetric positive semi-definite ``A`` with ``A^2 = D`` and ``mean(eig(D)) = 1``.
    """
    if isinstance(power, bool) or not (
        isinstance(power, Real) and math.isfinite(power) and power > 0
    ):
        raise InvalidParameterError(
            f"The 'power' parameter must be a finite real number > 0; got {power!r}."
        )
    d = Sigma.shape[0]
    vals, U = scipy.linalg.eigh(Sigma, check_finite=False, driver="evd")
    lam = np.maximum(vals + (0.0 if shift is None else shift), 0.0)
    if penalty == "groupsparse":
        diag = (U * U) @ lam
        Dv = diag**power + floor ** (2.0 * power)
        if not Dv.mean() > 0:
            return np.eye(d)
        return np.diag(np.sqrt(Dv / Dv.mean()))
    if penalty != "lowrank":
        raise InvalidParameterError(
            f"The 'penalty' parameter must be 'lowrank' or 'groupsparse'; got {penalty!r}."
        )
    Dv = lam**power + floor ** (2.0 * power)
    if not Dv.mean() > 0:
        return np.eye(d)
    return np.asarray((U * np.sqrt(Dv / Dv.mean())) @ U.T, dtype=np.float64)


def refit_with_metric(
    batch: TaskBatch, loss: str, rho: float | FloatArray, A: FloatArray
) -> FloatArray:
    """Per-task ``argmin_w L_i(w) + (rho_i/2) w^T D^-1 w`` with ``D = A^2`` (columns, d x m).

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
