"""Hyper-parameter selection for the linear methods, as in the MP-MTL paper's protocol (§5.2).

Every method is tuned by k-fold cross-validation (default 5) **on the training split of each run**:
each task's training samples are shuffled and cut into k folds; split s validates on fold s of every
task and trains on the rest (every task is on both sides of every split). The grid point with the
best mean validation score wins — lowest nMSE for regression (``loss="squared"``), highest aAUC for
classification (``loss="logistic"``) — and the caller refits it on the whole training split.

As in the paper, **the tuning is not charged to the privacy budget** (:data:`TUNING_NOT_CHARGED`):
a private method's reported (ε, δ) covers one training run with the selected hyper-parameters,
not the many runs of the search.

:data:`DEFAULT_GRIDS` documents the grid of every CLI method name (:data:`METHODS`); they are
lists of parameter dictionaries (scikit-learn ``ParameterGrid`` format, so parameters can be
coupled). :func:`tune_method` is the one call the CLI needs: it tunes any method with its grid.

The MP-MTL grids are templates in relative units. The clipping norm K must sit near the scale of
the task models (a K far above it wastes budget on noise ∝ K², one far below shrinks every model),
and that scale differs by orders of magnitude between data sets (School: ``||w_i|| ~ 10^2..10^3``
with unit-norm rows and raw scores; the paper's synthetic data: ``~50``). So :func:`tune_method`
first tunes the STL-l2 baseline, starts MP-MTL from those ridge models (the paper's "initial task
models acquired via STL") and searches K in multiples of their median norm and ``lam = c K`` (the
released covariance, its noise and the useful threshold ``η lam`` all scale with K). Sizes were
chosen so that tuning one method on one School training split takes seconds (the slowest
non-private solvers — trace norm, l1 and especially exact MTRL — dominate; their solver tolerances
are never loosened).
"""

from __future__ import annotations

import itertools
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from sklearn.base import BaseEstimator

from privmtl._validation import check_choice, check_int, check_rng
from privmtl.exceptions import DataFormatError, InvalidParameterError
from privmtl.linear.common import _LinearMTLMixin, check_tasks
from privmtl.linear.local import task_fold_ids
from privmtl.linear.losses import TaskBatch
from privmtl.linear.methods import (
    DEFAULT_GRIDS,
    ISOLATED_METHODS,
    METHOD_ESTIMATORS,
    METHODS,
    MPMTL_METHODS,
    PRIVATE_METHODS,
    RELATIVE_KEYS,
    STL_WEIGHT,
    STLL2,
    linear_method,
    method_names,
)

__all__ = [
    "DEFAULT_GRIDS",
    "FINAL_STEPS",
    "ISOLATED_METHODS",
    "METHODS",
    "METHOD_ESTIMATORS",
    "MPMTL_METHODS",
    "PRIVATE_METHODS",
    "RELATIVE_KEYS",
    "TUNING_NOT_CHARGED",
    "PerTaskSelected",
    "estimator_class",
    "expand_grid",
    "make_estimator",
    "per_task_folds",
    "resolve_grid",
    "select_hyperparameters",
    "tune_method",
]

#: Output rules of the MP-MTL low-rank / group-sparse estimators searched by :func:`tune_method`.
FINAL_STEPS: tuple[str, ...] = ("auto", "projection", "refit")

#: Printed by the CLI next to every tuned private result.
TUNING_NOT_CHARGED = (
    "Hyper-parameters were selected by k-fold cross-validation on the training data, as in the "
    "MP-MTL paper; this tuning is NOT charged to the privacy budget: the reported (epsilon, delta) "
    "covers one training run with the selected hyper-parameters, not the search."
)


def resolve_grid(
    grid: Sequence[Mapping[str, Sequence[Any]]], *, clip_scale: float, init_alpha: float
) -> list[dict[str, list[Any]]]:
    """Turn a relative MP-MTL template (:data:`RELATIVE_KEYS`) into estimator parameters.

    Each template dict becomes one dict per ``clip_factor`` with ``clip = clip_factor *
    clip_scale``, ``lam = [c * clip for c in lam_per_clip]`` (and ``lam_sparse`` likewise), and
    ``init_alpha =`` :data:`~privmtl.linear.methods.STL_WEIGHT` replaced by ``init_alpha``. Dicts without relative keys pass through.
    """
    if not (clip_scale > 0 and math.isfinite(clip_scale)):
        raise InvalidParameterError(
            f"The 'clip_scale' parameter must be a finite real > 0; got {clip_scale!r}."
        )
    out: list[dict[str, list[Any]]] = []
    for g in grid:
        base = {k: list(v) for k, v in g.items() if k not in RELATIVE_KEYS}
        if base.get("init_alpha") == [STL_WEIGHT]:
            base["init_alpha"] = [float(init_alpha)]
        if "clip_factor" not in g:
            out.append(base)
            continue
        for f in g["clip_factor"]:
            K = float(f) * clip_scale
            point = dict(base)
            point["clip"] = [K]
            point["lam"] = [float(c) * K for c in g.get("lam_per_clip", [0.0])]
            if "lam_sparse_per_clip" in g:
                point["lam_sparse"] = [float(c) * K for c in g["lam_sparse_per_clip"]]
            if "refit_lam_per_stl" in g:
                point["refit_lam"] = [float(c) * float(init_alpha) for c in g["refit_lam_per_stl"]]
            out.append(point)
    return out


def _is_refit_point(g: Mapping[str, Sequence[Any]]) -> bool:
    """True for grid points of the local refit (a refit weight other than None)."""
    return "refit_lam_per_stl" in g or any(v is not None for v in g.get("refit_lam", [None]))


def tune_method(
    method: str,
    Xs: Sequence[ArrayLike],
    ys: Sequence[ArrayLike],
    *,
    n_splits: int = 5,
    random_state: Any = None,
    grid: Any = None,
    final_step: str = "auto",
    **fixed: Any,
) -> tuple[dict[str, Any], Any]:
    """Tune a CLI method on training data with its default grid; the entry point for the CLI.

    ``final_step`` (MP-MTL low-rank and group-sparse only): ``"auto"`` searches both output rules,
    ``"projection"`` only the paper's projected output (grid points without ``refit_lam``),
    ``"refit"`` only the local variational refit (points with it).

    Non-MP-MTL methods: :func:`select_hyperparameters` over ``DEFAULT_GRIDS[method]`` (or
    ``grid``) with the estimator ``make_estimator(method, **fixed)``.

    MP-MTL methods (``lowrank``, ``groupsparse``, ``lowrank-sparse``), two stages:
    (1) tune the STL-l2 baseline (same loss) by the same k-fold CV, fit it on all of ``Xs`` and take
    the median norm ``s`` of the tasks' ridge models; (2) resolve the template
    (:func:`resolve_grid`: ``W^(0)`` = those ridge models, ``K`` in multiples of ``s``, ``lam`` in
    multiples of ``K``) and select by CV. The clipping norm is thus tuned around the scale of the
    tasks' own models — a data-dependent search space, which like all tuning here is not charged
    to the privacy budget (:data:`TUNING_NOT_CHARGED`); the fitted estimator's guarantee holds for
    the selected, then fixed, K.

    Returns
    -------
    best_params : dict
        Estimator parameters (``fixed`` not included).
    cv_table : pandas.DataFrame
        The CV table of the (last) search; for MP-MTL methods ``cv_table.attrs`` holds
        ``stl_lam`` and ``clip_scale``.
    """
    import functools

    cls = linear_method(method)
    factory = functools.partial(cls.make, **fixed)
    if not cls.relative_grid:
        cls.make(**fixed)  # validates the parameters early
        g = cls.grid if grid is None else grid
        return select_hyperparameters(
            factory, g, Xs, ys, n_splits=n_splits, random_state=random_state
        )
    rng = check_rng(random_state)
    loss = fixed.get("loss", "squared")
    stl_best, _ = select_hyperparameters(
        functools.partial(STLL2.make, loss=loss),
        STLL2.grid,
        Xs,
        ys,
        n_splits=n_splits,
        random_state=rng,
    )
    W = STLL2.make(loss=loss, **stl_best).fit(Xs, ys).coef_
    norms = np.linalg.norm(W, axis=0)
    scale = float(np.median(norms))
    if not scale > 0:
        scale = 1.0  # all-zero ridge models (e.g. constant zero targets): any scale will do
    template = cls.grid if grid is None else grid
    check_choice("final_step", final_step, FINAL_STEPS)
    if final_step != "auto":
        want = final_step == "refit"
        template = [g for g in template if _is_refit_point(g) == want]
        if not template:
            raise InvalidParameterError(
                f"The 'final_step' parameter {final_step!r} leaves no grid point for "
                f"method={method!r}."
            )
    resolved = resolve_grid(template, clip_scale=scale, init_alpha=float(stl_best["lam"]))
    best, table = select_hyperparameters(
        factory, resolved, Xs, ys, n_splits=n_splits, random_state=rng
    )
    table.attrs["stl_lam"] = float(stl_best["lam"])
    table.attrs["clip_scale"] = scale
    return best, table


def estimator_class(method: Any) -> Any:
    """The estimator class behind a method name or :class:`~privmtl.linear.methods.LinearMethod`
    (its module is imported on use)."""
    return linear_method(method).estimator_class()


def make_estimator(method: Any, **params: Any) -> Any:
    """Instantiate the estimator of a method name with ``params``."""
    return linear_method(method).make(**params)


def expand_grid(
    grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Sequence[Any]]],
) -> list[dict[str, Any]]:
    """All parameter combinations of a grid (a dict of lists, or a list of such dicts), in order."""
    grids = [grid] if isinstance(grid, Mapping) else list(grid)
    if not grids:
        raise InvalidParameterError("The 'grid' parameter must contain at least one point; got [].")
    out: list[dict[str, Any]] = []
    for g in grids:
        if not isinstance(g, Mapping):
            raise InvalidParameterError(
                f"The 'grid' parameter must be a dict of lists or a list of dicts; got {g!r}."
            )
        keys = list(g)
        values = []
        for k in keys:
            v = g[k]
            if isinstance(v, str) or not isinstance(v, Sequence) or len(v) == 0:
                raise InvalidParameterError(
                    f"grid entry {k!r} must be a non-empty list of values; got {v!r}."
                )
            values.append(list(v))
        for combo in itertools.product(*values):
            out.append(dict(zip(keys, combo, strict=True)))
    return out


def per_task_folds(
    sizes: Sequence[int], n_splits: int, rng: np.random.Generator
) -> list[list[np.ndarray]]:
    """Per-task folds: ``folds[i][s]`` are the (sorted) validation indices of task i in split s."""
    folds = []
    for i, n in enumerate(sizes):
        if n < n_splits:
            raise DataFormatError(
                f"task {i} has {n} training samples, fewer than n_splits={n_splits}: it cannot be "
                "validated in every split (use fewer folds or drop the task)."
            )
        folds.append([np.sort(f) for f in np.array_split(rng.permutation(n), n_splits)])
    return folds


def _fold_splits(
    Xl: Sequence[np.ndarray], yl: Sequence[np.ndarray], folds: list[list[np.ndarray]], k: int
) -> list[tuple[list[Any], list[Any], list[Any], list[Any]]]:
    """(train X, train y, validation X, validation y) of every split: split s validates on fold s
    of every task and trains on the rest."""
    splits = []
    for s in range(k):
        Xtr, ytr, Xva, yva = [], [], [], []
        for x, y, f in zip(Xl, yl, folds, strict=True):
            va = f[s]
            tr = np.sort(np.concatenate([f[j] for j in range(k) if j != s]))
            Xtr.append(x[tr])
            ytr.append(y[tr])
            Xva.append(x[va])
            yva.append(y[va])
        splits.append((Xtr, ytr, Xva, yva))
    return splits


def _fit_and_score(
    est: Any,
    params: dict[str, Any],
    s: int,
    split: tuple[list[Any], list[Any], list[Any], list[Any]],
    prepared: dict[tuple[int, type, str], Any],
) -> float:
    """Fit ``est`` on split ``s``'s training part and score it on its validation part (NaN, with
    a RuntimeWarning, when the fit or the score fails)."""
    Xtr, ytr, Xva, yva = split
    try:
        train: Any = Xtr
        if hasattr(est, "prepare_tasks"):
            # validate/pad the split once per estimator type and loss (MP-MTL estimators)
            pkey = (s, type(est), str(getattr(est, "loss", "")))
            if pkey not in prepared:
                prepared[pkey] = est.prepare_tasks(Xtr, ytr)
            train = prepared[pkey]
        est.fit(train, ytr)
        # privmtl's estimators: the paper's nMSE / aAUC (score() is R² for regression)
        scorer = getattr(est, "paper_score", est.score)
        return float(scorer(Xva, yva))
    except (DataFormatError, FloatingPointError, np.linalg.LinAlgError) as exc:
        # e.g. a diverging fit whose predictions are not finite: score it as failed
        # (like scikit-learn's error_score=nan) instead of aborting the search.
        warnings.warn(
            f"grid point {params} failed on split {s} and is ranked last: {exc}",
            RuntimeWarning,
            stacklevel=3,
        )
        return math.nan


def _greater_is_better(estimator: Any) -> bool:
    return getattr(estimator, "loss", "squared") == "logistic"


def select_hyperparameters(
    estimator_factory: Callable[..., Any],
    grid: Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Sequence[Any]]],
    Xs: Sequence[ArrayLike],
    ys: Sequence[ArrayLike],
    *,
    n_splits: int = 5,
    random_state: Any = None,
    greater_is_better: bool | None = None,
) -> tuple[dict[str, Any], Any]:
    """Pick the grid point with the best k-fold cross-validated score on training data.

    Parameters
    ----------
    estimator_factory : callable
        ``estimator_factory(**params)`` returns an unfitted estimator with ``fit(Xs, ys)`` and
        ``score(Xs, ys)`` (an estimator class, or e.g. ``functools.partial(MPMTLLowRank,
        epsilon=1.0)``). privmtl's estimators are scored with ``paper_score`` (nMSE or aAUC),
        other estimators with ``score``.
    grid : dict of lists or list of dicts
        The search space (every combination of every dict, see :func:`expand_grid`).
    Xs, ys : sequences of per-task arrays
        The training split of one run.
    n_splits : int, default=5
        Number of folds k (every task needs at least k samples).
    random_state : None, int or Generator
        Shuffles the folds. If the estimator has a ``random_state`` parameter that is not in the
        grid, fold s gets the seed ``SeedSequence(...).spawn`` number s (the same for every grid
        point, so grid points are compared on common noise draws).
    greater_is_better : bool or None, default=None
        Direction of ``score``; None ⇒ from the estimator's ``loss`` (aAUC for ``"logistic"``,
        higher is better; nMSE otherwise, lower is better).

    Returns
    -------
    best_params : dict
    cv_table : pandas.DataFrame
        One row per grid point: the parameters, ``mean_score``, ``std_score``, ``split{s}_score``,
        ``fit_time`` (seconds, summed over folds) and ``rank`` (1 = selected; ties keep grid order).
        A grid point whose fit or score fails on some split (non-finite predictions of a diverging
        fit, a singular system) gets a NaN mean score, a RuntimeWarning and the last rank.

    Notes
    -----
    The tuning is not charged to the privacy budget (:data:`TUNING_NOT_CHARGED`).
    """
    import pandas as pd

    k = check_int("n_splits", n_splits, low=2)
    points = expand_grid(grid)
    relative = sorted({key for p in points for key in p if key in RELATIVE_KEYS})
    if relative or any(p.get("init_alpha") == STL_WEIGHT for p in points):
        raise InvalidParameterError(
            f"The 'grid' parameter holds relative MP-MTL keys {relative or ['init_alpha']}: "
            "resolve it with resolve_grid() or use tune_method()."
        )
    Xl, yl = check_tasks(Xs, ys)
    assert yl is not None
    rng = check_rng(random_state)
    folds = per_task_folds([x.shape[0] for x in Xl], k, rng)
    seeds = [
        int(s.generate_state(1)[0])
        for s in np.random.SeedSequence(int(rng.integers(0, 2**63 - 1))).spawn(k)
    ]
    splits = _fold_splits(Xl, yl, folds, k)

    rows = []
    direction: bool | None = greater_is_better
    prepared: dict[tuple[int, type, str], Any] = {}
    for params in points:
        scores = []
        elapsed = 0.0
        for s in range(k):
            est = estimator_factory(**params)
            if "random_state" not in params and hasattr(est, "get_params"):
                if "random_state" in est.get_params(deep=False):
                    est.set_params(random_state=seeds[s])
            if direction is None:
                direction = _greater_is_better(est)
            t0 = time.perf_counter()
            scores.append(_fit_and_score(est, params, s, splits[s], prepared))
            elapsed += time.perf_counter() - t0
        arr = np.asarray(scores)
        row = dict(params)
        row["mean_score"] = float(arr.mean()) if np.all(np.isfinite(arr)) else math.nan
        row["std_score"] = float(arr.std())
        for s, v in enumerate(scores):
            row[f"split{s}_score"] = v
        row["fit_time"] = elapsed
        rows.append(row)
    table = pd.DataFrame(rows)
    if bool(table["mean_score"].isna().all()):
        raise DataFormatError(
            "every grid point failed during cross-validation (see the warnings); cannot select."
        )
    key = table["mean_score"].to_numpy(dtype=float)
    key = np.where(np.isnan(key), -np.inf if direction else np.inf, key)
    order = np.argsort(-key if direction else key, kind="stable")
    ranks = np.empty(len(order), dtype=int)
    ranks[order] = np.arange(1, len(order) + 1)
    table["rank"] = ranks
    best = dict(points[int(order[0])])
    return best, table


class PerTaskSelected(_LinearMTLMixin, BaseEstimator):  # type: ignore[misc]
    """A single-task method whose every task chooses its own hyper-parameters on its own samples.

    Every task's samples are cut into ``n_splits`` folds by a generator spawned for that task alone
    (:func:`~privmtl.linear.local.task_fold_ids`). For every fold and grid point the single-task
    method is fitted on the training parts and **every task scores itself** on its own validation
    part (squared error, or log-loss for the logistic loss); task i keeps the grid point with its
    least summed error, and its model is column i of the method fitted with that point. No task's
    choice reads another task's validation data (single-task learning: ε = 0 towards the others).
    The fits are batched over tasks; each task's column is its own problem's solution (for a solver
    with a joint stopping rule, up to that solver's tolerance).

    Parameters
    ----------
    method : {"stl-l2", "stl-l1"}, default="stl-l1"
        The single-task method (:data:`ISOLATED_METHODS`).
    grid : list of dicts or None, default=None
        Search space; None ⇒ ``DEFAULT_GRIDS[method]``.
    n_splits : int, default=10
        Folds per task (a task with fewer samples puts each in its own fold, so its choice still
        depends on its own size only). More folds than pooled CV's 5: a task's training parts
        then stay near its own size, which matters when it has about as many samples as
        features.
    loss : {"squared", "logistic"}, default="squared"
    random_state : int, default=0
        Seed of the tasks' folds.

    Attributes
    ----------
    coef_ : ndarray of shape (d, m)
    best_params_ : list of dict
        Every task's selected parameters.
    """

    def __init__(
        self,
        *,
        method: str = "stl-l1",
        grid: Any = None,
        n_splits: int = 10,
        loss: str = "squared",
        random_state: int = 0,
    ) -> None:
        self.method = method
        self.grid = grid
        self.n_splits = n_splits
        self.loss = loss
        self.random_state = random_state

    def fit(self, Xs: Any, ys: Sequence[ArrayLike] | None = None) -> PerTaskSelected:
        """Select every task's point on its own folds, then fit."""
        check_choice("method", self.method, method_names(isolated=True))
        k = check_int("n_splits", self.n_splits, low=2)
        seed = check_int("random_state", self.random_state, low=0)
        Xl, yl = check_tasks(Xs, ys, loss=self.loss, need_y=True)
        assert yl is not None
        for i, x in enumerate(Xl):
            if x.shape[0] < 2:
                raise DataFormatError(
                    f"task {i} has {x.shape[0]} training sample; per-task selection needs at "
                    "least 2 (one to train, one to validate)."
                )
        points = expand_grid(linear_method(self.method).grid if self.grid is None else self.grid)
        folds = task_fold_ids(TaskBatch.from_tasks(Xl, yl), k, seed)
        errors = np.zeros((len(points), len(Xl)))
        for s in range(k):
            tr = [np.flatnonzero(folds[i, : x.shape[0]] != s) for i, x in enumerate(Xl)]
            va = [np.flatnonzero(folds[i, : x.shape[0]] == s) for i, x in enumerate(Xl)]
            Xtr = [x[t] for x, t in zip(Xl, tr, strict=True)]
            ytr = [y[t] for y, t in zip(yl, tr, strict=True)]
            for g, params in enumerate(points):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    coef = make_estimator(self.method, loss=self.loss, **params).fit(Xtr, ytr).coef_
                for i, (x, y, v) in enumerate(zip(Xl, yl, va, strict=True)):
                    errors[g, i] += _own_error(x[v] @ coef[:, i], y[v], self.loss)
        errors = np.where(np.isfinite(errors), errors, np.inf)
        best = np.argmin(errors, axis=0)
        coef = np.zeros((Xl[0].shape[1], len(Xl)))
        for g in np.unique(best):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fitted = make_estimator(self.method, loss=self.loss, **points[g]).fit(Xl, yl)
            cols = np.flatnonzero(best == g)
            coef[:, cols] = fitted.coef_[:, cols]
        self.coef_ = coef
        self.best_params_ = [dict(points[int(g)]) for g in best]
        self.n_features_in_, self.n_tasks_ = coef.shape
        return self


def _own_error(score: np.ndarray, y: np.ndarray, loss: str) -> float:
    """A task's summed validation loss: squared error, or log-loss of 0/1 labels."""
    if loss == "squared":
        return float(np.sum((score - y) ** 2))
    return float(np.sum(np.logaddexp(0.0, -(2.0 * y - 1.0) * score)))
