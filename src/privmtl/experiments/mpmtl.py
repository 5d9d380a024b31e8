"""One MP-MTL experiment run (data → optional CV tuning → fit → test metric → guarantee), and ε sweeps.

This is what ``privmtl mpmtl`` and ``privmtl mpmtl-sweep`` call. The protocol follows the MP-MTL paper
(§5): School uses 30% of each school's students for training, the rest for test; every data point is
scaled to unit ℓ2 norm; δ = 1/(m·log m); hyper-parameters are chosen by k-fold cross-validation on
the training split only, and — as in the paper — tuning is *not* charged to the privacy budget.
"""

from __future__ import annotations

import importlib
import inspect
import time
from pathlib import Path
from typing import Any

from privmtl._validation import check_choice, check_int, check_real
from privmtl.data.multitask import MultiTaskDataset
from privmtl.data.readers import load_school, read_table
from privmtl.data.synthetic import make_groupsparse_tasks, make_lowrank_tasks
from privmtl.exceptions import InvalidParameterError
from privmtl.linear.common import default_delta
from privmtl.linear.metrics import aauc, nmse
from privmtl.privacy import PrivacyGuarantee

__all__ = [
    "DATASETS",
    "METHODS",
    "PRIVATE_METHODS",
    "TUNING_NOTE",
    "estimator_class",
    "load_mpmtl_data",
    "run_mpmtl",
]

DATASETS = ("school", "synthetic-lowrank", "synthetic-groupsparse", "table")

#: CLI method name → estimator (``module:Class`` under :mod:`privmtl.linear`, imported on use).
METHODS: dict[str, str] = {
    "lowrank": "mpmtl:MPMTLLowRank",
    "groupsparse": "mpmtl:MPMTLGroupSparse",
    "lowrank-sparse": "mpmtl:MPMTLLowRankSparse",
    "stl-l2": "baselines:STLRidge",
    "stl-l1": "baselines:STLLasso",
    "mtl-trace": "baselines:TraceNormMTL",
    "mtl-l21": "baselines:L21MTL",
    "mtrl": "baselines:MTRL",
    "average": "baselines:ModelAveraging",
    "dp-mtrl": "dp_baselines:DPMTRL",
    "dp-aggr": "dp_baselines:DPAGGR",
}
#: Methods that take (epsilon, delta) and release something about every task.
PRIVATE_METHODS = ("lowrank", "groupsparse", "lowrank-sparse", "dp-mtrl", "dp-aggr")
#: Methods that share nothing between tasks (ε = 0 towards every other task).
ISOLATED_METHODS = ("stl-l2", "stl-l1")

TUNING_NOTE = (
    "hyper-parameters tuned by k-fold cross-validation on the training split; as in the MP-MTL "
    "paper, tuning is not charged to the privacy budget"
)


def load_mpmtl_data(
    data: str,
    *,
    data_path: str | Path | None = None,
    seed: int = 0,
    train_fraction: float = 0.3,
    task_column: str = "task",
    target_column: str = "y",
) -> tuple[MultiTaskDataset, MultiTaskDataset]:
    """(train, test) for a named dataset, with the paper's preprocessing (unit-norm rows)."""
    check_choice("data", data, DATASETS)
    if data == "synthetic-lowrank":
        train, test = make_lowrank_tasks(random_state=seed)
        return train, test
    if data == "synthetic-groupsparse":
        train, test = make_groupsparse_tasks(random_state=seed)
        return train, test
    frac = check_real("train_fraction", train_fraction, low=0.0, high=1.0, closed="neither")
    if data == "school":
        full = load_school(data_path)
    else:
        if data_path is None:
            raise InvalidParameterError(
                "The 'data_path' parameter is required with data='table'; got None."
            )
        full = read_table(data_path, task_column=task_column, target_column=target_column)
    full = full.normalize_rows()
    train, test = full.train_test_split(frac, random_state=seed)
    return train, test


def estimator_class(method: str) -> Any:
    """The estimator class behind a CLI method name."""
    check_choice("method", method, tuple(METHODS))
    module, name = METHODS[method].split(":")
    return getattr(importlib.import_module(f"privmtl.linear.{module}"), name)


def _supported(cls: Any, params: dict[str, Any]) -> dict[str, Any]:
    names = set(inspect.signature(cls.__init__).parameters)
    return {k: v for k, v in params.items() if k in names and v is not None}


def _guarantee_of(method: str, est: Any) -> PrivacyGuarantee:
    if method in ISOLATED_METHODS:
        return PrivacyGuarantee(
            epsilon=0.0,
            delta=0.0,
            relation="add-remove",
            sampling="none",
            accountant="none",
            notion="MP-MTL",
            notes=("single-task learning shares nothing: epsilon = 0 towards every other task",),
        )
    g = getattr(est, "privacy_", None)
    if isinstance(g, PrivacyGuarantee):
        return g
    return PrivacyGuarantee.non_private(notion="MP-MTL", sampling="all")


def run_mpmtl(
    *,
    data: str,
    method: str,
    data_path: str | Path | None = None,
    epsilon: float | None = None,
    delta: float | None = None,
    noise: str = "gaussian",
    iterations: int | None = None,
    seed: int = 0,
    tune: bool = True,
    n_splits: int = 5,
    relation: str = "add-remove",
    accountant: str = "rdp",
    split: tuple[MultiTaskDataset, MultiTaskDataset] | None = None,
    extra_params: dict[str, Any] | None = None,
    final_step: str = "auto",
) -> dict[str, Any]:
    """Run one method at one ε and return a JSON-ready result dictionary.

    ``final_step`` restricts the tuning of the MP-MTL low-rank / group-sparse estimators to the
    paper's projected output (``"projection"``) or the local variational refit (``"refit"``);
    ``"auto"`` lets cross-validation choose (see :func:`privmtl.linear.selection.tune_method`).

    Keys: ``method, data, epsilon, delta, relation, sampling, accountant, nmse | auc, seconds,
    params, tuned, tuning_note, guarantee, n_tasks, n_features, seed``.
    """
    check_choice("method", method, tuple(METHODS))
    check_choice("noise", noise, ("gaussian", "wishart"))
    seed = check_int("seed", seed, low=0)
    check_choice("final_step", final_step, ("auto", "projection", "refit"))
    if epsilon is not None:
        epsilon = check_real("epsilon", epsilon, low=0.0, closed="neither")
        if method not in PRIVATE_METHODS:
            raise InvalidParameterError(
                f"The 'epsilon' parameter applies to the private methods {PRIVATE_METHODS}; "
                f"method={method!r} is a non-private or single-task baseline (omit --epsilon)."
            )
    if iterations is not None:
        iterations = check_int("iterations", iterations, low=1)
    t0 = time.perf_counter()
    train, test = (
        split if split is not None else load_mpmtl_data(data, data_path=data_path, seed=seed)
    )
    dlt = (
        default_delta(train.n_tasks)
        if delta is None
        else check_real("delta", delta, low=0.0, high=1.0, closed="neither")
    )
    cls = estimator_class(method)
    fixed: dict[str, Any] = {
        "epsilon": epsilon,
        "delta": dlt,
        "noise": noise,
        "iterations": iterations,
        "relation": relation,
        "accountant": accountant,
        "random_state": seed,
        "loss": "logistic" if train.task_type == "classification" and method != "dp-mtrl" else None,
    }
    if final_step == "refit" and not tune and method in ("lowrank", "groupsparse"):
        fixed["refit_lam"] = 1e-3  # the default ridge weight (init_alpha's)
    fixed.update(extra_params or {})
    fixed = _supported(cls, fixed)
    Xs, ys = list(train.X), list(train.y)
    best: dict[str, Any] = {}
    tuned = False
    if tune:
        from privmtl.linear.selection import DEFAULT_GRIDS, tune_method

        grid = None
        if iterations is not None or extra_params:
            # Keep the user's explicit choices out of the search.
            raw = DEFAULT_GRIDS.get(method, [])
            grid = [dict(g) for g in (raw if isinstance(raw, list) else [raw])]
            for sub in grid:
                for key in ("iterations", *(extra_params or {})):
                    if key in fixed:
                        sub.pop(key, None)
            grid = [g for g in grid if g]
        if grid is None or grid:
            # Fold splits and per-fold estimator seeds derive from ``seed``.
            search_fixed = {k: v for k, v in fixed.items() if k != "random_state"}
            best, _ = tune_method(
                method,
                Xs,
                ys,
                n_splits=n_splits,
                random_state=seed,
                grid=grid,
                final_step=final_step if method in ("lowrank", "groupsparse") else "auto",
                **search_fixed,
            )
            tuned = True
    est = cls(**{**fixed, **best})
    est.fit(Xs, ys)
    pred = (
        est.decision_function(list(test.X))
        if train.task_type == "classification" and hasattr(est, "decision_function")
        else est.predict(list(test.X))
    )
    guarantee = _guarantee_of(method, est)
    out: dict[str, Any] = {
        "method": method,
        "data": data,
        "epsilon": guarantee.epsilon,
        "delta": guarantee.delta,
        "relation": guarantee.relation,
        "sampling": guarantee.sampling,
        "accountant": guarantee.accountant,
        "noise": noise if method in PRIVATE_METHODS and epsilon is not None else None,
        "target_epsilon": epsilon,
        "seed": seed,
        "n_tasks": train.n_tasks,
        "n_features": train.n_features,
        "params": {**{k: v for k, v in fixed.items() if k != "random_state"}, **best},
        "final_step": (
            ("refit" if est.get_params().get("refit_lam") is not None else "projection")
            if method in ("lowrank", "groupsparse")
            else None
        ),
        "tuned": tuned,
        "tuning_note": TUNING_NOTE if tuned else "no tuning (defaults)",
        "guarantee": guarantee.to_dict(),
        "summary": guarantee.describe(),
    }
    if train.task_type == "classification":
        out["auc"] = aauc(list(test.y), pred)
    else:
        out["nmse"] = nmse(list(test.y), pred)
    out["seconds"] = time.perf_counter() - t0
    return out
