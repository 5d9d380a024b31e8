"""Tests of cross-validated hyper-parameter selection and the default grids."""

from __future__ import annotations

import functools
from typing import ClassVar

import numpy as np
import pytest

from privmtl.exceptions import DataFormatError, InvalidParameterError
from privmtl.linear.selection import (
    DEFAULT_GRIDS,
    METHOD_ESTIMATORS,
    METHODS,
    TUNING_NOT_CHARGED,
    expand_grid,
    make_estimator,
    per_task_folds,
    resolve_grid,
    select_hyperparameters,
    tune_method,
)


def make_tasks(m=5, d=3, n=12, seed=0):
    rng = np.random.default_rng(seed)
    Xs = [rng.standard_normal((n + i, d)) for i in range(m)]
    ys = [x @ rng.standard_normal(d) for x in Xs]
    return Xs, ys


class Dummy:
    """Scores a known function of its parameters; records what it was fitted on."""

    calls: ClassVar[list] = []

    def __init__(self, *, a=0.0, b=0, loss="squared", random_state=None):
        self.a, self.b, self.loss, self.random_state = a, b, loss, random_state

    def get_params(self, deep=False):
        return {"a": self.a, "b": self.b, "loss": self.loss, "random_state": self.random_state}

    def set_params(self, **p):
        for k, v in p.items():
            setattr(self, k, v)
        return self

    def fit(self, Xs, ys):
        Dummy.calls.append((self.a, self.b, self.random_state, [len(y) for y in ys]))
        return self

    def score(self, Xs, ys):
        return (self.a - 0.3) ** 2 + 0.01 * self.b


def test_expand_grid():
    assert expand_grid({"a": [1, 2], "b": ["x"]}) == [{"a": 1, "b": "x"}, {"a": 2, "b": "x"}]
    pts = expand_grid([{"a": [1]}, {"a": [2, 3], "c": [None]}])
    assert pts == [{"a": 1}, {"a": 2, "c": None}, {"a": 3, "c": None}]
    for bad in ({"a": []}, {"a": "abc"}, [], [5]):
        with pytest.raises(InvalidParameterError):
            expand_grid(bad)


def test_selects_the_best_point_in_both_directions():
    Xs, ys = make_tasks()
    Dummy.calls = []
    best, table = select_hyperparameters(
        Dummy, {"a": [0.0, 0.25, 1.0], "b": [0, 1]}, Xs, ys, n_splits=3, random_state=0
    )
    assert best == {"a": 0.25, "b": 0}  # lower is better for the squared loss (nMSE)
    assert table.loc[table["rank"] == 1, "a"].item() == 0.25
    assert sorted(table["rank"]) == list(range(1, 7))
    assert {"mean_score", "std_score", "split0_score", "split2_score", "fit_time"} <= set(table)
    # classification: aAUC, higher is better
    best, _ = select_hyperparameters(
        functools.partial(Dummy, loss="logistic"),
        {"a": [0.0, 0.25, 1.0]},
        Xs,
        ys,
        n_splits=3,
        random_state=0,
    )
    assert best == {"a": 1.0}
    best, _ = select_hyperparameters(
        Dummy, {"a": [0.0, 0.25, 1.0]}, Xs, ys, n_splits=3, random_state=0, greater_is_better=True
    )
    assert best == {"a": 1.0}


def test_common_noise_seed_per_fold_and_training_sizes():
    Xs, ys = make_tasks()
    Dummy.calls = []
    select_hyperparameters(Dummy, {"a": [0.0, 1.0]}, Xs, ys, n_splits=4, random_state=5)
    seeds_a0 = [c[2] for c in Dummy.calls if c[0] == 0.0]
    seeds_a1 = [c[2] for c in Dummy.calls if c[0] == 1.0]
    assert seeds_a0 == seeds_a1 and len(set(seeds_a0)) == 4  # same per fold, different folds
    sizes = [x.shape[0] for x in Xs]
    for call in Dummy.calls:  # every task trains on about (k-1)/k of its samples
        for got, n in zip(call[3], sizes, strict=True):
            assert n - int(np.ceil(n / 4)) <= got <= n - n // 4
    Dummy.calls = []
    select_hyperparameters(Dummy, {"a": [0.0]}, Xs, ys, n_splits=4, random_state=5)
    assert [c[2] for c in Dummy.calls] == seeds_a0  # deterministic


def test_per_task_folds_partition_every_task():
    rng = np.random.default_rng(0)
    folds = per_task_folds([7, 10, 5], 5, rng)
    for f, n in zip(folds, [7, 10, 5], strict=True):
        assert len(f) == 5 and all(len(v) >= 1 for v in f)
        assert sorted(np.concatenate(f).tolist()) == list(range(n))
    with pytest.raises(DataFormatError, match="fewer than n_splits"):
        per_task_folds([7, 3], 5, rng)


def test_failed_points_are_ranked_last():
    Xs, ys = make_tasks()

    class Failing(Dummy):
        def score(self, Xs, ys):
            if self.a > 0.5:
                raise DataFormatError("predictions contain NaN")
            return super().score(Xs, ys)

    with pytest.warns(RuntimeWarning, match="failed"):
        best, table = select_hyperparameters(
            Failing, {"a": [1.0, 0.0]}, Xs, ys, n_splits=2, random_state=0
        )
    assert best == {"a": 0.0}
    assert table.loc[table["a"] == 1.0, "rank"].item() == 2
    with pytest.warns(RuntimeWarning), pytest.raises(DataFormatError, match="every grid point"):
        select_hyperparameters(Failing, {"a": [1.0]}, Xs, ys, n_splits=2, random_state=0)


def test_real_estimator_selection():
    Xs, ys = make_tasks(m=4, d=3, n=15)
    ys = [y + 0.01 * np.random.default_rng(1).standard_normal(y.shape) for y in ys]
    best, table = select_hyperparameters(
        functools.partial(make_estimator, "stl-l2"),
        {"lam": [1e-6, 10.0]},
        Xs,
        ys,
        random_state=0,
    )
    assert best == {"lam": 1e-6}  # nearly noiseless linear data: no shrinkage wins
    assert table["mean_score"].min() < 0.01


def test_default_grids_cover_every_method_with_valid_parameters():
    assert set(DEFAULT_GRIDS) == set(METHODS) == set(METHOD_ESTIMATORS)
    for method in METHODS:
        points = expand_grid(resolve_grid(DEFAULT_GRIDS[method], clip_scale=5.0, init_alpha=1e-3))
        assert 1 <= len(points) <= 330, method
        for point in points[:: max(1, len(points) // 7)]:
            est = make_estimator(method, **point)
            assert set(point) <= set(est.get_params()), method
    with pytest.raises(InvalidParameterError, match="method"):
        make_estimator("lasso")


def test_private_grid_fits_and_tuning_note():
    Xs, ys = make_tasks(m=6, d=3, n=10)
    grid = resolve_grid(DEFAULT_GRIDS["lowrank"][:2], clip_scale=3.0, init_alpha=1e-3)
    grid = [dict(p, iterations=[2]) for p in grid[:2]]
    best, table = select_hyperparameters(
        functools.partial(make_estimator, "lowrank", epsilon=1.0),
        grid,
        Xs,
        ys,
        n_splits=2,
        random_state=0,
    )
    assert set(best) >= {"clip", "lam", "iterations"}
    assert np.isfinite(table["mean_score"]).all()
    assert "NOT charged" in TUNING_NOT_CHARGED


def test_resolve_grid_and_relative_keys_guard():
    template = [
        {"clip_factor": [1.0, 2.0], "lam_per_clip": [0.1], "init_alpha": ["stl-l2"], "x": [1]},
        {"lam": [3.0]},
    ]
    out = resolve_grid(template, clip_scale=10.0, init_alpha=0.5)
    assert out == [
        {"init_alpha": [0.5], "x": [1], "clip": [10.0], "lam": [1.0]},
        {"init_alpha": [0.5], "x": [1], "clip": [20.0], "lam": [2.0]},
        {"lam": [3.0]},
    ]
    Xs, ys = make_tasks()
    with pytest.raises(InvalidParameterError, match="tune_method"):
        select_hyperparameters(Dummy, {"clip_factor": [1.0]}, Xs, ys, n_splits=2)
    with pytest.raises(InvalidParameterError, match="clip_scale"):
        resolve_grid(template, clip_scale=0.0, init_alpha=0.5)


def test_tune_method_two_stage_for_mpmtl():
    from privmtl.linear.stl import STLRidge

    Xs, ys = make_tasks(m=6, d=3, n=12)
    small = [
        {
            "clip_factor": [1.0, 2.0],
            "lam_per_clip": [1e-3],
            "iterations": [1, 2],
            "init": ["stl"],
            "init_alpha": ["stl-l2"],
        }
    ]
    best, table = tune_method("lowrank", Xs, ys, grid=small, random_state=0, epsilon=1.0)
    stl_best, _ = tune_method("stl-l2", Xs, ys, random_state=0)
    assert table.attrs["stl_lam"] == best["init_alpha"] == stl_best["lam"]
    W = STLRidge(lam=stl_best["lam"]).fit(Xs, ys).coef_
    scale = float(np.median(np.linalg.norm(W, axis=0)))
    assert table.attrs["clip_scale"] == pytest.approx(scale)
    assert best["clip"] / scale in (pytest.approx(1.0), pytest.approx(2.0))
    assert len(table) == 4
    # non-MP-MTL methods use their grid directly
    best, table = tune_method("dp-aggr", Xs, ys, random_state=0, epsilon=1.0)
    assert set(best) == {"lam"} and len(table) == len(DEFAULT_GRIDS["dp-aggr"][0]["lam"])
    with pytest.raises(InvalidParameterError, match="method"):
        tune_method("nope", Xs, ys)


def test_final_step_restricts_the_search_to_one_output_rule():
    Xs, ys = make_tasks(m=6, d=3, n=12)
    proj = [{"clip_factor": [1.0], "lam_per_clip": [1e-3], "iterations": [1], "init": ["stl"],
             "init_alpha": ["stl-l2"]}]  # fmt: skip
    refit = [{**proj[0], "refit_lam_per_stl": [1.0, 10.0]}]
    grid = proj + refit
    best, table = tune_method("lowrank", Xs, ys, grid=grid, final_step="refit", random_state=0)
    assert len(table) == 2 and best["refit_lam"] in (
        pytest.approx(table.attrs["stl_lam"]),
        pytest.approx(10 * table.attrs["stl_lam"]),
    )
    best, table = tune_method("lowrank", Xs, ys, grid=grid, final_step="projection", random_state=0)
    assert len(table) == 1 and "refit_lam" not in best
    _, table = tune_method("lowrank", Xs, ys, grid=grid, random_state=0)
    assert len(table) == 3
    with pytest.raises(InvalidParameterError, match="final_step"):
        tune_method("lowrank", Xs, ys, grid=grid, final_step="both")
    with pytest.raises(InvalidParameterError, match="final_step"):
        tune_method("lowrank", Xs, ys, grid=proj, final_step="refit")
