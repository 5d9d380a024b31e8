"""One MP-MTL experiment run: load (data) → fit (estimator, guarantee) → finish → report.

This is what ``privmtl mpmtl`` and ``privmtl mpmtl-sweep`` call. The data sets and their protocol
are :mod:`privmtl.data.registry`'s (re-exported here: :func:`load_mpmtl_data`,
:func:`data_protocol`, :func:`target_offsets`); the protocol follows the MP-MTL paper (§5):
School uses 30% of each school's students for training, the rest for test; every data point is
scaled to unit ℓ2 norm. The privacy defaults follow DP practice instead of the paper:

* δ = min(1e-5, 1/(100·m)) on every data set (``delta="paper"``: the paper's 1/(m·log m));
* hyper-parameters stay under the guarantee (``tune="covered"``, :data:`TUNE_MODES`): the
  single-task baselines choose their weights per task, on each task's own samples; the private
  methods use public hyper-parameters (their estimators' defaults; the MP-MTL estimators' only
  data-dependent choices are per-task ridge weights, each on the task's own samples); the
  non-private methods (ε = ∞, nothing to cover) keep the k-fold CV over all tasks.
  ``tune="pooled"`` is the paper's protocol: k-fold CV over every task's pooled training data for
  every method, not charged to the budget; its private results then say ``"covered": false``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from privmtl._timing import MPMTL_PHASES, PhaseTimer
from privmtl._validation import check_choice
from privmtl.checkpoint import has_checkpoint
from privmtl.data.multitask import INTERCEPT, MultiTaskDataset
from privmtl.data.registry import (
    MPMTL_SCALINGS as TABLE_SCALINGS,
)
from privmtl.data.registry import (
    PREPROCESSING,
    absolute_data_path,
    data_protocol,
    dataset_names,
    load_mpmtl_data,
    target_offsets,
)
from privmtl.exceptions import InvalidParameterError
from privmtl.experiments.mpmtl_baseline import STL_BASELINE, _stl_baseline
from privmtl.experiments.mpmtl_saved import _jsonable, _save_models, _write_json, evaluate_saved
from privmtl.linear import selection
from privmtl.linear.loading import resolve_linear_method
from privmtl.linear.methods import (
    METHODS,
    PRIVATE_METHODS,
    linear_method,
    method_names,
)
from privmtl.linear.metrics import aauc, nmse
from privmtl.linear.options import MPMTLExecution, MPMTLOptions, split_mpmtl_settings
from privmtl.linear.rows import mpmtl_rows
from privmtl.linear.selection import PerTaskSelected, estimator_class
from privmtl.linear.spec import SPEC, TUNE_MODES, MPMTLSpec, resolve_defaults
from privmtl.locking import holding_directories
from privmtl.per_client import check_rows_path, write_rows
from privmtl.privacy import PrivacyGuarantee
from privmtl.privacy.guarantee import DEFAULT_RELATION
from privmtl.trust import check_signing_key

__all__ = [
    "DATASETS",
    "METHODS",
    "NOT_COVERED_POOLED",
    "PRIVATE_METHODS",
    "STL_BASELINE",
    "TABLE_SCALINGS",
    "TUNE_MODES",
    "TUNING_NOTE",
    "DataRequest",
    "Durability",
    "FinishedRun",
    "FittedRun",
    "LoadedData",
    "data_protocol",
    "estimator_class",
    "evaluate_saved",
    "load_mpmtl_data",
    "run_mpmtl",
    "target_offsets",
]

DATASETS = dataset_names("mpmtl")

TUNING_NOTE = (
    "hyper-parameters tuned by k-fold cross-validation over every task's pooled training data; as "
    "in the MP-MTL paper, tuning is not charged to the privacy budget"
)

#: The not-covered reason of a private result whose hyper-parameters were chosen on pooled data.
NOT_COVERED_POOLED = (
    "hyper-parameters chosen by cross-validation over every task's data (not charged)"
)

_NOTE_PER_TASK = (
    "every task chose its own weight by cross-validation on its own training samples only "
    "(per-task selection, covered)"
)
_NOTE_PUBLIC = (
    "public hyper-parameters (the estimator's defaults, no search over the data); the only "
    "data-dependent choices are every task's ridge weights, each made on the task's own samples "
    "(covered)"
)
_NOTE_NONPRIVATE = (
    "hyper-parameters tuned by k-fold cross-validation over every task's pooled training data; "
    "a non-private method (epsilon = inf): there is no guarantee to cover"
)
_NOTE_UNTUNED = "no tuning (the estimator's defaults)"

SEEDED_NOTE = (
    "seeded noise (--reproducible-noise): anyone who knows the seed can regenerate and subtract "
    "it; for research simulation only, it protects nobody"
)


def _guarantee_of(method: str, est: Any) -> PrivacyGuarantee:
    from dataclasses import replace

    if linear_method(method).isolated:
        return PrivacyGuarantee(
            epsilon=0.0,
            delta=0.0,
            relation=DEFAULT_RELATION,
            sampling="none",
            accountant="none",
            notion="MP-MTL",
            notes=("single-task learning shares nothing: epsilon = 0 towards every other task",),
            noise_source="none",
        )
    g = getattr(est, "privacy_", None)
    if isinstance(g, PrivacyGuarantee):
        if math.isfinite(g.epsilon):
            return g
        # ran without noise: no privacy notion applies
        return replace(g, notion="none", noise_source="none")
    return replace(PrivacyGuarantee.non_private(notion="none", sampling="all"), noise_source="none")


def _tune_mode(tune: bool | str) -> str:
    if isinstance(tune, bool | np.bool_):
        return "covered" if tune else "none"
    return check_choice("tune", tune, TUNE_MODES)


# ------------------------------------------------------------------ the steps of one run


@dataclass(frozen=True)
class DataRequest:
    """The data a run asks for: a registered MP-MTL data set and its options
    (:func:`~privmtl.data.registry.load_mpmtl_data`'s keywords)."""

    data: str
    data_path: str | Path | None = None
    train_fraction: float | None = None
    task_column: str = "task"
    target_column: str = "y"
    normalize: str = "auto"
    feature_columns: Sequence[str] | None = None


@dataclass(frozen=True)
class LoadedData:
    """The (train, test) split of a run, its resolved protocol and every task's intercept."""

    request: DataRequest
    train: MultiTaskDataset
    test: MultiTaskDataset
    scaling: str
    train_fraction: float | None
    offsets: NDArray[np.float64]

    def record(self, seed: int) -> dict[str, Any]:
        """The data section of ``model.json``: enough to rebuild the same test split (``seed``:
        the run's, which drew the split)."""
        req, frac = self.request, self.train_fraction
        table = req.data == "table"
        return {
            "data": req.data,
            "data_path": absolute_data_path("mpmtl", req.data, req.data_path),
            "seed": seed,
            "train_fraction": frac,
            "scaling": self.scaling,
            **(
                {
                    "task_column": req.task_column,
                    "target_column": req.target_column,
                    "feature_columns": [f for f in self.train.feature_names if f != INTERCEPT],
                }
                if table
                else {}
            ),
            "preprocessing": (
                f"{PREPROCESSING[self.scaling]}; each task's rows split "
                f"{frac:g}/{1 - frac:g} train/test by the seed"
                if frac is not None
                else "built-in synthetic generator, train/test drawn from the seed"
            ),
            "task_type": self.train.task_type,
            "target_offsets": self.offsets.tolist(),
            "task_names": list(self.train.task_names),
            "n_tasks": self.train.n_tasks,
            "n_features": self.train.n_features,
        }


@dataclass(frozen=True)
class Durability:
    """What keeps a run across interruptions: the estimator's budget and checkpoint keywords,
    where the tuned hyper-parameters are kept, and whether the run continues an earlier one."""

    runtime: dict[str, Any] = field(default_factory=dict)
    tuning_file: Path | None = None
    resume: bool = False


@dataclass(frozen=True)
class FittedRun:
    """The fitted estimator, its settings (fixed and chosen), how they were chosen, and the
    guarantee of what it released."""

    est: Any
    fixed: dict[str, Any]
    best: dict[str, Any]
    tuned: bool
    note: str
    guarantee: PrivacyGuarantee


@dataclass(frozen=True)
class FinishedRun:
    """The run's output: its output rule, its test metric, and its baseline's keys (every task
    alone: :func:`_stl_baseline`)."""

    final_step: str | None
    metric: str
    value: float
    baseline: dict[str, Any] = field(default_factory=dict)
    pred: list[Any] | None = None
    """The test predictions (scores) of every task, and of every task alone (``stl_pred``)."""
    stl_pred: list[Any] | None = None


def _durability(spec: MPMTLSpec, checkpoint_dir: str | Path | None, resume: bool) -> Durability:
    """Check the budget / checkpoint / resume settings and build the estimator's keywords."""
    runtime: dict[str, Any] = {}
    if spec.budget_epsilon is not None:
        runtime["budget_epsilon"] = spec.budget_epsilon
    if checkpoint_dir is not None:
        runtime.update(
            checkpoint_dir=str(checkpoint_dir),
            checkpoint_every=spec.checkpoint_every,
            resume=bool(resume),
        )
    elif resume:
        raise InvalidParameterError(
            "The 'resume' parameter needs a checkpoint_dir to resume from; got checkpoint_dir=None."
        )
    if runtime and not linear_method(spec.method).protocol:
        raise InvalidParameterError(
            "The checkpoint/budget parameters apply to the MP-MTL methods "
            f"{method_names(protocol=True)}; got method={spec.method!r}."
        )
    tuning_file = None if checkpoint_dir is None else Path(checkpoint_dir) / "tuning.json"
    if checkpoint_dir is not None and not resume:
        if has_checkpoint(checkpoint_dir) or (Path(checkpoint_dir) / "ledger.jsonl").exists():
            raise InvalidParameterError(
                f"The 'checkpoint_dir' {checkpoint_dir} holds a run already; pass resume=True "
                "(--resume) to continue it, or choose a new directory."
            )
    return Durability(runtime=runtime, tuning_file=tuning_file, resume=bool(resume))


def _load(
    spec: MPMTLSpec,
    request: DataRequest,
    split: tuple[MultiTaskDataset, MultiTaskDataset] | None = None,
) -> LoadedData:
    """Load: the (train, test) split (``split``, or the registered data set loaded by the seed),
    its resolved scaling and training fraction, and every task's own intercept."""
    req, unit_norm = request, linear_method(spec.method).unit_norm
    train, test = (
        split
        if split is not None
        else load_mpmtl_data(
            req.data,
            data_path=req.data_path,
            seed=spec.seed,
            train_fraction=req.train_fraction,
            task_column=req.task_column,
            target_column=req.target_column,
            normalize=req.normalize,
            feature_columns=req.feature_columns,
            unit_norm=unit_norm,
        )
    )
    scaling, frac = data_protocol(req.data, req.normalize, req.train_fraction, unit_norm=unit_norm)
    return LoadedData(req, train, test, scaling, frac, target_offsets(train, scaling))


def _fixed_params(
    spec: MPMTLSpec, loaded: LoadedData, search: bool, extra_params: dict[str, Any] | None
) -> dict[str, Any]:
    """The estimator keywords the run fixes: the run settings the method declares
    (:meth:`~privmtl.linear.methods.LinearMethod.estimator_params`; None keeps the estimator's
    default), then the user's extras, each checked to be a parameter of the estimator."""
    cls = linear_method(spec.method)
    resolved = resolve_defaults(spec, loaded.train)
    classification = loaded.train.task_type == "classification"
    run: dict[str, Any] = {
        "epsilon": spec.epsilon,
        "delta": resolved.delta,
        "noise": spec.noise,
        "iterations": spec.iterations,
        "relation": spec.relation,
        "accountant": spec.accountant,
        "random_state": spec.seed,
        "noise_source": spec.noise_source,
        "eigen_floor": spec.eigen_floor,
        "refit_power": spec.refit_power,
        "loss": "logistic" if classification else None,
    }
    extra: dict[str, Any] = {}
    if not search and spec.final_step == "projection" and cls.output_rule:
        extra["refit_lam"] = None  # the paper's projected output (the default is the refit)
    extra.update(extra_params or {})
    return cls.estimator_params(run, extra)


def _search_grid(
    method: str, fixed: dict[str, Any], user_set: tuple[str, ...]
) -> list[dict[str, Any]] | None:
    """The pooled search's grid without the settings the user fixed (None: the default grid)."""
    if not user_set:
        return None
    raw = linear_method(method).grid
    grid = [dict(g) for g in (raw if isinstance(raw, list) else [raw])]
    for sub in grid:
        for key in user_set:
            if key in fixed:
                sub.pop(key, None)
    return [g for g in grid if g]


def _fit(
    spec: MPMTLSpec,
    loaded: LoadedData,
    durability: Durability,
    extra_params: dict[str, Any] | None = None,
    timer: PhaseTimer | None = None,
) -> FittedRun:
    """Fit: choose the hyper-parameters as ``spec.tune`` says, fit the estimator to every task's
    centred targets, and read the guarantee of what it released. ``timer`` (the run's) measures
    the ``setup``, ``tuning`` (a search over a grid) and ``fit`` phases."""
    timer = PhaseTimer(MPMTL_PHASES) if timer is None else timer
    method, tune_mode, seed = spec.method, spec.tune, spec.seed
    cls = linear_method(method)
    search = tune_mode == "pooled" or (tune_mode == "covered" and not (cls.private or cls.isolated))
    with timer.phase("setup"):
        fixed = _fixed_params(spec, loaded, search, extra_params)
    train, offsets = loaded.train, loaded.offsets
    Xs, ys = list(train.X), [y - o for y, o in zip(train.y, offsets, strict=True)]
    tuning_file = durability.tuning_file
    best: dict[str, Any] = {}
    tuned = False
    note = _NOTE_UNTUNED
    est: Any = None
    if tune_mode == "covered" and cls.isolated:
        tuned, note = True, _NOTE_PER_TASK
        if cls.per_task_params is not None:
            best = dict(cls.per_task_params)  # the estimator chooses per task on its own
        else:
            est = PerTaskSelected(
                method=method, loss=fixed.get("loss") or "squared", random_state=seed
            )
    elif tune_mode == "covered" and cls.private:
        note = _NOTE_PUBLIC
    elif search and durability.resume and tuning_file is not None and tuning_file.is_file():
        # the resumed run continues the configuration tuned (and checkpointed) before
        best = json.loads(tuning_file.read_text())["best"]
        tuned = True
    elif search:
        with timer.phase("tuning"):
            # Keep the user's explicit choices out of the search.
            user_set = (
                ("iterations", *(extra_params or {}))
                if spec.iterations is not None or extra_params
                else ()
            )
            grid = _search_grid(method, fixed, user_set)
            if grid is None or grid:
                # Fold splits and per-fold estimator seeds derive from ``seed``.
                search_fixed = {k: v for k, v in fixed.items() if k != "random_state"}
                # through its module: a test replaces it there
                best, _ = selection.tune_method(
                    method,
                    Xs,
                    ys,
                    n_splits=spec.n_splits,
                    random_state=seed,
                    grid=grid,
                    final_step=spec.final_step if cls.output_rule else "auto",
                    **search_fixed,
                )
                tuned = True
                if tuning_file is not None:
                    _write_json(tuning_file, {"method": method, "best": _jsonable(best)})
    if tuned and search:
        note = TUNING_NOTE if tune_mode == "pooled" else _NOTE_NONPRIVATE
    if est is None:
        est = cls.make(**{**fixed, **best, **durability.runtime})
    with timer.phase("fit"):
        est.fit(Xs, ys)
    guarantee = _guarantee_of(method, est)
    if tune_mode == "pooled" and tuned and math.isfinite(guarantee.epsilon):
        guarantee = guarantee.with_not_covered(NOT_COVERED_POOLED)
    return FittedRun(est, fixed, best, tuned, note, guarantee)


def _finish(spec: MPMTLSpec, loaded: LoadedData, fitted: FittedRun) -> FinishedRun:
    """Finish: the output rule the estimator applied, its test predictions (each task's own
    intercept added back) and the test metric (aAUC for classification, nMSE otherwise)."""
    est, train, test = fitted.est, loaded.train, loaded.test
    classification = train.task_type == "classification"
    pred = (
        est.decision_function(list(test.X))
        if classification and hasattr(est, "decision_function")
        else [p + o for p, o in zip(est.predict(list(test.X)), loaded.offsets, strict=True)]
    )
    final_step = (
        ("refit" if est.get_params().get("refit_lam") is not None else "projection")
        if linear_method(spec.method).output_rule
        else None
    )
    baseline = _stl_baseline(loaded, pred, classification)
    alone = baseline.pop("_pred")
    if classification:
        return FinishedRun(final_step, "auc", aauc(list(test.y), pred), baseline, pred, alone)
    return FinishedRun(final_step, "nmse", nmse(list(test.y), pred), baseline, pred, alone)


def _report(
    spec: MPMTLSpec,
    loaded: LoadedData,
    fitted: FittedRun,
    finished: FinishedRun,
    durability: Durability,
) -> dict[str, Any]:
    """Report: the JSON-ready result dictionary of the run (without ``seconds`` and ``phases``)."""
    method, epsilon, est, guarantee = spec.method, spec.epsilon, fitted.est, fitted.guarantee
    private = linear_method(method).private
    train = loaded.train
    out: dict[str, Any] = {
        "method": method,
        "data": loaded.request.data,
        "epsilon": guarantee.epsilon,
        "delta": guarantee.delta,
        "relation": guarantee.relation,
        "sampling": guarantee.sampling,
        "accountant": guarantee.accountant,
        "noise": spec.noise if private and epsilon is not None else None,
        "target_epsilon": epsilon,
        "seed": spec.seed,
        "n_tasks": train.n_tasks,
        "n_features": train.n_features,
        "params": {
            **{k: v for k, v in fitted.fixed.items() if k not in ("random_state", "noise_source")},
            **fitted.best,
        },
        "final_step": finished.final_step,
        "tuned": fitted.tuned,
        "tune": spec.tune,
        "tuning_note": fitted.note,
        "guarantee": guarantee.to_dict(),
        "covered": guarantee.covered,
        "summary": guarantee.describe(),
    }
    floor = getattr(est, "eigen_floor_", None)
    if floor is not None:
        out["eigen_floor"] = floor
    power = getattr(est, "refit_power_", None)
    if power is not None:
        out["refit_power"] = power
    per_task = _per_task_params(est)
    if per_task:
        out["per_task_params"] = per_task
    out.update(_protocol_keys(method, est, spec.noise_source, durability.runtime))
    notes = out["guarantee"]["notes"]
    if private and epsilon is not None and "noise_source" not in est.get_params(deep=False):
        notes.append(
            f"{method} draws its noise from the seed (seeded); secure noise is not implemented "
            "for this baseline: " + SEEDED_NOTE
        )
    out[finished.metric] = finished.value
    out.update(finished.baseline)
    if loaded.train_fraction is not None:
        out["scaling"] = loaded.scaling
        out["train_fraction"] = loaded.train_fraction
        out["preprocessing"] = PREPROCESSING[loaded.scaling]
        if loaded.scaling == "per-task":
            notes.append(
                "features: each task standardized with the mean and standard deviation of its "
                "own training rows (never pooled over tasks), part of its local computation"
            )
        if np.any(loaded.offsets != 0):
            out["target_offsets"] = loaded.offsets.tolist()
            notes.append(
                "targets: each task's intercept is the mean target of its own training rows, "
                "added to its own predictions only (never released to other tasks)"
            )
    return out


@holding_directories("checkpoint_dir", "save_models")
def run_mpmtl(spec: MPMTLSpec | None = None, /, **settings: Any) -> dict[str, Any]:
    """Run one method at one ε and return a JSON-ready result dictionary.

    ``run_mpmtl(data="school", method="lowrank", epsilon=1.0)``, or ``run_mpmtl(spec,
    **settings)`` from an :class:`~privmtl.linear.spec.MPMTLSpec` (``settings`` replace its
    values). Every keyword is a field of one of the run's three typed parts, where its default is
    defined (:data:`~privmtl.linear.options.MPMTL_PARAMETERS`): the spec (method and privacy),
    :class:`~privmtl.linear.options.MPMTLExecution` (``checkpoint_dir``, ``resume``,
    ``save_models``) and :class:`~privmtl.linear.options.MPMTLOptions` (the data,
    ``extra_params``, ``per_client``); an unknown keyword, or no ``data``, is an
    :class:`~privmtl.exceptions.InvalidParameterError`.

    ``method``: a name of :mod:`privmtl.linear.methods` (or a registered own method), a
    :class:`~privmtl.linear.methods.LinearMethod` subclass, or ``PATH.py:NAME`` /
    ``MODULE:NAME`` naming one (loaded, its file's SHA-256 recorded as ``method_source``).

    The run is four steps: load the data (:class:`DataRequest` → :class:`LoadedData`), fit the
    estimator and read its guarantee (:class:`FittedRun`), finish (output rule, test metric:
    :class:`FinishedRun`; the models saved when asked), report (the result dictionary). The
    method and privacy settings are an :class:`~privmtl.linear.spec.MPMTLSpec`.

    ``noise_source`` goes to the estimator and every fit of the cross-validation;
    ``budget_epsilon``, ``checkpoint_dir``, ``checkpoint_every`` and ``resume`` to the final fit of
    an MP-MTL estimator (durable ledger ``checkpoint_dir/ledger.jsonl``; the tuned
    hyper-parameters kept in ``checkpoint_dir/tuning.json`` for a resumed run). ``save_models``
    writes the fitted ``W`` (:mod:`privmtl.linear.saved`); :func:`evaluate_saved` scores it again.

    ``delta``, ``eigen_floor``, ``refit_power``, ``final_step`` and the other method and privacy
    settings mean what :class:`~privmtl.linear.spec.MPMTLSpec` says (δ: None ⇒ min(1e-5,
    1/(100·m)), ``"paper"`` ⇒ 1/(m·log m); ``final_step="auto"``: the refit unless a pooled search
    chooses); the result's keys ``eigen_floor`` and ``refit_power`` describe the floor's vote and
    the power used. ``tune`` (:data:`TUNE_MODES`; ``True`` means ``"covered"``, ``False``
    ``"none"``): see the module docstring; ``"pooled"`` marks every private or single-task result
    ``covered: false`` with :data:`NOT_COVERED_POOLED`.

    ``data`` names a data set of :data:`privmtl.data.registry.REGISTRY` (``"mpmtl"`` family);
    ``normalize``, ``train_fraction``, ``task_column``, ``target_column`` and
    ``feature_columns`` are :func:`~privmtl.data.registry.load_mpmtl_data`'s (School: the paper's
    protocol; a table: per-task standardization and a 70/30 split by default); the result
    reports them under ``"preprocessing"``, ``"train_fraction"`` and ``"scaling"``.

    Keys: ``method, data, epsilon, delta, relation, sampling, accountant, nmse | auc, seconds,
    params, tuned, tune, tuning_note, guarantee, covered, n_tasks, n_features, seed, noise_source,
    stopped_on_budget`` (and ``eigen_floor``, ``refit_power``, ``per_task_params``,
    ``iterations_run``, ``checkpoint_dir``, ``ledger``, ``resumed_from``, ``models_dir``,
    ``method_source`` when they apply) and ``phases``. ``seconds`` is the run's wall time (saving
    included), ``phases`` its seconds by phase (:data:`~privmtl._timing.MPMTL_PHASES`, adding up
    to ``seconds``). ``epsilon`` is what the ledger recorded; ``covered`` is
    ``guarantee["covered"]``; ``noise_source`` is ``"none"`` when the run added no noise.
    """
    given, x, o = split_mpmtl_settings(spec, settings)
    return _run(given, x, o)


def _run(given: dict[str, Any], x: MPMTLExecution, o: MPMTLOptions) -> dict[str, Any]:
    """:func:`run_mpmtl` of its settings split into the three parts."""
    timer = PhaseTimer(MPMTL_PHASES)  # the run's wall time starts here
    method_obj, method_source = resolve_linear_method(given.pop("method", SPEC.method))
    tune = _tune_mode(given.pop("tune", SPEC.tune))
    spec = MPMTLSpec(**given, tune=tune, method=method_obj.name)
    save_models, per_client = x.save_models, o.per_client
    if save_models is not None:  # its model.json is signed: a bad key stops the run now
        check_signing_key()
    if per_client is not None:  # checked before any data is read
        per_client = check_rows_path(per_client)
    with timer.phase("setup"):
        durability = _durability(spec, x.checkpoint_dir, x.resume)
    assert o.data is not None  # split_mpmtl_settings refuses a run without data
    request = DataRequest(
        data=o.data,
        data_path=o.data_path,
        train_fraction=o.train_fraction,
        task_column=o.task_column,
        target_column=o.target_column,
        normalize=o.normalize,
        feature_columns=o.feature_columns,
    )
    with timer.phase("data"):
        loaded = _load(spec, request, o.split)
    fitted = _fit(spec, loaded, durability, o.extra_params, timer=timer)
    with timer.phase("scoring"):
        finished = _finish(spec, loaded, fitted)
    out = _report(spec, loaded, fitted, finished, durability)
    if method_source is not None:  # a user's method: its file and the file's SHA-256
        out["method_source"] = method_source
    rows = _task_rows(spec, loaded, finished) if per_client or save_models else None
    if per_client is not None:
        with timer.phase("saving"):
            out["per_client_file"] = str(write_rows(per_client, rows))
    if save_models is not None:
        with timer.phase("saving"):
            record = loaded.record(spec.seed)
            out["models_dir"] = str(
                _save_models(save_models, fitted.est, out, data=record, rows=rows)
            )
    return timer.record(out)


def _per_task_params(est: Any) -> dict[str, list[Any]]:
    """Every task's own data-dependent choices (each made on the task's own samples)."""
    out: dict[str, list[Any]] = {}
    for attr, key in (("lam_", "lam"), ("init_alpha_", "init_alpha"), ("refit_lam_", "refit_lam")):
        value = getattr(est, attr, None)
        if value is not None and np.ndim(value) == 1:
            out[key] = [float(v) for v in value]
    chosen = getattr(est, "best_params_", None)
    if isinstance(chosen, list):
        for k in sorted({k for c in chosen for k in c}):
            out[k] = [_jsonable(c.get(k)) for c in chosen]
    return out


def _protocol_keys(
    method: str, est: Any, requested: str, runtime: dict[str, Any]
) -> dict[str, Any]:
    """``noise_source``, ``stopped_on_budget`` and the checkpoint/ledger keys of a result."""
    cls = linear_method(method)
    params = est.get_params(deep=False) if hasattr(est, "get_params") else {}
    private = cls.private and params.get("epsilon") is not None
    if not private:
        source = "none"  # the run adds no noise
    elif "noise_source" in params:
        source = getattr(est, "noise_source_", params["noise_source"])
    else:
        source = "seeded"  # these baselines draw their noise from random_state only
    out: dict[str, Any] = {
        "noise_source": source,
        "stopped_on_budget": bool(getattr(est, "stopped_on_budget_", False)),
    }
    if hasattr(est, "n_iter_") and cls.protocol:
        out["iterations_run"] = int(est.n_iter_)
    if "checkpoint_dir" in runtime:
        out["checkpoint_dir"] = runtime["checkpoint_dir"]
        out["ledger"] = str(Path(runtime["checkpoint_dir"]) / "ledger.jsonl")
        out["resumed_from"] = getattr(est, "resumed_from_", None)
    if "budget_epsilon" in runtime:
        out["budget_epsilon"] = runtime["budget_epsilon"]
    return out


def _task_rows(spec: MPMTLSpec, loaded: LoadedData, finished: FinishedRun) -> Any:
    """The run's per-client (per-task) rows (:func:`~privmtl.linear.rows.mpmtl_rows`): every
    task's test score beside its score alone."""
    train, test = loaded.train, loaded.test
    assert finished.pred is not None
    return mpmtl_rows(
        train.task_names, [len(y) for y in train.y], list(test.y), finished.pred, spec.method,
        finished.stl_pred, classification=finished.metric == "auc",
    )  # fmt: skip
