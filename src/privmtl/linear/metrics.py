"""Multi-task evaluation metrics: MSE, nMSE (regression) and aAUC (binary classification).

All functions take per-task sequences ``y_true_list[i]``, ``y_pred_list[i]`` (1-D, same length
per task).

nMSE pooling
------------
The MP-MTL paper defines nMSE as "the mean squared error divided by the variance of the target
vector" without saying how tasks are pooled. The default here, ``pooling="global"``, pools every
test sample of every task::

    nMSE = [sum_i sum_j (yhat_ij - y_ij)^2 / N] / Var(y)     (N = sum_i n_i)

where ``Var(y)`` is the population variance (``ddof=0``) of the concatenation of all tasks'
targets. Equivalently ``nMSE = SSE / sum_ij (y_ij - ybar)^2`` with ``ybar`` the grand mean: the
numerator is the sample-size-weighted mean of the task MSEs, ``sum_i n_i MSE_i / sum_i n_i``, and
``1 - nMSE`` is the "explained variance" reported for the School data (Argyriou et al., 2008).
Predicting the grand mean gives 1. (MALSAR's example ``eval_MTL_mse`` pools
``sum_i sqrt(SSE_i) n_i / sum_i n_i`` instead, which is not a mean squared error; it is not
followed here.)

Two alternatives are available: ``"task-weighted"`` normalizes each task by its own variance and
averages with weights ``n_i`` (``sum_i n_i MSE_i / Var(y_i) / N``), and ``"task-mean"`` takes the
unweighted mean of the per-task nMSEs. Both require every task to have non-constant targets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from privmtl._validation import check_choice
from privmtl.exceptions import DataFormatError

__all__ = [
    "NMSE_POOLINGS",
    "aauc",
    "mse",
    "nmse",
    "per_task_auc",
    "per_task_mse",
    "per_task_nmse",
    "r2",
]

NMSE_POOLINGS: tuple[str, ...] = ("global", "task-weighted", "task-mean")
FloatArray = NDArray[np.float64]


def _pairs(
    y_true_list: Sequence[ArrayLike], y_pred_list: Sequence[ArrayLike]
) -> list[tuple[FloatArray, FloatArray]]:
    if len(y_true_list) != len(y_pred_list):
        raise DataFormatError(
            f"got {len(y_true_list)} target vectors but {len(y_pred_list)} prediction vectors."
        )
    if len(y_true_list) == 0:
        raise DataFormatError("at least one task is required.")
    out = []
    for i, (t, p) in enumerate(zip(y_true_list, y_pred_list, strict=True)):
        ta = np.asarray(t, dtype=np.float64).ravel()
        pa = np.asarray(p, dtype=np.float64).ravel()
        if ta.shape != pa.shape:
            raise DataFormatError(f"task {i}: {ta.size} targets but {pa.size} predictions.")
        if ta.size == 0:
            raise DataFormatError(f"task {i}: no samples to evaluate.")
        if not (np.all(np.isfinite(ta)) and np.all(np.isfinite(pa))):
            raise DataFormatError(f"task {i}: targets or predictions contain NaN or infinity.")
        out.append((ta, pa))
    return out


def per_task_mse(y_true_list: Sequence[ArrayLike], y_pred_list: Sequence[ArrayLike]) -> FloatArray:
    """Mean squared error of every task, shape ``(m,)``."""
    return np.array([np.mean((p - t) ** 2) for t, p in _pairs(y_true_list, y_pred_list)])


def mse(y_true_list: Sequence[ArrayLike], y_pred_list: Sequence[ArrayLike]) -> float:
    """MSE pooled over all samples: ``sum_i n_i MSE_i / sum_i n_i``."""
    pairs = _pairs(y_true_list, y_pred_list)
    sse = sum(float(np.sum((p - t) ** 2)) for t, p in pairs)
    return sse / sum(t.size for t, _ in pairs)


def per_task_nmse(y_true_list: Sequence[ArrayLike], y_pred_list: Sequence[ArrayLike]) -> FloatArray:
    """``MSE_i / Var(y_i)`` of every task (population variance), shape ``(m,)``.

    Raises
    ------
    DataFormatError
        If a task's targets are constant (zero variance).
    """
    out = []
    for i, (t, p) in enumerate(_pairs(y_true_list, y_pred_list)):
        var = float(np.var(t))
        if var <= 0:
            raise DataFormatError(f"task {i}: targets are constant, so its nMSE is undefined.")
        out.append(float(np.mean((p - t) ** 2)) / var)
    return np.array(out, dtype=np.float64)


def nmse(
    y_true_list: Sequence[ArrayLike],
    y_pred_list: Sequence[ArrayLike],
    *,
    pooling: Literal["global", "task-weighted", "task-mean"] = "global",
) -> float:
    """Normalized mean squared error over tasks (lower is better; see the module docstring).

    Parameters
    ----------
    y_true_list, y_pred_list : sequence of array_like
        Targets and predictions of every task.
    pooling : {"global", "task-weighted", "task-mean"}, default="global"
        ``"global"``: pooled MSE divided by the variance of all targets pooled;
        ``"task-weighted"``: ``sum_i n_i MSE_i / Var(y_i) / sum_i n_i``;
        ``"task-mean"``: ``mean_i MSE_i / Var(y_i)``. Variances use ``ddof=0``.

    Returns
    -------
    float

    Examples
    --------
    >>> nmse([[0.0, 2.0], [4.0]], [[1.0, 2.0], [4.0]])  # SSE 1, N 3, Var([0, 2, 4]) = 8/3
    0.125
    """
    how = check_choice("pooling", pooling, NMSE_POOLINGS)
    if how == "global":
        pairs = _pairs(y_true_list, y_pred_list)
        t_all = np.concatenate([t for t, _ in pairs])
        var = float(np.var(t_all))
        if var <= 0:
            raise DataFormatError("all targets are equal, so the nMSE is undefined.")
        return mse(y_true_list, y_pred_list) / var
    per = per_task_nmse(y_true_list, y_pred_list)
    if how == "task-mean":
        return float(np.mean(per))
    n = np.array([np.asarray(t).size for t in y_true_list], dtype=np.float64)
    return float(np.sum(per * n) / np.sum(n))


def r2(y_true_list: Sequence[ArrayLike], y_pred_list: Sequence[ArrayLike]) -> float:
    """Coefficient of determination of all tasks' samples pooled: ``1 - nmse`` (global pooling).

    Higher is better (1 is perfect, 0 is predicting the grand mean). It equals scikit-learn's
    ``r2_score`` of the concatenated targets and predictions, and it is what the estimators'
    ``score`` returns for regression.

    Examples
    --------
    >>> r2([[0.0, 2.0], [4.0]], [[1.0, 2.0], [4.0]])  # 1 - 0.125
    0.875
    """
    return 1.0 - nmse(y_true_list, y_pred_list)


def per_task_auc(y_true_list: Sequence[ArrayLike], score_list: Sequence[ArrayLike]) -> FloatArray:
    """ROC AUC of every task, shape ``(m,)``; ``nan`` for a task whose labels are all equal.

    Labels must be 0/1 (the positive class is 1); scores are any real numbers (higher means
    more likely positive), e.g. ``decision_function`` outputs.
    """
    from sklearn.metrics import roc_auc_score

    out = []
    for i, (t, s) in enumerate(_pairs(y_true_list, score_list)):
        if not np.all((t == 0) | (t == 1)):
            raise DataFormatError(f"task {i}: AUC needs 0/1 labels; found {np.unique(t)[:5]}.")
        if t.min() == t.max():
            out.append(np.nan)
        else:
            out.append(float(roc_auc_score(t, s)))
    return np.array(out, dtype=np.float64)


def aauc(y_true_list: Sequence[ArrayLike], score_list: Sequence[ArrayLike]) -> float:
    """Average AUC: the unweighted mean over tasks of the per-task ROC AUC (higher is better).

    Tasks whose evaluation labels contain a single class have no defined AUC and are left out of
    the mean (they are reported as ``nan`` by :func:`per_task_auc`).

    Raises
    ------
    DataFormatError
        If no task has both classes.
    """
    per = per_task_auc(y_true_list, score_list)
    if np.all(np.isnan(per)):
        raise DataFormatError("no task has both classes, so the average AUC is undefined.")
    return float(np.nanmean(per))
