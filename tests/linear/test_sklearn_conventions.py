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
