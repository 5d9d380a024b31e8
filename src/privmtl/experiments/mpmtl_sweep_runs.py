"""The runs of an MP-MTL sweep: what every (method, ε, seed) point of
:func:`~privmtl.experiments.mpmtl_sweep.run_mpmtl_sweep` runs and logs, and the public plan of a
covered private point (its candidates, their share of the target, the signal bound).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from privmtl.data.multitask import MultiTaskDataset
from privmtl.data.registry import data_protocol, load_mpmtl_data
from privmtl.experiments.mpmtl import run_mpmtl
from privmtl.experiments.runlog import RunLog
from privmtl.experiments.sweep import apply_selection
from privmtl.experiments.sweep_selection import (
    candidates_accounting,
    ledger_events,
    select_candidates,
)
from privmtl.linear.methods import (
    RELATIVE_KEYS,
    linear_method,
)
from privmtl.linear.metrics import aauc, nmse, per_task_auc, per_task_mse
from privmtl.linear.saved import load_linear_models
from privmtl.linear.selection import expand_grid
from privmtl.linear.spec import SPEC, resolve_defaults
from privmtl.privacy.covariance import plan_covariance_releases, signal_to_noise_bound
from privmtl.privacy.selection import plan_candidates

__all__ = ["MIN_SIGNAL_TO_NOISE", "SweepRuns"]

# The public candidate grids of the private MP-MTL estimators for a covered selection
# (:data:`VOTE_GRIDS`) are declared by the methods
# (:attr:`~privmtl.linear.methods.LinearMethod.vote_grid`). Every candidate of a point is a
# training run: the point's target ε is split between them and the vote
# (:func:`~privmtl.privacy.selection.plan_candidates`), and each is fitted on the tasks' fit
# parts only, so a grid pays only where its candidates differ more than that costs. The
# low-rank and group-sparse grids are the estimator's public defaults alone (one release, the
# local refit, K = 1: a clip below the models' norms, where the release's signal is the largest
# its sensitivity allows, so that no other K does better): the point runs them on the whole
# training split with the whole target, and the low-rank refit's own recorded floor vote
# (:mod:`privmtl.linear.eigen_floor`, ``eigen_floor``) is the private choice inside it. The
# first point of a grid is the one run alone when no vote is held.

#: A candidate is run only when its last covariance release, at its share of the budget, can
#: carry signal: the largest eigenvalue its m clipped models can produce is at least this many
#: times the release's noise edge (:func:`~privmtl.privacy.covariance.signal_to_noise_bound`;
#: public: m, d, K, T and the candidate's ε).
MIN_SIGNAL_TO_NOISE = 1.0

#: Seed stream of the per-task fit/validation split.
_VAL_STREAM = 13

#: The sweep's tables and plot, written into its output folder when every run has finished.
MPMTL_SWEEP_FILES = ("mpmtl_sweep.csv", "mpmtl_sweep.json", "mpmtl_tradeoff.png")

_PRIVACY_KEYS = ("epsilon", "delta", "noise", "relation", "accountant", "random_state")


class SweepRuns:
    """The runs of one MP-MTL sweep: its data splits, the logged runs' keys, and every kind of
    point (pooled, covered by a vote or the tasks' own choice, single-task, defaults alone).

    :func:`~privmtl.experiments.mpmtl_sweep.run_mpmtl_sweep` builds one (loading every split
    once) and hands :meth:`covered_one` or :meth:`pooled_logged` to the sweep runner.
    """

    def __init__(
        self,
        *,
        data: str,
        data_path: Path | None,
        methods: list[str],
        epsilons: list[float],
        seeds: list[int],
        noise: str,
        tune_mode: str,
        out_dir: Path,
        iterations: int | None,
        n_splits: int,
        final_step: str,
        noise_source: str,
        select: str,
        vote_share: float,
        val_fraction: float,
        task_column: str,
        target_column: str,
        feature_columns: list[str] | None,
        normalize: str,
        train_fraction: float | None,
        eigen_floor: float | str,
    ) -> None:
        self.data = data
        self.data_path = data_path
        self.methods = methods
        self.epsilons = epsilons
        self.seeds = seeds
        self.noise = noise
        self.tune_mode = tune_mode
        self.iterations = iterations
        self.n_splits = n_splits
        self.final_step = final_step
        self.noise_source = noise_source
        self.select = select
        self.vote_share = vote_share
        self.val_fraction = val_fraction
        self.eigen_floor = eigen_floor
        self.log = RunLog(out_dir, outputs=MPMTL_SWEEP_FILES)
        self.columns: dict[str, Any] = {}
        if self.data == "table":
            self.columns = {
                "task_column": task_column,
                "target_column": target_column,
                "feature_columns": feature_columns,
            }
        # each method's resolved protocol (dp-aggr keeps unit-norm rows on a table: its proof needs them)
        self.protocols = {
            m: data_protocol(
                self.data, normalize, train_fraction, unit_norm=linear_method(m).unit_norm
            )
            for m in self.methods
        }

        self.splits: dict[tuple[int, Any], Any] = {}
        for seed in self.seeds:
            for m in self.methods:
                if (seed, self.protocols[m]) not in self.splits:
                    self.splits[seed, self.protocols[m]] = load_mpmtl_data(
                        self.data, data_path=self.data_path, seed=seed, **self.data_kwargs(m)
                    )
        self.classification = next(iter(self.splits.values()))[0].task_type == "classification"
        self.metric = "auc" if self.classification else "nmse"
        self.covered_mode = self.select != "pooled" and self.tune_mode != "none"

        self.tuned_once: dict[tuple[str, int], dict[str, Any]] = {}
        self.reference_eps = sorted(self.epsilons)[len(self.epsilons) // 2]
        self.fixed = {
            "sweep": "mpmtl",
            "data": self.data,
            "data_path": None if self.data_path is None else str(self.data_path),
            "noise": self.noise,
            "tune_mode": self.tune_mode
            if self.select == "pooled" or self.tune_mode == "none"
            else None,
            "reference_epsilon": self.reference_eps
            if self.tune_mode == "once" and self.select == "pooled"
            else None,
            "iterations": self.iterations,
            "n_splits": self.n_splits,
            "final_step": self.final_step,
            "noise_source": self.noise_source,
        }
        if (
            self.eigen_floor != SPEC.eigen_floor
        ):  # the default adds no key: earlier logs stay reusable
            self.fixed["eigen_floor"] = self.eigen_floor

        self.plans: dict[tuple[str, float, int], dict[str, Any]] = {}

    def data_kwargs(self, method: str) -> dict[str, Any]:
        if self.data not in ("school", "table"):
            return dict(self.columns)
        scaling, fraction = self.protocols[method]
        return {**self.columns, "normalize": scaling, "train_fraction": fraction}

    def config_keys(self, method: str) -> dict[str, Any]:
        # the resolved protocol identifies logged runs (School's paper protocol adds no key)
        keys = {k: v for k, v in self.columns.items()}
        if self.protocols[method] not in (("unit-norm", 0.3), ("none", None)):
            keys.update(scaling=self.protocols[method][0], train_fraction=self.protocols[method][1])
        return keys

    def config(self, method: str, epsilon: float | None, seed: int) -> dict[str, Any]:
        return {
            **self.fixed,
            **self.config_keys(method),
            "method": method,
            "epsilon": epsilon,
            "seed": seed,
        }

    def common(self, method: str, seed: int, point: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "eigen_floor": _floor_for(method, self.eigen_floor, point or {}),
            "data": self.data,
            "method": method,
            "noise": self.noise,
            "seed": seed,
            "split": self.splits[seed, self.protocols[method]],
            **{k: v for k, v in self.data_kwargs(method).items() if not k.endswith("column")},
            "final_step": self.final_step,
            "n_splits": self.n_splits,
            "noise_source": self.noise_source,
        }

    def pooled_one(self, *, method: str, epsilon: float | None, seed: int) -> dict[str, Any]:
        if self.tune_mode != "once" or epsilon is None:
            return run_mpmtl(
                **self.common(method, seed),
                epsilon=epsilon,
                tune="pooled" if self.tune_mode != "none" else "none",
                iterations=self.iterations,
            )
        key = (method, seed)
        if key not in self.tuned_once:
            ref = self.log.get(self.config(method, self.reference_eps, seed))
            if ref is None:
                ref = run_mpmtl(
                    **self.common(method, seed),
                    epsilon=self.reference_eps,
                    tune="pooled",
                    iterations=self.iterations,
                )
            self.tuned_once[key] = {
                k: v for k, v in ref["params"].items() if k not in _PRIVACY_KEYS
            }
            if epsilon == self.reference_eps:
                return ref
        out = run_mpmtl(
            **self.common(method, seed),
            epsilon=epsilon,
            tune=False,
            extra_params=self.tuned_once[key],
        )
        out["tuned"] = True
        out["tuning_note"] = (
            f"hyper-parameters tuned once by k-fold CV at epsilon={self.reference_eps:g} and reused; "
            "tuning is not charged to the privacy budget (as in the MP-MTL paper)"
        )
        return out

    def pooled_logged(self, *, method: str, epsilon: float | None, seed: int) -> dict[str, Any]:
        cfg = self.config(method, epsilon, seed)
        row = self.log.get(cfg)
        if row is None:
            row = self.log.add(cfg, self.pooled_one(method=method, epsilon=epsilon, seed=seed))
        if not row.get("tuned"):
            sel = {"method": "none", "covered": True, "candidates": 1, "epsilon": row["epsilon"]}
            sel["note"] = "no selection: the estimator's defaults"
            return apply_selection(row, sel)
        return apply_selection(
            row,
            {
                "method": "pooled",
                "covered": False,
                "candidates": None,
                "epsilon": None,
                "reason": (
                    "hyper-parameters chosen by k-fold cross-validation over every task's "
                    "training data (--select pooled): not a recorded release"
                ),
            },
        )

    def candidates_of(self, method: str) -> list[dict[str, Any]]:
        return _candidate_grid(method, self.iterations)

    def plan_of(self, method: str, epsilon: float | None, seed: int) -> dict[str, Any] | None:
        """The private point's public plan (None: nothing to split, e.g. a non-private method)."""
        grid = self.candidates_of(method)
        no_vote_grid = linear_method(method).vote_grid is None
        if epsilon is None or no_vote_grid or not grid or self.noise == "wishart":
            return None
        key = (method, epsilon, seed)
        if key not in self.plans:
            train = self.splits[seed, self.protocols[method]][0]
            self.plans[key] = _plan_point(
                method, epsilon, grid, n_tasks=train.n_tasks, dim=train.n_features,
                vote_share=self.vote_share, vote=self.select == "vote",
            )  # fmt: skip
        return self.plans[key]

    def candidate_cfg(
        self, method: str, epsilon: float | None, seed: int, point: dict[str, Any]
    ) -> dict[str, Any]:
        inputs: dict[str, Any] = {"val_fraction": self.val_fraction, "point": point}
        plan = self.plan_of(method, epsilon, seed)
        if plan is not None:
            if plan["alone"]:
                inputs = {"point": point, "alone": True}
            else:
                inputs["candidate_epsilon"] = plan["budget"]["candidate_epsilon"]
        return {**self.config(method, epsilon, seed), "select_inputs": inputs}

    def runs_of(self, method: str, epsilon: float | None, seed: int) -> list[dict[str, Any]]:
        """The logged runs a covered point needs (its candidates, or the one run alone)."""
        plan = self.plan_of(method, epsilon, seed)
        if linear_method(method).isolated:
            return [self.isolated_cfg(method, seed)]
        points = self.candidates_of(method) if plan is None else plan["points"]
        out = [self.candidate_cfg(method, epsilon, seed, p) for p in points]
        if epsilon is None and len(points) > 1:  # a free refit of every candidate
            out += [self.refit_cfg(method, seed, p) for p in points]
        return out

    def isolated_cfg(self, method: str, seed: int) -> dict[str, Any]:
        return {**self.config(method, None, seed), "tune_mode": "covered"}

    def isolated_logged(self, *, method: str, seed: int) -> dict[str, Any]:
        """A single-task baseline: every task chooses its own weight by cross-validation on its
        own whole training split (the run's covered per-task selection), at ε = 0."""
        cfg = self.isolated_cfg(method, seed)
        row = self.log.get(cfg)
        if row is None:
            row = self.log.add(
                cfg, run_mpmtl(**self.common(method, seed), epsilon=None, tune="covered")
            )
        sel = {
            "method": "client",
            "covered": True,
            "candidates": None,
            "epsilon": row["epsilon"],
            "note": row["tuning_note"],
        }
        return apply_selection(row, sel)

    def refit_cfg(self, method: str, seed: int, point: dict[str, Any]) -> dict[str, Any]:
        return {**self.config(method, None, seed), "select_inputs": {"point": point, "refit": True}}

    def covered_one(self, *, method: str, epsilon: float | None, seed: int) -> dict[str, Any]:
        if linear_method(method).isolated:
            return self.isolated_logged(method=method, seed=seed)
        grid = self.candidates_of(method)
        if not grid or (self.noise == "wishart" and epsilon is not None):
            # nothing accountable to compose (the Wishart ledger records non-private events):
            # the defaults, no selection
            return self.pooled_logged_none(method=method, epsilon=epsilon, seed=seed)
        plan = self.plan_of(method, epsilon, seed)
        if plan is not None and plan["alone"]:
            return self.alone_logged(method=method, epsilon=epsilon, seed=seed, plan=plan)
        points = grid if plan is None else plan["points"]
        eps_run = epsilon if plan is None else plan["budget"]["candidate_epsilon"]
        fit, val = _validation_split(
            self.splits[seed, self.protocols[method]][0], self.val_fraction, seed
        )
        test = self.splits[seed, self.protocols[method]][1]
        cands, cfgs = [], []
        for point in points:
            cfg = self.candidate_cfg(method, epsilon, seed, point)
            row = self.log.get(cfg)
            if row is None:
                row = self.log.add(
                    cfg,
                    _candidate_run(
                        self.common(method, seed, point) | {"split": (fit, test)}, eps_run, point
                    ),
                )
            cands.append(row)
            cfgs.append(cfg)
        if not all(_accountable(c) for c in cands):
            return self.pooled_logged_none(method=method, epsilon=epsilon, seed=seed)
        coefs = [np.asarray(c["coef"], dtype=float) for c in cands]
        # each candidate's per-task intercepts (its fit part's own target means; none: zeros)
        offsets = [np.asarray(c.get("target_offsets") or np.zeros(len(val))) for c in cands]
        scores = _task_val_scores(coefs, val, self.classification, offsets)
        sel = select_candidates(
            select=self.select,
            scores=scores,
            pooled=[None] * len(cands),
            events=[c["release_events"] for c in cands],
            target_epsilon=epsilon,
            **candidates_accounting(cands),
            noise_source=self.noise_source,
            seed=seed,
            vote_share=self.vote_share,
            log=self.log,
            log_key={"sweep": "mpmtl-selection", "candidates": cfgs},
            higher_is_better=self.classification,
            what="the hyper-parameters",
        )  # fmt: skip
        if plan is not None:
            sel["plan"] = _public_plan(plan)
        if epsilon is None and len(cands) > 1:
            # a non-private method (nothing to charge): the chosen configuration is fitted
            # again on the whole training split, free
            whole = self.common(method, seed)
            cands = [
                self.log.get(self.refit_cfg(method, seed, p))
                or self.log.add(self.refit_cfg(method, seed, p), _candidate_run(whole, None, p))
                for p in points
            ]
            coefs = [np.asarray(c["coef"], dtype=float) for c in cands]
            offsets = [np.asarray(c.get("target_offsets") or np.zeros(len(val))) for c in cands]
            sel["note"] += "; the choice refitted on the whole training split (free: ε unchanged)"
        if sel["chosen"] is not None:
            row = dict(cands[sel["chosen"]])
        else:
            row = dict(cands[0])
            row["params"] = None
            row[self.metric] = _per_task_metric(
                coefs, sel["choices"], test, self.classification, offsets
            )
        row = {k: v for k, v in row.items() if k not in ("coef", "release_events")}
        row["target_epsilon"] = epsilon  # the point's target (a candidate ran at its share)
        row["tuned"] = len(cands) > 1
        row["tuning_note"] = sel["note"]
        return apply_selection(row, sel)

    def alone_logged(
        self, *, method: str, epsilon: float | None, seed: int, plan: dict[str, Any]
    ) -> dict[str, Any]:
        """The plan's one candidate, on the whole training split, with the whole target."""
        point = plan["points"][0]
        cfg = self.candidate_cfg(method, epsilon, seed, point)
        row = self.log.get(cfg)
        if row is None:
            row = self.log.add(
                cfg,
                run_mpmtl(**self.common(method, seed, point), epsilon=epsilon, tune=False,
                          extra_params=point),
            )  # fmt: skip
        why = plan["budget"]["vote_reason"]
        if plan["swamped"]:
            why += (
                f"; even alone its release is below the signal bound (ratio "
                f"{plan['signal_to_noise'][0]:.3g} < {MIN_SIGNAL_TO_NOISE:g}): the refit keeps "
                "little more than single-task learning"
            )
        sel = {
            "method": "none",
            "covered": True,
            "candidates": 1,
            "epsilon": row["epsilon"],
            "note": f"no vote ({why}): {_describe(point)} with the whole budget",
            "plan": _public_plan(plan),
        }
        return apply_selection(row, sel)

    def pooled_logged_none(
        self, *, method: str, epsilon: float | None, seed: int
    ) -> dict[str, Any]:
        cfg = {**self.config(method, epsilon, seed), "tune_mode": "none", "select_fallback": True}
        row = self.log.get(cfg)
        if row is None:
            row = self.log.add(
                cfg,
                run_mpmtl(**self.common(method, seed), epsilon=epsilon, tune=False,
                          iterations=self.iterations),
            )  # fmt: skip
        sel = {
            "method": "none",
            "covered": True,
            "candidates": 1,
            "epsilon": row["epsilon"],
            "note": "no selection (no recorded events to compose candidates with): defaults",
        }
        return apply_selection(row, sel)


def _candidate_grid(method: str, iterations: int | None) -> list[dict[str, Any]]:
    """The public candidates of ``method`` for a covered selection ([] when it has none)."""
    cls = linear_method(method)
    if cls.vote_grid is not None:
        points = expand_grid(cls.vote_grid)
    elif cls.private:
        return []  # no ledger of accountable events to compose
    else:
        raw = cls.grid
        if any(k in g for g in raw for k in RELATIVE_KEYS):
            return []
        points = expand_grid(raw) if raw else []
    if iterations is not None and "iterations" in cls.settings:
        # the user's explicit T is kept out of the search
        points = [{**p, "iterations": iterations} for p in points]
        points = list({tuple(sorted(p.items())): p for p in points}.values())
    return points


def _plan_point(
    method: str,
    epsilon: float,
    grid: list[dict[str, Any]],
    *,
    n_tasks: int,
    dim: int,
    vote_share: float,
    vote: bool = True,
) -> dict[str, Any]:
    """Which candidates of a private sweep point run, at which ε, and whether a vote is held.

    Decided before any run from public quantities only (ε, δ, m, d, each candidate's K and T,
    the vote share): the target is split between the candidates and the vote
    (:func:`~privmtl.privacy.selection.plan_candidates`: they compose to the target); a
    candidate whose last release at its share could not carry signal (:data:`MIN_SIGNAL_TO_NOISE`,
    computed for an even split of its releases) is dropped, and the rest are planned again with
    the budget it leaves. Without a vote (one candidate left, or a vote that could not carry
    signal) the first remaining candidate runs alone with the whole target, on the whole
    training split. Returns ``points`` (the candidates run), ``budget``
    (:meth:`~privmtl.privacy.selection.CandidateBudget.to_dict`), ``signal_to_noise`` (of each
    run candidate), ``dropped`` (each with its ratio and the ε it would have had), ``alone``
    and ``swamped`` (a lone candidate below the bound: it is run anyway, the grid's
    public default when every candidate is below).
    """
    delta = float(resolve_defaults(SPEC, n_tasks).delta)  # type: ignore[arg-type]
    acc: dict[str, Any] = {"delta": delta, "accountant": SPEC.accountant, "relation": SPEC.relation}
    defaults = linear_method(method).make().get_params()

    def ratio(point: dict[str, Any], eps: float) -> float:
        p = {**defaults, **point}
        schedule = plan_covariance_releases(
            epsilon=eps, iterations=int(p["iterations"]), clip=float(p["clip"]), dim=dim,
            allocation="power", alpha=0.0, **acc,
        )  # fmt: skip
        return signal_to_noise_bound(schedule, n_tasks)

    kept = list(range(len(grid)))
    dropped: list[dict[str, Any]] = []
    while True:
        budget = plan_candidates(
            len(kept), n_tasks, epsilon=epsilon, share=vote_share, vote=vote, **acc
        )
        run = kept if budget.n_candidates > 1 else kept[:1]
        ratios = {j: ratio(grid[j], budget.candidate_epsilon) for j in run}
        low = [j for j in run if ratios[j] < MIN_SIGNAL_TO_NOISE]
        if len(run) == 1 or not low:
            break
        for j in low if len(low) < len(run) else low[1:]:  # all low: the first may run alone
            dropped.append(
                {"point": grid[j], "signal_to_noise": ratios[j],
                 "candidate_epsilon": budget.candidate_epsilon}
            )  # fmt: skip
            kept.remove(j)
    return {
        "points": [grid[j] for j in run],
        "budget": budget.to_dict(),
        "signal_to_noise": [ratios[j] for j in run],
        "dropped": dropped,
        "alone": len(run) == 1,
        "swamped": len(run) == 1 and ratios[run[0]] < MIN_SIGNAL_TO_NOISE,
        "delta": delta,
    }


def _floor_for(method: str, eigen_floor: float | str, point: dict[str, Any]) -> float | str:
    """The eigenvalue floor a run of ``point`` takes: the sweep's, where a floor acts (the
    low-rank refit with the ``"denoise"`` or ``"clip"`` fix); elsewhere the spec's default, which
    holds no vote and spends nothing there."""
    acts = (
        linear_method(method).floor_vote
        and point.get("eigen_fix", "denoise") in ("denoise", "clip")
        and point.get("refit_lam", "cv") is not None
    )
    return eigen_floor if acts else SPEC.eigen_floor


def _describe(point: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(point.items())) or "the defaults"


def _public_plan(plan: dict[str, Any]) -> dict[str, Any]:
    """The plan as rows state it (every entry a public quantity)."""
    return {
        "candidates": plan["points"],
        "candidate_epsilon": plan["budget"]["candidate_epsilon"],
        "signal_to_noise": plan["signal_to_noise"],
        "min_signal_to_noise": MIN_SIGNAL_TO_NOISE,
        "dropped": plan["dropped"],
        "vote_held": plan["budget"]["vote_held"],
        "vote_reason": plan["budget"]["vote_reason"],
        "swamped": plan["swamped"],
    }


def _validation_split(
    train: MultiTaskDataset, val_fraction: float, seed: int
) -> tuple[MultiTaskDataset, list[tuple[np.ndarray, np.ndarray]]]:
    """Each task's own fit part and validation part.

    Task ``i`` holds out ``floor(val_fraction · n_i + 0.5)`` of its samples (at most
    ``n_i - 1``; none when ``n_i = 1``), drawn from ``default_rng([seed, 13, i])``: a task's
    split depends on its own size only, never on another task's.
    """
    Xf, yf, val = [], [], []
    for i, (Xi, yi) in enumerate(zip(train.X, train.y, strict=True)):
        n = Xi.shape[0]
        k = min(int(np.floor(val_fraction * n + 0.5)), n - 1)
        perm = np.random.default_rng([int(seed), _VAL_STREAM, i]).permutation(n)
        v, f = np.sort(perm[:k]), np.sort(perm[k:])
        Xf.append(Xi[f])
        yf.append(yi[f])
        val.append((Xi[v], yi[v]))
    fit = MultiTaskDataset(
        X=tuple(Xf),
        y=tuple(yf),
        task_names=train.task_names,
        task_type=train.task_type,
        feature_names=train.feature_names,
    )
    return fit, val


def _candidate_run(
    common: dict[str, Any], epsilon: float | None, point: dict[str, Any]
) -> dict[str, Any]:
    """One candidate: the run on the fit parts, its ledger's events and its ``W`` (``coef``)."""
    method = common["method"]
    with tempfile.TemporaryDirectory(prefix="privmtl-candidate-") as tmp:
        t = Path(tmp)
        ckpt: dict[str, Any] = (
            {"checkpoint_dir": t / "run"}
            if linear_method(method).protocol and epsilon is not None
            else {}
        )
        row = run_mpmtl(
            **common, epsilon=epsilon, tune=False, extra_params=point, save_models=t / "m", **ckpt
        )
        events = ledger_events(t / "run" / "ledger.jsonl") if ckpt else []
        _, coef = load_linear_models(t / "m")
    for key in ("checkpoint_dir", "ledger", "models_dir", "resumed_from"):
        row.pop(key, None)
    if row["guarantee"]["epsilon"] is None:  # a non-private method: its releases are exact
        events = [{"type": "non_private"}]
    row["release_events"] = events
    row["coef"] = coef
    return row


def _accountable(row: dict[str, Any]) -> bool:
    """Whether a candidate's ε is the composition of the events it recorded."""
    g = row["guarantee"]
    if g["epsilon"] is None or g["epsilon"] == 0.0:
        return True
    return bool(row["release_events"]) and g["accountant"] in ("rdp", "pld") and g["valid"]


def _task_val_scores(
    coefs: list[np.ndarray],
    val: list[tuple[np.ndarray, np.ndarray]],
    classification: bool,
    offsets: list[np.ndarray],
) -> np.ndarray:
    """(m, K): task ``i``'s validation score of candidate ``j`` with its own column ``w_i``
    and its own intercept ``offsets[j][i]``.

    Mean squared error (regression) or AUC (classification); NaN without validation samples
    (or with one class only).
    """
    m, k = len(val), len(coefs)
    out = np.full((m, k), np.nan)
    has = [i for i, (_, yv) in enumerate(val) if yv.size]
    if not has:
        return out
    for j, W in enumerate(coefs):
        ys = [val[i][1] for i in has]
        preds = [val[i][0] @ W[:, i] + offsets[j][i] for i in has]
        out[has, j] = per_task_auc(ys, preds) if classification else per_task_mse(ys, preds)
    return out


def _per_task_metric(
    coefs: list[np.ndarray],
    choices: np.ndarray,
    test: MultiTaskDataset,
    classification: bool,
    offsets: list[np.ndarray],
) -> float:
    """The sweep metric of the per-task choice: task ``i`` predicts with ``W_{choices[i]}[:, i]``
    plus that candidate's intercept of task ``i``."""
    preds = [test.X[i] @ coefs[int(c)][:, i] + offsets[int(c)][i] for i, c in enumerate(choices)]
    return aauc(list(test.y), preds) if classification else nmse(list(test.y), preds)
