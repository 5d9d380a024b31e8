"""Pieces shared by every linear multi-task estimator: task validation, the paper's default δ, the
prepared (validated, padded, cached) task batch and the predict / decision_function / score mixin."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from privmtl.exceptions import DataFormatError, InvalidParameterError
from privmtl.linear.local import local_ridge
from privmtl.linear.losses import TaskBatch, task_lipschitz

__all__ = ["PreparedTasks", "check_tasks", "default_delta"]

FloatArray = NDArray[np.float64]


def default_delta(m: int) -> float:
    """The paper's ``delta = 1 / (m log m)`` (natural log); needs at least 2 tasks."""
    if m < 2:
        raise InvalidParameterError(
            "The 'delta' parameter must be given explicitly with fewer than 2 tasks "
            f"(the default 1/(m log m) is undefined); got m={m}."
        )
    return 1.0 / (m * math.log(m))


def check_tasks(
    Xs: Sequence[ArrayLike], ys: Sequence[ArrayLike] | None, *, loss: str | None = None
) -> tuple[list[FloatArray], list[FloatArray] | None]:
    """Validate per-task arrays; return float64 copies (``ys`` raveled) or raise DataFormatError.

    The one validator of :mod:`privmtl.linear` (shared with the non-private baselines).
    """
    from privmtl.linear.baselines import _check_tasks

    return _check_tasks(Xs, ys, loss, need_y=False)


def _clip_columns(W: FloatArray, bound: float) -> FloatArray:
    from privmtl.privacy.mechanisms import clip_columns

    return np.asarray(clip_columns(W, bound), dtype=np.float64)


def _scores(Xs: Sequence[FloatArray], coef: FloatArray) -> list[FloatArray]:
    return [np.asarray(x @ coef[:, i], dtype=np.float64) for i, x in enumerate(Xs)]


class PreparedTasks:
    """Validated, zero-padded tasks with cached per-task quantities, reusable across fits.

    Holds the :class:`~privmtl.linear.losses.TaskBatch` of ``(Xs, ys)`` and caches the Lipschitz
    constant (per ``mu``) and the local ridge solutions (per weight), which depend only on the
    data. Cross-validation builds one per split and fits every grid point on it.
    """

    def __init__(self, Xs: Sequence[ArrayLike], ys: Sequence[ArrayLike] | None, *, loss: str):
        Xl, yl = check_tasks(Xs, ys, loss=loss)
        if yl is None:
            raise DataFormatError("targets ys are required.")
        self.loss = loss
        self.batch = TaskBatch.from_tasks(Xl, yl)
        self._lips: dict[float, float] = {}
        self._ridge: dict[float, FloatArray] = {}

    def lipschitz(self, mu: float) -> float:
        """``max_i`` Lipschitz constant of ``grad L_i`` (with ``(mu/2)||w||^2``)."""
        if mu not in self._lips:
            kind: Any = self.loss
            self._lips[mu] = float(np.max(task_lipschitz(kind, self.batch, mu=mu)))
        return self._lips[mu]

    def ridge(self, alpha: float) -> FloatArray:
        """The tasks' own ridge solutions (a copy), see :func:`local_ridge`."""
        if alpha not in self._ridge:
            self._ridge[alpha] = local_ridge(self.batch, self.loss, alpha)
        return self._ridge[alpha].copy()


class _LinearMTLMixin:
    """predict / decision_function / score for estimators with ``coef_`` (d x m) and ``loss``."""

    coef_: FloatArray
    loss: str

    def _check_fitted(self) -> None:
        if not hasattr(self, "coef_"):
            from sklearn.exceptions import NotFittedError

            raise NotFittedError(f"This {type(self).__name__} instance is not fitted yet.")

    def _check_predict_input(self, Xs: Sequence[ArrayLike]) -> list[FloatArray]:
        self._check_fitted()
        Xl, _ = check_tasks(Xs, None)
        d, m = self.coef_.shape
        if len(Xl) != m:
            raise DataFormatError(f"the model was fitted on {m} tasks; got {len(Xl)} tasks.")
        if Xl[0].shape[1] != d:
            raise DataFormatError(f"the model was fitted with {d} features; got {Xl[0].shape[1]}.")
        return Xl

    def decision_function(self, Xs: Sequence[ArrayLike]) -> list[FloatArray]:
        """Scores ``X_i w_i`` of every task (list of arrays of shape ``(n_i,)``)."""
        return _scores(self._check_predict_input(Xs), self.coef_)

    def predict(self, Xs: Sequence[ArrayLike]) -> list[FloatArray]:
        """Predictions per task: the scores (regression) or labels in ``{0, 1}`` (logistic)."""
        scores = self.decision_function(Xs)
        if self._is_classifier():
            return [(s > 0).astype(np.float64) for s in scores]
        return scores

    def _is_classifier(self) -> bool:
        return self.loss == "logistic"

    def score(self, Xs: Sequence[ArrayLike], ys: Sequence[ArrayLike]) -> float:
        """nMSE (regression, lower is better) or aAUC (classification, higher is better).

        See :func:`privmtl.linear.metrics.nmse` and :func:`privmtl.linear.metrics.aauc` for the
        exact pooling over tasks.
        """
        from privmtl.linear.metrics import aauc, nmse

        Xl = self._check_predict_input(Xs)
        _, yl = check_tasks(Xl, ys)
        assert yl is not None
        scores = _scores(Xl, self.coef_)
        if self._is_classifier():
            return float(aauc(yl, scores))
        return float(nmse(yl, scores))
