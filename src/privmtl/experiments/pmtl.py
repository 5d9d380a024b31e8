"""One PMTL-family federated run: load (data, model, method) → train → finish → report.

This is what ``privmtl pmtl`` and ``privmtl pmtl-sweep`` call. Each step is a function of small
frozen dataclasses (:class:`DataRequest`, :class:`FinishRequest`, :class:`Durability` →
:class:`LoadedRun` → :class:`TrainedRun` → :class:`FinishedRun` → the result dictionary, assembled
by :mod:`privmtl.federated.report`, which Flower's ServerApp uses too). Privacy is client-level: the server's
released sequence (noisy mean of clipped updates, the billboard) is accounted by the ledger of the
training engine with the sampler it actually used; personalized models and local fine-tuning are
post-processing and keep the guarantee (billboard privacy ⇒ joint DP).

Every default output is covered by the reported guarantee: a client's models and numbers depend
on the other clients only through the recorded releases. Choices are made by each client on its
own validation split (``finetune="auto"``, ``local_select="client"``, ``finetune_select="client"``).
The opt-ins that break this — a choice on pooled validation data (``local_select="pooled"``,
``finetune_select="pooled"``) and the curator's diagnostics computed from un-noised updates
(``diagnostics=True``) — are listed in the guarantee's ``not_covered`` and make ``covered`` false.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from privmtl._device import DEFAULT_DEVICE, resolve_device
from privmtl._timing import PMTL_PHASES, PhaseTimer
from privmtl._validation import check_choice, check_int
from privmtl.data.federated import FederatedDataset
from privmtl.data.registry import (
    absolute_data_path,
    dataset_names,
    default_femnist_dir,
    load_federated,
)
from privmtl.exceptions import DataFormatError, InvalidParameterError, PrivacyBudgetError
from privmtl.federated.algorithms import Params
from privmtl.federated.config import TrainResult, resolve
from privmtl.federated.finetune import FINETUNE_METHODS
from privmtl.federated.finetune_selection import SELECT_MODES
from privmtl.federated.finish import (
    AUTO_CANDIDATES,
    AUTO_CLEAR_SIGNAL,
    AUTO_FINETUNE_EPOCHS,
    AUTO_FINETUNE_LRS,
    AUTO_NOTE,
    AUTO_ORDERS,
    FINETUNE_NOTE,
    FINETUNE_SELECT_CHOICES,
    FINETUNE_VOTE_ID,
    FINETUNE_VOTE_NOTE,
    FINETUNE_VOTE_SHARE,
    FINETUNE_VOTE_STREAM,
    FINETUNE_VOTERS,
    FINETUNE_VOTERS_STREAM,
    auto_info,
    auto_plan,
    final_models_keys,
    finish_clients,
    resolve_finetune_select,
    resolve_local_solver,
    stack_trained,
)
from privmtl.federated.local import LOCAL_SELECT, LOCAL_SOLVER_CHOICES
from privmtl.federated.methods import Method, get_method, method_class
from privmtl.federated.methods.loading import resolve_method
from privmtl.federated.models import MODELS, MultinomialLogReg, make_model
from privmtl.federated.options import RunOptions, split_settings
from privmtl.federated.report import (
    DIAGNOSTICS_NOT_COVERED,
    FINETUNE_SELECT_POOLED,
    LOCAL_SELECT_CLIENT_NOTE,
    LOCAL_SELECT_POOLED,
    curator_diagnostics,
    finish_guarantee,
    joint_dp,
    local_selection_summary,
    released_dim,
    result_parts,
    scaling_note,
)
from privmtl.federated.spec import (
    DEFAULT_CLIENTS_PER_ROUND,
    DEFAULT_FEDPROX_MU,
    DEFAULT_LAM_NONPRIVATE,
    DEFAULT_LAM_PRIVATE,
    EXECUTION,
    RUN_METHODS,
    SPEC,
    Execution,
    RunSpec,
    check_resume,
    check_vote_mechanism,
    default_clients_per_round,
    default_lam,
    pmtl_delta,
)
from privmtl.locking import holding_directories
from privmtl.privacy.ledger import PrivacyLedger
from privmtl.privacy.noise import make_noise_source
from privmtl.privacy.selection import VotePlan, plan_vote

if TYPE_CHECKING:
    import pandas as pd

    from privmtl.federated.user_model import UserFactory

__all__ = [
    "AUTO_CANDIDATES",
    "AUTO_CLEAR_SIGNAL",
    "AUTO_FINETUNE_EPOCHS",
    "AUTO_FINETUNE_LRS",
    "AUTO_ORDERS",
    "DEFAULT_CLIENTS_PER_ROUND",
    "DEFAULT_FEDPROX_MU",
    "DEFAULT_LAM_NONPRIVATE",
    "DEFAULT_LAM_PRIVATE",
    "FINETUNE_STARTS",
    "FL_DATASETS",
    "FL_METHODS",
    "FL_MODELS",
    "NO_RELEASE_METHODS",
    "DataRequest",
    "Durability",
    "FinishRequest",
    "FinishedRun",
    "LoadedRun",
    "TrainedRun",
    "default_clients_per_round",
    "default_femnist_dir",
    "default_lam",
    "evaluate_saved",
    "load_federated",
    "make_model",
    "run_pmtl",
]

FL_DATASETS = dataset_names("pmtl")
FL_MODELS = MODELS
FL_METHODS = RUN_METHODS
NO_RELEASE_METHODS = tuple(n for n in RUN_METHODS if not method_class(n).communicates)
"""The methods that train every client alone: nothing is released, there is no shared model."""
FINETUNE_STARTS = ("auto", "billboard")
"""Where fine-tuning starts: the personalized models when the method has them, else the released
global model (auto), or the released global model (billboard)."""


def _absolute_data_path(data: str, data_path: str | Path | None) -> str | None:
    """The data's absolute path, so that saved models can be evaluated from anywhere."""
    return absolute_data_path("pmtl", data, data_path)


# ------------------------------------------------------------------ the steps of one run


@dataclass(frozen=True)
class DataRequest:
    """The data and model a run asks for: a registered PMTL data set with
    :func:`~privmtl.data.registry.load_federated`'s options (``table``: a table's
    ``client_column``, ``label_column`` and ``feature_columns``) and the model's name or factory."""

    data: str
    data_path: str | Path | None
    model: str
    table: dict[str, Any]
    num_clients: int | None
    scaling: str

    def record(self) -> dict[str, Any]:
        """The data section of ``model.json`` (the saver adds the seed): enough to load the same
        data again from anywhere."""
        table = self.data == "table"
        return {
            "data": self.data,
            "data_path": _absolute_data_path(self.data, self.data_path),
            **(self.table if table else {}),
            **({"scaling": self.scaling} if table else {}),
            "num_clients": self.num_clients,
        }


@dataclass(frozen=True)
class FinishRequest:
    """How the run ends after training, checked by :func:`_finish_request`: fine-tuning's epochs
    (a grid only from the billboard), its grids of step sizes and penalty weights (None: the
    run's), where it starts, how the grid is chosen, and the extra variants scored beside it."""

    epochs: tuple[int, ...]
    lrs: tuple[float, ...] | None
    lams: tuple[float, ...] | None
    start: str
    select: str
    extra: tuple[str, ...]


@dataclass(frozen=True)
class Durability:
    """What keeps a run across interruptions, passed to the method's ``fit``: the checkpoint
    folder and cadence, whether the run continues an earlier one, and the ε budget it stops at."""

    checkpoint_dir: str | Path | None
    checkpoint_every: int
    resume: bool
    budget_epsilon: float | None

    def run_options(self) -> dict[str, Any]:
        """The backend's run keywords (a spent budget stops the run)."""
        return {
            "checkpoint_dir": self.checkpoint_dir,
            "checkpoint_every": self.checkpoint_every,
            "resume": self.resume,
            "budget_epsilon": self.budget_epsilon,
            "on_budget": "stop",
        }


@dataclass(frozen=True)
class LoadedRun:
    """Load's output: the checked settings and the ones resolved on the data, the data, the model,
    and the method bound to the calibrated engine configuration (the target ε already σ)."""

    spec: RunSpec
    resolved: RunSpec
    request: DataRequest
    dataset: FederatedDataset
    net: torch.nn.Module
    method: Method
    name: str
    method_source: dict[str, Any] | None
    factory: UserFactory | None
    notes: tuple[str, ...]
    seconds: float
    """The seconds of loading or generating the data (the run's ``data`` phase)."""
    vote: VotePlan | None = None
    """``finetune_select="vote"``: the end-of-run vote's public plan (its event is reserved in the
    calibration of the rounds when it is held)."""

    @property
    def m(self) -> int:
        """The number of clients."""
        return self.dataset.n_clients

    @property
    def q(self) -> int:
        """The clients per round, as resolved on the data."""
        return int(self.resolved.clients_per_round or self.m)

    @property
    def lam(self) -> float:
        """λ, as resolved on the data."""
        return float(self.resolved.lam or 0.0)


@dataclass(frozen=True)
class TrainedRun:
    """Train's output: the engine's result, the noise of the released mean and the clients per
    round as reported (0 and m when nothing is released), and how local training chose."""

    result: TrainResult
    sigma: float
    q: int
    local_select: str
    local_solver: str = "sgd"
    local_patience: int | None = None


@dataclass(frozen=True)
class FinishedRun:
    """Finish's output: the keys fine-tuning sets (``parts``; the trained run's accuracies are
    replaced by the fine-tuned ones), the extra variants' results, the clients' final models
    (None: the trained ones), the final-model keys, and what the guarantee adds: notes, reasons
    not covered, and whether every client's model now reads its own data (joint DP)."""

    parts: dict[str, Any]
    finetune_results: dict[str, dict[str, Any]] | None
    params: Params | None
    final_models: dict[str, Any]
    notes: tuple[str, ...]
    not_covered: tuple[str, ...]
    own_data: bool
    score_seconds: float = 0.0
    per_client: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
    kept: np.ndarray | None = None
    """``finetune="auto"``: the candidate every client kept (its name), in the clients' order."""


def _finish_request(
    finetune: str,
    *,
    epochs: int | Sequence[int],
    lrs: Sequence[float] | None,
    lams: Sequence[float] | None,
    start: str,
    select: str,
    extra: Sequence[str],
) -> FinishRequest:
    """Check the fine-tuning settings against ``finetune`` (the run spec's) before any data is
    read; the parameters are ``run_pmtl``'s ``finetune_*`` and ``extra_finetunes``."""
    check_choice("finetune_start", start, FINETUNE_STARTS)
    check_choice("finetune_select", select, (*SELECT_MODES, *FINETUNE_SELECT_CHOICES))
    if select == "auto" and finetune != "auto":
        select = "client"  # an explicit fine-tuning's own grid: every client chooses
    if select == "vote" and finetune != "auto":
        raise InvalidParameterError(
            "finetune_select='vote' elects one candidate of finetune='auto' for every client; "
            f"got finetune={finetune!r}."
        )
    if finetune == "auto":
        fixed = {
            "finetune_epochs": (epochs, 1),
            "finetune_lrs": (lrs, None),
            "finetune_lams": (lams, None),
            "finetune_start": (start, "auto"),
            "finetune_select": (select, select if select in FINETUNE_SELECT_CHOICES else "client"),
        }
        for name, (value, default) in fixed.items():
            if value != default:
                raise InvalidParameterError(
                    f"finetune='auto' chooses its own grid and start; the '{name}' parameter "
                    f"needs an explicit finetune method (e.g. 'vanilla'); got {name}={value!r}."
                )
    grid = _epochs_grid(epochs)
    if start != "billboard" and (len(grid) > 1 or select == "pooled"):
        raise InvalidParameterError(
            "A grid of 'finetune_epochs' and finetune_select='pooled' need "
            f"finetune_start='billboard'; got finetune_start={start!r}, "
            f"finetune_epochs={epochs!r}, finetune_select={select!r}."
        )
    if start == "billboard" and (finetune not in ("none", "vanilla") or extra):
        raise InvalidParameterError(
            "finetune_start='billboard' supports finetune='vanilla' only (fine-tuning from the "
            f"billboard, no penalty); got finetune={finetune!r}, "
            f"extra_finetunes={list(extra)!r}."
        )
    for name in extra:
        check_choice("extra_finetunes", name, FINETUNE_METHODS)
    return FinishRequest(
        epochs=tuple(grid),
        lrs=None if lrs is None else tuple(lrs),
        lams=None if lams is None else tuple(lams),
        start=start,
        select=select,
        extra=tuple(extra),
    )


def _load(
    spec: RunSpec,
    method: str | type[Method] | Method,
    request: DataRequest,
    *,
    method_source: dict[str, Any] | None,
    dataset: FederatedDataset | None,
    batched: bool,
    progress: bool,
    threads: int,
    timer: PhaseTimer | None = None,
    device: str = DEFAULT_DEVICE,
    finetune_select: str = "client",
    eval_every: int = EXECUTION.eval_every,
) -> LoadedRun:
    """Load: the user's model factory (before any data is read), the data (``dataset``, or the
    registered data set loaded by the seed), the settings resolved on it, the model, and the
    method bound to the engine configuration with the target ε calibrated to σ once (with
    ``finetune_select="vote"``, the vote's event reserved: :func:`_vote_plan`). ``timer``
    (the run's) measures the ``data`` and ``setup`` phases."""
    from privmtl.federated.user_model import is_factory_spec, load_factory

    timer = PhaseTimer(PMTL_PHASES) if timer is None else timer
    model = request.model
    with timer.phase("setup"):
        factory = load_factory(model) if is_factory_spec(model) else None
    with timer.phase("data"):
        ds = (
            dataset
            if dataset is not None
            else load_federated(
                request.data,
                data_path=request.data_path,
                seed=spec.seed,
                **request.table,
                num_clients=request.num_clients,
                scaling=request.scaling,
            )
        )
    with timer.phase("setup"):
        m = ds.n_clients
        net = make_model(model, ds, spec.seed, factory=factory)
        on = str(resolve_device(device))  # "auto" becomes the device the run computes on
        vote = None
        declared = method_class(method) if isinstance(method, str) else method
        samples = declared.communicates and not declared.every_client
        select = resolve_finetune_select(
            finetune_select, net, finetune=spec.finetune, samples=samples,
            noise_mechanism=spec.noise_mechanism, epsilon=spec.epsilon,
        )  # fmt: skip
        if select == "vote" and samples:
            vote = _vote_plan(spec, m)
            if finetune_select == "auto" and not vote.held:
                vote = None  # the default without a vote: every client's own choice, as asked
        # the one resolution of the run: q, λ, δ, and the target ε calibrated to the release's σ
        execution = {"batched": batched, "progress": progress, "threads": threads, "device": on}
        execution["eval_every"] = eval_every
        run = resolve(
            spec, m, method=method, reserve=None if vote is None else vote.event(),
            execution=execution,
        )  # fmt: skip
        resolved = run.spec
        assert resolved is not None  # resolved from a RunSpec
        runner = get_method(method, run.config).with_run(run)  # bound to the calibrated noise
    if runner.models is not None and model not in runner.models:
        raise InvalidParameterError(
            f"The 'method' parameter {spec.method!r} supports --model "
            f"{', '.join(runner.models)} only; got model={model!r}."
        )
    return LoadedRun(
        spec=spec,
        resolved=resolved,
        request=request,
        dataset=ds,
        net=net,
        method=runner,
        name=spec.method,
        method_source=method_source,
        factory=factory,
        notes=run.notes,
        seconds=timer.seconds("data"),
        vote=vote,
    )


def _vote_plan(spec: RunSpec, m: int) -> VotePlan:
    """The public plan of the end-of-run vote (:func:`~privmtl.privacy.selection.plan_vote`):
    :data:`~privmtl.federated.finish.FINETUNE_VOTE_SHARE` of the target ε, among the ``m``
    clients or, in a larger population, the expected
    :data:`~privmtl.federated.finish.FINETUNE_VOTERS` of them
    (:func:`~privmtl.federated.finish.vote_voters`); a private run needs a target ε (its share
    is of that target)."""
    if spec.epsilon is None and spec.noise_std:
        raise InvalidParameterError(
            "finetune_select='vote' takes its share of a target 'epsilon'; got noise_std="
            f"{spec.noise_std!r} without epsilon."
        )
    delta = pmtl_delta(spec.delta, m)[0]
    return plan_vote(
        min(m, FINETUNE_VOTERS), epsilon=spec.epsilon, delta=delta, share=FINETUNE_VOTE_SHARE,
        accountant=spec.accountant, relation=spec.relation,
    )  # fmt: skip


def _scores_at_finish(loaded: LoadedRun, request: FinishRequest) -> bool:
    """Whether the end of run scores the trained models while it finishes the clients (one pass
    over the clients' data instead of two): ``finetune="auto"`` of a method the in-process
    engine runs as it is (:meth:`Method.fit <privmtl.federated.methods.base.Method.fit>`)."""
    runner = loaded.method
    return (
        loaded.spec.finetune == "auto"
        and not runner.every_client
        and not request.extra
        and type(runner).fit is Method.fit
    )


def _train(
    loaded: LoadedRun,
    durability: Durability,
    local_select: str,
    local_solver: str = "sgd",
    local_patience: int | None = None,
    *,
    score: bool = True,
) -> TrainedRun:
    """Train: the method's ``fit`` with the run's checkpoint and budget; a method that releases
    nothing reports no noise and every client. ``score=False``: the trained models' scores are
    left to the end of run (:func:`_scores_at_finish`)."""
    runner = loaded.method
    options = {
        "local_select": local_select,
        "local_solver": local_solver,
        "local_patience": local_patience,
    }
    result = runner.fit(
        loaded.dataset,
        loaded.net,
        **{k: options[k] for k in runner.fit_options},
        **durability.run_options(),
        **({} if score else {"score_at_end": False}),
    )
    if runner.every_client:  # nothing released: no noise, every client trains
        return TrainedRun(result, 0.0, loaded.m, local_select, local_solver, local_patience)
    sigma = runner.config.noise_std
    return TrainedRun(result, sigma, loaded.q, local_select, local_solver, local_patience)


def _finish(loaded: LoadedRun, trained: TrainedRun, request: FinishRequest) -> FinishedRun:
    """Finish: the extra fine-tuning variants, then the run's end (``finetune``: the clients'
    automatic choice, fine-tuning from their models or from the billboard, or none) and the keys
    describing the final models. Everything here is post-processing of the releases."""
    spec, result, ds, net = loaded.spec, trained.result, loaded.dataset, loaded.net
    seed, lr, batch_size, lam = spec.seed, spec.lr, spec.batch_size, loaded.lam
    grid = None
    if request.lrs is not None or request.lams is not None:
        grid = (
            [float(v) for v in (request.lrs if request.lrs is not None else [lr])],
            [float(v) for v in (request.lams if request.lams is not None else [lam])],
        )
    results = None
    score_seconds = 0.0
    if request.extra:
        # Several fine-tuning variants of the SAME trained run (post-processing, no privacy cost):
        # cheaper and a fairer comparison than one training run per variant.
        results = {
            name: _finetune(
                result, ds, net, name, request.epochs[0], lr, batch_size, lam, seed, grid
            )
            for name in request.extra
        }
        for res in results.values():
            res.pop("_params")
    parts: dict[str, Any] = {}
    params = None
    per_client = None
    kept = None
    notes: tuple[str, ...] = ()
    not_covered: tuple[str, ...] = ()
    own_data = False
    finetune = spec.finetune
    if finetune == "auto" and not loaded.method.every_client:
        sigma = float(trained.sigma or 0.0)
        parts = _finetune_auto(
            result, ds, net, loaded.name, sigma, batch_size, seed, trained.local_solver,
            trained.local_patience, score_trained=_scores_at_finish(loaded, request),
            vote=loaded.vote,
        )  # fmt: skip
        params = parts.pop("_params")
        score_seconds = float(parts.pop("_score_seconds"))
        per_client = parts.pop("_per_client")
        kept = parts.pop("_kept")
        held = parts["finetune_auto"]["select"] == "vote"
        notes, own_data = (FINETUNE_VOTE_NOTE if held else AUTO_NOTE,), True
    elif finetune == "auto":
        parts = {
            "finetune": "auto",
            "finetune_auto": {
                "select": "client",
                "rule": "local-all: every client's model is already its own local training",
                "clients_per_candidate": {"trained": loaded.m},
            },
        }
    elif finetune != "none":
        parts = (
            _finetune_from_billboard(
                result, ds, net, request.epochs, grid[0] if grid else [lr], batch_size, seed,
                request.select,
            )
            if request.start == "billboard"
            else _finetune(
                result, ds, net, finetune, request.epochs[0], lr, batch_size, lam, seed, grid
            )
        )  # fmt: skip
        params = parts.pop("_params")
        if request.start == "billboard" and request.select == "pooled":
            not_covered = (FINETUNE_SELECT_POOLED,)
        own_data = True  # each client's fine-tuned model reads its own data
    final = final_models_keys(
        str(parts.get("finetune") or "none"),
        loaded.m,
        auto=parts.get("finetune_auto"),
        from_billboard=request.start == "billboard",
        personalized=result.primary == "personalized",
    )
    return FinishedRun(
        parts, results, params, final, notes, not_covered, own_data, score_seconds, per_client,
        kept,
    )  # fmt: skip


def _final_params(trained: TrainedRun, finished: FinishedRun) -> tuple[Params, bool]:
    """Every client's final model: the finished (fine-tuned) ones, the trained personalized ones,
    or the released global model; and whether they are stacked per client."""
    result = trained.result
    if finished.params is not None:
        return finished.params, True
    if result.primary == "personalized" and result.personalized_params is not None:
        return result.personalized_params, True
    return result.global_params, False


Scored = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""The baseline's clients and their correct test predictions (final, local) and test examples."""


def _baseline(
    loaded: LoadedRun, trained: TrainedRun, finished: FinishedRun
) -> tuple[dict[str, Any], Scored]:
    """The result's baseline keys (:func:`~privmtl.federated.baseline.local_baseline`): every
    client's final model against its own local training, the end of run's ``local`` candidate
    where every client computed it, else trained for :func:`baseline_sample`'s clients; and the
    per-client scores they come from."""
    from privmtl.federated.baseline import local_keys, local_scores

    result, spec = trained.result, loaded.spec
    per_client = finished.per_client or {}
    if "local" in per_client and "final" in per_client:
        (final_c, n), (local_c, _) = per_client["final"], per_client["local"]
        idx = np.arange(loaded.m)
    else:
        final, personalized = _final_params(trained, finished)
        idx, final_c, local_c, n = local_scores(
            loaded.dataset, loaded.net, final, personalized=personalized, seed=spec.seed,
            batch_size=spec.batch_size, solver=trained.local_solver,
            patience=trained.local_patience, device=result.config.device,
            workers=result.config.threads,
            local=result.personalized_params if loaded.method.every_client else None,
        )  # fmt: skip
    keys = local_keys(final_c, local_c, n, m=loaded.m, solver=trained.local_solver)
    return keys, (idx, final_c, local_c, n)


def _client_rows(
    loaded: LoadedRun, trained: TrainedRun, finished: FinishedRun, scored: Scored | None
) -> pd.DataFrame:
    """The run's per-client rows (:func:`~privmtl.per_client.pmtl_rows`): each client's kept
    model, its test accuracy and its local-only accuracy (NaN outside the baseline's sample).
    The correct predictions are the end of run's or the baseline's where they cover every
    client, else one scoring pass a block of clients at a time."""
    from privmtl.federated.baseline import per_client_correct
    from privmtl.per_client import pmtl_rows, ratio

    ds, m = loaded.dataset, loaded.m
    if finished.kept is not None:
        kept: Sequence[str] = [str(k) for k in finished.kept]
    else:  # one kind of final model for every client
        (name,) = finished.final_models["clients_per_final_model"]
        kept = [str(name)] * m
    per_client = finished.per_client or {}
    local = None
    if scored is not None:
        idx, _, local_c, n = scored
        local = np.full(m, np.nan)
        local[idx] = ratio(local_c, n)
    if "final" in per_client:
        correct = per_client["final"][0]
    elif scored is not None and len(scored[0]) == m:
        correct = scored[1]
    else:
        final, personalized = _final_params(trained, finished)
        correct = per_client_correct(ds, loaded.net, final, personalized=personalized)[0]
    sizes = {split: ds.sizes(split) for split in ("train", "val", "test")}
    return pmtl_rows(ds.client_ids, sizes, kept, correct, local)


def _report(
    loaded: LoadedRun,
    durability: Durability,
    trained: TrainedRun,
    finished: FinishedRun,
    *,
    diagnostics: bool,
) -> dict[str, Any]:
    """Report: the result dictionary (:func:`~privmtl.federated.report.result_parts`, then the
    run's own keys and the finish's), its guarantee with every note and reason not covered."""
    result, runner, ds = trained.result, loaded.method, loaded.dataset
    out, guarantee = result_parts(
        result,
        method=loaded.name,
        model=loaded.request.model,
        data=loaded.request.data,
        sigma=trained.sigma,
        q=trained.q,
        m=loaded.m,
    )
    out["data_seconds"] = loaded.seconds
    out.update({k: result.extra[k] for k in runner.result_keys if k != "local_selection"})
    if loaded.method_source is not None:
        out["method_source"] = loaded.method_source
    # the resolved settings (personal_init as the trainer resolved it), re-runnable as they are
    out["config"] = loaded.resolved.replace(personal_init=result.config.personal_init).to_dict()
    out["clients_per_round_default"] = loaded.spec.clients_per_round is None  # then min(20, m)
    out["scaling"] = ds.scaling
    out["device"] = runner.config.device  # where it computed (resolved by _load)
    notes = [*loaded.notes, *scaling_note(ds.scaling)]
    not_covered: list[str] = []
    if diagnostics:
        out["curator_diagnostics"] = curator_diagnostics(result)
        not_covered.append(DIAGNOSTICS_NOT_COVERED)
    if "local_selection" in runner.result_keys:
        out["local_selection"] = local_selection_summary(result.extra["local_selection"])
        if trained.local_select == "pooled":
            not_covered.append(LOCAL_SELECT_POOLED)
        else:
            notes.append(LOCAL_SELECT_CLIENT_NOTE)
    if durability.checkpoint_dir is not None:
        out["checkpoint_dir"] = str(durability.checkpoint_dir)
    if finished.finetune_results is not None:
        out["finetune_results"] = finished.finetune_results
    out.update(finished.parts)
    notes.extend(finished.notes)
    if finished.own_data:
        guarantee, added = joint_dp(guarantee, runner.notion)
        notes.extend(added)
    out.update(finished.final_models)
    finish_guarantee(out, guarantee, notes, [*not_covered, *finished.not_covered])
    return out


def _save(
    directory: str | Path, loaded: LoadedRun, trained: TrainedRun, finished: FinishedRun,
    out: dict[str, Any], rows: pd.DataFrame | None = None,
) -> str:  # fmt: skip
    """Finish's last part, once the report exists (``model.json`` records it): write the
    trained models, the fine-tuned ones as the clients', and the per-client ``rows``
    (:func:`privmtl.federated.saved.save_models`)."""
    from privmtl.federated.saved import save_models

    return str(
        save_models(
            directory,
            trained.result,
            out,
            model=loaded.request.model,
            dataset=loaded.dataset,
            data=loaded.request.record(),
            personalized=finished.params,
            factory=None if loaded.factory is None else loaded.factory.record(),
            clients=rows,
        )
    )


@holding_directories("checkpoint_dir", "save_models")
def run_pmtl(spec: RunSpec | None = None, /, **settings: Any) -> dict[str, Any]:
    """Run one federated method and return a JSON-ready result dictionary (see the CLI contract).

    ``run_pmtl(data="synthetic", rounds=50, epsilon=2.0)``, or ``run_pmtl(spec, **settings)`` from
    a :class:`~privmtl.federated.spec.RunSpec` (``settings`` replace its values). Every keyword
    is a field of one of the run's three typed parts, where its default is defined
    (:data:`~privmtl.federated.options.PMTL_PARAMETERS`): the run spec (algorithm and
    privacy), :class:`~privmtl.federated.spec.Execution` (``threads``, ``device``,
    ``show_progress``, ``sequential``, checkpointing, ``save_models``) and
    :class:`~privmtl.federated.options.RunOptions` (data, model, end of run, report); an
    unknown keyword is an :class:`~privmtl.exceptions.InvalidParameterError` listing the valid
    ones.

    The algorithm and privacy defaults are the run spec's (:data:`~privmtl.federated.spec.SPEC`,
    shared with ``privmtl pmtl``, the sweep and Flower); the settings are checked once by
    :class:`~privmtl.federated.spec.RunSpec`, the data-dependent defaults filled in by
    :func:`~privmtl.federated.spec.resolve_defaults`, and the result reports the resolved spec
    under ``config`` (``personal_init`` as the trainer resolved it): passed back to ``run_pmtl``,
    it runs the same settings. They differ from
    :class:`~privmtl.federated.config.TrainConfig`'s where the benchmarks found better behaviour: ``server_update="ditto"`` (the billboard follows FedAvg's
    and the personalized models are pulled towards it; ``"offset"`` is the authors' code,
    ``"delta"`` Algorithm 1 as printed) and ``finetune="auto"`` (:data:`AUTO_FINETUNE_EPOCHS`:
    every client chooses on its own validation split between its trained model, the billboard
    fine-tuned on its data and its own local training).

    ``finetune_select="auto"`` and ``local_solver="auto"`` (the defaults) resolve once per run
    (:func:`~privmtl.federated.finish.resolve_finetune_select`,
    :func:`~privmtl.federated.finish.resolve_local_solver`): a private run of a logistic
    regression with a target ε holds the clients' recorded vote over exact ridge candidates where
    the vote can carry signal, every other run lets each client choose among the SGD grids.

    ``finetune`` replaces the reported accuracies by those after local fine-tuning (the CLI's
    ``--finetune``); ``extra_finetunes`` additionally scores each listed variant on the same trained
    run and stores them under ``finetune_results[name]`` (benchmarks compare variants this way).
    ``finetune_lrs`` / ``finetune_lams`` turn fine-tuning into a per-client choice over that grid
    of step sizes and penalty weights (default: ``[lr]`` / ``[lam]``), each client choosing on its
    own validation split (:func:`~privmtl.federated.finetune_selection.finetune_select`; the
    privacy guarantee is unchanged).
    ``finetune_start="billboard"`` (vanilla only) starts every client from the released global
    model instead of its personalized one (``"auto"``: personalized when the method has
    personalized models); it runs :func:`~privmtl.federated.local.train_local` from the billboard,
    so ``finetune_epochs`` may be a grid, each client choosing on its own validation split;
    ``finetune_select="pooled"`` (opt-in, not covered by the guarantee) picks one ``(epochs, lr)``
    for all clients on the pooled validation accuracy.

    ``method="fedrep"`` (:mod:`~privmtl.federated.fedrep`, DP-FedRep) shares a representation
    only (``shared_params``; default every parameter but the last layer's): each sampled client
    trains its own head for ``head_epochs`` epochs on the released representation, then the
    representation, and sends the representation's change; at the end every client trains its
    head on the last release. The result reports ``representation``, ``head`` and
    ``head_epochs``; ``released_dim`` is the representation's size.

    ``method="local-all"`` is the training-alone baseline of
    :func:`~privmtl.federated.local.train_local`: every client (not only sampled ones) trains on its
    own data over a grid of epochs and step sizes, each client choosing on its own validation split
    (``local_select="client"``; ``"pooled"``: one setting for all on the pooled validation
    accuracy, opt-in and not covered by the guarantee); ``rounds``, ``clients_per_round``, ``lr``
    and the privacy options do not apply (ε = 0 towards the others).

    ``delta``: None (default) is :func:`~privmtl.privacy.delta.user_data_delta`,
    min(1e-5, 1/(100 m)) on every data set (:func:`~privmtl.federated.spec.pmtl_delta`);
    ``"paper"`` the PMTL paper's 1/m (reproductions); a float is checked (δ ≥ 1/m warns).
    ``diagnostics=True`` adds ``curator_diagnostics`` (per-round training loss and the norms of
    the un-noised mean, of the noise, and with ``subspace_dim`` of the full un-noised mean): they
    read un-noised client updates, so the result is labelled not covered. Without it the result
    has none of them.

    ``baseline=True`` (default) adds every client's own local training beside its final model
    (:func:`~privmtl.federated.baseline.local_baseline`: ``local_test_accuracy``,
    ``gain_over_local`` and its ``gain_interval``), the end of run's local candidate where it
    computed one for every client, else trained for at most
    :data:`~privmtl.federated.baseline.LOCAL_BASELINE_CLIENTS` sampled clients. No privacy cost.

    ``per_client`` (a ``.csv`` or ``.parquet`` file, checked before any data is read) receives
    one row per client (:mod:`privmtl.per_client`: its sizes, the model it kept, its test
    accuracy, its local-only accuracy and the gain); ``save_models`` writes the same rows into the
    folder (``clients.csv``). ``eval_every`` records the validation accuracy of the method's model
    every that many rounds (``val_accuracy_per_round``; 0: none).

    ``device`` (``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``;
    :func:`~privmtl._device.resolve_device`) is where the in-process engine trains and scores:
    ``"auto"`` is CUDA where available, ``"cuda"`` without CUDA is an error before any work. The
    release's noise is still drawn on the CPU from the noise source and the ledger is the same;
    the result reports the device used under ``"device"``.

    ``noise_source`` (``"secure"``: OS entropy, the default; ``"seeded"``: reproducible from
    ``seed``, research simulation only), ``checkpoint_dir``/``checkpoint_every``/``resume`` and
    ``budget_epsilon`` are passed to :class:`~privmtl.federated.protocol.Trainer`; the result
    reports ``noise_source`` and ``stopped_on_budget``. ``save_models`` writes the trained models
    (:func:`privmtl.federated.saved.save_models`). ``num_clients`` sets the synthetic population's
    size; ``server_optimizer``/``server_lr``/``server_momentum``, ``shared_params`` and
    ``personal_init``, ``subspace_dim`` and ``adaptive_clip_*`` are the
    :class:`~privmtl.federated.config.TrainConfig` options of the same names (post-processing,
    partial sharing and random-subspace releases leave the guarantee unchanged; adaptive clipping's
    count is accounted with the mean, so with ``epsilon`` the mean gets a little more noise).
    ``sampling="cyclic"`` with ``groups`` and ``noise_mechanism="banded"`` are those options too
    (banded noise: the result's ``banded`` entry; ``resume`` needs seeded noise).

    ``clients_per_round`` defaults to :func:`default_clients_per_round` (``min(20, m)``); an
    explicit value above ``m`` is an error. ``scaling`` applies to ``data="table"``
    (:func:`load_federated`); the result reports what was done under ``"scaling"``. A user's
    ``model`` factory is loaded before the data and checked by a forward pass before training.

    ``method`` is a method name, or your own method: a
    :class:`~privmtl.federated.methods.base.Method` subclass or instance, or ``"PATH.py:NAME"`` /
    ``"MODULE:NAME"`` naming one (loaded as a ``model`` factory is; the result's
    ``method_source`` records the file and its SHA-256). It runs with the same release,
    accounting, ledger and checkpointing as privmtl's methods.

    ``seconds`` is the run's wall time, from the call to the finished result, and ``phases`` its
    seconds by phase (:data:`~privmtl._timing.PMTL_PHASES`: ``data``, ``setup``, ``rounds``,
    ``end_of_run``, ``scoring``, ``saving`` and ``other``, which add up to ``seconds``);
    ``seconds_per_round`` is the rounds' own time per round and ``data_seconds`` the ``data``
    phase.
    """
    given, x, o = split_settings(spec, settings)
    return _run(given, x, o)


def _run(given: dict[str, Any], x: Execution, o: RunOptions) -> dict[str, Any]:
    """:func:`run_pmtl` of the run spec's settings ``given`` (``method`` may be a user's method
    object), the execution ``x`` and the run options ``o``."""
    method = given.get("method", SPEC.method)
    shared_params = given.get("shared_params")
    finetune = given.get("finetune", SPEC.finetune)
    timer = PhaseTimer(PMTL_PHASES)  # the run's wall time starts here
    if x.save_models is not None:  # its model.json is signed: a bad key stops the run now
        from privmtl.trust import check_signing_key

        check_signing_key()
    with timer.phase("setup"):
        own_method, method_source = resolve_method(method)
    spec = RunSpec(
        **{k: v for k, v in given.items() if k not in ("method", "shared_params")},
        method=own_method if isinstance(own_method, str) else own_method.name,
        shared_params=None if shared_params is None else tuple(shared_params),
    )
    finishing = _finish_request(
        finetune,
        epochs=o.finetune_epochs,
        lrs=o.finetune_lrs,
        lams=o.finetune_lams,
        start=o.finetune_start,
        select=o.finetune_select,
        extra=o.extra_finetunes,
    )
    local_solver, local_patience = o.local_solver, o.local_patience
    check_choice("local_select", o.local_select, LOCAL_SELECT)
    check_choice("local_solver", local_solver, LOCAL_SOLVER_CHOICES)
    if local_patience is not None:
        local_patience = check_int("local_patience", local_patience, low=1)
        local_solver = "sgd" if local_solver == "auto" else local_solver  # patience stops SGD
        if local_solver != "sgd":
            raise InvalidParameterError(
                "The 'local_patience' parameter stops SGD runs (local_solver='sgd'); got "
                f"local_patience={local_patience} with local_solver={local_solver!r}."
            )
    resolve_device(x.device)  # before any data is read: "cuda" without CUDA fails here
    eval_every = check_int("eval_every", x.eval_every, low=0)
    per_client = o.per_client
    if per_client is not None:
        from privmtl.per_client import check_rows_path

        per_client = check_rows_path(per_client)
    for name, flag in (("diagnostics", o.diagnostics), ("baseline", o.baseline)):
        if not isinstance(flag, bool):
            raise InvalidParameterError(f"The '{name}' parameter must be a bool; got {flag!r}.")
    request = DataRequest(
        data=o.data,
        data_path=o.data_path,
        model=o.model,
        table={
            "client_column": o.client_column,
            "label_column": o.label_column,
            "feature_columns": None if o.feature_columns is None else list(o.feature_columns),
        },
        num_clients=o.num_clients,
        scaling=o.scaling,
    )
    check_resume(x.resume, spec.noise_mechanism, spec.noise_source)
    check_vote_mechanism(o.finetune_select, spec.noise_mechanism)
    durability = Durability(x.checkpoint_dir, x.checkpoint_every, x.resume, o.budget_epsilon)
    loaded = _load(
        spec, own_method, request, method_source=method_source, dataset=o.dataset,
        batched=not x.sequential, progress=x.show_progress, threads=x.threads, timer=timer,
        device=x.device, finetune_select=o.finetune_select, eval_every=eval_every,
    )  # fmt: skip
    if local_solver == "ridge" and not isinstance(loaded.net, MultinomialLogReg):
        raise InvalidParameterError(
            "The 'local_solver' parameter 'ridge' needs a logistic-regression model (model="
            f"'logreg'); got local_solver='ridge' with {type(loaded.net).__name__}."
        )
    held = loaded.vote is not None and loaded.vote.held
    local_solver = resolve_local_solver(
        local_solver, loaded.net, vote_held=held, patience=local_patience
    )
    fused = _scores_at_finish(loaded, finishing)
    with timer.phase("scoring"):  # the method's fit: its rounds, then the trained models' scores
        trained = _train(
            loaded, durability, o.local_select, local_solver, local_patience, score=not fused
        )
    timer.carve("scoring", "rounds", trained.result.seconds)  # the engine's own time of its rounds
    with timer.phase("end_of_run"):
        finished = _finish(loaded, trained, finishing)
        if isinstance(trained.result.ledger, PrivacyLedger):
            trained.result.ledger.close()  # after the end-of-run vote, when there was one
    timer.carve("end_of_run", "scoring", finished.score_seconds)
    alone: dict[str, Any] = {}
    scored = None
    if o.baseline:
        before = timer.seconds("scoring")
        with timer.phase("scoring"):  # the baseline: each client's training alone, scored
            alone, scored = _baseline(loaded, trained, finished)
        alone["baseline_seconds"] = timer.seconds("scoring") - before
    out = _report(loaded, durability, trained, finished, diagnostics=o.diagnostics)
    out.update(alone)
    if per_client is not None or x.save_models is not None:
        from privmtl.per_client import write_rows

        with timer.phase("saving"):  # the per-client rows (the run's scores), then the files
            rows = _client_rows(loaded, trained, finished, scored)
            if per_client is not None:
                out["per_client_file"] = str(write_rows(per_client, rows))
            if x.save_models is not None:
                out["models_dir"] = _save(x.save_models, loaded, trained, finished, out, rows)
    return timer.record(out)


def evaluate_saved(
    models_dir: str | Path,
    *,
    data: str | None = None,
    data_path: str | Path | None = None,
    seed: int | None = None,
    client_column: str | None = None,
    label_column: str | None = None,
    feature_columns: Sequence[str] | None = None,
    scaling: str | None = None,
    model: str | None = None,
    trust_code: bool = False,
    per_client: str | Path | None = None,
) -> dict[str, Any]:
    """Reload models saved by ``run_pmtl(save_models=...)`` and score them on the test split.

    The data set defaults to the one the run used (its name, absolute path, columns, scaling and
    seed, recorded in ``model.json``); the same data and split give exactly the run's
    ``test_accuracy``. A folder this user's privmtl saved (signed, :mod:`privmtl.trust`) is
    followed as it is: its recorded data path, and a user's model rebuilt from the factory source
    recorded in ``model.json`` (:func:`~privmtl.federated.saved.build_model`), so neither the
    working directory nor ``PYTHONPATH`` matters. For a folder someone else wrote, a user's model
    needs ``model`` (the factory named again, checked against the recorded SHA-256) or
    ``trust_code``, and a recorded data path outside the folder needs ``data_path``.

    ``per_client`` (a ``.csv`` or ``.parquet`` file) receives one row per client
    (:mod:`privmtl.per_client`): its test accuracy as scored now, beside the model it kept and
    its local-only accuracy as the run recorded them in the folder's ``clients.csv`` (blank for a
    folder without one); the same data give the run's rows.
    """
    from privmtl.federated.saved import (
        build_model,
        check_params,
        iter_personalized,
        load_global,
        read_meta,
    )
    from privmtl.trust import followed_data_path, is_signed

    if per_client is not None:
        from privmtl.per_client import check_rows_path

        per_client = check_rows_path(per_client)
    meta = read_meta(models_dir)
    glob = load_global(models_dir, meta)
    where = str(Path(models_dir) / "model.json")
    saved = meta.get("data", {})
    sd = int(seed if seed is not None else saved.get("seed") or 0)
    # the model first: code this user did not allow is refused before any data is read
    net, notes = build_model(meta, seed=sd, where=where, trust_code=trust_code, factory=model)
    check_params(glob, net, where=where, key="files.global")
    has_pers = False
    for _ in iter_personalized(models_dir, meta, net=net, mmap=True):  # every file, mapped: cheap
        has_pers = True
    name = data if data is not None else saved.get("data")
    path = followed_data_path(
        saved.get("data_path"),
        data_path,
        folder=Path(models_dir),
        signed=is_signed(meta),
        where=where,
    )
    given = {
        "client_column": client_column,
        "label_column": label_column,
        "feature_columns": None if feature_columns is None else list(feature_columns),
    }
    table: dict[str, Any] = {k: v if v is not None else saved.get(k) for k, v in given.items()}
    scale = scaling if scaling is not None else saved.get("scaling", "none")
    if name == "table":
        table["scaling"] = scale
    ds = load_federated(
        str(name), data_path=path, seed=sd, **table, num_clients=saved.get("num_clients")
    )
    if list(ds.client_ids) != list(meta["client_ids"]):
        raise DataFormatError(
            f"The data has other clients than the saved models ({ds.n_clients} vs "
            f"{len(meta['client_ids'])}); pass the --data the run used."
        )
    if (ds.n_features, ds.n_classes) != (meta["model"]["n_features"], meta["model"]["n_classes"]):
        raise DataFormatError(
            f"The data has {ds.n_features} features and {ds.n_classes} classes; the saved models "
            f"{meta['model']['n_features']} and {meta['model']['n_classes']}."
        )
    personalized = meta["primary"] == "personalized" and has_pers
    released = meta.get("method") not in NO_RELEASE_METHODS
    scores, correct = _score_saved(
        models_dir, meta, net, glob, ds, personalized=personalized, shared=has_pers or released
    )
    acc = scores["own"]
    guarantee = meta.get("guarantee")
    from privmtl.privacy.ledger import check_saved_ledger

    # a recorded path outside the folder is followed only for a folder this user signed (trust)
    record = meta.get("ledger") if is_signed(meta) else None
    checked = check_saved_ledger(record, guarantee, where=f"the saved models in {models_dir}")
    out = {
        "family": "pmtl",
        "method": meta.get("method"),
        "data": name,
        "data_path": None if path is None else str(path),
        "scaling": ds.scaling,
        "model": meta["model"]["name"],
        "models_dir": str(Path(models_dir).resolve()),
        "primary": meta["primary"],
        "test_accuracy": acc["accuracy"],
        "mean_client_accuracy": acc["mean_client_accuracy"],
        "n_test": acc["n"],
        "noise_source": meta.get("run", {}).get("noise_source"),
        "guarantee": guarantee,
        "covered": None if not isinstance(guarantee, dict) else guarantee.get("covered"),
        "summary": meta.get("summary"),
        "notes": notes,
        "ledger_checked": checked,
    }
    if "shared" in scores:
        shared = scores["shared"]
        out["global_test_accuracy"] = shared["accuracy"]
        if released:
            # the released global model on every client's own test data, averaged over clients
            out["global_mean_client_accuracy"] = shared["mean_client_accuracy"]
            out["shared_params"] = meta.get("config", {}).get("shared_params")
    run = meta.get("run", {})
    for key in ("clients_per_final_model", "end_of_run"):  # recorded at training
        if key in run:
            out[key] = run[key]
    if per_client is not None:
        from privmtl.per_client import write_rows

        rows = _saved_rows(models_dir, meta, ds, correct)
        out["per_client_file"] = str(write_rows(per_client, rows))
    return out


def _saved_rows(
    models_dir: str | Path, meta: dict[str, Any], ds: FederatedDataset, correct: np.ndarray
) -> pd.DataFrame:
    """:func:`evaluate_saved`'s per-client rows: the accuracies scored now (``correct``), the
    kept models and local-only accuracies recorded in the folder's ``clients.csv``."""
    from privmtl.federated.saved import verified_file
    from privmtl.per_client import pmtl_rows, read_rows

    m = ds.n_clients
    kept: list[str] = [""] * m
    local = np.full(m, np.nan)
    path = verified_file(models_dir, meta, "clients")  # inside the folder, its SHA-256 checked
    if path is not None:
        recorded = read_rows(path)
        if list(recorded["client"]) != list(ds.client_ids):
            raise DataFormatError(
                f"{path} lists other clients than the data ({len(recorded)} rows, {m} clients)."
            )
        kept = [str(k) for k in recorded["kept"]]
        local = recorded["local_test_accuracy"].to_numpy(np.float64)
    sizes = {split: ds.sizes(split) for split in ("train", "val", "test")}
    return pmtl_rows(ds.client_ids, sizes, kept, correct, local)


def _score_saved(
    models_dir: str | Path,
    meta: dict[str, Any],
    net: torch.nn.Module,
    glob: Params,
    ds: FederatedDataset,
    *,
    personalized: bool,
    shared: bool,
) -> tuple[dict[str, dict[str, float]], np.ndarray]:
    """:func:`evaluate_saved`'s test scores, streamed: ``"own"`` (each client's own model: its
    personalized one when ``personalized``, else the global one) and, when ``shared``, ``"shared"``
    (the global model on every client). A block of clients at a time is read from the saved files
    (:func:`~privmtl.federated.saved.personalized_blocks`) and drawn from ``ds``
    (:meth:`~privmtl.data.federated.FederatedDataset.subset`), so one file of models and one
    block's test data are held at once; the sums equal scoring every client at once. Also
    every client's correct test predictions of its own model."""
    from privmtl.federated.algorithms import BlockScores
    from privmtl.federated.blocks import client_blocks
    from privmtl.federated.saved import personalized_blocks

    buffers = {n: b.detach() for n, b in net.named_buffers()}
    book = BlockScores(net, buffers, ("test",))
    if personalized:
        blocks: Any = personalized_blocks(models_dir, meta, net=net)
    else:
        blocks = ((pos, None) for pos in client_blocks(ds.n_clients))
    with torch.no_grad():
        for pos, own in blocks:
            piece = ds if len(pos) == ds.n_clients else ds.subset(pos.tolist())
            if own is not None:
                book.add("own", own, True, piece)
                if shared:
                    book.add("shared", glob, False, piece)
            else:
                book.add("own", glob, False, piece)
    scores = book.summary()["test"]
    if shared and not personalized:  # the global model is the clients' own: scored once
        scores["shared"] = scores["own"]
    return scores, book.per_client("test", "own")[0]


def _epochs_grid(epochs: int | Sequence[int]) -> list[int]:
    values = [epochs] if isinstance(epochs, int) else list(epochs)
    if not values or any(isinstance(e, bool) or not isinstance(e, int) or e < 1 for e in values):
        raise InvalidParameterError(
            "The 'finetune_epochs' parameter must be an int >= 1 or a non-empty sequence of "
            f"them; got {epochs!r}."
        )
    return values


def _finetune_from_billboard(
    result: Any,
    ds: FederatedDataset,
    net: torch.nn.Module,
    epochs: Sequence[int],
    lrs: Sequence[float],
    batch_size: int,
    seed: int,
    select: str,
) -> dict[str, Any]:
    """Every client fine-tunes from the billboard: ``train_local`` started at the global model."""
    import copy

    from privmtl.federated.local import train_local

    start = copy.deepcopy(net)
    start.load_state_dict({**start.state_dict(), **result.global_params})
    tuned = train_local(
        ds, start, epochs=epochs, lrs=lrs, batch_size=batch_size, select=select, seed=seed,
        device=result.config.device,
    )  # fmt: skip
    sel = tuned.extra["local_selection"]
    test = tuned.accuracies["test"]["personalized"]
    return {
        "finetune_selection": {
            "select": sel["select"],
            "grid": sel["grid"],
            "grid_axes": ["epochs", "lr"],
            "choice_counts": np.bincount(sel["choice"], minlength=len(sel["grid"])).tolist(),
            "grid_test_accuracy": sel["grid_test_accuracy"],
            "note": "every client fine-tuned from the billboard on its own data; "
            + (
                "each client chose (epochs, lr) on its own validation split: no privacy cost"
                if select == "client"
                else "one (epochs, lr) chosen on the pooled validation accuracy of all clients "
                "(not covered by the guarantee)"
            ),
        },
        "finetune": "vanilla",
        "finetune_start": "global",
        "pre_finetune_test_accuracy": float(result.test_accuracy),
        "test_accuracy": float(test["accuracy"]),
        "mean_client_accuracy": float(test["mean_client_accuracy"]),
        "val_accuracy": float(tuned.accuracies["val"]["personalized"]["accuracy"]),
        "finetune_note": FINETUNE_NOTE,
        "_params": tuned.personalized_params,
    }


def _finetune_auto(
    result: TrainResult,
    ds: FederatedDataset,
    net: torch.nn.Module,
    method: str,
    sigma: float,
    batch_size: int,
    seed: int,
    local_solver: str = "sgd",
    local_patience: int | None = None,
    *,
    score_trained: bool = False,
    vote: VotePlan | None = None,
) -> dict[str, Any]:
    """``finetune="auto"`` (:data:`AUTO_FINETUNE_EPOCHS`): every client chooses on its own
    validation split among the billboard fine-tuned on its data (where it carries signal), its own
    local training and its trained model (:func:`~privmtl.federated.finish.finish_clients`).
    Which candidates it compares depends on public parameters only: ``sigma`` (the released
    mean's noise), the clip, one release's size and the releases made. The final models are
    scored block by block as the clients finish; ``score_trained``: the trained models too
    (``result.accuracies`` is filled in). ``vote`` (held): one candidate for every client by the
    clients' noisy vote, recorded in the run's ledger before any final model exists; the
    result's ε is then the ledger's, rounds and vote composed."""
    cfg = result.config
    shared = None if cfg.shared_params is None else list(cfg.shared_params)
    dim = int(released_dim(result) or 0)
    rounds = len(result.history) or cfg.rounds
    plan = auto_plan(method, shared, sigma, cfg.clip, dim, rounds)
    trained = stack_trained(result.personalized_params, result.global_params, ds.n_clients)
    others: dict[str, tuple[Params, bool]] = {}
    if score_trained:
        others = {name: (result.global_params, False) for name in result.accuracies["test"]}
        if "personalized" in others:
            assert result.personalized_params is not None
            others["personalized"] = (result.personalized_params, True)
    record: dict[str, Any] | None = None
    # a seeded vote is a deterministic function of the run: its replay after a resume is the
    # recorded release (its recorded epsilon, not charged twice); a secure one is new noise
    replay = result.noise_source == "seeded"
    replayed = replay and result.ledger is not None and result.ledger.has_release(FINETUNE_VOTE_ID)
    if vote is not None and vote.held and result.ledger is not None and not replayed:
        try:  # a run stopped on its budget may have no room left for the vote
            result.ledger.check(vote.vote(1).event())
        except PrivacyBudgetError as exc:
            vote = dataclasses.replace(vote, held=False, reason=f"no vote: {exc}")
    if vote is not None:
        record = {"id": FINETUNE_VOTE_ID, "held": vote.held, "reason": vote.reason}
    elect = None
    if vote is not None and vote.held:
        assert record is not None

        def elect(shares: np.ndarray, names: tuple[str, ...]) -> int:
            ballot = vote.vote(len(names))
            noise = make_noise_source(result.noise_source, seed, stream=(FINETUNE_VOTE_STREAM,))
            ledger = result.ledger
            res = ballot.select(
                shares, noise if ballot.private else None, ledger=ledger,
                release_id=FINETUNE_VOTE_ID, replay_ok=replay, delta=float(result.delta),
                accountant=cfg.accountant,
            )  # fmt: skip
            if ledger is not None:
                result.epsilon = res.epsilon  # rounds and vote, composed by the ledger
            own = ballot.epsilon(float(result.delta), accountant=cfg.accountant)
            record.update(
                candidates=list(names), winner=names[res.winner],
                noisy_counts=list(res.noisy_counts), noise_std=ballot.noise_std,
                share=vote.share, epsilon=own if math.isfinite(own) else None,
                noise_source=res.details["noise_source"],
            )  # fmt: skip
            return res.winner

    fin = finish_clients(
        "auto", ds, net, trained, result.global_params, batch_size=batch_size, seed=seed,
        lr=float(cfg.lr), lam=float(cfg.lam or 0.0), plan=plan, progress=bool(cfg.progress),
        device=cfg.device, score=others, workers=cfg.threads, local_solver=local_solver,
        local_patience=local_patience, select="vote" if elect is not None else "client",
        vote=elect, voter_rng=_voter_rng(result.noise_source, seed),
    )  # fmt: skip
    if record is not None and fin.voters is not None:
        record["voters"] = fin.voters
    assert fin.choice is not None and fin.scores is not None
    if score_trained:  # the trained models' scores, from the same pass
        result.accuracies = {
            split: {name: fin.scores[split][name] for name in others} for split in fin.scores
        }
    acc = {split: fin.scores[split]["final"] for split in fin.scores}
    counts = np.bincount(fin.choice, minlength=len(plan.names))
    return {
        "finetune": "auto",
        "finetune_auto": {
            **auto_info(plan, counts.tolist(), fin.grids, local_solver, record),
            **({"patience": local_patience} if local_patience is not None else {}),
        },
        "pre_finetune_test_accuracy": float(result.test_accuracy),
        "test_accuracy": float(acc["test"]["accuracy"]),
        "mean_client_accuracy": float(acc["test"]["mean_client_accuracy"]),
        "val_accuracy": float(acc["val"]["accuracy"]),
        "_params": fin.params,
        "_score_seconds": fin.score_seconds,
        "_per_client": fin.per_client,
        "_kept": np.asarray(plan.names, dtype=object)[fin.choice],
    }


def _voter_rng(noise_source: str, seed: int) -> np.random.Generator | None:
    """The voters' coins (:func:`~privmtl.federated.finish.vote_voters`): the seeded stream
    :data:`~privmtl.federated.finish.FINETUNE_VOTERS_STREAM` of a seeded run (a simulation),
    else None (OS entropy: secret, as the rounds' sampling of a secure run)."""
    if noise_source != "seeded":
        return None
    return np.random.default_rng([int(seed), FINETUNE_VOTERS_STREAM])


def _finetune(
    result: Any,
    ds: FederatedDataset,
    net: torch.nn.Module,
    method: str,
    epochs: int,
    lr: float,
    batch_size: int,
    lam: float,
    seed: int,
    grid: tuple[list[float], list[float]] | None = None,
) -> dict[str, Any]:
    from privmtl.federated.finetune_selection import finetune_select

    start = "personalized" if result.personalized_params is not None else "global"
    extra: dict[str, Any] = {}
    if grid is not None:
        params, acc, sel = finetune_select(
            result,
            ds,
            net,
            method=method,
            lrs=grid[0],
            lams=grid[1],
            start=start,
            epochs=epochs,
            batch_size=batch_size,
            seed=seed,
        )
        extra["finetune_selection"] = {
            "select": sel["select"],
            "grid": sel["grid"],
            "choice_counts": [sel["choice"].count(g) for g in range(len(sel["grid"]))],
            "note": "each client chose (lr, lam) on its own validation split: no privacy cost",
        }
    else:
        from privmtl.federated.algorithms import evaluate_dataset

        fin = finish_clients(
            method, ds, net,
            stack_trained(result.personalized_params, result.global_params, ds.n_clients),
            result.global_params, batch_size=batch_size, seed=seed, lr=lr, lam=lam, start=start,
            epochs=epochs, device=result.config.device, workers=result.config.threads,
        )  # fmt: skip
        params = fin.params
        buffers = {n: b.detach() for n, b in net.named_buffers()}
        scores = evaluate_dataset(net, {"final": (params, True)}, buffers, ds)
        acc = {split: scores[split]["final"] for split in scores}
    return {
        **extra,
        "finetune": method,
        "finetune_start": start,
        "pre_finetune_test_accuracy": float(result.test_accuracy),
        "test_accuracy": float(acc["test"]["accuracy"]),
        "mean_client_accuracy": float(acc["test"]["mean_client_accuracy"]),
        "val_accuracy": float(acc.get("val", {}).get("accuracy", float("nan"))),
        "finetune_note": FINETUNE_NOTE,
        "_params": params,
    }
