"""In-memory multi-task datasets for linear MTL: one ``(X_i, y_i)`` pair per task.

A :class:`MultiTaskDataset` is immutable: its arrays are float64 copies flagged read-only, and every
transformation (splits, normalization, subsets) returns a new dataset. No intercept column is ever
added: if a model needs one, include a constant feature in the data (the School data already has it).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from privmtl._validation import check_choice, check_int, check_real, check_rng
from privmtl.exceptions import DataFormatError, InvalidParameterError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["INTERCEPT", "TASK_TYPES", "MultiTaskDataset", "TaskType", "standardization"]

#: Name of the constant column :meth:`MultiTaskDataset.with_intercept` appends.
INTERCEPT = "(intercept)"

TaskType = Literal["regression", "classification"]
TASK_TYPES: tuple[str, ...] = ("regression", "classification")

FloatArray = NDArray[np.float64]


def standardization(X_train: ArrayLike) -> tuple[FloatArray, FloatArray]:
    """Column means and scales that standardize ``X_train`` (the statistics of one group's rows).

    ``(X - mean) / scale`` has mean 0 and standard deviation 1 (``ddof=0``) on ``X_train`` in every
    column that varies there. A column constant on ``X_train`` (a bias column of ones, an unused
    indicator) gets ``mean = 0`` and ``scale = 1``: it is left as it is, so a constant (intercept)
    feature stays one. Used per client (:func:`~privmtl.data.federated_table.load_federated_table`)
    and per task (:meth:`MultiTaskDataset.standardize`), always with the statistics of that
    client's or task's own training rows.

    Parameters
    ----------
    X_train : array_like of shape (n, d)
        The training rows of one client or task (``n >= 1``).

    Returns
    -------
    mean, scale : ndarray of shape (d,)
    """
    X = np.asarray(X_train, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] == 0:
        raise DataFormatError(f"standardization needs a non-empty (n, d) array; got {X.shape}.")
    mean = X.mean(axis=0)
    std = X.std(axis=0)
    # relative tolerance: a column whose spread is rounding noise counts as constant
    const = std <= 1e-12 * np.maximum(np.abs(mean), 1.0)
    return np.where(const, 0.0, mean), np.where(const, 1.0, std)


def _frozen(a: ArrayLike) -> FloatArray:
    out = np.array(a, dtype=np.float64, copy=True)
    out.flags.writeable = False
    return out


@dataclass(frozen=True, eq=False, repr=False)
class MultiTaskDataset:
    """Per-task feature matrices and targets with a common feature dimension.

    Parameters
    ----------
    X : sequence of array_like, each of shape (n_i, d)
        Features of every task. Converted to float64 (copies, read-only).
    y : sequence of array_like, each of shape (n_i,)
        Targets of every task; ``(n_i, 1)`` column vectors are flattened. For classification the
        labels must be 0/1.
    task_names : sequence of str, optional
        Unique task names; default ``("task_0", "task_1", ...)``.
    task_type : {"regression", "classification"}, default="regression"
        Kind of target.
    feature_names : sequence of str, optional
        Names of the ``d`` features; default ``("x0", "x1", ...)``.

    Raises
    ------
    DataFormatError
        If there is no task, a task is empty, the arrays have inconsistent shapes (the message names
        the task), contain NaN or infinity, or classification labels are not 0/1.
    InvalidParameterError
        If ``task_type`` is not one of the allowed values.

    Examples
    --------
    >>> import numpy as np
    >>> ds = MultiTaskDataset(X=[np.ones((3, 2)), np.zeros((2, 2))], y=[np.ones(3), np.zeros(2)])
    >>> ds.n_tasks, ds.n_features, ds.n_samples.tolist()
    (2, 2, [3, 2])
    """

    X: tuple[FloatArray, ...]
    y: tuple[FloatArray, ...]
    task_names: tuple[str, ...] = ()
    task_type: TaskType = "regression"
    feature_names: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        check_choice("task_type", self.task_type, TASK_TYPES)
        Xs, ys = list(self.X), list(self.y)
        if len(Xs) == 0:
            raise DataFormatError("a multi-task dataset needs at least one task; got 0.")
        if len(Xs) != len(ys):
            raise DataFormatError(
                f"got {len(Xs)} feature matrices but {len(ys)} target vectors (one per task)."
            )
        names = tuple(str(n) for n in self.task_names) or tuple(f"task_{i}" for i in range(len(Xs)))
        if len(names) != len(Xs):
            raise DataFormatError(f"got {len(names)} task names for {len(Xs)} tasks.")
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise DataFormatError(f"task names must be unique; repeated: {dup}.")
        X_out: list[FloatArray] = []
        y_out: list[FloatArray] = []
        d: int | None = None
        for i, (Xi, yi, name) in enumerate(zip(Xs, ys, names, strict=True)):
            where = f"task {name!r} (index {i})"
            try:
                Xa = np.asarray(Xi, dtype=np.float64)
                ya = np.asarray(yi, dtype=np.float64)
            except (TypeError, ValueError) as exc:
                raise DataFormatError(f"{where}: data are not numeric ({exc}).") from exc
            if Xa.ndim != 2:
                raise DataFormatError(
                    f"{where}: features must be a 2-D (n_i, d) array; got shape {Xa.shape}."
                )
            if ya.ndim == 2 and 1 in ya.shape:
                ya = ya.ravel()
            if ya.ndim != 1:
                raise DataFormatError(
                    f"{where}: targets must be a 1-D (n_i,) array; got shape {ya.shape}."
                )
            if d is None:
                d = Xa.shape[1]
            if Xa.shape[1] != d:
                raise DataFormatError(
                    f"{where}: has {Xa.shape[1]} features but the first task has {d}."
                )
            if Xa.shape[0] != ya.shape[0]:
                raise DataFormatError(
                    f"{where}: {Xa.shape[0]} feature rows but {ya.shape[0]} targets."
                )
            if Xa.shape[0] == 0:
                raise DataFormatError(f"{where}: has no samples.")
            if not np.all(np.isfinite(Xa)):
                row = int(np.argwhere(~np.isfinite(Xa))[0, 0])
                raise DataFormatError(f"{where}: features contain NaN or infinity (row {row}).")
            if not np.all(np.isfinite(ya)):
                row = int(np.argwhere(~np.isfinite(ya))[0, 0])
                raise DataFormatError(f"{where}: targets contain NaN or infinity (row {row}).")
            if self.task_type == "classification" and not np.all((ya == 0) | (ya == 1)):
                bad = np.unique(ya[(ya != 0) & (ya != 1)])[:5].tolist()
                raise DataFormatError(
                    f"{where}: classification labels must be 0 or 1; found {bad}."
                )
            X_out.append(_frozen(Xa))
            y_out.append(_frozen(ya))
        assert d is not None
        fnames = tuple(str(f) for f in self.feature_names) or tuple(f"x{j}" for j in range(d))
        if len(fnames) != d:
            raise DataFormatError(f"got {len(fnames)} feature names for {d} features.")
        object.__setattr__(self, "X", tuple(X_out))
        object.__setattr__(self, "y", tuple(y_out))
        object.__setattr__(self, "task_names", names)
        object.__setattr__(self, "feature_names", fnames)

    # ------------------------------------------------------------------ properties
    @property
    def n_tasks(self) -> int:
        """Number of tasks ``m``."""
        return len(self.X)

    @property
    def n_features(self) -> int:
        """Feature dimension ``d`` (common to all tasks)."""
        return int(self.X[0].shape[1])

    @property
    def n_samples(self) -> NDArray[np.int64]:
        """Number of samples of every task, shape ``(m,)``."""
        return np.array([x.shape[0] for x in self.X], dtype=np.int64)

    def __len__(self) -> int:
        return self.n_tasks

    def __repr__(self) -> str:
        n = self.n_samples
        return (
            f"MultiTaskDataset(n_tasks={self.n_tasks}, n_features={self.n_features}, "
            f"n_samples={int(n.sum())} (min {int(n.min())}, max {int(n.max())} per task), "
            f"task_type={self.task_type!r})"
        )

    def _replace(
        self, X: Sequence[ArrayLike], y: Sequence[ArrayLike], **kw: Any
    ) -> MultiTaskDataset:
        args: dict[str, Any] = {
            "task_names": self.task_names,
            "task_type": self.task_type,
            "feature_names": self.feature_names,
        }
        args.update(kw)
        return MultiTaskDataset(X=tuple(X), y=tuple(y), **args)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ transformations
    def train_test_split(
        self, train_fraction: float, *, random_state: int | np.random.Generator | None
    ) -> tuple[MultiTaskDataset, MultiTaskDataset]:
        """Split every task's samples at random into a training and a test part.

        Task ``i`` gets ``floor(train_fraction * n_i + 0.5)`` training samples, clipped to
        ``[1, n_i - 1]`` so that both sides keep at least one sample; the rest is test data.
        Samples keep their original order within each side. The MP-MTL protocol uses
        ``train_fraction=0.3``.

        Parameters
        ----------
        train_fraction : float in (0, 1)
        random_state : int, Generator or None
            Source of the permutations (one per task, drawn in task order).

        Returns
        -------
        train, test : MultiTaskDataset

        Raises
        ------
        DataFormatError
            If a task has fewer than 2 samples (its name is given).
        """
        f = check_real("train_fraction", train_fraction, low=0.0, high=1.0, closed="neither")
        rng = check_rng(random_state)
        self._require_min_samples(2, "a train/test split")
        Xtr, ytr, Xte, yte = [], [], [], []
        for Xi, yi in zip(self.X, self.y, strict=True):
            n = Xi.shape[0]
            k = min(max(math.floor(f * n + 0.5), 1), n - 1)
            perm = rng.permutation(n)
            tr, te = np.sort(perm[:k]), np.sort(perm[k:])
            Xtr.append(Xi[tr])
            ytr.append(yi[tr])
            Xte.append(Xi[te])
            yte.append(yi[te])
        return self._replace(Xtr, ytr), self._replace(Xte, yte)

    def kfold(
        self, n_splits: int = 5, *, random_state: int | np.random.Generator | None
    ) -> Iterator[tuple[MultiTaskDataset, MultiTaskDataset]]:
        """Per-task k-fold cross-validation: yield ``n_splits`` ``(train, validation)`` pairs.

        Each task's samples are shuffled once and cut into ``n_splits`` folds of near-equal size
        (``numpy.array_split``); split ``k`` validates on fold ``k`` of every task and trains on the
        others, so every task appears on both sides of every split.

        Raises
        ------
        DataFormatError
            If a task has fewer than ``n_splits`` samples (it could not be validated in every
            split); no silent fallback is made. Use fewer folds or drop the task with
            :meth:`subset`.
        """
        k = check_int("n_splits", n_splits, low=2)
        rng = check_rng(random_state)
        self._require_min_samples(k, f"{k}-fold cross-validation")
        folds = [np.array_split(rng.permutation(x.shape[0]), k) for x in self.X]
        return self._kfold_iter(folds, k)

    def _kfold_iter(
        self, folds: list[list[NDArray[np.int64]]], k: int
    ) -> Iterator[tuple[MultiTaskDataset, MultiTaskDataset]]:
        for s in range(k):
            Xtr, ytr, Xva, yva = [], [], [], []
            for Xi, yi, fi in zip(self.X, self.y, folds, strict=True):
                va = np.sort(fi[s])
                tr = np.sort(np.concatenate([fi[j] for j in range(k) if j != s]))
                Xtr.append(Xi[tr])
                ytr.append(yi[tr])
                Xva.append(Xi[va])
                yva.append(yi[va])
            yield self._replace(Xtr, ytr), self._replace(Xva, yva)

    def normalize_rows(self) -> MultiTaskDataset:
        """Scale every data point (row of every ``X_i``) to unit l2 norm; zero rows stay zero.

        This is the MP-MTL paper's preprocessing ("each data point normalized to unit length"). It
        applies to all columns, including a constant (bias) column if the data has one.
        """
        Xs = []
        for Xi in self.X:
            norms = np.linalg.norm(Xi, axis=1, keepdims=True)
            Xs.append(Xi / np.where(norms > 0, norms, 1.0))
        return self._replace(Xs, self.y)

    def standardize(self, reference: MultiTaskDataset | None = None) -> MultiTaskDataset:
        """Standardize every task's features with that task's statistics in ``reference``.

        Task ``i``'s columns are centred and scaled by :func:`standardization` of ``reference``'s
        task ``i`` (default: this dataset). Fit on a training split and apply to its test split,
        ``test.standardize(train)`` then ``train.standardize()``: each task's statistics come from
        its own training rows only, nothing is pooled across tasks. Columns constant within a
        task's reference rows are left unchanged (a bias column stays a bias column).

        Raises
        ------
        DataFormatError
            If ``reference`` has other tasks or another number of features.
        """
        ref = self if reference is None else reference
        if ref.task_names != self.task_names or ref.n_features != self.n_features:
            raise DataFormatError(
                "standardize: the reference must have the same tasks and features; got "
                f"{ref.n_tasks} tasks x {ref.n_features} features for {self.n_tasks} x "
                f"{self.n_features}."
            )
        Xs = []
        for Xi, Ri in zip(self.X, ref.X, strict=True):
            mean, scale = standardization(Ri)
            Xs.append((Xi - mean) / scale)
        return self._replace(Xs, self.y)

    def target_means(self) -> FloatArray:
        """Every task's mean target on this dataset's rows, shape ``(n_tasks,)``.

        Fit on a training split, these are per-task intercepts: subtracting task ``i``'s mean from
        its own training targets and adding it back to its own predictions fits that task's
        intercept without penalty (as scikit-learn's ``fit_intercept`` does with centred
        features), and uses no other task's rows.
        """
        return np.array([float(np.mean(yi)) for yi in self.y], dtype=np.float64)

    def has_constant_feature(self) -> bool:
        """Whether some feature is a non-zero constant within every task (it acts as an intercept)."""
        for j in range(self.n_features):
            if all(np.all(Xi[:, j] == Xi[0, j]) and Xi[0, j] != 0 for Xi in self.X):
                return True
        return False

    def with_intercept(self) -> MultiTaskDataset:
        """This dataset with a column of ones appended, named :data:`INTERCEPT`.

        The linear models have no intercept of their own; after centring the features, this column
        lets each task's model fit the mean of its targets.
        """
        Xs = [np.hstack([Xi, np.ones((Xi.shape[0], 1))]) for Xi in self.X]
        return self._replace(Xs, self.y, feature_names=(*self.feature_names, INTERCEPT))

    def subset(self, task_indices: Sequence[int] | NDArray[np.integer]) -> MultiTaskDataset:
        """Dataset with the tasks ``task_indices`` (in that order; negative indices allowed).

        Raises
        ------
        InvalidParameterError
            If the selection is empty, has repeats or an index is out of range.
        """
        idx = [int(i) for i in np.asarray(task_indices, dtype=np.int64).ravel()]
        m = self.n_tasks
        if not idx:
            raise InvalidParameterError("The 'task_indices' parameter must select at least 1 task.")
        bad = [i for i in idx if not -m <= i < m]
        if bad:
            raise InvalidParameterError(
                f"The 'task_indices' parameter must be in [-{m}, {m - 1}]; got {bad[:5]}."
            )
        idx = [i % m for i in idx]
        if len(set(idx)) != len(idx):
            raise InvalidParameterError("The 'task_indices' parameter must not repeat a task.")
        return self._replace(
            [self.X[i] for i in idx],
            [self.y[i] for i in idx],
            task_names=tuple(self.task_names[i] for i in idx),
        )

    def to_frame(self) -> pd.DataFrame:
        """Long table: one row per sample with a ``task`` column, the features and ``y``."""
        import pandas as pd

        X = np.concatenate(self.X, axis=0)
        frame = pd.DataFrame(X, columns=list(self.feature_names))
        frame.insert(0, "task", np.repeat(np.array(self.task_names, dtype=object), self.n_samples))
        frame["y"] = np.concatenate(self.y)
        return frame

    # ------------------------------------------------------------------ helpers
    def _require_min_samples(self, k: int, what: str) -> None:
        small = [(name, x.shape[0]) for name, x in zip(self.task_names, self.X, strict=True)]
        small = [(n, s) for n, s in small if s < k]
        if small:
            shown = ", ".join(f"{n!r} ({s})" for n, s in small[:5])
            more = f" and {len(small) - 5} more" if len(small) > 5 else ""
            raise DataFormatError(
                f"{what} needs at least {k} samples per task; too small: {shown}{more}."
            )
