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

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from privmtl._device import resolve_device
from privmtl._timing import PMTL_PHASES, PhaseTimer
from privmtl._validation import check_choice, check_int
from privmtl.data.registry import (
    dataset_names,
    default_femnist_dir,
    load_federated,
)
from privmtl.exceptions import InvalidParameterError
from privmtl.experiments.pmtl_saved import NO_RELEASE_METHODS, evaluate_saved
from privmtl.experiments.pmtl_steps import (
    FINETUNE_STARTS,
    DataRequest,
    Durability,
    FinishedRun,
    FinishRequest,
    LoadedRun,
    TrainedRun,
    _finish_request,
    _load,
)
from privmtl.federated.algorithms import Params
from privmtl.federated.baseline import local_keys, local_scores, per_client_correct
from privmtl.federated.end_of_run.finish import (
    AUTO_CANDIDATES,
    AUTO_CLEAR_SIGNAL,
    AUTO_FINETUNE_EPOCHS,
    AUTO_FINETUNE_LRS,
    AUTO_NOTE,
    AUTO_ORDERS,
    FINETUNE_VOTE_NOTE,
    final_models_keys,
    resolve_local_solver,
)
from privmtl.federated.end_of_run.local import LOCAL_SELECT, LOCAL_SOLVER_CHOICES
from privmtl.federated.end_of_run.trained_run import (
    finetune_auto,
    finetune_from_billboard,
    finetune_trained,
)
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
    result_parts,
    scaling_note,
)
from privmtl.federated.runner import fit, runs_rounds
from privmtl.federated.saved import save_models
from privmtl.federated.spec import (
    DEFAULT_CLIENTS_PER_ROUND,
    DEFAULT_FEDPROX_MU,
    DEFAULT_LAM_NONPRIVATE,
    DEFAULT_LAM_PRIVATE,
    RUN_METHODS,
    SPEC,
    Execution,
    RunSpec,
    check_resume,
    check_vote_mechanism,
    default_clients_per_round,
    default_lam,
)
from privmtl.locking import holding_directories
from privmtl.per_client import check_rows_path, pmtl_rows, ratio, write_rows
from privmtl.privacy.ledger import PrivacyLedger
from privmtl.trust import check_signing_key

if TYPE_CHECKING:
    import pandas as pd


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


def _scores_at_finish(loaded: LoadedRun, request: FinishRequest) -> bool:
    """Whether the end of run scores the trained models while it finishes the clients (one pass
    over the clients' data instead of two): ``finetune="auto"`` of a method the in-process
    engine runs as it is, round by round (:func:`~privmtl.federated.runner.runs_rounds`)."""
    runner = loaded.method
    return (
        loaded.spec.finetune == "auto"
        and not runner.every_client
        and not request.extra
        and runs_rounds(runner)
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
    """Train: the method's run (:func:`~privmtl.federated.runner.fit`) with the run's checkpoint
    and budget; a method that releases nothing reports no noise and every client.
    ``score=False``: the trained models' scores are left to the end of run
    (:func:`_scores_at_finish`)."""
    runner = loaded.method
    options = {
        "local_select": local_select,
        "local_solver": local_solver,
        "local_patience": local_patience,
    }
    result = fit(
        runner,
        loaded.dataset,
        loaded.net,
        **{k: options[k] for k in runner.fit_options},
        **durability.run_options(),
        **({} if score else {"score_at_end": False}),
    )
    if runner.every_client:  # nothing released: no noise, every client trains
        return TrainedRun(result, 0.0, loaded.m, local_select, local_solver, local_patience)
    sigma = result.config.noise_std  # the σ the run's release calibrated to its target
    return TrainedRun(result, sigma, loaded.q, local_select, local_solver, local_patience)


def _finish(
    loaded: LoadedRun, trained: TrainedRun, request: FinishRequest, *, keep_models: bool = True
) -> FinishedRun:
    """Finish: the extra fine-tuning variants, then the run's end (``finetune``: the clients'
    automatic choice, fine-tuning from their models or from the billboard, or none) and the keys
    describing the final models. Everything here is post-processing of the releases.
    ``keep_models=False``: ``finetune="auto"`` drops every block's final models once scored (the
    per-client scores and the result do not need them; a run that saves them keeps them, on
    disk: :func:`~privmtl.federated.end_of_run.trained_run.finetune_auto`)."""
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
            name: finetune_trained(
                result,
                ds,
                net,
                name,
                request.epochs[0],
                lr,
                batch_size,
                lam,
                seed,
                grid,
                keep_models=False,
            )
            for name in request.extra
        }
        for res in results.values():
            res.pop("_params")
            res.pop("_per_client", None)
    parts: dict[str, Any] = {}
    params = None
    per_client = None
    kept = None
    dropped = False
    notes: tuple[str, ...] = ()
    not_covered: tuple[str, ...] = ()
    own_data = False
    finetune = spec.finetune
    if finetune == "auto" and not loaded.method.every_client:
        sigma = float(trained.sigma or 0.0)
        parts = finetune_auto(
            result, ds, net, loaded.name, sigma, batch_size, seed, trained.local_solver,
            trained.local_patience, score_trained=_scores_at_finish(loaded, request),
            vote=loaded.vote, keep_models=keep_models,
        )  # fmt: skip
        params = parts.pop("_params")
        score_seconds = float(parts.pop("_score_seconds"))
        per_client = parts.pop("_per_client")
        kept = parts.pop("_kept")
        dropped = params is None
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
            finetune_from_billboard(
                result, ds, net, request.epochs, grid[0] if grid else [lr], batch_size, seed,
                request.select, keep_models=keep_models,
            )
            if request.start == "billboard"
            else finetune_trained(
                result, ds, net, finetune, request.epochs[0], lr, batch_size, lam, seed, grid,
                keep_models=keep_models,
            )
        )  # fmt: skip
        params = parts.pop("_params")
        per_client = parts.pop("_per_client", None)
        dropped = params is None
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
        kept, dropped,
    )  # fmt: skip


def _final_params(trained: TrainedRun, finished: FinishedRun) -> tuple[Params, bool]:
    """Every client's final model: the finished (fine-tuned) ones, the trained personalized ones,
    or the released global model; and whether they are stacked per client."""
    result = trained.result
    if finished.params is not None:
        return finished.params, True
    if finished.dropped:  # finished in one pass, the models dropped once scored
        raise RuntimeError("the end of run kept no final models (finish with keep_models=True)")
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
    result, spec = trained.result, loaded.spec
    per_client = finished.per_client or {}
    if "local" in per_client and "final" in per_client:
        (final_c, n), (local_c, _) = per_client["final"], per_client["local"]
        idx = np.arange(loaded.m)
    else:  # the final models scored already by the end of run's pass: not read again
        scored = per_client.get("final")
        final, personalized = (
            _final_params(trained, finished) if scored is None else (result.global_params, False)
        )
        idx, final_c, local_c, n = local_scores(
            loaded.dataset, loaded.net, final, personalized=personalized, seed=spec.seed,
            batch_size=spec.batch_size, solver=trained.local_solver,
            patience=trained.local_patience, device=result.config.device,
            workers=result.config.threads,
            local=result.personalized_params if loaded.method.every_client else None,
            final_correct=scored,
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
    (:func:`~privmtl.federated.end_of_run.finish.resolve_finetune_select`,
    :func:`~privmtl.federated.end_of_run.finish.resolve_local_solver`): a private run of a logistic
    regression with a target ε holds the clients' recorded vote over exact ridge candidates where
    the vote can carry signal, every other run lets each client choose among the SGD grids.

    ``finetune`` replaces the reported accuracies by those after local fine-tuning (the CLI's
    ``--finetune``); ``extra_finetunes`` additionally scores each listed variant on the same trained
    run and stores them under ``finetune_results[name]`` (benchmarks compare variants this way).
    ``finetune_lrs`` / ``finetune_lams`` turn fine-tuning into a per-client choice over that grid
    of step sizes and penalty weights (default: ``[lr]`` / ``[lam]``), each client choosing on its
    own validation split (:func:`~privmtl.federated.end_of_run.finetune_selection.finetune_select`; the
    privacy guarantee is unchanged).
    ``finetune_start="billboard"`` (vanilla only) starts every client from the released global
    model instead of its personalized one (``"auto"``: personalized when the method has
    personalized models); it runs :func:`~privmtl.federated.end_of_run.local.train_local` from the billboard,
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
    :func:`~privmtl.federated.end_of_run.local.train_local`: every client (not only sampled ones) trains on its
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
        finished = _finish(loaded, trained, finishing, keep_models=x.save_models is not None)
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
        with timer.phase("saving"):  # the per-client rows (the run's scores), then the files
            rows = _client_rows(loaded, trained, finished, scored)
            if per_client is not None:
                out["per_client_file"] = str(write_rows(per_client, rows))
            if x.save_models is not None:
                out["models_dir"] = _save(x.save_models, loaded, trained, finished, out, rows)
    return timer.record(out)
