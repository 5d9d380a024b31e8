"""Pieces shared by every linear multi-task estimator: task validation, the paper's δ, the
prepared (validated, padded, cached) task batch, the predict / decision_function / score mixin and
the fitting helpers of the non-private estimators."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from sklearn.base import BaseEstimator

from privmtl._validation import check_choice
from privmtl.data.multitask import MultiTaskDataset
from privmtl.exceptions import DataFormatError, InvalidParameterError
from privmtl.linear.local import local_ridge
from privmtl.linear.losses import LOSSES, TaskBatch, lipschitz, task_lipschitz
from privmtl.linear.metrics import aauc, nmse, r2
from privmtl.privacy.delta import user_data_delta
from privmtl.privacy.mechanisms import clip_columns

__all__ = [
    "PAPER_DELTA",
    "PreparedTasks",
    "check_tasks",
    "paper_delta",
    "resolve_delta",
    "task_steps",
]

FloatArray = NDArray[np.float64]


#: ``delta="paper"`` selects the MP-MTL paper's δ (:func:`paper_delta`) for reproductions.
PAPER_DELTA = "paper"


def paper_delta(m: int) -> float:
    """The MP-MTL paper's ``delta = 1 / (m log m)`` (natural log); needs at least 2 tasks.

    Kept for reproducing the paper (``delta="paper"``, ``--paper-delta``); it is above
    ``1/(100 m)``, which DP practice asks for.
    """
    if m < 2:
        raise InvalidParameterError(
            "The 'delta' parameter 'paper' needs at least 2 tasks (1/(m log m) is undefined); "
            f"got m={m}."
        )
    return 1.0 / (m * math.log(m))


def resolve_delta(delta: float | str | None, m: int) -> float:
    """δ of a fit with ``m`` tasks: ``None`` ⇒ :func:`~privmtl.privacy.delta.user_data_delta`
    (``min(1e-5, 1/(100 m))``, well below ``1/m`` as DP practice asks), ``"paper"`` ⇒
    :func:`paper_delta`, a number ⇒ itself."""
    if delta is None:
        return user_data_delta(m)
    if isinstance(delta, str):
        if delta != PAPER_DELTA:
            raise InvalidParameterError(
                f"The 'delta' parameter must be a float in (0, 1), 'paper' or None; got {delta!r}."
            )
        return paper_delta(m)
    return float(delta)


def check_tasks(
    Xs: Any,
    ys: Sequence[ArrayLike] | None,
    *,
    loss: str | None = None,
    need_y: bool = False,
) -> tuple[list[FloatArray], list[FloatArray] | None]:
    """Validate per-task arrays; return float64 copies (``ys`` raveled) or raise DataFormatError.

    The one validator of :mod:`privmtl.linear`. ``Xs`` may be a
    :class:`~privmtl.data.MultiTaskDataset` (its targets are used when ``ys`` is None); with
    ``need_y`` the targets are required; with ``loss="logistic"`` they must be 0/1 labels.
    """
    if isinstance(Xs, MultiTaskDataset):
        if ys is None:
            ys = Xs.y
        Xs = Xs.X
    if isinstance(Xs, np.ndarray) and Xs.ndim == 2:
        raise DataFormatError(
            "Xs must be a sequence of per-task (n_i, d) arrays, not a single 2-D array."
        )
    try:
        Xl = [np.asarray(x, dtype=np.float64) for x in Xs]
    except (TypeError, ValueError) as exc:
        raise DataFormatError(f"Xs must be a sequence of numeric (n_i, d) arrays: {exc}") from exc
    if not Xl:
        raise DataFormatError("at least one task is required; got 0.")
    d = Xl[0].shape[1] if Xl[0].ndim == 2 else None
    for i, x in enumerate(Xl):
        if x.ndim != 2 or x.shape[1] != d:
            raise DataFormatError(
                f"task {i}: features must be a 2-D array with the same number of columns as task "
                f"0 ({d}); got shape {x.shape}."
            )
        if x.shape[0] == 0:
            raise DataFormatError(f"task {i}: has no samples.")
        if not np.all(np.isfinite(x)):
            raise DataFormatError(f"task {i}: features contain NaN or infinity.")
    if ys is None:
        if need_y:
            raise DataFormatError("targets ys are required.")
        return Xl, None
    if len(ys) != len(Xl):
        raise DataFormatError(f"got {len(Xl)} feature arrays but {len(ys)} target arrays.")
    yl = []
    for i, (x, y) in enumerate(zip(Xl, ys, strict=True)):
        try:
            ya = np.asarray(y, dtype=np.float64).ravel()
        except (TypeError, ValueError) as exc:
            raise DataFormatError(f"task {i}: targets are not numeric ({exc}).") from exc
        if ya.shape[0] != x.shape[0]:
            raise DataFormatError(f"task {i}: {x.shape[0]} feature rows but {ya.shape[0]} targets.")
        if not np.all(np.isfinite(ya)):
            raise DataFormatError(f"task {i}: targets contain NaN or infinity.")
        if loss == "logistic" and not np.all((ya == 0) | (ya == 1)):
            raise DataFormatError(
                f"task {i}: the logistic loss needs 0/1 labels; found {np.unique(ya)[:5].tolist()}."
            )
        yl.append(ya)
    return Xl, yl


def _clip_columns(W: FloatArray, bound: float) -> FloatArray:
    return np.asarray(clip_columns(W, bound), dtype=np.float64)


def _scores(Xs: Sequence[FloatArray], coef: FloatArray) -> list[FloatArray]:
    return [np.asarray(x @ coef[:, i], dtype=np.float64) for i, x in enumerate(Xs)]


class PreparedTasks:
    """Validated, zero-padded tasks with cached per-task quantities, reusable across fits.

    Holds the :class:`~privmtl.linear.losses.TaskBatch` of ``(Xs, ys)`` and caches the Lipschitz
    constant (per ``mu``) and the local ridge solutions (per weight), which depend only on the
    data. Cross-validation builds one per split and fits every grid point on it.
    """

    def __init__(self, Xs: Any, ys: Sequence[ArrayLike] | None, *, loss: str):
        Xl, yl = check_tasks(Xs, ys, loss=loss, need_y=True)
        assert yl is not None
        self.loss = loss
        self.Xl, self.yl = Xl, yl
        self.m, self.d = len(Xl), Xl[0].shape[1]
        self.batch = TaskBatch.from_tasks(Xl, yl)
        self._lips: dict[float, float] = {}
        self._ridge: dict[float, FloatArray] = {}

    def losses(self, W: FloatArray) -> FloatArray:
        """Per-task losses ``L_i(w_i)``, shape ``(m,)``."""
        return self.batch.losses(self._kind(), W)

    def grads(self, W: FloatArray) -> FloatArray:
        """Per-task gradients ``grad L_i(w_i)`` as the columns of a ``(d, m)`` matrix."""
        return self.batch.gradients(self._kind(), W)

    def task_lipschitz(self, mu: float = 0.0) -> FloatArray:
        """Per-task Lipschitz constants of ``grad L_i`` (with ``(mu/2)||w||^2``), shape ``(m,)``."""
        return np.asarray(task_lipschitz(self._kind(), self.batch, mu=mu), dtype=np.float64)

    def hess_sq(self, W: FloatArray) -> FloatArray:
        """Columns ``H_i w_i`` with ``H_i = X_i^T X_i / n_i`` (Hessian of the squared loss)."""
        scores = self.batch.scores(W) * self.batch.mask / self.batch.n[:, None]
        return np.asarray(np.matmul(scores[:, None, :], self.batch.X)[:, 0, :].T)

    def rhs_sq(self) -> FloatArray:
        """Columns ``X_i^T y_i / n_i``."""
        yw = self.batch.y / self.batch.n[:, None]
        return np.asarray(np.matmul(yw[:, None, :], self.batch.X)[:, 0, :].T)

    def _kind(self) -> Any:
        return self.loss

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


def task_steps(
    prepared: PreparedTasks, mu: float, *, decomposed: bool = False
) -> tuple[FloatArray, FloatArray]:
    """Per-task Lipschitz constants ``L_i`` and proximal-gradient steps ``1/L_i`` (``1/(2 L_i)``
    for a decomposed ``W = P + Q``), each computed from task i's own rows only.

    ``L_i = c ||X_i||_2^2 / n_i + mu`` (:func:`~privmtl.linear.losses.lipschitz`) is evaluated on
    the task's own unpadded array, so task i's step does not depend on any other task's data
    (not even on the padding length of a batch).

    Raises
    ------
    DataFormatError
        If a task's constant is zero (all its features are zero) or not finite.
    """
    kind: Any = prepared.loss
    lips = np.array([lipschitz(kind, X, mu=mu) for X in prepared.Xl], dtype=np.float64)
    bad = np.flatnonzero(~(np.isfinite(lips) & (lips > 0)))
    if bad.size:
        raise DataFormatError(
            f"task {int(bad[0])}: the loss has a zero Lipschitz constant (all its features are "
            "zero?); cannot set its step."
        )
    return lips, 1.0 / ((2.0 if decomposed else 1.0) * lips)


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
            raise DataFormatError(
                f"the model was fitted on {m} tasks; got {len(Xl)} tasks. scikit-learn's model "
                "selection (GridSearchCV, cross_val_score) splits a list of tasks into tasks, not "
                "rows: wrap the estimator in privmtl.linear.StackedTasks and pass "
                "privmtl.linear.stack_tasks(Xs, ys)."
            )
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

    def predict_proba(self, Xs: Sequence[ArrayLike]) -> list[FloatArray]:
        """``P(y = 1 | x) = sigmoid(x^T w_i)`` per task (logistic loss only)."""
        from scipy.special import expit

        if not self._is_classifier():
            raise AttributeError("predict_proba is only available with loss='logistic'.")
        return [np.asarray(expit(s), dtype=np.float64) for s in self.decision_function(Xs)]

    def _is_classifier(self) -> bool:
        return self.loss == "logistic"

    def score(self, Xs: Any, ys: Sequence[ArrayLike] | None = None) -> float:
        """Higher-is-better score (scikit-learn's convention): pooled R² or aAUC.

        Regression: the coefficient of determination of all tasks' samples pooled,
        ``1 - nMSE`` (:func:`privmtl.linear.metrics.r2`; 1 is perfect, 0 is the grand mean), so
        that ``GridSearchCV`` and other scikit-learn tools maximize it. Classification: the
        average per-task ROC AUC (:func:`privmtl.linear.metrics.aauc`). The MP-MTL paper's nMSE
        (lower is better) is :meth:`paper_score`. ``Xs`` may be a
        :class:`~privmtl.data.MultiTaskDataset` (then ``ys`` defaults to its targets).
        """
        yl, scores = self._targets_and_scores(Xs, ys)
        if self._is_classifier():
            return float(aauc(yl, scores))
        return float(r2(yl, scores))

    def paper_score(self, Xs: Any, ys: Sequence[ArrayLike] | None = None) -> float:
        """The MP-MTL paper's metric: nMSE (regression, lower is better) or aAUC (higher).

        See :func:`privmtl.linear.metrics.nmse` (global pooling) and
        :func:`privmtl.linear.metrics.aauc`; :meth:`score` is the higher-is-better form.
        """
        yl, scores = self._targets_and_scores(Xs, ys)
        if self._is_classifier():
            return float(aauc(yl, scores))
        return float(nmse(yl, scores))

    def _targets_and_scores(
        self, Xs: Any, ys: Sequence[ArrayLike] | None
    ) -> tuple[list[FloatArray], list[FloatArray]]:
        Xl = self._check_predict_input(Xs)
        _, yl = check_tasks(Xs, ys, need_y=True)
        assert yl is not None
        return yl, _scores(Xl, self.coef_)


class _LinearMTLBase(_LinearMTLMixin, BaseEstimator):  # type: ignore[misc]
    """Fitting helpers of the non-private estimators (predict / score come from the mixin)."""

    def _prepare_fit(self, Xs: Any, ys: Any) -> PreparedTasks:
        return PreparedTasks(Xs, ys, loss=check_choice("loss", self.loss, LOSSES))

    def _set_fitted(self, W: FloatArray, n_iter: int, objective: Sequence[float]) -> None:
        self.coef_ = np.asarray(W, dtype=np.float64)
        self.n_features_in_, self.n_tasks_ = self.coef_.shape
        self.n_iter_ = int(n_iter)
        self.objective_ = np.asarray(objective, dtype=np.float64)

    def _warn_not_converged(self, what: str) -> None:
        from sklearn.exceptions import ConvergenceWarning

        warnings.warn(
            f"{type(self).__name__}: {what} did not converge within max_iter; increase max_iter "
            "or tol.",
            ConvergenceWarning,
            stacklevel=3,
        )
