"""Proximal operators and the matching norms, as pure functions on the ``d x m`` model matrix.

For a convex function ``h`` and ``tau >= 0``::

    prox_{tau h}(V) = argmin_W  0.5 * ||W - V||_F^2 + tau * h(W)

=================  ===============================  ==============================================
function           ``h(W)``                         closed form
=================  ===============================  ==============================================
prox_trace_norm    ``||W||_*`` (sum of sing. vals)  singular values ``s -> max(s - tau, 0)``
prox_l21           ``sum_j ||W[j, :]||_2`` (rows)   row ``r -> r * max(0, 1 - tau / ||r||)``
prox_l1            ``sum_jk |W[j, k]|``             entry ``v -> sign(v) max(|v| - tau, 0)``
prox_l2sq          ``0.5 * ||W||_F^2``              ``V / (1 + tau)``
=================  ===============================  ==============================================

Rows of ``W`` are features and columns are tasks, so the l2,1 norm couples a feature across tasks
(joint feature selection, Liu et al. 2009) as in the MP-MTL paper's group-sparse estimator.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from privmtl._validation import check_real
from privmtl.exceptions import DataFormatError

__all__ = [
    "l1_norm",
    "l21_norm",
    "prox_l1",
    "prox_l2sq",
    "prox_l21",
    "prox_trace_norm",
    "trace_norm",
]

FloatArray = NDArray[np.float64]


def _matrix(W: ArrayLike, name: str = "W") -> FloatArray:
    Wa = np.asarray(W, dtype=np.float64)
    if Wa.ndim != 2:
        raise DataFormatError(f"{name} must be a 2-D (d, m) matrix; got shape {Wa.shape}.")
    return Wa


def _tau(tau: float) -> float:
    return check_real("tau", tau, low=0.0)


def trace_norm(W: ArrayLike) -> float:
    """Trace (nuclear) norm ``||W||_*``, the sum of the singular values."""
    Wa = _matrix(W)
    if Wa.size == 0:
        return 0.0
    return float(np.linalg.svd(Wa, compute_uv=False).sum())


def l21_norm(W: ArrayLike) -> float:
    """``||W||_{2,1} = sum_j ||W[j, :]||_2``: sum over rows (features) of the row's l2 norm."""
    return float(np.linalg.norm(_matrix(W), axis=1).sum())


def l1_norm(W: ArrayLike) -> float:
    """Entry-wise ``||W||_1 = sum_jk |W[j, k]|``."""
    return float(np.abs(_matrix(W)).sum())


def prox_trace_norm(W: ArrayLike, tau: float) -> FloatArray:
    """Singular-value soft-thresholding: ``prox`` of ``tau * ||.||_*``.

    Parameters
    ----------
    W : array_like of shape (d, m)
    tau : float
        Threshold ``>= 0``.

    Returns
    -------
    ndarray of shape (d, m)
        ``U diag(max(s - tau, 0)) V^T`` where ``W = U diag(s) V^T`` is a thin SVD.
    """
    Wa = _matrix(W)
    t = _tau(tau)
    if Wa.size == 0:
        return Wa.copy()
    U, s, Vt = np.linalg.svd(Wa, full_matrices=False)
    s = np.maximum(s - t, 0.0)
    keep = s > 0
    return np.asarray((U[:, keep] * s[keep]) @ Vt[keep], dtype=np.float64)


def prox_l21(W: ArrayLike, tau: float) -> FloatArray:
    """Row-wise group soft-thresholding: ``prox`` of ``tau * ||.||_{2,1}`` (groups = rows).

    Row ``r`` becomes ``r * max(0, 1 - tau / ||r||_2)`` (zero rows stay zero).
    """
    Wa = _matrix(W)
    t = _tau(tau)
    norms = np.linalg.norm(Wa, axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(norms > t, 1.0 - t / np.where(norms > 0, norms, 1.0), 0.0)
    return np.asarray(Wa * scale, dtype=np.float64)


def prox_l1(W: ArrayLike, tau: float) -> FloatArray:
    """Entry-wise soft-thresholding: ``prox`` of ``tau * ||.||_1``."""
    Wa = np.asarray(W, dtype=np.float64)
    t = _tau(tau)
    return np.asarray(np.sign(Wa) * np.maximum(np.abs(Wa) - t, 0.0), dtype=np.float64)


def prox_l2sq(W: ArrayLike, tau: float) -> FloatArray:
    """``prox`` of ``tau * 0.5 * ||.||_F^2``, i.e. the shrinkage ``W / (1 + tau)``."""
    Wa = np.asarray(W, dtype=np.float64)
    t = _tau(tau)
    return np.asarray(Wa / (1.0 + t), dtype=np.float64)
