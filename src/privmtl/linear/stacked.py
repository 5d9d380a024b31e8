"""Stacked rows for scikit-learn's model selection (``GridSearchCV``, ``cross_val_score``).

privmtl's linear estimators take one array per task. scikit-learn's model-selection tools split
one ``(n_samples, n_features)`` array by rows, so :class:`StackedTasks` wraps an estimator to take
the tasks stacked: the first column of ``X`` is the task index ``0 .. m-1``, the other columns
are the features, and ``y`` holds every row's target.

Every training fold must hold rows of every task. :func:`stack_tasks` interleaves the tasks' rows
(each task spread evenly from the first row to the last), so scikit-learn's default folds
(``cv=3``: consecutive blocks of rows) already keep every task with at least ``cv`` rows in every
fold: ``cross_val_score(StackedTasks(STLRidge()), X, y, cv=3)`` and ``GridSearchCV(...,
cv=3)`` work on its output. Rows stacked some other way (one task after another) need folds
stratified on the task column: ``cv=list(StratifiedKFold(3, shuffle=True,
random_state=0).split(X, X[:, 0]))``; a fold that leaves out a whole task fails with a message
saying so.

Such a search reads every task's rows, validation rows included, and fits a private estimator
once per candidate and fold on the same data: as with
:func:`~privmtl.linear.select_hyperparameters`, it is not covered by the ε of the selected model
and not charged to it (:data:`~privmtl.linear.TUNING_NOT_CHARGED`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from sklearn.base import BaseEstimator, clone

from privmtl.exceptions import DataFormatError
from privmtl.linear.common import check_tasks
from privmtl.linear.metrics import aauc, nmse, r2

__all__ = ["StackedTasks", "stack_tasks"]

FloatArray = NDArray[np.float64]


def stack_tasks(Xs: Any, ys: Any = None) -> tuple[FloatArray, FloatArray | None]:
    """Per-task arrays to stacked rows: ``X`` with the task index first, and ``y`` (or None).

    ``Xs`` may be a :class:`~privmtl.data.MultiTaskDataset` (its targets are used when ``ys`` is
    None). The tasks' rows are interleaved: row ``j`` of a task with ``n`` rows sits at relative
    position ``(j + 1/2) / n`` (ties in task order), each task keeping its own row order. So any
    block of consecutive rows, such as one of scikit-learn's default ``KFold`` folds, holds about
    the same share of every task.
    """
    Xl, yl = check_tasks(Xs, ys)
    X = np.vstack([np.column_stack([np.full(x.shape[0], float(i)), x]) for i, x in enumerate(Xl)])
    where = np.concatenate([(np.arange(x.shape[0]) + 0.5) / x.shape[0] for x in Xl])
    order = np.argsort(where, kind="stable")
    return X[order], None if yl is None else np.concatenate(yl)[order]


class StackedTasks(BaseEstimator):  # type: ignore[misc]
    """A privmtl linear estimator on stacked rows ``[task index, features...]``.

    Parameters
    ----------
    estimator : estimator
        An unfitted privmtl linear estimator (for example ``MPMTLLowRank(epsilon=1.0)`` or
        ``STLRidge()``); its parameters are searched as ``estimator__<name>``.
    n_tasks : int or None, default=None
        Number of tasks m; None ⇒ one more than the largest task index seen by ``fit``.

    Attributes
    ----------
    estimator_ : estimator
        The fitted clone of ``estimator`` (its ``coef_``, ``privacy_``, ...).
    n_tasks_ : int

    Notes
    -----
    ``score`` is higher-is-better, as the wrapped estimator's: the pooled R² (``1 - nMSE``) for
    regression, the average per-task AUC for classification; ``paper_score`` gives the nMSE.
    Rows of a task that has no row in a validation fold simply do not count.
    """

    def __init__(self, estimator: Any, *, n_tasks: int | None = None) -> None:
        self.estimator = estimator
        self.n_tasks = n_tasks

    def _split_rows(self, X: ArrayLike, m: int | None) -> tuple[NDArray[np.int64], FloatArray]:
        Xa = np.asarray(X, dtype=np.float64)
        if Xa.ndim != 2 or Xa.shape[1] < 2:
            raise DataFormatError(
                "X must be a 2-D array whose first column is the task index and the others the "
                f"features; got shape {Xa.shape}."
            )
        tasks = Xa[:, 0]
        if not np.all(np.isfinite(tasks)) or np.any(tasks != np.round(tasks)) or tasks.min() < 0:
            raise DataFormatError("the first column of X must hold task indices 0, 1, ...")
        t = tasks.astype(np.int64)
        if m is not None and t.max() >= m:
            raise DataFormatError(
                f"task index {int(t.max())} out of range for the {m} tasks fitted (a fold whose "
                "training rows miss a task?): use stack_tasks' row order with cv=k, or folds "
                "stratified on the task column (StratifiedKFold(...).split(X, X[:, 0]))."
            )
        return t, Xa[:, 1:]

    def fit(self, X: ArrayLike, y: ArrayLike) -> StackedTasks:
        """Fit a clone of ``estimator`` on the tasks of the stacked rows; returns self."""
        t, F = self._split_rows(X, self.n_tasks)
        ya = np.asarray(y, dtype=np.float64).ravel()
        if ya.shape[0] != F.shape[0]:
            raise DataFormatError(f"X has {F.shape[0]} rows but y has {ya.shape[0]} targets.")
        m = int(t.max()) + 1 if self.n_tasks is None else int(self.n_tasks)
        missing = sorted(set(range(m)) - set(np.unique(t).tolist()))
        if missing:
            raise DataFormatError(
                f"task(s) {missing[:5]} have no training row: use stack_tasks' row order with "
                "cv=k, or folds stratified on the task column "
                "(StratifiedKFold(...).split(X, X[:, 0]))."
            )
        self.estimator_ = clone(self.estimator).fit(
            [F[t == i] for i in range(m)], [ya[t == i] for i in range(m)]
        )
        self.n_tasks_ = m
        return self

    def _decision(self, X: ArrayLike) -> tuple[NDArray[np.int64], FloatArray]:
        if not hasattr(self, "estimator_"):
            from sklearn.exceptions import NotFittedError

            raise NotFittedError("This StackedTasks instance is not fitted yet.")
        t, F = self._split_rows(X, self.n_tasks_)
        coef = self.estimator_.coef_
        if F.shape[1] != coef.shape[0]:
            raise DataFormatError(f"fitted with {coef.shape[0]} features; got {F.shape[1]}.")
        return t, np.einsum("nd,dn->n", F, coef[:, t])

    def decision_function(self, X: ArrayLike) -> FloatArray:
        """Every row's score ``x^T w_task``."""
        return self._decision(X)[1]

    def predict(self, X: ArrayLike) -> FloatArray:
        """Every row's prediction: the score (regression) or a 0/1 label (logistic loss)."""
        s = self.decision_function(X)
        return (s > 0).astype(np.float64) if self.estimator_.loss == "logistic" else s

    def _per_task(
        self, X: ArrayLike, y: ArrayLike
    ) -> tuple[list[FloatArray], list[FloatArray], bool]:
        t, s = self._decision(X)
        ya = np.asarray(y, dtype=np.float64).ravel()
        present = np.unique(t)
        return (
            [ya[t == i] for i in present],
            [s[t == i] for i in present],
            bool(self.estimator_.loss == "logistic"),
        )

    def score(self, X: ArrayLike, y: ArrayLike) -> float:
        """Pooled R² (regression) or average per-task AUC (classification): higher is better."""
        yl, sl, clf = self._per_task(X, y)
        return float(aauc(yl, sl) if clf else r2(yl, sl))

    def paper_score(self, X: ArrayLike, y: ArrayLike) -> float:
        """nMSE (regression, lower is better) or average per-task AUC (classification)."""
        yl, sl, clf = self._per_task(X, y)
        return float(aauc(yl, sl) if clf else nmse(yl, sl))
