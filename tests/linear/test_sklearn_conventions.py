"""scikit-learn conventions: score() is higher-is-better, GridSearchCV picks the lowest nMSE."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.model_selection import GridSearchCV, StratifiedKFold

from privmtl.data.synthetic import make_lowrank_tasks
from privmtl.linear import MPMTLLowRank, StackedTasks, STLRidge, TraceNormMTL, stack_tasks
from privmtl.linear.metrics import nmse


def _data():
    train, _ = make_lowrank_tasks(n_tasks=12, n_samples=30, n_features=6, rank=2, random_state=3)
    X, y = stack_tasks(train)
    folds = list(StratifiedKFold(3, shuffle=True, random_state=0).split(X, X[:, 0]))
    return X, y, folds


def _cv_nmse(make, X, y, folds):
    """Mean validation nMSE computed independently: per-task lists, fit, metrics.nmse."""
    t = X[:, 0].astype(int)
    m = t.max() + 1
    out = []
    for tr, va in folds:
        Xs = [X[tr][t[tr] == i, 1:] for i in range(m)]
        ys = [y[tr][t[tr] == i] for i in range(m)]
        est = make().fit(Xs, ys)
        Xv = [X[va][t[va] == i, 1:] for i in range(m)]
        yv = [y[va][t[va] == i] for i in range(m)]
        out.append(nmse(yv, [x @ est.coef_[:, i] for i, x in enumerate(Xv)]))
    return float(np.mean(out))


@pytest.mark.parametrize(
    ("estimator", "name", "values"),
    [
        (STLRidge(), "lam", [30.0, 1e-3, 1.0]),
        (TraceNormMTL(), "lam", [30.0, 1e-3, 1.0]),
        (
            # the paper's Algorithm 2 (where lam matters); clip: these features are not
            # normalized (rows of norm ~ sqrt(d))
            MPMTLLowRank(
                epsilon=10.0,
                clip=100.0,
                init="zeros",
                iterations=30,
                refit_lam=None,
                eigen_fix="shift",
                noise_source="seeded",
                random_state=0,
            ),
            "lam",
            [30.0, 3.0, 1e-3],
        ),
    ],
    ids=["stl", "trace", "mpmtl-lowrank"],
)
def test_gridsearchcv_picks_the_lowest_nmse(estimator, name, values):
    X, y, folds = _data()
    search = GridSearchCV(StackedTasks(estimator), {f"estimator__{name}": values}, cv=folds)
    search.fit(X, y)
    oracle = [
        _cv_nmse(
            lambda v=v: estimator.__class__(**{**estimator.get_params(), name: v}), X, y, folds
        )
        for v in values
    ]
    assert max(oracle) > 1.05 * min(oracle)  # the candidates differ: a wrong direction would show
    assert search.best_params_[f"estimator__{name}"] == values[int(np.argmin(oracle))]
    # GridSearchCV's mean score is the mean validation R² = 1 - nMSE of the same folds
    assert search.best_score_ == pytest.approx(1.0 - min(oracle), rel=1e-9)


def test_score_is_higher_is_better_on_every_regression_estimator():
    from privmtl.linear import METHODS, make_estimator

    train, test = make_lowrank_tasks(n_tasks=10, n_samples=15, n_features=5, rank=2, random_state=1)
    for method in METHODS:
        kw = {"epsilon": 5.0, "noise_source": "seeded", "random_state": 0}
        try:
            est = make_estimator(method, **kw)
        except TypeError:
            est = make_estimator(method)
        est.fit(train.X, train.y)
        n = est.paper_score(test)
        assert est.score(test) == pytest.approx(1.0 - n), method


def test_stacked_tasks_refuses_a_fold_without_some_task():
    X, y, _ = _data()
    keep = X[:, 0] != 4
    with pytest.raises(Exception, match="no training row"):
        StackedTasks(STLRidge(), n_tasks=12).fit(X[keep], y[keep])


def test_cross_val_score_with_default_folds_on_stacked_rows():
    from sklearn.model_selection import KFold, cross_val_score

    X, y, _ = _data()
    # stack_tasks interleaves the tasks: every block of consecutive rows holds every task
    for tr, va in KFold(3).split(X):
        assert set(X[tr, 0]) == set(X[va, 0]) == set(range(12))
    scores = cross_val_score(StackedTasks(STLRidge(lam=1.0)), X, y, cv=3, error_score="raise")
    assert np.all(np.isfinite(scores)) and scores.shape == (3,)
    folds = list(KFold(3).split(X))
    assert np.mean(scores) == pytest.approx(
        1.0 - _cv_nmse(lambda: STLRidge(lam=1.0), X, y, folds), rel=1e-9
    )
    search = GridSearchCV(StackedTasks(STLRidge()), {"estimator__lam": [1e-3, 1.0, 30.0]}, cv=3)
    search.fit(X, y)
    assert np.all(np.isfinite(search.cv_results_["mean_test_score"]))
    oracle = [_cv_nmse(lambda v=v: STLRidge(lam=v), X, y, folds) for v in (1e-3, 1.0, 30.0)]
    assert search.best_params_["estimator__lam"] == (1e-3, 1.0, 30.0)[int(np.argmin(oracle))]


def test_stack_tasks_keeps_each_tasks_rows_and_order():
    train, _ = make_lowrank_tasks(n_tasks=5, n_samples=7, n_features=3, rank=2, random_state=0)
    X, y = stack_tasks(train)
    for i in range(5):
        rows = X[:, 0] == i
        assert np.array_equal(X[rows, 1:], train.X[i]) and np.array_equal(y[rows], train.y[i])


def test_search_on_per_task_lists_says_what_to_use():
    train, _ = make_lowrank_tasks(n_tasks=12, n_samples=30, n_features=6, rank=2, random_state=3)
    est = MPMTLLowRank(epsilon=10.0, clip=100.0, iterations=5, noise_source="seeded")
    search = GridSearchCV(est, {"lam": [1e-3, 1.0]}, cv=3, error_score="raise")
    with pytest.raises(Exception, match="StackedTasks") as err:
        search.fit(list(train.X), list(train.y))
    assert "\n" not in str(err.value)
    # rows stacked one task after another: a default fold leaves out whole tasks, and says so
    Xs = np.vstack([np.column_stack([np.full(len(x), i), x]) for i, x in enumerate(train.X)])
    with pytest.raises(Exception, match="stratified on the task column"):
        GridSearchCV(StackedTasks(STLRidge()), {"estimator__lam": [1.0]}, cv=3,
                     error_score="raise").fit(Xs, np.concatenate(train.y))  # fmt: skip
