"""The MP-MTL estimators at their defaults, and the per-task selections they rely on."""

from __future__ import annotations

import numpy as np
import pytest

from privmtl.data.synthetic import make_lowrank_tasks
from privmtl.linear.local import RIDGE_GRID, local_ridge, select_ridge_per_task, task_fold_ids
from privmtl.linear.losses import TaskBatch
from privmtl.linear.metrics import nmse
from privmtl.linear.mpmtl import MPMTLGroupSparse, MPMTLLowRank
from privmtl.linear.stl import STLRidge


def _nmse(est, test) -> float:
    # the metric itself, not score(): its sign convention is the estimator API's business
    return float(nmse(list(test.y), est.predict(list(test.X))))


@pytest.fixture(scope="module")
def lowrank_tasks():
    return make_lowrank_tasks(random_state=0)


def test_defaults_beat_stl_defaults_on_the_readme_tasks(lowrank_tasks):
    """MPMTLLowRank(epsilon=10) at its other defaults (secure noise) beats STLRidge at
    its defaults on the README's synthetic tasks — and is a good model, not merely better."""
    train, test = lowrank_tasks
    stl = _nmse(STLRidge().fit(train.X, train.y), test)
    est = MPMTLLowRank(epsilon=10.0).fit(train.X, train.y)
    assert est.noise_source_ == "secure"
    got = _nmse(est, test)
    assert got < stl
    assert got < 0.05  # STL tuned on every task's pooled data: 0.12; non-private trace norm 0.016
    assert est.privacy_.is_private and est.privacy_.covered
    assert est.privacy_.delta == pytest.approx(min(1e-5, 1 / (100 * train.n_tasks)))


def test_defaults_are_good_on_standardized_tasks(lowrank_tasks):
    """Features and targets standardized per task (each task its own statistics): the defaults
    beat every task's own best ridge (leave-one-out) at epsilon = 10, and equal it under pure noise
    up to a margin."""
    train, test = lowrank_tasks
    Xs, ys, Xt, yt = [], [], [], []
    for x, y, x2, y2 in zip(train.X, train.y, test.X, test.y, strict=True):
        mu, sd = x.mean(0), x.std(0)
        Xs.append((x - mu) / sd)
        Xt.append((x2 - mu) / sd)
        ys.append((y - y.mean()) / y.std())
        yt.append((y2 - y.mean()) / y.std())
    batch = TaskBatch.from_tasks(Xs, ys)
    W = local_ridge(batch, "squared", select_ridge_per_task(batch, "squared"))
    stl = nmse(yt, [x @ W[:, i] for i, x in enumerate(Xt)])
    kw = {"noise_source": "seeded", "random_state": 0}
    good = MPMTLLowRank(epsilon=10.0, **kw).fit(Xs, ys)
    assert nmse(yt, good.predict(Xt)) < 0.6 * stl
    noisy = MPMTLLowRank(epsilon=1e-3, **kw).fit(Xs, ys)
    assert nmse(yt, noisy.predict(Xt)) < 1.05 * stl


def test_groupsparse_defaults_give_a_model(lowrank_tasks):
    train, test = lowrank_tasks
    est = MPMTLGroupSparse(epsilon=10.0, noise_source="seeded", random_state=0)
    assert _nmse(est.fit(train.X, train.y), test) < _nmse(STLRidge().fit(train.X, train.y), test)


# ---------------------------------------------------------------- per-task selection, oracles
def _tasks(m=5, d=4, seed=0):
    rng = np.random.default_rng(seed)
    Xs = [rng.standard_normal((8 + 3 * i, d)) for i in range(m)]
    ys = [x @ rng.standard_normal(d) + rng.standard_normal(x.shape[0]) for x in Xs]
    return Xs, ys


def test_leave_one_out_selection_matches_explicit_refits():
    """Independent computation: refit each task's ridge n_i times without one sample."""
    Xs, ys = _tasks()
    grid = (1e-3, 1e-1, 1.0, 10.0)
    A = np.diag([1.0, 0.5, 2.0, 1.0])
    chosen = select_ridge_per_task(TaskBatch.from_tasks(Xs, ys), "squared", A=A, grid=grid)
    for i, (x, y) in enumerate(zip(Xs, ys, strict=True)):
        xa = x @ A
        errs = []
        for rho in grid:
            e = 0.0
            n = len(y)
            for j in range(n):
                keep = np.arange(n) != j
                # the task's ridge without sample j, penalty n*rho*I as in the full fit
                v = np.linalg.solve(
                    xa[keep].T @ xa[keep] + n * rho * np.eye(4), xa[keep].T @ y[keep]
                )
                e += (xa[j] @ v - y[j]) ** 2
            errs.append(e)
        assert chosen[i] == grid[int(np.argmin(errs))]


def test_leave_one_out_residual_formula_uses_the_full_task_weight():
    """The exact identity: e_j/(1-h_jj) is the residual of the fit without j with the SAME
    penalty matrix n*rho*I (not the mean-loss weight of n-1 samples); check it directly."""
    from privmtl.linear.local import _loo_squared

    Xs, ys = _tasks(m=2)
    batch = TaskBatch.from_tasks(Xs, ys)
    got = _loo_squared(batch, 0.3)
    for i, (x, y) in enumerate(zip(Xs, ys, strict=True)):
        n = len(y)
        e = 0.0
        for j in range(n):
            keep = np.arange(n) != j
            w = np.linalg.solve(x[keep].T @ x[keep] + n * 0.3 * np.eye(4), x[keep].T @ y[keep])
            e += (x[j] @ w - y[j]) ** 2
        assert got[i] == pytest.approx(e, rel=1e-9)


def test_leave_one_out_of_a_centred_task_counts_its_intercept():
    """A task centred with its own means (n = d + 1: every row is minus the sum of the others) is
    validated as the ridge with an unpenalized intercept that its centring amounts to: explicit
    refits without each sample, intercept included."""
    from privmtl.linear.local import _loo_squared

    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 4))
    x = x - x.mean(0)
    y = x @ rng.standard_normal(4) + rng.standard_normal(5)
    y = y - y.mean()
    n, rho = 5, 0.05
    e = 0.0
    for j in range(n):
        keep = np.arange(n) != j
        z = np.hstack([x[keep], np.ones((n - 1, 1))])
        P = n * rho * np.diag([1.0, 1.0, 1.0, 1.0, 0.0])
        coef = np.linalg.solve(z.T @ z + P, z.T @ y[keep])
        e += (x[j] @ coef[:4] + coef[4] - y[j]) ** 2
    got = _loo_squared(TaskBatch.from_tasks([x], [y]), rho)
    assert got[0] == pytest.approx(e, rel=1e-8)


def test_each_task_selects_alone():
    """A task's choice and folds do not move when another task's data change (scaled, resized)."""
    Xs, ys = _tasks(m=6)
    a = select_ridge_per_task(TaskBatch.from_tasks(Xs, ys), "squared")
    Xs2, ys2 = [x.copy() for x in Xs], [y.copy() for y in ys]
    Xs2[0], ys2[0] = 100.0 * Xs2[0], -ys2[0]
    b = select_ridge_per_task(TaskBatch.from_tasks(Xs2, ys2), "squared")
    np.testing.assert_array_equal(a[1:], b[1:])
    assert set(a) <= set(RIDGE_GRID)
    # logistic: k folds, each task's folds from its own generator
    rng = np.random.default_rng(1)
    yl = [(rng.random(len(y)) < 0.5).astype(float) for y in ys]
    fa = task_fold_ids(TaskBatch.from_tasks(Xs, yl), 3, seed=5)
    longer = [*Xs[:2], rng.standard_normal((40, 4)), *Xs[3:]]
    fb = task_fold_ids(TaskBatch.from_tasks(longer, [*yl[:2], np.ones(40), *yl[3:]]), 3, seed=5)
    for i in (0, 1, 3, 4, 5):
        n = len(ys[i])
        np.testing.assert_array_equal(fa[i, :n], fb[i, :n])
    la = select_ridge_per_task(TaskBatch.from_tasks(Xs, yl), "logistic", n_splits=3)
    lb = select_ridge_per_task(
        TaskBatch.from_tasks(longer, [*yl[:2], np.ones(40), *yl[3:]]), "logistic", n_splits=3
    )
    np.testing.assert_array_equal(np.delete(la, 2), np.delete(lb, 2))


def test_per_task_weights_are_each_tasks_own_ridge():
    Xs, ys = _tasks()
    batch = TaskBatch.from_tasks(Xs, ys)
    alphas = np.array([1e-3, 1e-2, 1e-1, 1.0, 10.0])
    W = local_ridge(batch, "squared", alphas)
    for i in range(len(Xs)):
        np.testing.assert_allclose(W[:, i], local_ridge(batch, "squared", alphas[i])[:, i])
    with pytest.raises(Exception, match="ridge weight"):
        local_ridge(batch, "squared", np.array([1.0, 0.0, 1.0, 1.0, 1.0]))
