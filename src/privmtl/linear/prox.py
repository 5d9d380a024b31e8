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

:data:`PENALTIES` bundles each norm with its proximal operator and its dual norm (spectral norm,
largest row norm, largest entry) for the solvers and their duality-gap certificates
(:mod:`privmtl.linear.solvers`); those entries skip argument validation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from privmtl._validation import check_real
from privmtl.exceptions import DataFormatError

__all__ = [
    "PENALTIES",
    "Penalty",
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
    return _svt(_matrix(W), _tau(tau))[0]


def prox_l21(W: ArrayLike, tau: float) -> FloatArray:
    """Row-wise group soft-thresholding: ``prox`` of ``tau * ||.||_{2,1}`` (groups = rows).

    Row ``r`` becomes ``r * max(0, 1 - tau / ||r||_2)`` (zero rows stay zero).
    """
    return _group_soft(_matrix(W), _tau(tau))[0]


def prox_l1(W: ArrayLike, tau: float) -> FloatArray:
    """Entry-wise soft-thresholding: ``prox`` of ``tau * ||.||_1``."""
    return _soft(np.asarray(W, dtype=np.float64), _tau(tau))[0]


def prox_l2sq(W: ArrayLike, tau: float) -> FloatArray:
    """``prox`` of ``tau * 0.5 * ||.||_F^2``, i.e. the shrinkage ``W / (1 + tau)``."""
    Wa = np.asarray(W, dtype=np.float64)
    t = _tau(tau)
    return np.asarray(Wa / (1.0 + t), dtype=np.float64)


# Unchecked fast paths: (prox, norm of the result). ``tau`` may be an array of shape (m,) for the
# entry-wise l1 prox (one threshold per column, i.e. per task).
def _svt(V: FloatArray, tau: float | FloatArray) -> tuple[FloatArray, float]:
    if V.size == 0:
        return V.copy(), 0.0
    U, s, Vt = np.linalg.svd(V, full_matrices=False)
    s = np.maximum(s - float(tau), 0.0)
    keep = s > 0
    return np.asarray((U[:, keep] * s[keep]) @ Vt[keep], dtype=np.float64), float(s.sum())


def _group_soft(V: FloatArray, tau: float | FloatArray) -> tuple[FloatArray, float]:
    norms = np.linalg.norm(V, axis=1, keepdims=True)
    shrunk = np.maximum(norms - float(tau), 0.0)
    scale = np.divide(shrunk, norms, out=np.zeros_like(norms), where=norms > 0)
    return np.asarray(V * scale, dtype=np.float64), float(shrunk.sum())


def _soft(V: FloatArray, tau: float | FloatArray) -> tuple[FloatArray, float]:
    P = np.asarray(np.sign(V) * np.maximum(np.abs(V) - tau, 0.0), dtype=np.float64)
    return P, float(np.abs(P).sum())


def _spectral(G: FloatArray) -> FloatArray:
    return np.asarray(np.linalg.norm(G, 2) if G.size else 0.0, dtype=np.float64)


@dataclass(frozen=True)
class Penalty:
    """A norm ``h`` on ``d x m`` matrices with what first-order solvers and certificates need.

    Attributes
    ----------
    name : str
    prox : callable
        ``prox(V, tau) -> (P, h(P))`` with ``P = prox_{tau h}(V)`` (no argument checks).
    norm : callable
        ``norm(W) -> h(W)``.
    dual_norm : callable
        ``dual_norm(G)``: the dual norm ``h°(G) = max {<G, W> : h(W) <= 1}`` as a 0-d array, or,
        when ``separable``, one value per column (task), shape ``(m,)``.
    separable : bool
        ``h`` is a sum of per-column terms (tasks decouple).
    """

    name: str
    prox: Callable[[FloatArray, float | FloatArray], tuple[FloatArray, float]]
    norm: Callable[[FloatArray], float]
    dual_norm: Callable[[FloatArray], FloatArray]
    separable: bool = False


#: The penalties of the linear estimators, by name.
PENALTIES: dict[str, Penalty] = {
    "trace": Penalty(
        "trace", _svt, lambda W: float(np.linalg.svd(W, compute_uv=False).sum()), _spectral
    ),
    "l21": Penalty(
        "l21",
        _group_soft,
        lambda W: float(np.linalg.norm(W, axis=1).sum()),
        lambda G: np.asarray(np.linalg.norm(G, axis=1).max(initial=0.0)),
    ),
    "l1": Penalty(
        "l1",
        _soft,
        lambda W: float(np.abs(W).sum()),
        lambda G: np.asarray(np.abs(G).max(axis=0, initial=0.0)),
        separable=True,
    ),
}
